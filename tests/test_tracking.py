"""wandb: one run per stage, grouped by the run name, offline; read back from the run files."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf
from test_pipeline import ROOT, TOY
from wandb_records import offline_runs

from eto_train import tracking
from eto_train.manifest import Stage


@pytest.fixture
def tracked(tmp_path, monkeypatch):
    """tracking.configure on a small config, undone after the test (settings and WANDB_* env)."""
    for var in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_SILENT"):
        monkeypatch.setenv(var, "disabled" if var == "WANDB_MODE" else "x")
    monkeypatch.setattr(tracking, "_settings", None)
    monkeypatch.setattr(tracking, "_run", None)
    cfg = OmegaConf.create({"run_name": "unit", "paths": {"run": str(tmp_path / "run")},
                            "wandb": {"enabled": True, "mode": "offline", "project": "p"}, "seed": 3})
    tracking.configure(cfg)
    return tmp_path / "run"


def test_a_finished_stage_is_one_run_with_its_metrics_and_a_failed_one_exits_1(tracked):
    ok = Stage("bc", tracked / "bc", {"lr": 1e-3})
    assert not ok.done()
    ok.begin()
    ok.finish({"train_loss": 0.5, "eval": {"success": 0.25}, "note": "text"})
    bad = Stage("dpo/iter1", tracked / "eto" / "iter1" / "dpo", {"beta": 0.1})
    assert not bad.done()
    bad.begin()
    bad.release()  # an error between begin() and finish()
    runs = {r.name: r for r in offline_runs(tracked)}
    assert set(runs) == {"unit/bc", "unit/eto/iter1/dpo"}
    bc, dpo = runs["unit/bc"], runs["unit/eto/iter1/dpo"]
    assert (bc.group, bc.job_type, bc.exit_code) == ("unit", "bc", 0)
    assert bc.summary["train_loss"] == 0.5 and bc.summary["eval/success"] == 0.25 and "note" not in bc.summary
    assert bc.config["stage_config"] == {"lr": 1e-3} and bc.config["hydra"]["seed"] == 3  # the resolved config goes along
    assert (dpo.job_type, dpo.exit_code) == ("dpo", 1)


def test_nothing_is_tracked_unless_configured(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "_settings", None)
    s = Stage("bc", tmp_path / "bc", {})
    assert not s.done()
    s.begin()
    s.finish({"x": 1})
    assert tracking.report_to() == "none" and not list(tmp_path.rglob("*.wandb"))


def test_flat_numbers_keeps_numbers_and_joins_nested_keys():
    assert tracking.flat_numbers({"a": 1, "b": {"c": 2.5, "d": "x", "e": [1]}, "f": True}) == \
        {"a": 1.0, "b/c": 2.5, "f": 1.0}


def test_the_toy_demo_logs_one_wandb_run_per_stage_grouped_with_success_metrics(tmp_path):
    cmd = [sys.executable, "-m", "eto_train.cli", "demo", f"paths.runs={tmp_path}", "run_name=toy", *TOY,
           "eto.iterations=1", "wandb.enabled=true", "wandb.mode=offline"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = offline_runs(tmp_path / "toy")
    names = [r.name for r in runs]
    assert len(names) == len(set(names)), f"a stage logged twice: {names}"  # one run per stage
    assert {r.group for r in runs} == {"toy"} and all(r.exit_code == 0 for r in runs)
    by_name = {r.name.removeprefix("toy/"): r for r in runs}
    expected = {"experts", "model", "bc", "eval/bc/dev", "eval/bc/seen", "eto/iter1/explore", "eto/iter1/pairs",
                "eto/iter1/dpo", "eto/iter1/eval/dev", "compare/trajectory/pairs", "compare/step/dpo",
                "compare/control", "compare", "eto"}
    missing = expected - set(by_name)
    assert not missing, f"no wandb run for {missing}; runs: {sorted(by_name)}"
    for name, r in by_name.items():  # job_type = the stage, the resolved config along
        assert r.job_type == r.config["stage"].split("/")[0] and r.config["hydra"]["run_name"] == "toy"
    for name in ("eval/bc/seen", "eto/iter1/eval/dev", "compare/eval/control/seen"):  # success in every evaluation's summary
        assert 0.0 <= by_name[name].summary["success_rate"] <= 1.0
    assert "success_rate" in by_name["eto/iter1/explore"].summary
    assert by_name["eto/iter1/pairs"].summary["pairs"] >= 0 and "tasks" in by_name["eto/iter1/pairs"].summary
    assert by_name["bc"].history_rows > 0 and "train_loss" in by_name["bc"].summary  # the trainer logs into the stage's run
    assert by_name["eto/iter1/dpo"].history_rows > 0
    assert "best_iteration" in by_name["eto"].summary and "dev/iter1/success_rate" in by_name["eto"].summary
    assert 0.0 <= by_name["compare"].summary["seen/step/success_rate"] <= 1.0 and "seen/step/vs_bc" in by_name["compare"].summary
