"""Lamps: a room of numbered lamps; the task names the one to switch on. An eto-train adapter."""

from __future__ import annotations

from pydantic import BaseModel, Field

from eto_train.config import EnvSection
from eto_train.envs import EnvironmentFailure, StepResult, Task


class Split(BaseModel):
    start: int = Field(ge=0)
    count: int = Field(ge=1)


class Config(EnvSection):
    """The env section `env=lamps` composes (every field has a default) and validates."""

    name: str = "lamps"
    step_limit: int = Field(4, ge=2)
    lamps: int = Field(3, ge=2, le=9)
    splits: dict[str, Split] = {"train": Split(start=0, count=6), "dev": Split(start=100, count=2),
                                "seen": Split(start=200, count=3), "unseen": Split(start=300, count=2)}


class LampsEnv:
    Config = Config
    name = "lamps"

    def __init__(self, splits: dict, step_limit: int = 4, lamps: int = 3, **_) -> None:
        self.splits, self.step_limit, self.lamps = splits, step_limit, lamps
        self.target, self.lit = None, set()

    @property
    def version(self) -> str:  # recorded in every episode: what produced it
        return f"lamps-0.1 lamps={self.lamps}"

    def tasks(self, split: str) -> list[Task]:
        s = self.splits[split]
        return [Task("lamps", "lamps", split, seed, split) for seed in range(s["start"], s["start"] + s["count"])]

    def max_steps(self, task: Task) -> int:
        return self.step_limit

    def action_forms(self, game: str) -> list[str]:
        return ["look", "turn on lamp <n>"]

    def _result(self, text: str) -> StepResult:
        won, lost = self.target in self.lit, bool(self.lit - {self.target})  # a wrong lamp loses the game
        return StepResult(text, 1.0 if won else 0.0, won or lost, won, failure=lost,
                          valid_actions=["look"] + [f"turn on lamp {i}" for i in range(1, self.lamps + 1)])

    def reset(self, task: Task) -> tuple[str, StepResult]:
        self.target, self.lit = task.seed % self.lamps + 1, set()
        return f"Turn on lamp {self.target}.", self._result(f"You see {self.lamps} lamps, all off.")

    def step(self, action: str) -> StepResult:
        if self.target is None:
            raise EnvironmentFailure("lamps: step before reset")  # never a training example
        if action.startswith("turn on lamp ") and action[13:].isdigit():
            self.lit.add(int(action[13:]))
            return self._result(f"Lamp {action[13:]} is on.")
        return self._result(f"Lamps on: {sorted(self.lit) or 'none'}.")

    def expert_actions(self, task: Task) -> list[str]:
        return ["look", f"turn on lamp {task.seed % self.lamps + 1}"]

    def close(self) -> None:
        pass
