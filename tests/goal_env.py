"""A tiny deterministic game for the rollout tests (tests/test_faults.py, tests/test_env_workers.py):
importable by name, so a spawned environment worker can host it too."""

from __future__ import annotations

import time

from eto_train.envs import EnvironmentFailure, StepResult, Task

GOLD = ["go", "go", "go"]


class GoalEnv:
    """Three 'go' in a row win; the score is the share of the gold path done so far.

    Knobs for the tests: ``n_tasks`` tasks per split; ``garbage_at``: the step the simulator
    answers with garbage; seeds in ``crash_seeds`` crash on every reset; ``bad_seed`` raises a
    ValueError (a data error, not the simulator's); the action 'hang' never returns."""

    name = "goal"
    version = "goal-1"
    n_tasks = 24
    crash_seeds: tuple[int, ...] = ()
    bad_seed: int | None = None

    def __init__(self, garbage_at: int | None = None):
        self.t, self.progress, self.garbage_at = 0, 0, garbage_at

    def tasks(self, split):
        return [Task("goal", "g", "train", s, split) for s in range(self.n_tasks)]

    def max_steps(self, task):
        return 5

    def action_forms(self, game):
        return ["go", "wait"]

    def reset(self, task, **_):
        if task.seed in self.crash_seeds:
            raise EnvironmentFailure(f"simulator died on seed {task.seed}")
        if task.seed == self.bad_seed:
            raise ValueError(f"no such variation {task.seed}")
        self.t = self.progress = 0
        return f"Reach goal {task.seed}.", StepResult("start", 0.0, False, False, valid_actions=["go", "wait"])

    def step(self, action):
        if action == "hang":
            time.sleep(60)
        self.t += 1
        if self.garbage_at == self.t:
            return StepResult(None, 0.0, False, False)  # a real simulator answering garbage
        if action == "go" and self.progress == self.t - 1:
            self.progress += 1
        won = self.progress == len(GOLD)
        return StepResult(f"step {self.t}", self.progress / len(GOLD), won, won, valid_actions=["go", "wait"])

    def expert_actions(self, task):
        return list(GOLD)

    def close(self):
        pass
