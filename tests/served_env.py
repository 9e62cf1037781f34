"""The end-to-end half shared by the tests of served environments (tests/test_openenv.py,
tests/test_agentgym.py): stages through the CLI against a server on 127.0.0.1, the metrics of an
evaluation, and an evaluation during which the server dies at the first step of `seen`'s first task."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_pipeline import ROOT, TOY

BC_STEPS = "bc.max_steps=150"  # the tiny model then writes "Action: go": its episodes step the server


class ServedRun:
    """One run folder (``run_name``) of an environment selected by ``env_args``, its URL given per call."""

    def __init__(self, run_name: str, *env_args: str):
        self.run_name, self.env_args = run_name, list(env_args)

    def cli(self, stage: str, runs: Path, url: str, *extra: str, code: int = 0) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "eto_train.cli", stage, f"paths.runs={runs}", f"run_name={self.run_name}",
               *self.env_args, f"env.url={url}", *TOY, BC_STEPS, *extra]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == code, f"{stage}: " + proc.stdout[-3000:] + proc.stderr[-3000:]
        self.last = proc
        return proc

    def metrics(self, runs: Path, tag: str, split: str) -> dict:
        return json.loads((runs / self.run_name / "eval" / tag / split / "metrics.json").read_text())

    def killed_eval(self, server, runs: Path, tag: str, *extra: str, code: int = 0) -> tuple[dict, list[dict]]:
        """eval on `seen` while the server dies at the first step of seed 800 (seen's first task); ``code``:
        its exit status (2 when no episode could be scored: stages/evaluate.NothingScored)."""
        server.kill_at("800:1")
        self.cli("eval", runs, server.url, "eval.splits=[seen]", f"eval.tag={tag}", "rollout.env_retries=2", *extra,
                 code=code)
        folder = runs / self.run_name / "eval" / tag / "seen"
        episodes = [json.loads(line) for line in (folder / "episodes.jsonl").read_text().splitlines()]
        return self.metrics(runs, tag, "seen"), episodes
