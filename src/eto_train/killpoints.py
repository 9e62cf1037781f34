"""Kill points for the kill-and-resume tests (tests/test_resume.py); test-only, inert unless set.

``ETO_TRAIN_KILL_AT=<stage name>:<n>`` makes this process SIGKILL itself (no cleanup, no
``finally``, exactly like an OOM kill or a lost machine) at the n-th hit of that stage:

* rollout stages (``explore/iter1``, ``eval/bc/seen``, ...) hit after each episode has been
  appended to their ``episodes.jsonl``;
* trainers (``bc``, ``dpo/iter1``, ...) hit at the end of each optimizer step with the global
  step as the count, before that step's checkpoint is written: with ``save_steps`` below n the
  kill leaves an earlier checkpoint to resume from and a step to redo;
* a trainer's save of its policy (``bc/save``, ``dpo/iter1/save``, ...; training/save.py) hits
  twice: 1 once the weights and config are written but not the tokenizer, 2 once everything is
  written but before it is checked (``check_policy``), so the stage is never done at either.

A test sets the variable on the command it kills; nothing else should.
"""

from __future__ import annotations

import os
import signal
import sys

ENV = "ETO_TRAIN_KILL_AT"
_hits: dict[str, int] = {}


def _target() -> tuple[str, int] | None:
    spec = os.environ.get(ENV)
    if not spec:
        return None
    point, _, n = spec.rpartition(":")
    if not point or not n.isdigit():
        raise ValueError(f"{ENV}={spec!r}: expected <stage name>:<n>, e.g. explore/iter1:3")
    return point, int(n)


def hit(point: str, count: int | None = None) -> None:
    """Count a hit of ``point`` (or set its count); SIGKILL this process once it reaches n."""
    target = _target()
    if target is None or target[0] != point:
        return
    _hits[point] = _hits.get(point, 0) + 1 if count is None else count
    if _hits[point] >= target[1]:
        print(f"[killpoints] {ENV}={point}:{target[1]}: SIGKILL", flush=True)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def trainer_callback(point: str):
    """A TrainerCallback that hits ``point`` at each optimizer step; None when no kill is set."""
    if not os.environ.get(ENV):
        return None
    from transformers import TrainerCallback

    class KillAtStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            hit(point, state.global_step)

    return KillAtStep()
