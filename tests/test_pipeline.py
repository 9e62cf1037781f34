"""End to end at toy scale: the stages as a user runs them (`eto-train <stage>`).

experts -> model -> bc -> eval -> one eto-iter, then the demo (the ETO loop, which reuses all of
that, compare and the report) and a two-job Hydra sweep gathered into one table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TOY = [
    "env.step_limit=6", "env.splits.train.count=4", "env.splits.seen.count=2", "env.splits.unseen.count=1",
    "model.tokenizer.vocab_size=300", "model.arch.hidden_size=32", "model.arch.num_layers=1",
    "model.arch.num_heads=2", "model.arch.intermediate_size=64",
    "bc.max_steps=3", "bc.per_device_train_batch_size=4", "bc.save_steps=2", "wandb.enabled=false",
    "rollout.batch_size=4", "rollout.generation.max_new_tokens=6", "env.splits.dev.count=1",
    "eto.explore.tasks_per_game=3", "eto.explore.rollout.batch_size=6", "eto.dpo.max_steps=2", "eto.dpo.per_device_train_batch_size=2", "eto.dpo.logging_steps=1",
    "eto.dpo.loss_type=[sigmoid]", "eto.dpo.loss_weights=null",  # the paper's loss: log 2 at step 0
    "runtime.train_threads=1", "runtime.rollout_threads=1",  # make test runs two workers on two cores
    "reading.split=seen", "reading.permutations=200",  # the demo's reading on the episodes already played
]


def run_stage(stage: str, runs: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "eto_train.cli", stage, f"paths.runs={runs}", "run_name=toy", *TOY, *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    for stage in ("experts", "model", "bc", "eval", "eto-iter"):
        _ok(run_stage(stage, runs))
    _ok(run_stage("demo", runs, "eto.iterations=1"))
    return runs / "toy"


def test_stages_write_their_outputs_and_manifests(toy_run):
    experts = [json.loads(line) for line in (toy_run / "experts" / "train.jsonl").read_text().splitlines()]
    games = {e["game"] for e in experts}
    assert len(experts) == 4 * len(games) and len(games) == 2  # the default config mixes two games
    assert (toy_run / "model" / "model.safetensors").exists()
    assert (toy_run / "bc" / "model" / "model.safetensors").exists()
    bc = json.loads((toy_run / "bc" / "manifest.json").read_text())
    assert bc["status"] == "done" and bc["metrics"]["optimizer_steps"] == 3
    assert bc["input_hashes"]["experts"] and bc["versions"]["trl"] and bc["threads"] == 1
    for split, n in (("seen", 2 * 2), ("unseen", 2 * 1)):
        d = toy_run / "eval" / "bc" / split
        m = json.loads((d / "metrics.json").read_text())
        assert m["overall"]["episodes"] == n and set(m["per_game"]) == games
        lo, hi = m["overall"]["success_ci95"]
        assert 0.0 <= lo <= m["overall"]["success_rate"] <= hi <= 1.0
        assert json.loads((d / "manifest.json").read_text())["threads"] == 1  # runtime.rollout_threads
        assert m["policy"].startswith("bc@")


def test_one_eto_iteration_explores_pairs_trains_and_evaluates(toy_run):
    it = toy_run / "eto" / "iter1"
    explored = [json.loads(line) for line in (it / "explore" / "episodes.jsonl").read_text().splitlines()]
    assert len(explored) == 2 * 3 and {e["policy"]["id"].split("@")[0] for e in explored} == {"bc"}
    stats = json.loads((it / "pairs" / "stats.json").read_text())
    pairs = [json.loads(line) for line in (it / "pairs" / "pairs.jsonl").read_text().splitlines()]
    assert stats["pairs"] == len(pairs) > 0  # an untrained-ish policy loses to the expert
    assert all(p["chosen_policy"] == "expert" and p["rejected"][-1]["role"] == "assistant" for p in pairs)
    dpo = json.loads((it / "dpo" / "manifest.json").read_text())
    assert dpo["status"] == "done" and dpo["metrics"]["optimizer_steps"] == 2
    first = dpo["metrics"]["first_log"]
    assert abs(first["loss"] - 0.6931) < 1e-3  # policy == reference at step 0: log 2
    assert abs(first["rewards/margins"]) < 1e-6
    summary = json.loads((it / "summary.json").read_text())
    assert summary["dev"]["episodes"] == 2 and summary["policy"].endswith("iter1/dpo/model")
    # the next `make eto-iter` starts from this iteration's policy
    proc = _ok(run_stage("eto-iter", toy_run.parent, "eto.iterations=1"))
    assert "cap eto.iterations=1 is reached" in proc.stdout


def test_compare_trains_every_variant_and_the_control_from_bc_and_pairs_them(toy_run):
    out = toy_run / "compare"
    res = json.loads((out / "compare.json").read_text())
    assert set(res["policies"]) == {"bc", "trajectory", "step", "mixture", "control"}
    control = json.loads((out / "control" / "manifest.json").read_text())
    assert control["metrics"]["optimizer_steps"] == res["dpo_steps"]["trajectory"] == 2
    seen = res["splits"]["seen"]
    assert {r["n"] for r in seen.values()} == {4}  # the same seeds for every policy
    lo, hi = seen["step"]["vs_bc"]["diff_ci95"]
    assert lo <= seen["step"]["vs_bc"]["diff"] <= hi
    md = (out / "compare.md").read_text()
    assert "| seen | all | control |" in md and "| seen | mapreader | mixture |" in md and "| seen | twc | bc |" in md
    assert set(seen["mixture"]["per_game"]) == {"mapreader", "twc"} and "vs_control" in seen["mixture"]
    assert res["control_of"] == "trajectory"
    # the trajectory variant is ETO iteration 1 (same policy, pairs and config): trained once, copied
    it1 = toy_run / "eto" / "iter1" / "dpo"
    copied, trained = (json.loads((d / "manifest.json").read_text()) for d in (out / "trajectory" / "dpo", it1))
    trained["output_files"] = {k: v for k, v in trained["output_files"].items() if k == "model"}  # what was copied
    assert copied == trained
    assert (out / "trajectory" / "dpo" / "model" / "model.safetensors").read_bytes() == \
        (it1 / "model" / "model.safetensors").read_bytes()
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"
    # step pairs contrast one action after the expert prefix
    step_pairs = [json.loads(x) for x in (out / "step" / "pairs" / "pairs.jsonl").read_text().splitlines()]
    assert all(p["kind"] == "step" and len(p["chosen"]) == len(p["rejected"]) == 1 for p in step_pairs)


def test_rerun_with_same_config_does_nothing(toy_run):
    before = (toy_run / "bc" / "manifest.json").read_text()
    proc = _ok(run_stage("bc", toy_run.parent))
    assert "up to date" in proc.stdout
    assert (toy_run / "bc" / "manifest.json").read_text() == before


def test_adding_a_held_out_split_replays_no_evaluation(toy_run):
    before = (toy_run / "eval" / "bc" / "seen" / "manifest.json").read_text()
    proc = _ok(run_stage("eval", toy_run.parent, "+env.splits.extra={fold:test,start:0,count:1}",
                         "eval.splits=[seen,extra]", "eval.tag=bc"))
    assert "[eval/bc/seen] up to date" in proc.stdout
    assert (toy_run / "eval" / "bc" / "seen" / "manifest.json").read_text() == before
    extra = json.loads((toy_run / "eval" / "bc" / "extra" / "metrics.json").read_text())
    assert extra["overall"]["episodes"] == 2  # one test-fold seed of each game


def test_reading_tests_first_moves_and_takes_on_the_evaluations_episodes(toy_run):
    before = (toy_run / "eval" / "bc" / "seen" / "manifest.json").read_text()
    proc = _ok(run_stage("reading", toy_run.parent, "reading.split=seen", "reading.permutations=50"))
    assert "[eval/bc/seen] up to date" in proc.stdout and "mapreader first move" in proc.stdout
    assert (toy_run / "eval" / "bc" / "seen" / "manifest.json").read_text() == before  # played once, reused
    res = json.loads((toy_run / "reading" / "seen.json").read_text())["policies"]["bc"]
    eps = [json.loads(x) for x in (toy_run / "eval" / "bc" / "seen" / "episodes.jsonl").read_text().splitlines()]
    for key, game, prefix in (("first_move", "mapreader", "move "), ("first_take", "twc", "take ")):
        firsts = [next((s["action"][len(prefix):] for s in e["steps"] if (s["action"] or "").startswith(prefix)),
                       "(none)") for e in eps if e["game"] == game]
        assert res[key]["n"] == len(firsts) == 2 and sum(res[key]["choices"].values()) == 2
        assert res[key]["choices"] == {c: firsts.count(c) for c in firsts}
        assert 0 <= res[key]["hits"] <= 2 and 0 < res[key]["p"] <= 1
    bad = run_stage("reading", toy_run.parent, "reading.permutations=0", "reading.policies=null")
    assert bad.returncode != 0 and "reading.permutations=0" in bad.stderr and "reading.policies=null" in bad.stderr


def test_a_control_matched_to_an_absent_variant_is_a_clear_error(toy_run):
    proc = run_stage("compare", toy_run.parent, "compare.variants=[step]", "compare.control_of=trajectory")
    assert proc.returncode != 0
    assert "compare.control_of='trajectory' is not one of compare.variants=['step']" in proc.stderr


def test_unknown_config_key_is_a_clear_error(toy_run):
    proc = run_stage("bc", toy_run.parent, "bc.learning_rat=0.1")
    assert proc.returncode != 0
    assert "learning_rat" in proc.stderr and "not in struct" in proc.stderr


def test_missing_checkpoint_is_a_clear_error(toy_run):
    proc = run_stage("eval", toy_run.parent, f"eval.policy={toy_run}/nowhere/model")
    assert proc.returncode != 0
    assert f"{toy_run}/nowhere/model: checkpoint folder not found" in proc.stderr


def test_demo_report_has_iterations_variants_control_configs_and_versions(toy_run):
    report = (toy_run / "report.md").read_text()
    result = json.loads((toy_run / "eto" / "result.json").read_text())
    assert [h["iteration"] for h in result["history"]] == [0, 1]
    assert "| BC |" in report and "| 1 |" in report  # success per iteration
    for policy in ("| seen | all | bc |", "| seen | all | control |", "| seen | twc | trajectory |",
                   "| seen | mapreader | eto best (iteration"):
        assert policy in report
    assert "## Configuration" in report and "run_name: toy" in report and '"trl"' in report
    assert (toy_run / "success_vs_iteration.png").read_bytes()[:4] == b"\x89PNG"
    rep = json.loads((toy_run / "report.json").read_text())
    best = rep["splits"]["seen"][f"eto best (iteration {result['best_iteration']})"]
    assert best["n"] == 4 and ("vs_bc" in best or result["best_iteration"] == 0)
    assert {g: r["n"] for g, r in best["per_game"].items()} == {"mapreader": 2, "twc": 2}
    assert set(result["best_vs_bc"]["seen"]["per_game"]) == {"mapreader", "twc"}
    # BC was evaluated once, by the first stage that needed it; the demo reused it
    assert json.loads((toy_run / "eval" / "bc" / "seen" / "manifest.json").read_text())["status"] == "done"
    # the reading precondition of BC (and of the best iteration, when there is one), on those episodes
    assert "## Does the policy read its observation? (seen)" in report and "| bc | mapreader first move | 2 |" in report
    assert set(rep["reading"]["policies"]) == {"bc"} | ({"eto_best"} if result["best_iteration"] else set())


def test_multirun_sweep_gives_each_job_its_folder_and_one_table(toy_run):
    runs = toy_run.parent
    cmd = [sys.executable, "-m", "eto_train.cli", "eto", "-m", f"paths.runs={runs}", "run_name=toysweep",
           *TOY, "eto.iterations=1", "eto.dpo.beta=0.1,0.5"]
    proc = _ok(subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300))
    sweep = runs / "toysweep"
    # both jobs explore BC the same way: played once, reused by the second job
    assert len(list((sweep / "cache" / "explore").iterdir())) == 1 and "[explore/iter1] the same work already ran: reusing" in proc.stdout
    jobs = sorted(p.name for p in sweep.iterdir() if (p / "eto" / "result.json").exists())
    assert jobs == ["eto.dpo.beta=0.1", "eto.dpo.beta=0.5"]
    assert not (sweep / "eto.dpo.beta=0.5" / "bc").exists()  # BC is shared by jobs that do not change it
    assert (sweep / "bc" / "model" / "model.safetensors").exists()
    betas = {j: json.loads((sweep / j / "eto" / "iter1" / "dpo" / "manifest.json").read_text())["config"]["dpo"]["beta"]
             for j in jobs}
    assert betas == {"eto.dpo.beta=0.1": 0.1, "eto.dpo.beta=0.5": 0.5}
    proc = _ok(subprocess.run([sys.executable, str(ROOT / "scripts" / "sweep_table.py"), f"paths.runs={runs}",
                               "run_name=toysweep"], cwd=ROOT, capture_output=True, text=True, timeout=120))
    table = (sweep / "sweep.md").read_text()
    assert "| eto.dpo.beta=0.1 |" in table and "| eto.dpo.beta=0.5 |" in table and "seen: best vs BC" in table


def test_the_last_iteration_plays_the_test_splits_when_dev_keeps_bc(toy_run):
    """eto.test_last_iteration: with eto.min_improvement=1 no iteration can beat BC on dev, so BC is kept; the last
    iteration plays the test splits too (eto/iter1/eval/<split>), result.json names it and the report shows it."""
    runs = toy_run.parent
    _ok(run_stage("eto", runs, "eto.iterations=1", "eto.min_improvement=1.0", "eto.test_last_iteration=true"))
    result = json.loads((toy_run / "eto" / "result.json").read_text())
    assert result["best_iteration"] == 0 and result["last_iteration"] == 1
    assert Path(result["last_eval"]) == toy_run / "eto" / "iter1" / "eval"
    for split, n in (("seen", 4), ("unseen", 2)):
        m = json.loads((toy_run / "eto" / "iter1" / "eval" / split / "metrics.json").read_text())
        assert m["overall"]["episodes"] == n and m["policy"].startswith("iter1@")
        assert result["last_test"][split]["episodes"] == n
    _ok(run_stage("report", runs, "eto.iterations=1", "eto.min_improvement=1.0", "eto.test_last_iteration=true"))
    assert "| eto iteration 1 (last, not kept) |" in (toy_run / "report.md").read_text()
