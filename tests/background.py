"""A command of the package in the background, as the kill-and-resume tests start it (tests/test_resume.py,
test_kill_during_save.py, test_pretrain.py, test_two_machines.py): its output goes to a file, not a pipe (nothing
left behind by a killed process can hold a pipe open), and it runs in a process group of its own, stopped whole
(a JVM or worker orphaned by a kill goes with it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def eto_train(stage: str, *args: str) -> list[str]:
    """The command line of ``eto-train <stage> <args>`` in this interpreter."""
    return [sys.executable, "-m", "eto_train.cli", stage, *args]


def one_thread_env(kill_at: str | None = None, **extra: str) -> dict[str, str]:
    """This process's environment at one thread, with a kill point (``ETO_TRAIN_KILL_AT``) only where ``kill_at``
    sets one, and ``extra`` over it."""
    env = {k: v for k, v in os.environ.items() if k != "ETO_TRAIN_KILL_AT"}
    env["OMP_NUM_THREADS"] = "1"
    if kill_at:
        env["ETO_TRAIN_KILL_AT"] = kill_at
    return env | extra


class Background:
    """``cmd`` started from the repository root with ``env``, its output (stdout and stderr) in ``log``."""

    def __init__(self, cmd: list[str], log: Path, env: dict[str, str], timeout: float = 300):
        self.log, self.timeout = log, timeout
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def wait(self, timeout: float | None = None) -> tuple[int, str]:
        """(exit status, output), once it has ended (within ``timeout`` seconds); its group stopped."""
        try:
            rc = self.proc.wait(timeout=self.timeout if timeout is None else timeout)
        finally:
            self.stop()
        return rc, self.log.read_text(errors="replace")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
