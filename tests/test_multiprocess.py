"""Two processes as `accelerate launch` starts them on two GPUs (RANK / WORLD_SIZE set by
torchrun), here on the CPU with the gloo backend: bc and one ETO iteration at toy scale.

Training runs data-parallel; rollouts are played once, by rank 0, while rank 1 waits for its
manifest; DPO's precomputed reference log-probs are shared through one dataset folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_pipeline import ROOT, TOY


def _run(runs: Path, script: str, procs: int, *extra: str):
    launcher = [sys.executable] if procs == 1 else [sys.executable, "-m", "torch.distributed.run",
                                                  "--nproc_per_node", str(procs)]
    cmd = [*launcher, str(ROOT / "scripts" / script), f"paths.runs={runs}", "run_name=mp", *TOY,
           "bc.batch_size=2", "+bc.effective_batch=8", "+eto.dpo.effective_batch=4", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_bc_and_an_eto_iteration_on_two_processes(tmp_path):
    _run(tmp_path, "experts.py", 1)
    _run(tmp_path, "build_model.py", 1)
    _run(tmp_path, "bc.py", 2)
    run = tmp_path / "mp"
    bc = json.loads((run / "bc" / "manifest.json").read_text())
    # 8 trajectories, effective batch 8 = 2 per process x 2 processes x accumulation 2: one step per epoch
    assert bc["status"] == "done" and bc["metrics"]["optimizer_steps"] == 3 and bc["metrics"]["trajectories"] == 8
    assert sorted(p.name for p in (run / "bc" / "model").glob("*.safetensors")) == ["model.safetensors"]
    assert not (run / "bc" / "model" / "training_args.bin").exists()

    proc = _run(tmp_path, "eto_iter.py", 2)
    it = run / "eto" / "iter1"
    explored = (it / "explore" / "episodes.jsonl").read_text().splitlines()
    assert len(explored) == 3 * 2  # eto.explore.tasks_per_game=3 of 2 games, played once, not per process
    assert "[rank 1] waiting for the main process" in proc.stdout
    summary = json.loads((it / "summary.json").read_text())
    assert summary["pairs"] > 0 and (it / "dpo" / "model" / "model.safetensors").exists()
    assert json.loads((it / "dpo" / "manifest.json").read_text())["status"] == "done"
    assert summary["dev"]["episodes"] == 2
