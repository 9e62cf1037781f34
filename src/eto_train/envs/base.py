"""The protocol every environment implements, and its typed errors.

An environment adapter owns one live simulator instance. The rollout engine holds a pool of
adapters (one per parallel episode) and drives them through this small surface only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class EnvironmentFailure(RuntimeError):
    """The simulator crashed, hung or returned garbage.

    Rollouts record such an episode with status ``environment_failure``; it is never used as a
    negative example, because the model did nothing wrong.
    """


class EnvironmentTimeout(EnvironmentFailure):
    """The simulator did not answer within the configured time."""


class AdapterContractError(RuntimeError):
    """An adapter answered something the contract forbids (docs/environments.md#the-contract): a
    reward outside its declared range or not finite, ``success`` without ``done``, an observation
    longer than ``env.max_observation_chars``, a result of the wrong type. Never retried: the stage
    stops before anything is built on the answer (envs/guard.py says which adapter, task, step, value)."""


class AdapterError(RuntimeError):
    """An adapter's call raised an exception that is not an :class:`EnvironmentFailure` (a bug or a
    data error in the adapter): one block naming the adapter, the call, the task and the step; the
    adapter's own traceback is the cause (``ETO_TRAIN_TRACEBACK=1`` prints it)."""


@dataclass(frozen=True)
class Task:
    """One task instance: a game (or task family), a data fold and a seed/variation."""

    env: str  # registry name of the environment, e.g. "twx"
    game: str  # task family, e.g. "sorting"
    fold: str  # the simulator's own data fold ("train", "dev", "test")
    seed: int
    split: str  # the project's split name ("train", "seen", "unseen")

    @property
    def task_id(self) -> str:
        return f"{self.game}/{self.fold}/{self.seed}"


@dataclass
class StepResult:
    observation: str
    reward: float  # cumulative, normalised score after this step: in the adapter's reward_range, [0, 1] by default
    done: bool
    success: bool
    failure: bool = False  # the game says the task is lost (not a step-limit stop)
    valid_actions: list[str] | None = None
    info: dict[str, Any] = field(default_factory=dict)


REWARD_RANGE = (0.0, 1.0)  # an adapter's rewards unless it declares its own ``reward_range``


@runtime_checkable
class Environment(Protocol):
    name: str
    # optional class attribute: (low, high) of the rewards it answers, REWARD_RANGE when absent
    # reward_range: tuple[float, float]

    @property
    def version(self) -> str:
        """Package version and parameters; pins what produced an episode."""

    def tasks(self, split: str) -> list[Task]:
        """Task instances of one of the project's splits."""

    def max_steps(self, task: Task) -> int: ...

    def reset(self, task: Task) -> tuple[str, StepResult]:
        """Start ``task``; returns (task instruction, first observation)."""

    def step(self, action: str) -> StepResult: ...

    def expert_actions(self, task: Task) -> list[str]:
        """The gold action sequence for ``task`` (the expert)."""

    def action_forms(self, game: str) -> list[str]:
        """Short templates of the actions a game accepts, for the system prompt."""

    def close(self) -> None: ...


class EnvWrapper:
    """An environment around another (``inner``): every call passes through unless a subclass
    changes it; adapter-specific extras (e.g. WebShop's ``check_playable``) are forwarded too."""

    def __init__(self, env: Environment) -> None:
        self.inner = env

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def version(self) -> str:
        return self.inner.version

    def tasks(self, split: str) -> list[Task]:
        return self.inner.tasks(split)

    def max_steps(self, task: Task) -> int:
        return self.inner.max_steps(task)

    def reset(self, task: Task, *args: Any, **kwargs: Any) -> tuple[str, StepResult]:
        return self.inner.reset(task, *args, **kwargs)

    def step(self, action: str) -> StepResult:
        return self.inner.step(action)

    def expert_actions(self, task: Task) -> list[str]:
        return self.inner.expert_actions(task)

    def action_forms(self, game: str) -> list[str]:
        return self.inner.action_forms(game)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, attr: str) -> Any:  # only for names not found above
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)
