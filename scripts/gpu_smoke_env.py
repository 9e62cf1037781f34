"""A tiny deterministic text game for scripts/gpu_smoke.py: no simulator, no Java.

``env.adapter: gpu_smoke_env:SmokeTextEnv`` (an adapter named by import path, envs/registry.py). Each task is a walk through rooms: the
observation names the room, its exits and what lies there; the gold path is a fixed sequence of
moves drawn from the task's seed, and the score is the share of it done in order. The text is
long enough (several sentences per turn) that conversations reach a few hundred tokens, as a
real game's do, so that training and rollout figures are not those of toy sequences.
"""

from __future__ import annotations

import random

from eto_train.envs import StepResult, Task
from eto_train.envs.base import EnvWrapper

MOVES = ["go north", "go south", "go east", "go west", "open door", "take key"]
ROOMS = ["kitchen", "pantry", "hallway", "cellar", "attic", "garden", "library", "study", "workshop", "porch"]
THINGS = ["a brass lamp", "an old map", "a wooden crate", "a locked chest", "a coil of rope", "a dusty shelf"]


class SmokeTextEnv:
    """A walk of ``path_len`` moves; ``max_steps`` turns at most; ``n_tasks`` tasks per split."""

    name = "smoke_text"

    def __init__(self, n_tasks: int = 512, path_len: int = 6, max_steps: int = 8, **_ignored):
        self.n_tasks, self.path_len, self._max_steps = int(n_tasks), int(path_len), int(max_steps)
        self.gold: list[str] = []
        self.done = 0
        self.t = 0
        self.rng = random.Random(0)

    @property
    def version(self) -> str:
        return f"smoke_text-1(path={self.path_len},steps={self._max_steps})"

    def tasks(self, split: str) -> list[Task]:
        return [Task("smoke_text", "walk", split, s, split) for s in range(self.n_tasks)]

    def max_steps(self, task: Task) -> int:
        return self._max_steps

    def action_forms(self, game: str) -> list[str]:
        return list(MOVES)

    def gold_path(self, task: Task) -> list[str]:
        rng = random.Random(f"{task.fold}/{task.seed}")
        return [rng.choice(MOVES) for _ in range(self.path_len)]

    def _observation(self) -> str:
        room, thing = self.rng.choice(ROOMS), self.rng.choice(THINGS)
        exits = ", ".join(sorted(self.rng.sample(["north", "south", "east", "west"], 2)))
        return (f"You are in the {room}. The air is still and the floor creaks under your feet. "
                f"There are exits to the {exits}. In a corner you see {thing}, and beside it a note "
                f"that reads: step {self.t} of your walk, {len(self.gold) - self.done} moves to go.")

    def reset(self, task: Task, **_):
        self.gold, self.done, self.t = self.gold_path(task), 0, 0
        self.rng = random.Random(f"obs/{task.fold}/{task.seed}")
        instruction = f"Walk the route of task {task.seed}: reach the last room by the right moves."
        return instruction, StepResult(self._observation(), 0.0, False, False, valid_actions=list(MOVES))

    def step(self, action: str) -> StepResult:
        self.t += 1
        if self.done < len(self.gold) and action == self.gold[self.done]:
            self.done += 1
        won = self.done == len(self.gold)
        return StepResult(self._observation(), self.done / len(self.gold), won, won, valid_actions=list(MOVES))

    def expert_actions(self, task: Task) -> list[str]:
        return self.gold_path(task)

    def close(self) -> None:
        pass


class Scripted(EnvWrapper):
    """The environment with ``actions`` as its 'expert': replayed by
    :func:`eto_train.experts.expert_episode`, it records a scripted (e.g. losing) episode."""

    def __init__(self, env, actions: list[str]):
        super().__init__(env)
        self.actions = actions

    def expert_actions(self, task: Task) -> list[str]:
        return list(self.actions)


def losing_actions(env: SmokeTextEnv, task: Task) -> list[str]:
    """The gold path's first half, then a wrong move repeated: a failure that shares a prefix."""
    gold = env.gold_path(task)
    half = len(gold) // 2
    wrong = next(m for m in MOVES if m != gold[half])
    return gold[:half] + [wrong] * (env.max_steps(task) - half)

