"""Sweeps that hid or overwrote (issue 53, item 4): every job's config checked before the first job runs, a record
of the jobs that the sweep table reads (a row for each, missing and failed ones named; plug-in environments too), no
stage folder shared by jobs whose settings for that stage differ, and no finished stage of another run (reached
through ``paths.base``) replaced in place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_env_plugins import TOY_NO_ENV, _environ, site  # noqa: F401 - site: the installed plug-in (a fixture)
from test_pipeline import ROOT, TOY


def _cli(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eto_train.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _refused(proc, stage: str) -> str:
    """One block on stderr, `eto-train <stage>: ...`, exit 2, no traceback."""
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr
    head = f"eto-train {stage}: "
    assert proc.stderr.startswith(head) or f"\n{head}" in proc.stderr, proc.stderr  # (a library's warning line first)
    return proc.stderr[proc.stderr.index(head):]


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` but the hash sidecars (a cache of hashes, written by whoever reads: store.py)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".identity.json"}


# -- every job checked before the first runs ---------------------------------------------------------------

def test_a_bad_job_stops_the_sweep_before_job_0_does_any_work(tmp_path):
    """The user's sweep eto.dpo.beta=0.1,-1,0.5: job 0 trained fully before job 1 was refused."""
    runs = tmp_path / "runs"
    err = _refused(_cli("bc", "-m", f"paths.runs={runs}", "run_name=s", *TOY, "eto.dpo.beta=0.1,-1,0.5"), "bc")
    assert "1 of 3 sweep jobs cannot run (no job was run or written)" in err, err
    assert "job 1 (eto.dpo.beta=-1): eto.dpo.beta=-1: a number > 0" in err
    assert "job 0 " not in err and "job 2 " not in err  # the good jobs are not named
    assert not runs.exists()  # job 0 wrote nothing: no experts, no model, no log folder


def test_every_bad_job_and_key_in_one_block(tmp_path):
    runs = tmp_path / "runs"
    err = _refused(_cli("bc", "-m", f"paths.runs={runs}", "run_name=s", *TOY, "eto.dpo.beta=0.1,-1",
                        "bc.learning_rate=1e-3,0"), "bc")
    # jobs in Hydra's order (the first swept key varies slowest): 0 good, 1 bad lr, 2 bad beta, 3 both
    assert "3 of 4 sweep jobs" in err, err
    assert "job 1 (bc.learning_rate=0,eto.dpo.beta=0.1): bc.learning_rate=0: a number > 0" in err
    assert "job 2 (bc.learning_rate=0.001,eto.dpo.beta=-1): eto.dpo.beta=-1: a number > 0" in err
    assert "job 3 (bc.learning_rate=0,eto.dpo.beta=-1): bc.learning_rate=0" in err
    assert "job 3 (bc.learning_rate=0,eto.dpo.beta=-1): eto.dpo.beta=-1" in err
    assert not runs.exists()


def test_a_key_no_job_has_is_named_with_its_job(tmp_path):
    err = _refused(_cli("eval", "-m", f"paths.runs={tmp_path}/runs", "eval.beta=0.1,0.2"), "eval")
    assert "job 0 (eval.beta=0.1): eval.beta=0.1: no such key" in err and "did you mean eto.dpo.beta" in err, err
    assert not (tmp_path / "runs").exists()


# -- the record of a sweep's jobs and its table ----------------------------------------------------------------

def _result(job: Path, dev: tuple[float, ...]) -> None:
    """An eto/result.json as the ETO loop writes it (the fields the sweep table reads)."""
    history = [{"iteration": k, "policy": str(job / "eto" / f"iter{k}" / "dpo" / "model"),
                "dev": {"success_rate": d, "scored_episodes": 2}} for k, d in enumerate(dev)]
    overall = {"success_rate": 0.5}
    (job / "eto").mkdir(parents=True)
    (job / "eto" / "result.json").write_text(json.dumps(
        {"history": history, "best_iteration": 1, "test": {"seen": overall, "unseen": overall},
         "bc_test": {"seen": overall, "unseen": overall}, "best_vs_bc": {}}))


def test_the_sweep_table_has_a_row_for_every_job_missing_and_failed_ones_named(tmp_path):
    runs = tmp_path / "runs"
    # a sweep of three jobs (experts: the cheapest stage) records its jobs before the first runs
    _ok(_cli("experts", "-m", f"paths.runs={runs}", "run_name=s", *TOY, "eto.dpo.beta=0.1,0.5,0.9"))
    sweep = runs / "s"
    [record] = json.loads((sweep / "sweep.json").read_text())["sweeps"]
    assert record["stage"] == "experts" and "eto.dpo.beta=0.1,0.5,0.9" in record["command"]
    assert [j["folder"] for j in record["jobs"]] == ["eto.dpo.beta=0.1", "eto.dpo.beta=0.5", "eto.dpo.beta=0.9"]
    assert [j["index"] for j in record["jobs"]] == [0, 1, 2] and record["jobs"][1]["swept"] == ["eto.dpo.beta=0.5"]
    # as an eto sweep leaves them: job 0 finished, job 1 stopped in its DPO, job 2 never ran
    _result(sweep / "eto.dpo.beta=0.1", (0.5, 1.0))
    dpo = sweep / "eto.dpo.beta=0.5" / "eto" / "iter1" / "dpo"
    dpo.mkdir(parents=True)
    (dpo / "manifest.json").write_text(json.dumps({"stage": "dpo/iter1", "status": "running", "config_hash": "x"}))
    proc = _ok(subprocess.run([sys.executable, "scripts/sweep_table.py", f"paths.runs={runs}", "run_name=s"],
                              cwd=ROOT, capture_output=True, text=True, timeout=120))
    rows = [line for line in (sweep / "sweep.md").read_text().splitlines() if line.startswith("| eto.dpo.beta=")]
    assert len(rows) == 3, rows
    assert rows[0].startswith("| eto.dpo.beta=0.1 | done | 50, 100 (n=2) |")
    assert rows[1].startswith("| eto.dpo.beta=0.5 | failed or stopped: dpo/iter1 did not finish |"), rows[1]
    assert rows[2].startswith("| eto.dpo.beta=0.9 | missing: never ran |"), rows[2]
    assert "1 of 3 jobs done; not done: job 1 (eto.dpo.beta=0.5), job 2 (eto.dpo.beta=0.9)" in proc.stdout


def test_the_sweep_table_works_on_a_plugin_environment(site, tmp_path):  # noqa: F811 - the fixture
    runs = tmp_path / "runs"
    _result(runs / "s" / "eto.dpo.beta=0.1", (0.5, 1.0))
    proc = subprocess.run([sys.executable, "scripts/sweep_table.py", f"paths.runs={runs}", "run_name=s", "env=lamps"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=_environ(site))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| eto.dpo.beta=0.1 | done |" in (runs / "s" / "sweep.md").read_text()


# -- no stage folder shared by jobs of other settings -------------------------------------------------------------

def _plan(*overrides: str, stage: str = "eto"):
    from eto_train import sweeps

    return sweeps.plan(stage, ["-m", "paths.runs=/tmp/nowhere", "run_name=s", *overrides])


def test_jobs_share_a_stage_folder_only_when_that_stages_settings_are_the_same():
    # DPO settings only: experts, model, BC and BC's evaluations shared in the sweep's folder
    a, b = _plan("eto.dpo.beta=0.1,0.5")
    assert a.paths["bc"] == b.paths["bc"] == "/tmp/nowhere/s/bc"
    assert a.paths["bc_eval"] == b.paths["bc_eval"] == "/tmp/nowhere/s/eval/bc"
    assert a.paths["run"] == "/tmp/nowhere/s/eto.dpo.beta=0.1"
    # how policies play: BC shared, its evaluations each job's own (they were evaluated again over each other)
    a, b = _plan("rollout.generation.max_new_tokens=5,6")
    assert a.paths["bc"] == b.paths["bc"] == "/tmp/nowhere/s/bc"
    assert a.paths["bc_eval"] == "/tmp/nowhere/s/rollout.generation.max_new_tokens=5/eval/bc" != b.paths["bc_eval"]
    a, b = _plan("+eval.rollout.batch_size=2,4")
    assert a.paths["bc"] == b.paths["bc"] and a.paths["bc_eval"] != b.paths["bc_eval"]
    # BC's own settings, or a key no list names: every base stage each job's own
    for swept in ("bc.max_steps=3,5", "seed=0,1", "trust_remote_code=false,true"):
        a, b = _plan(swept)
        assert a.paths["bc"] != b.paths["bc"] and a.paths["bc_eval"] != b.paths["bc_eval"], swept


def test_jobs_with_other_rollout_settings_evaluate_bc_each_in_its_own_folder(tmp_path):
    runs = tmp_path / "runs"
    _ok(_cli("bc", f"paths.runs={runs}", "run_name=s", *TOY))
    _ok(_cli("eval", "-m", f"paths.runs={runs}", "run_name=s", *TOY, "eval.splits=[unseen]",
             "rollout.generation.max_new_tokens=5,6"))
    for n in (5, 6):
        m = json.loads((runs / "s" / f"rollout.generation.max_new_tokens={n}" / "eval" / "bc" / "unseen" /
                        "manifest.json").read_text())
        assert m["status"] == "done" and m["config"]["sampling"]["max_new_tokens"] == n, m["config"]
    assert not (runs / "s" / "eval" / "bc" / "unseen").exists()  # not one folder played twice over itself


def test_a_fixed_base_shared_by_jobs_of_other_bc_settings_is_refused_before_any_job(tmp_path):
    runs = tmp_path / "runs"
    err = _refused(_cli("bc", "-m", f"paths.runs={runs}", "run_name=c", f"paths.base={runs}/a", *TOY,
                        "bc.max_steps=2,4"), "bc")
    assert "job 0 (bc.max_steps=2), job 1 (bc.max_steps=4) would share" in err, err
    assert f"paths.bc={runs}/a/bc" in err and "bc.max_steps" in err
    assert not runs.exists()


# -- a finished stage of another run is never replaced in place -----------------------------------------------------

@pytest.fixture(scope="module")
def other_run(tmp_path_factory) -> Path:
    """runs/a with its experts, tiny model and BC finished (the run another run's paths.base points at)."""
    runs = tmp_path_factory.mktemp("runs")
    _ok(_cli("bc", f"paths.runs={runs}", "run_name=a", *TOY))
    return runs / "a"


def test_a_finished_bc_of_another_run_with_other_settings_is_refused_not_retrained(other_run):
    runs, before = other_run.parent, _tree(other_run)
    err = _refused(_cli("bc", f"paths.runs={runs}", "run_name=b", f"paths.base={other_run}", *TOY, "bc.max_steps=2"),
                   "bc")
    assert f"{other_run}/bc: stage 'bc' finished in another run's folder" in err, err
    assert "bc.max_steps" in err and "3 there, 2 here" in err
    assert "run_name" in err and "paths.base" in err  # how to go on
    assert _tree(other_run) == before  # nothing of runs/a changed: no .next, no lock left, the same manifest
    assert not (runs / "b").exists()


def test_a_finished_model_of_another_run_with_another_architecture_is_refused(other_run):
    runs, before = other_run.parent, _tree(other_run)
    err = _refused(_cli("model", f"paths.runs={runs}", "run_name=b", f"paths.base={other_run}", *TOY,
                        "model.arch.hidden_size=48"), "model")
    assert f"{other_run}/model: stage 'model' finished in another run's folder" in err, err
    assert "model.arch.hidden_size (32 there, 48 here)" in err
    assert _tree(other_run) == before


def test_another_runs_finished_stages_with_the_same_settings_are_used_as_they_are(other_run):
    runs, before = other_run.parent, _tree(other_run)
    proc = _ok(_cli("bc", f"paths.runs={runs}", "run_name=b", f"paths.base={other_run}", *TOY,
                    "bc.logging_steps=7"))  # a key that changes how it runs, not its result
    assert f"[bc] up to date in {other_run}/bc" in proc.stdout
    assert {k: v for k, v in _tree(other_run).items() if not k.startswith("logs/")} == \
        {k: v for k, v in before.items() if not k.startswith("logs/")}
