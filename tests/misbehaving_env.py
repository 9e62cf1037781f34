"""Lamps (tests/plugin_env, the docs' example adapter) misbehaving on purpose, one way per ``misbehave``
setting: the cases of issue 37's table, for tests/test_env_guard.py. Importable by name
(``env.adapter: misbehaving_env:BadLamps``), so an env worker process can host it too."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Literal

_PLUGIN = str(Path(__file__).resolve().parent / "plugin_env")
if _PLUGIN not in sys.path:
    sys.path.append(_PLUGIN)

from eto_lamps import Config as LampsConfig, LampsEnv  # noqa: E402

from eto_train.envs import EnvironmentFailure, StepResult  # noqa: E402

VERSION = "1"  # the adapter's release: a test sets another to play "a new version of the plug-in"
RELEASE = threading.Event()  # set: a hung call returns (a test's teardown)
MISBEHAVE = ("none", "reward7", "hang", "raise", "raise_reset", "envfail", "lose", "big", "slow", "nan",
             "success_not_done")


class Config(LampsConfig):
    name: str = "lamps"
    misbehave: Literal[MISBEHAVE] = "none"


class BadLamps(LampsEnv):
    Config = Config

    def __init__(self, splits: dict, step_limit: int = 4, lamps: int = 3, misbehave: str = "none", **_) -> None:
        super().__init__(splits, step_limit, lamps)
        self.misbehave = misbehave

    @property
    def version(self) -> str:
        return f"badlamps-{VERSION}"

    def reset(self, task):
        if self.misbehave == "raise_reset":
            raise ValueError("lamp controller not found")
        return super().reset(task)

    def step(self, action: str) -> StepResult:
        how = self.misbehave
        if how == "hang":
            RELEASE.wait(60)  # "sleeps 60 s"
        if how == "slow":
            time.sleep(0.3)
        if how == "raise":
            raise ValueError("lamp controller crashed")
        if how == "envfail":
            raise EnvironmentFailure("lamp controller unreachable")
        res = super().step(action)
        if how == "reward7" and res.failure:  # a lost game scored 7.0
            res.reward = 7.0
        if how == "big" and action == "look":
            res.observation = "x" * 1_000_000  # a 1 MB observation
        if how == "nan":
            res.reward = float("nan")
        if how == "success_not_done" and res.success:
            res.done = False
        return res

    def expert_actions(self, task) -> list[str]:
        if self.misbehave == "lose":  # a gold path that lights the wrong lamp
            return ["look", f"turn on lamp {(task.seed + 1) % self.lamps + 1}"]
        return super().expert_actions(task)


class WideLamps(BadLamps):
    """Declares its own reward range: 7.0 is within it."""

    reward_range = (0.0, 10.0)


class BadRangeLamps(LampsEnv):
    reward_range = (1.0, 0.0)
