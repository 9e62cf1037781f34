"""The read-only stages on a finished, read-only run folder (issue 26, item 5): `reading` and `report`
run and exit 0 on a run folder that is really read-only (a read-only bind mount as root, see
test_cli_errors._read_only_run), and the folder is byte-identical afterwards. A finished, up-to-date
stage is looked at without its lock (manifest.Stage.done); work to do still stops, naming the path."""

from __future__ import annotations

import json

import pytest
from test_cli_errors import _read_only_run, _tree
from test_durability import _compose
from test_pipeline import TOY


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished toy run: experts, model, bc, BC's evaluation on dev and `seen`, reading on `seen`
    and a report. The ETO loop's and the comparison's result files are written by hand from BC's
    evaluation (an ETO loop whose best policy is BC, no variant): training is not what is tested."""
    from eto_train import layout
    from eto_train.stages import bc, experts, model, reading, report
    from eto_train.stages.evaluate import evaluate_policy

    runs = tmp_path_factory.mktemp("runs")
    overrides = [*TOY, f"paths.runs={runs}", "run_name=toy", "eval.splits=[seen]"]
    cfg = _compose(overrides)
    experts.run(cfg)
    model.run(cfg)
    bc.run(cfg)
    lay, dev = layout.RunLayout.of(cfg), cfg.eto.dev_split
    res = evaluate_policy(cfg, str(lay.bc_policy), "bc", [dev, "seen"], lay.evaluation("bc"))
    reading.run(cfg)
    run = runs / "toy"
    lay.eto_result.parent.mkdir(parents=True)
    lay.eto_result.write_text(json.dumps({"best_iteration": 0, "best_eval": str(lay.evaluation("bc")),
                                          "history": [{"iteration": 0, "dev": res[dev]["overall"]}]}))
    (run / "compare").mkdir()
    (run / "compare" / "compare.json").write_text(json.dumps({"policies": [], "splits": ["seen"], "dpo_steps": {}}))
    report.run(cfg)
    assert (run / "report.md").exists() and (run / "reading" / "seen.json").exists()
    return {"runs": runs, "run": run, "overrides": overrides}


def test_reading_and_report_run_on_a_read_only_finished_run(finished, tmp_path, monkeypatch):
    run = finished["run"]
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the report goes (and Hydra's log folder)
    before = _tree(run)
    proc = _read_only_run(run, "reading", *finished["overrides"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"[eval/bc/seen] up to date in {run}/eval/bc/seen" in proc.stdout  # answered without its lock
    assert "Does the policy read?" in proc.stdout
    assert "reading written to" not in proc.stderr  # the same result as the one kept: nothing to write
    proc = _read_only_run(run, "report", *finished["overrides"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    where = tmp_path / "eto-train-report" / "toy"
    assert f"eto-train: note: {run} is not writable; report written to {where}" in proc.stderr
    assert proc.stdout.strip().endswith(str(where / "report.md"))
    md = (where / "report.md").read_text()
    assert md.splitlines()[0] == (run / "report.md").read_text().splitlines()[0] == "# ETO demo report: run `toy`"
    assert f"![arms]({run}/compare/compare.png)" in md  # a link that still reaches the run folder
    assert json.loads((where / "report.json").read_text()) == json.loads((run / "report.json").read_text())
    assert (where / "success_vs_iteration.png").read_bytes()[:4] == b"\x89PNG"
    assert _tree(run) == before  # no lock file, no log folder, no metrics rewritten
    # work to do on a read-only folder (a split never played) still stops before it, naming the path
    proc = _read_only_run(run, "reading", *finished["overrides"], "reading.split=unseen")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "eto-train reading: cannot write [" in proc.stderr
    assert f"] {run}/eval/bc/.unseen.lock: read-only file system" in proc.stderr
    assert _tree(run) == before


def test_a_writable_finished_stage_is_still_locked_while_it_is_looked_at(finished, monkeypatch):
    """On a folder that can be written nothing changes: done() takes the lock, so a live writer of the
    same stage still stops a second process (StageLocked), up to date or not."""
    from eto_train import locks
    from eto_train.manifest import Stage
    from eto_train.rollouts.play import OUTPUTS

    d = finished["run"] / "eval" / "bc" / "seen"
    m = json.loads((d / "manifest.json").read_text())
    taken = []
    real = locks.acquire_lock
    monkeypatch.setattr("eto_train.manifest.acquire_lock", lambda *a: taken.append(a) or real(*a))
    stage = Stage(m["stage"], d, m["config"], m["inputs"], outputs=OUTPUTS)
    assert stage.done() and taken == [(d, m["stage"])]
    assert not locks.lock_path(d).exists()  # up to date: released


def test_a_folder_that_cannot_be_written_is_looked_at_only_when_no_lock_file_is_there(finished, monkeypatch):
    """Taking the lock fails (EACCES, as for a folder without write permission): a finished stage is up
    to date without it; a stage with work, or a lock file that exists (another user's writer, maybe
    live), still raises the lock's error."""
    import errno

    from eto_train import locks
    from eto_train.manifest import Stage
    from eto_train.rollouts.play import OUTPUTS

    def refused(stage_dir, name):
        raise PermissionError(errno.EACCES, "Permission denied", str(locks.lock_path(stage_dir)))

    monkeypatch.setattr("eto_train.manifest.acquire_lock", refused)
    d = finished["run"] / "eval" / "bc" / "seen"
    m = json.loads((d / "manifest.json").read_text())
    assert Stage(m["stage"], d, m["config"], m["inputs"], outputs=OUTPUTS).done()
    with pytest.raises(PermissionError):  # another config: work to do
        Stage(m["stage"], d, {**m["config"], "seed": -1}, m["inputs"], outputs=OUTPUTS).done()
    locks.lock_path(d).write_text("{}")
    try:
        with pytest.raises(PermissionError):
            Stage(m["stage"], d, m["config"], m["inputs"], outputs=OUTPUTS).done()
    finally:
        locks.lock_path(d).unlink()
