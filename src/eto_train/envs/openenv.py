"""``env=openenv``: a text environment served by OpenEnv (``openenv-core``) at a URL.

OpenEnv serves an environment behind reset / step / state over a WebSocket session (one session,
one environment instance on the server). This adapter plays one session per environment through
the package's own client (:class:`openenv.core.generic_client.GenericEnvClient`, its sync wrapper):
the text action goes into the action field ``env.action_field``; the observation's fields named by
the config give the text, the instruction, the valid actions, the expert's actions and success.

- Tasks: ``env.splits.<split>: {start, count}`` are seeds; ``reset`` passes ``seed`` and
  ``episode_id`` (the task id) and ``task`` (``env.game``) to the server's ``Environment.reset``.
- Score: OpenEnv's ``reward`` is the step's reward (``env.reward: increment``, summed) or the
  score so far (``score``); the episode's score is clipped to [0, 1]. Success: the observation's
  ``env.success_field``, else a score of 1.
- Faults: a server that cannot be reached (after ``env.connect_retries`` attempts), a closed or
  reset connection and a server error are :class:`EnvironmentFailure`; no answer within
  ``env.timeout_s`` is :class:`EnvironmentTimeout`. A reset reconnects and tries again (nothing
  is lost); a failed step is not retried here: the rollout replays the episode on a fresh
  instance (``rollout.env_retries``), else the episode ends as ``environment_failure``, never
  as a training example.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from ..config import EnvSection
from .base import EnvironmentFailure, EnvironmentTimeout, StepResult, Task


class SeedRange(BaseModel):
    start: int = Field(0, ge=0)
    count: int = Field(ge=1)


class Config(EnvSection):
    """The env section of ``env=openenv`` (configs/env/openenv.yaml)."""

    # values: configs/env/openenv.yaml (one home); here their types and bounds
    url: str = Field(description="the server, e.g. http://127.0.0.1:8000")
    game: str  # the task family in the records; passed to reset as `task`
    step_limit: Annotated[int, Field(ge=1)]
    splits: dict[str, SeedRange]
    action_field: str  # the action model's text field
    observation_field: str
    instruction_field: str | None  # None: the first observation is the instruction
    valid_actions_field: str | None
    expert_field: str | None  # the gold actions in reset's observation; None: no gold
    success_field: str | None  # None: success = a score of 1
    reward: Literal["increment", "score"]
    action_forms: list[str]  # action templates for the system prompt
    timeout_s: Annotated[float, Field(gt=0)]  # one answer
    connect_timeout_s: Annotated[float, Field(gt=0)]
    connect_retries: Annotated[int, Field(ge=0)]


class OpenEnvEnv:
    """One OpenEnv session (see the module's docstring)."""

    Config = Config
    name = "openenv"

    def __init__(self, url: str, splits: dict[str, Any], step_limit: int = 15, game: str = "openenv",
                 action_field: str = "message", observation_field: str = "text",
                 instruction_field: str | None = "instruction", valid_actions_field: str | None = "valid_actions",
                 expert_field: str | None = "expert_actions", success_field: str | None = "success",
                 reward: str = "increment", action_forms: list[str] | None = None, timeout_s: float = 60.0,
                 connect_timeout_s: float = 10.0, connect_retries: int = 3, **_: Any) -> None:
        self.url, self.splits, self.step_limit, self.game = url.rstrip("/"), dict(splits), int(step_limit), game
        self.fields = {"action": action_field, "text": observation_field, "instruction": instruction_field,
                       "valid": valid_actions_field, "expert": expert_field, "success": success_field}
        self.reward_mode, self.forms = reward, list(action_forms or [])
        self.timeout_s, self.connect_timeout_s, self.connect_retries = timeout_s, connect_timeout_s, connect_retries
        self._client = None
        self._score, self._experts, self._task = 0.0, {}, None

    @property
    def version(self) -> str:
        from importlib.metadata import version

        return f"openenv-core {version('openenv-core')} {self.url} game={self.game}"

    # tasks ---------------------------------------------------------------------------------------
    def tasks(self, split: str) -> list[Task]:
        if split not in self.splits:
            raise KeyError(f"env.splits: no split {split!r} (have {sorted(self.splits)})")
        s = self.splits[split]
        return [Task(self.name, self.game, split, seed, split) for seed in range(s["start"], s["start"] + s["count"])]

    def max_steps(self, task: Task) -> int:
        return self.step_limit

    def action_forms(self, game: str) -> list[str]:
        return self.forms

    def expert_actions(self, task: Task) -> list[str]:
        if self.fields["expert"] is None:
            raise NotImplementedError(f"{self.url}: env.expert_field=null, no gold actions: set experts.source "
                                      f"to a trajectories file (ETO's or AgentTraj layout)")
        if task.task_id not in self._experts:
            self.reset(task)
        return list(self._experts[task.task_id])

    # the session ---------------------------------------------------------------------------------
    def _connect(self):
        from openenv.core.generic_client import GenericEnvClient

        last: Exception | None = None
        for attempt in range(self.connect_retries + 1):
            client = GenericEnvClient(base_url=self.url, connect_timeout_s=self.connect_timeout_s,
                                      message_timeout_s=self.timeout_s).sync()
            try:
                return client.connect()
            except Exception as exc:  # refused, reset, timed out: the server is not (yet) there
                last = exc
                self._close(client)
                time.sleep(min(0.2 * 2 ** attempt, 2.0))
        raise EnvironmentFailure(f"openenv server {self.url}: cannot connect ({self.connect_retries + 1} "
                                 f"attempts): {last}")

    def _call(self, what: str, fn):
        if self._client is None:
            self._client = self._connect()
        try:
            return fn(self._client)
        except (asyncio.TimeoutError, TimeoutError) as exc:
            self._drop()
            raise EnvironmentTimeout(f"openenv server {self.url}: no answer to {what} within "
                                     f"{self.timeout_s:g} s (env.timeout_s)") from exc
        except Exception as exc:  # a closed connection, a server error, a bad answer
            self._drop()
            raise EnvironmentFailure(f"openenv server {self.url}: {what} failed: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _close(client) -> None:
        try:
            client.close()
        except Exception:
            pass

    def _drop(self) -> None:
        """Forget a session that failed: the next call opens a new one."""
        if self._client is not None:
            self._close(self._client)
            self._client = None

    def _result(self, payload, first: bool = False) -> StepResult:
        obs = payload.observation
        if not isinstance(obs, dict) or not isinstance(obs.get(self.fields["text"]), str):
            raise EnvironmentFailure(f"openenv server {self.url}: malformed observation {obs!r:.200} (no text "
                                     f"field {self.fields['text']!r}, env.observation_field)")
        reward = float(payload.reward or 0.0)
        self._score = reward if self.reward_mode == "score" or first else self._score + reward
        score = min(max(self._score, 0.0), 1.0)
        key = self.fields["success"]
        success = bool(obs.get(key)) if key and key in obs else score >= 1.0
        valid = obs.get(self.fields["valid"]) if self.fields["valid"] else None
        return StepResult(obs[self.fields["text"]], score, bool(payload.done) or success, success,
                          valid_actions=list(valid) if isinstance(valid, list) else None)

    def reset(self, task: Task) -> tuple[str, StepResult]:
        kwargs = {"seed": task.seed, "episode_id": task.task_id, "task": task.game}
        try:
            payload = self._call(f"reset of {task.task_id}", lambda c: c.reset(**kwargs))
        except EnvironmentFailure:  # a stale session (the server restarted): once more, on a new one
            payload = self._call(f"reset of {task.task_id}", lambda c: c.reset(**kwargs))
        self._task = task
        first = self._result(payload, first=True)
        obs = payload.observation
        if self.fields["expert"] and isinstance(obs.get(self.fields["expert"]), list):
            self._experts[task.task_id] = [str(a) for a in obs[self.fields["expert"]]]
        key = self.fields["instruction"]
        instruction = obs.get(key) if key else first.observation
        if not isinstance(instruction, str):
            raise EnvironmentFailure(f"openenv server {self.url}: reset of {task.task_id} has no instruction "
                                     f"field {key!r} (env.instruction_field)")
        return instruction, first

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise EnvironmentFailure(f"openenv server {self.url}: step before reset")
        payload = self._call(f"step {action!r:.60} of {self._task.task_id}",
                             lambda c: c.step({self.fields["action"]: action}))
        return self._result(payload)

    def check_playable(self) -> None:
        """The server answers (before hours of BC)."""
        self._call("connect", lambda c: c)

    def close(self) -> None:
        self._drop()
