"""``env=agentgym``: an environment served by an AgentGym env server (github.com/WooooDyy/AgentGym).

An AgentGym server hosts many environment instances: ``POST /create`` makes one, ``POST /reset``
starts a task index on it, ``POST /step`` plays an action string. The fields differ per
environment (AgentGym's clients in agentenv/agentenv/envs/*.py); :data:`PROTOCOLS` is that table,
one row per ``env.env_name``. One adapter instance = one server instance, created on the first reset.

- Tasks: ``env.splits.<split>`` are AgentGym task indices (``{start, count}``, ``{file}`` a JSON
  list, or a list). ``task_id`` is ``<env_name>_<index>``, AgentTraj's ``item_id``, so AgentGym's
  trajectories bind to tasks as they are (``experts.source=<AgentTraj file>``: the servers have no
  gold actions).
- Score: the protocol's score field scaled to [0, 1] (SciWorld's is 0..100; a negative one is a lost
  task, ``failure``). Success: a score of 1.
- HTTP: one ``httpx.Client`` per process and server (:func:`_client`), shared by every adapter
  instance, with at most ``env.max_connections`` connections; calls wait for a free one.
- Faults: no answer within ``env.timeout_s`` (or no free connection within ``env.pool_timeout_s``)
  is :class:`EnvironmentTimeout`; a server that cannot be reached after ``env.retries`` connection
  attempts, a dropped connection, an HTTP error or an answer with ``error`` / without the protocol's
  fields is :class:`EnvironmentFailure`. Only what cannot have changed the server is retried here
  (connecting, HTTP 503 "busy"); a failed step is not: the rollout replays the episode on a fresh
  instance (``rollout.env_retries``), else the episode ends as ``environment_failure``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
from pydantic import BaseModel, Field

from ..config import EnvSection
from .base import EnvironmentFailure, EnvironmentTimeout, StepResult, Task


@dataclass(frozen=True)
class Protocol:
    """How one AgentGym environment's server names things (see AgentGym's client of it)."""

    id_key: str  # the key naming the server's instance in every request
    create_id: str | None  # the field of /create's answer holding that id; None: the answer is the id
    reset_key: str  # reset's task index key
    reset_extra: dict[str, Any] = field(default_factory=dict)
    reset_observation: str | None = "observation"  # None: GET /observation after reset
    step_observation: str = "observation"
    instruction: str | None = None  # reset's field holding the task; None: the first observation is it
    score: str = "reward"  # the score so far in step's answer
    score_scale: float = 1.0
    valid_actions: str | None = None
    forms: tuple[str, ...] = ()


PROTOCOLS: dict[str, Protocol] = {
    # agentenv/envs/webshop.py: /create answers an int; reset {session_id} (the goal index, as
    # envs/webshop.py numbers goals); the page text from GET /observation; step {state, reward, done}
    "webshop": Protocol("env_idx", None, "session_id", reset_observation=None, step_observation="state",
                        forms=("search[keywords]", "click[value]")),
    # agentenv/envs/alfworld.py: /create answers {id}; reset {game, world_type}; available_actions;
    # reward is 1 when won
    "alfworld": Protocol("id", "id", "game", {"world_type": "Text"}, valid_actions="available_actions",
                         forms=("go to {recep}", "take {obj} from {recep}", "put {obj} in/on {recep}",
                                "open {recep}", "use {obj}", "heat/cool/clean {obj} with {recep}")),
    # agentenv/envs/sciworld.py: reset {data_idx} answers task_description + observation; score 0..100
    "sciworld": Protocol("id", "id", "data_idx", instruction="task_description", score="score",
                         score_scale=100.0, forms=("look around", "go to {loc}", "pick up {obj}", "focus on {obj}",
                                                   "move {obj} to {container}", "wait1")),
}


class IndexRange(BaseModel):
    start: int = Field(0, ge=0)
    count: int = Field(ge=1)


class IndexFile(BaseModel):
    file: str  # a JSON list of task indices; relative: from the working directory, else the repo root


class Config(EnvSection):
    """The env section of ``env=agentgym`` (configs/env/agentgym_*.yaml)."""

    # values: configs/env/agentgym*.yaml (one home); here their types and bounds
    url: str = Field(description="the AgentGym env server")
    env_name: str = Field(description=f"the server's environment: {', '.join(PROTOCOLS)}")
    splits: dict[str, IndexRange | IndexFile | list[int]]
    limit: Annotated[int | None, Field(ge=1)]  # keep the first N tasks of every split
    step_limit: Annotated[int, Field(ge=1)]
    action_forms: list[str] | None  # None: the protocol's
    timeout_s: Annotated[float, Field(gt=0)]  # one answer; more is EnvironmentTimeout
    connect_timeout_s: Annotated[float, Field(gt=0)]
    pool_timeout_s: Annotated[float, Field(gt=0)]  # waiting for a free connection
    retries: Annotated[int, Field(ge=0)]  # connection attempts and HTTP 503 answers retried (never a step sent)
    max_connections: Annotated[int, Field(ge=1)]  # per process and server, shared by its adapter instances


_CLIENTS: dict[tuple, httpx.Client] = {}
_CLIENTS_LOCK = threading.Lock()


def _client(url: str, max_connections: int, timeouts: tuple[float, float, float], retries: int) -> httpx.Client:
    """The process's client for ``url`` (a bounded pool shared by every adapter instance of it);
    ``timeouts``: (an answer, connecting, waiting for a free connection) in seconds."""
    key = (os.getpid(), url, max_connections, timeouts, retries)  # a forked child builds its own
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
            timeout = httpx.Timeout(timeouts[0], connect=timeouts[1], pool=timeouts[2])
            _CLIENTS[key] = httpx.Client(base_url=url, timeout=timeout, limits=limits,
                                         transport=httpx.HTTPTransport(retries=retries, limits=limits))
        return _CLIENTS[key]


def _repo_path(name: str) -> Path:
    path = Path(name)
    if path.is_absolute() or path.exists():
        return path
    return Path(__file__).resolve().parents[3] / path


class AgentGymTask(Task):
    """A task index of an AgentGym server; ``task_id`` is AgentTraj's ``item_id`` (``webshop_12``)."""

    @property
    def task_id(self) -> str:
        return f"{self.game}_{self.seed}"


class AgentGymEnv:
    """One environment instance on an AgentGym server (see the module's docstring)."""

    Config = Config
    name = "agentgym"

    def __init__(self, url: str = "http://127.0.0.1:36001", env_name: str = "webshop",
                 splits: dict[str, Any] | None = None, limit: int | None = None, step_limit: int = 15,
                 action_forms: list[str] | None = None, timeout_s: float = 60.0, connect_timeout_s: float = 10.0,
                 pool_timeout_s: float = 600.0, retries: int = 3, max_connections: int = 16, **_: Any) -> None:
        if env_name not in PROTOCOLS:
            raise ValueError(f"env.env_name={env_name!r}: AgentGym environments known here: {', '.join(PROTOCOLS)}")
        self.url, self.env_name, self.proto = url.rstrip("/"), env_name, PROTOCOLS[env_name]
        self.splits, self.limit, self.step_limit = dict(splits or {}), limit, int(step_limit)
        self.forms = list(action_forms) if action_forms is not None else list(self.proto.forms)
        self.retries = retries
        self._args = (self.url, max_connections, (timeout_s, connect_timeout_s, pool_timeout_s), retries)
        self._id: Any = None  # the server's instance
        self._task: Task | None = None

    @property
    def version(self) -> str:
        return f"agentgym {self.env_name} {self.url} (httpx {httpx.__version__})"

    # tasks ---------------------------------------------------------------------------------------
    def _indices(self, spec: Any) -> list[int]:
        if isinstance(spec, list):
            return [int(i) for i in spec]
        if "file" in spec:
            return [int(i) for i in json.loads(_repo_path(spec["file"]).read_text())]
        return list(range(spec["start"], spec["start"] + spec["count"]))

    def tasks(self, split: str) -> list[Task]:
        if split not in self.splits:
            raise KeyError(f"env.splits: no split {split!r} (have {sorted(self.splits)})")
        seeds = list(dict.fromkeys(self._indices(self.splits[split])))[: self.limit]
        return [AgentGymTask(self.name, self.env_name, split, s, split) for s in seeds]

    def max_steps(self, task: Task) -> int:
        return self.step_limit

    def action_forms(self, game: str) -> list[str]:
        return self.forms

    def expert_actions(self, task: Task) -> list[str]:
        raise NotImplementedError(f"an AgentGym server has no gold actions: set experts.source to AgentGym's "
                                  f"trajectories (AgentTraj, item ids such as {task.task_id!r})")

    # HTTP ----------------------------------------------------------------------------------------
    def _http(self, what: str, method: str, path: str, **kw: Any) -> Any:
        client = _client(*self._args)
        for attempt in range(self.retries + 1):
            try:
                res = client.request(method, path, **kw)
            except httpx.TimeoutException as exc:
                raise EnvironmentTimeout(f"agentgym server {self.url}: no answer to {what} within the limit "
                                         f"({type(exc).__name__}; env.timeout_s, env.pool_timeout_s)") from exc
            except httpx.HTTPError as exc:  # refused after env.retries, dropped, reset
                raise EnvironmentFailure(f"agentgym server {self.url}: {what} failed: "
                                         f"{type(exc).__name__}: {exc}") from exc
            if res.status_code != 503 or attempt == self.retries:  # 503: busy, nothing done; again
                break
            time.sleep(min(0.1 * 2 ** attempt, 2.0))
        if res.status_code != 200:
            raise EnvironmentFailure(f"agentgym server {self.url}: {what}: HTTP {res.status_code} {res.text:.200}")
        try:
            body = res.json()
        except ValueError as exc:
            raise EnvironmentFailure(f"agentgym server {self.url}: {what}: not JSON: {res.text:.200}") from exc
        if isinstance(body, dict) and "error" in body:
            raise EnvironmentFailure(f"agentgym server {self.url}: {what}: {body['error']!s:.300}")
        return body

    def _post(self, what: str, path: str, data: dict[str, Any]) -> Any:
        return self._http(what, "POST", path, json={**data, self.proto.id_key: self._id})

    def _field(self, body: Any, key: str, what: str, kind: type | tuple = str) -> Any:
        if not isinstance(body, dict) or not isinstance(body.get(key), kind):
            raise EnvironmentFailure(f"agentgym server {self.url}: {what}: malformed answer {body!r:.200} "
                                     f"(no {key!r}, env_name={self.env_name})")
        return body[key]

    def _create(self) -> None:
        body = self._http("create", "POST", "/create")
        key = self.proto.create_id
        self._id = body if key is None else self._field(body, key, "create", (int, str))
        if not isinstance(self._id, (int, str)):
            raise EnvironmentFailure(f"agentgym server {self.url}: create: malformed answer {body!r:.200}")

    # the episode ---------------------------------------------------------------------------------
    def _result(self, text: str, raw: Any, done: bool, valid: Any = None) -> StepResult:
        score = float(raw or 0.0) / self.proto.score_scale
        failure = score < 0  # SciWorld: -100 when the task is lost
        score = min(max(score, 0.0), 1.0)
        success = score >= 1.0
        return StepResult(text, score, bool(done) or success or failure, success, failure=failure,
                          valid_actions=[str(a) for a in valid] if isinstance(valid, list) else None)

    def _reset_once(self, task: Task) -> tuple[str, StepResult]:
        if self._id is None:
            self._create()
        what = f"reset of {task.task_id}"
        body = self._post(what, "/reset", {self.proto.reset_key: task.seed, **self.proto.reset_extra})
        p = self.proto
        if p.reset_observation is None:
            text = self._http(what, "GET", "/observation", params={p.id_key: self._id})
            if not isinstance(text, str):
                raise EnvironmentFailure(f"agentgym server {self.url}: {what}: malformed observation {text!r:.200}")
        else:
            text = self._field(body, p.reset_observation, what)
        instruction = self._field(body, p.instruction, what) if p.instruction else text
        valid = body.get(p.valid_actions) if p.valid_actions and isinstance(body, dict) else None
        return instruction, self._result(text, 0.0, False, valid)

    def reset(self, task: Task) -> tuple[str, StepResult]:
        try:
            out = self._reset_once(task)
        except EnvironmentFailure:  # a stale instance (the server restarted): once more, on a new one
            self._id = None
            out = self._reset_once(task)
        self._task = task
        return out

    def step(self, action: str) -> StepResult:
        if self._task is None or self._id is None:
            raise EnvironmentFailure(f"agentgym server {self.url}: step before reset")
        what = f"step {action!r:.60} of {self._task.task_id}"
        body = self._post(what, "/step", {"action": action})
        p = self.proto
        text = self._field(body, p.step_observation, what)
        raw = self._field(body, p.score, what, (int, float, type(None)))
        return self._result(text, raw, self._field(body, "done", what, (bool, int)),
                            body.get(p.valid_actions) if p.valid_actions else None)

    def check_playable(self) -> None:
        """The server answers (before hours of BC)."""
        self._http("GET /", "GET", "/")

    def close(self) -> None:
        """Release the server's instance (best effort: AgentGym's WebShop and ALFWorld servers have no
        /close, and a dead server must not hold the rollout up)."""
        if self._id is None:
            return
        try:
            _client(*self._args).post("/close", json={self.proto.id_key: self._id}, timeout=2.0)
        except httpx.HTTPError:
            pass
        self._id, self._task = None, None


__all__ = ["PROTOCOLS", "AgentGymEnv", "AgentGymTask", "Config", "Protocol"]
