"""The rollout progress bar: drawn on a terminal (done == total at the end), silent elsewhere,
and without effect on the episodes played."""

from __future__ import annotations

import re
from io import StringIO

from rich.console import Console
from test_rollout import FlakyEnv, ScriptedPolicy, _prompt, _ref

from eto_train.rollouts.loop import run_rollouts
from eto_train.rollouts.progress import RolloutProgress
from fixture_settings import rollout_config

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _play(console: Console | None, done: int = 0, **kw):
    work = [(t, 0) for t in FlakyEnv().tasks("train")][done:]  # the first ``done`` recorded by a killed run
    eps = []
    if console is None:
        run_rollouts(work, FlakyEnv, ScriptedPolicy("Action: go"), _ref(), _prompt(), rollout_config(batch_size=2),
                     on_episode=eps.append)
        return eps, None
    with RolloutProgress("explore iter1", total=5, done=done, console=console, **kw) as bar:
        run_rollouts(work, FlakyEnv, ScriptedPolicy("Action: go"), _ref(), _prompt(), rollout_config(batch_size=2),
                     on_episode=eps.append, progress=bar)
    return eps, bar


def test_a_terminal_draws_a_bar_that_ends_with_every_episode_done():
    out = StringIO()
    eps, bar = _play(Console(force_terminal=True, file=out, width=120), done=2)
    assert (bar.done, bar.total, bar.steps) == (5, 5, 6)  # 2 resumed + 3 played, 2 steps each
    frames = [f for f in ANSI.sub("", out.getvalue()).replace("\r", "\n").split("\n") if f.strip()]
    last = frames[-1]
    assert last.startswith("explore iter1") and "5/5 episodes" in last, last
    assert "steps/s" in last and "eta 0:00:00" in last
    assert [e.seed for e in eps] == [2, 3, 4]


def test_no_terminal_prints_nothing_and_the_episodes_are_the_same():
    out = StringIO()
    eps, bar = _play(Console(file=out))
    assert out.getvalue() == "" and bar.done == 5
    plain, _ = _play(None)
    assert [_timeless(e) for e in eps] == [_timeless(e) for e in plain]


def _timeless(ep) -> dict:
    """An episode's record but its steps' latencies (wall-clock times)."""
    d = ep.to_dict()
    d["steps"] = [{k: v for k, v in s.items() if k not in ("latency_s", "env_s")} for s in d["steps"]]
    return d


def test_a_rank_that_must_not_draw_stays_silent_on_a_terminal():
    out = StringIO()
    _, bar = _play(Console(force_terminal=True, file=out), draw=False)
    assert out.getvalue() == "" and bar.done == 5
