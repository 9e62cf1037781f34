"""End to end at toy scale: the stage scripts as a user runs them (experts -> model -> bc -> eval)."""

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
    "bc.max_steps=3", "bc.batch_size=4", "bc.save_steps=2", "wandb.enabled=false",
    "eval.batch_size=4", "eval.generation.max_new_tokens=6",
]


def run_stage(script: str, runs: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "scripts" / script), f"paths.runs={runs}", "run_name=toy", *TOY, *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    for script in ("experts.py", "build_model.py", "bc.py", "evaluate.py"):
        _ok(run_stage(script, runs))
    return runs / "toy"


def test_stages_write_their_outputs_and_manifests(toy_run):
    assert (toy_run / "experts" / "train.jsonl").read_text().count("\n") == 2 * 4
    assert (toy_run / "model" / "model.safetensors").exists()
    assert (toy_run / "bc" / "model" / "model.safetensors").exists()
    bc = json.loads((toy_run / "bc" / "manifest.json").read_text())
    assert bc["status"] == "done" and bc["metrics"]["optimizer_steps"] == 3
    assert bc["input_hashes"]["experts"] and bc["versions"]["trl"] and bc["threads"] == 2
    for split, n in (("seen", 4), ("unseen", 2)):
        d = toy_run / "eval" / "bc" / split
        m = json.loads((d / "metrics.json").read_text())
        assert m["overall"]["episodes"] == n and set(m["per_game"]) == {"sorting", "mapreader"}
        lo, hi = m["overall"]["success_ci95"]
        assert 0.0 <= lo <= m["overall"]["success_rate"] <= hi <= 1.0
        assert json.loads((d / "manifest.json").read_text())["threads"] == 1
        assert m["policy"].startswith("bc@")


def test_rerun_with_same_config_does_nothing(toy_run):
    before = (toy_run / "bc" / "manifest.json").read_text()
    proc = _ok(run_stage("bc.py", toy_run.parent))
    assert "up to date" in proc.stdout
    assert (toy_run / "bc" / "manifest.json").read_text() == before


def test_unknown_config_key_is_a_clear_error(toy_run):
    proc = run_stage("bc.py", toy_run.parent, "bc.learning_rat=0.1")
    assert proc.returncode != 0
    assert "learning_rat" in proc.stderr and "not in struct" in proc.stderr


def test_missing_checkpoint_is_a_clear_error(toy_run):
    proc = run_stage("evaluate.py", toy_run.parent, f"eval.policy={toy_run}/nowhere/model")
    assert proc.returncode != 0
    assert f"{toy_run}/nowhere/model: checkpoint folder not found" in proc.stderr
