"""The end-to-end half shared by the tests of served environments (tests/test_openenv.py,
tests/test_agentgym.py): stages through the CLI against a server on 127.0.0.1, the metrics of an
evaluation, an evaluation during which the server dies at the first step of `seen`'s first task, and what both
tests check of eto-iter and of a server that comes back or stays dead."""

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

    def eto_iter_and_eval(self, server, runs: Path) -> list[dict]:
        """eto-iter, its DPO stage done, then eval, against ``server`` (BC on `seen`: 2 episodes, no environment
        failure); the experts. The policy wins its training tasks greedily: exploration samples
        hot, so that it loses some (pairs)."""
        self.cli("eto-iter", runs, server.url, "eto.explore.rollout.generation.do_sample=true",
                 "eto.explore.rollout.generation.temperature=5.0")
        self.cli("eval", runs, server.url)
        run = runs / self.run_name
        assert json.loads((run / "eto" / "iter1" / "dpo" / "manifest.json").read_text())["status"] == "done"
        m = self.metrics(runs, "bc", "seen")
        assert m["overall"]["episodes"] == 2 and m["overall"]["environment_failures"] == 0
        return [json.loads(line) for line in (run / "experts" / "train.jsonl").read_text().splitlines()]

    def recovered_eval(self, server, runs: Path) -> list[dict]:
        """:meth:`killed_eval` while the server dies once, mid-episode, and comes back: every episode played to
        its end, the error counted and recovered. Its episodes."""
        before = len(server.exits)
        m, episodes = self.killed_eval(server, runs, "killed_back")
        assert server.exits[before:] == [17]  # it died once, mid-episode, and came back
        assert m["overall"]["episodes"] == 2 and m["overall"]["environment_failures"] == 0
        assert m["overall"]["environment_errors"] >= 1 and m["overall"]["recovered_episodes"] >= 1
        return episodes

    def dead_eval(self, server, runs: Path, *extra: str) -> list[dict]:
        """:meth:`killed_eval` while the server dies and stays dead (``extra``: one connection attempt per
        instance, so that the dead server is named at once; the rollout still retries): every episode an
        environment failure, which no score counts, so the command says so, exit 2 (issue 37). Its episodes."""
        server.restart = False
        try:
            m, episodes = self.killed_eval(server, runs, "killed_dead", *extra, code=2)
        finally:
            server.restart = True  # back up for what follows
        failed = [e for e in episodes if e["status"] == "environment_failure"]
        assert failed and m["overall"]["environment_failures"] == len(failed)
        assert len(failed) == len(episodes) and "NothingScored: [eval/killed_dead/seen] every one of its" in \
            self.last.stderr
        assert any("EnvironmentFailure" in err for e in failed for err in e["env_errors"])
        from eto_train.records import NOT_POLICY_FAULT  # what BC, pairs and the scores leave out

        assert "environment_failure" in NOT_POLICY_FAULT
        return episodes
