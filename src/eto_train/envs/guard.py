"""One wrapper around every adapter: its answers checked as they arrive, every call bounded and named.

:func:`eto_train.envs.registry.build` wraps each adapter it builds in a :class:`GuardedEnv`, built-in or
plug-in, in the rollout's process or in an env worker process (envs/workers.py builds its environments
with the same function), so every answer any stage sees has passed these checks:

- **Answers** (:meth:`GuardedEnv.check_result`): ``reset`` returns ``(instruction, StepResult)`` and
  ``step`` a ``StepResult``; the reward is a finite number within the adapter's declared
  ``reward_range`` (a class attribute, ``(0.0, 1.0)`` when absent: the contract's [0, 1]); ``done``,
  ``success`` and ``failure`` are booleans and agree (success or failure only on a done step, never
  both; a reset is never done); the observation (and the instruction) is text of at most
  ``env.max_observation_chars`` characters; ``valid_actions`` is None or a list of strings. A violation
  raises :class:`AdapterContractError`, one line naming the adapter (``module:Class``), the task, the
  step and the value. It is not an environment failure: nothing retries it, the stage stops before an
  episode, a pair or a DPO run is built on it, and finished stages are not touched.
- **Time**: every call (the constructor, ``tasks``, ``reset``, ``step``, ``max_steps``,
  ``action_forms``, ``expert_actions``, an adapter's extras such as ``check_playable``, ``close``) runs
  in the instance's own daemon thread and must answer within ``env.call_timeout_s``; else
  :class:`EnvironmentTimeout` naming the call, the task and the step (the rollout then replaces the
  instance and replays the episode on a fresh one, ``rollout.env_retries``; the hung thread is left
  behind, and the instance refuses every later call but ``close``). Each ``reset`` / ``step`` answer
  carries the adapter's own time in ``info["env_s"]``, which the rollout records as the step's ``env_s``.
- **Exceptions**: an adapter's exception that is not an :class:`EnvironmentFailure` becomes one
  :class:`AdapterError` naming the adapter, the call, the task and the step (the adapter's traceback is
  its cause). Left as they are: ``KeyError`` from ``tasks`` (a split the environment lacks: the stages
  name it), and what eto-train's own adapters raise (their messages are written for the user: a
  missing WebShop install, a ScienceWorld variation out of range).

Written by hand: a call cannot be interrupted from outside (a thread cannot be killed, a signal
reaches the main thread only and not a worker thread), so the call runs in a thread of its own and
the caller stops waiting; one thread per instance keeps every call of an instance on one thread.
"""

from __future__ import annotations

import functools
import inspect
import math
import queue
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable

from .base import (REWARD_RANGE, AdapterContractError, AdapterError, Environment, EnvironmentFailure,
                   EnvironmentTimeout, EnvWrapper, StepResult, Task)

CONTRACT = "docs/environments.md#the-contract"


@dataclass(frozen=True)
class Limits:
    """The guard's settings, from the env section (no values of their own: configs/env_common.yaml's)."""

    call_timeout_s: float
    max_observation_chars: int

    @classmethod
    def of(cls, cfg: dict[str, Any]) -> Limits:
        """``env.call_timeout_s`` and ``env.max_observation_chars`` of an env section (absent or null, in a dict
        built in code: configs/env_common.yaml's), checked: the schema checks a composed config, this a dict."""
        t = cfg.get("call_timeout_s")
        n = cfg.get("max_observation_chars")
        t = shipped_limits().call_timeout_s if t is None else t
        n = shipped_limits().max_observation_chars if n is None else n
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"env.call_timeout_s={t!r}: a number of seconds > 0 (the most one adapter call may take)")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"env.max_observation_chars={n!r}: an integer >= 1 (the longest observation an "
                             f"adapter may answer)")
        return cls(float(t), n)


@functools.lru_cache(maxsize=None)
def shipped_limits() -> Limits:
    """configs/env_common.yaml's ``call_timeout_s`` and ``max_observation_chars``: what an env section built in
    code without them gets (their one home is that file; a composed config always has them)."""
    import yaml

    from ..layout import CONFIGS

    common = yaml.safe_load((CONFIGS / "env_common.yaml").read_text())
    return Limits(float(common["call_timeout_s"]), int(common["max_observation_chars"]))


# -- the instance's thread ----------------------------------------------------------------------
class _Timeout(Exception):
    pass


class _Box:
    __slots__ = ("value", "error", "done")

    def __init__(self) -> None:
        self.value, self.error, self.done = None, None, threading.Event()


def _serve(q: queue.SimpleQueue) -> None:
    """The thread's loop: make each call put in ``q`` (None: stop)."""
    while True:
        item = q.get()
        if item is None:
            return
        fn, box = item
        try:
            box.value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
            box.error = exc
        box.done.set()
        del fn, box, item


class _Caller:
    """One daemon thread that makes an instance's calls, one at a time, each waited for up to a timeout."""

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=_serve, args=(self._q,), name=name, daemon=True).start()

    def call(self, fn: Callable[[], Any], timeout_s: float) -> Any:
        box = _Box()
        self._q.put((fn, box))
        if not box.done.wait(timeout_s):
            raise _Timeout
        if box.error is not None:
            error, box.error = box.error, None
            raise error
        return box.value

    def stop(self) -> None:
        self._q.put(None)  # a thread still inside a hung call ends after it (daemon: never waited for)


def _in_thread(fn: Callable[[], Any], timeout_s: float, name: str) -> None:
    """``fn()`` in a daemon thread of its own, waited for up to ``timeout_s`` (a hung instance's close)."""
    caller = _Caller(name)
    try:
        caller.call(fn, timeout_s)
    except Exception:  # noqa: BLE001 - best effort: the instance is discarded anyway
        pass
    finally:
        caller.stop()


def _on_purpose(exc: BaseException) -> bool:
    """An error that already reports itself as one block (eto-train's own, a full disk)."""
    from ..errors import is_disk_error, is_input_error

    return is_disk_error(exc) or is_input_error(exc)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def declared_range(env: Any, adapter: str) -> tuple[float, float]:
    """The adapter's ``reward_range`` (REWARD_RANGE when it declares none), checked."""
    r = getattr(env, "reward_range", None)
    if r is None:
        return REWARD_RANGE
    try:
        lo, hi = r
    except (TypeError, ValueError):
        lo = hi = None
    if not (_number(lo) and _number(hi) and math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise AdapterContractError(f"{adapter}.reward_range={r!r}: two finite numbers (low, high) with low < high, "
                                   f"the rewards the adapter answers ({CONTRACT})")
    return float(lo), float(hi)


_OWN = frozenset({"inner", "adapter", "env_name", "limits", "reward_range", "_task", "_step", "_action", "_hung",
                  "_caller", "_stop", "_limits"})


def _task_id(task: Any) -> Any:
    return getattr(task, "task_id", task)


def _raised_in_eto_train(exc: BaseException) -> bool:
    """Raised by a ``raise`` in eto-train's own code (a built-in adapter's error, meant as it is)."""
    from ..errors import _raised_here

    return _raised_here(exc)


def env_seconds(res: StepResult) -> float:
    """The environment's own time for a step, as the guard measured it (``info["env_s"]``; 0 without)."""
    t = res.info.get("env_s", 0.0) if isinstance(res.info, dict) else 0.0
    return round(float(t), 4) if _number(t) else 0.0


class GuardedEnv(EnvWrapper):
    """An adapter whose calls are bounded (``limits.call_timeout_s``) and whose answers are checked
    (reward range, flags, observation size, types); see the module docstring.

    ``build`` makes the adapter (its constructor is bounded too), ``adapter`` is its ``module:Class``
    and ``env_name`` the registry name: both name it in every message."""

    def __init__(self, build: Callable[[], Environment], adapter: str, env_name: str, limits: Limits) -> None:
        self.adapter, self.env_name, self.limits = adapter, env_name, limits
        self._task: Task | None = None
        self._step = 0
        self._action: str | None = None
        self._hung: str | None = None  # the call that did not answer: the instance takes no other
        self._limits: dict = {}  # max_steps per task
        self._caller = _Caller(f"eto-env {adapter}")
        self._stop = weakref.finalize(self, self._caller.stop)  # its thread ends with the instance
        try:
            inner, _ = self._run("its constructor", build, task=False)
            self.reward_range = declared_range(inner, adapter)
        except BaseException:
            self._stop()
            raise
        super().__init__(inner)

    # -- naming ------------------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        """The guard's own attributes here; any other is the adapter's (a test that sets one on the
        environment it got from make_env sets it on the adapter, as before the guard)."""
        if name in _OWN or "inner" not in self.__dict__:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    def where(self, call: str, task: bool = True) -> str:
        """``module:Class (env=name) <call> on task <id>, step <n>``."""
        text = f"{self.adapter} (env={self.env_name}) {call}"
        if task and self._task is not None:
            text += f" on task {_task_id(self._task)}"
            if self._step:
                text += f", step {self._step}"
        return text

    # -- bounded calls -------------------------------------------------------------------------------
    def _run(self, call: str, fn: Callable[[], Any], task: bool = True, passes: tuple[type, ...] = ()) -> tuple[Any, float]:
        """(``fn()``'s answer, the seconds it took), within the call timeout; exceptions named."""
        if self._hung is not None:
            raise EnvironmentFailure(f"{self.where(call, task)}: refused, this instance did not answer "
                                     f"{self._hung} and is discarded")
        t0 = time.perf_counter()
        try:
            value = self._caller.call(fn, self.limits.call_timeout_s)
        except _Timeout:
            self._hung = call
            raise EnvironmentTimeout(
                f"{self.where(call, task)}: no answer within env.call_timeout_s={self.limits.call_timeout_s:g} s "
                f"(the instance is discarded)") from None
        except EnvironmentFailure:
            raise  # the adapter's own, as the contract asks: retried on a fresh instance
        except passes:
            raise
        except Exception as exc:
            if _on_purpose(exc) or _raised_in_eto_train(exc):
                raise
            raise AdapterError(f"{self.where(call, task)} raised {type(exc).__name__}: {exc} (a bug or a data error "
                               f"in the adapter, not an EnvironmentFailure, so nothing retried it; "
                               f"ETO_TRAIN_TRACEBACK=1 prints its traceback)") from exc
        return value, time.perf_counter() - t0

    def violation(self, call: str, what: str) -> AdapterContractError:
        return AdapterContractError(
            f"{self.where(call)}: {what}; the adapter broke its contract ({CONTRACT}): the stage stopped before "
            f"anything was built on this answer, finished stages are untouched")

    # -- the protocol -----------------------------------------------------------------------------
    @property
    def version(self) -> str:
        version, _ = self._run("version", lambda: self.inner.version, task=False)
        return version

    def tasks(self, split: str) -> list[Task]:
        tasks, _ = self._run(f"tasks({split!r})", lambda: self.inner.tasks(split), task=False, passes=(KeyError,))
        if not isinstance(tasks, list):
            raise self.violation(f"tasks({split!r})", f"answered a {type(tasks).__name__}, not a list of Tasks")
        return tasks

    def max_steps(self, task: Task) -> int:
        """The step limit (asked once per task: the rollout asks at every step, a function of the config)."""
        try:
            if task in self._limits:
                return self._limits[task]
        except TypeError:  # an unhashable task
            pass
        call = f"max_steps({_task_id(task)!r})"
        n, _ = self._run(call, lambda: self.inner.max_steps(task), task=False)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise self.violation(call, f"step limit {n!r} is not an integer >= 1")
        try:
            self._limits[task] = n
        except TypeError:
            pass
        return n

    def action_forms(self, game: str) -> list[str]:
        forms, _ = self._run(f"action_forms({game!r})", lambda: self.inner.action_forms(game), task=False)
        return forms

    def expert_actions(self, task: Task) -> list[str]:
        actions, _ = self._run(f"expert_actions({_task_id(task)!r})", lambda: self.inner.expert_actions(task),
                               task=False)
        return actions

    def reset(self, task: Task, *args: Any, **kwargs: Any) -> tuple[str, StepResult]:
        self._task, self._step, self._action = task, 0, None
        answer, seconds = self._run("reset", lambda: self.inner.reset(task, *args, **kwargs))
        if not (isinstance(answer, tuple) and len(answer) == 2):
            raise self.violation("reset", f"answered {type(answer).__name__} {answer!r:.80}, not "
                                          f"(instruction, StepResult)")
        instruction, res = answer
        if not isinstance(instruction, str):
            raise self.violation("reset", f"instruction {instruction!r:.80} is not text")
        if len(instruction) > self.limits.max_observation_chars:
            raise self.violation("reset", f"instruction of {len(instruction):,} characters, over "
                                          f"env.max_observation_chars={self.limits.max_observation_chars:,}")
        return instruction, self.check_result(res, "reset", seconds)

    def step(self, action: str) -> StepResult:
        self._step += 1
        self._action = action
        call = f"step({action!r:.80})"
        res, seconds = self._run(call, lambda: self.inner.step(action))
        return self.check_result(res, call, seconds)

    def check_result(self, res: Any, call: str, seconds: float) -> StepResult:
        """``res`` checked against the contract, with the adapter's time in ``info["env_s"]``."""
        if not isinstance(res, StepResult):
            raise self.violation(call, f"answered a {type(res).__name__}, not a StepResult")
        obs = res.observation
        if not isinstance(obs, str):
            raise self.violation(call, f"observation {obs!r:.80} is not text")
        if len(obs) > self.limits.max_observation_chars:
            raise self.violation(call, f"observation of {len(obs):,} characters, over env.max_observation_chars="
                                       f"{self.limits.max_observation_chars:,} (raise it if such observations are "
                                       f"meant: every prompt must hold them)")
        r = res.reward
        lo, hi = self.reward_range
        if not _number(r) or not math.isfinite(r):
            raise self.violation(call, f"reward {r!r} is not a finite number")
        if not lo - 1e-9 <= r <= hi + 1e-9:
            declared = "the adapter's reward_range" if getattr(self.inner, "reward_range", None) is not None \
                else "the default range; an adapter declares another with reward_range = (low, high)"
            raise self.violation(call, f"reward {r!r} is outside [{lo:g}, {hi:g}] ({declared})")
        for flag in ("done", "success", "failure"):
            if not isinstance(getattr(res, flag), bool):
                raise self.violation(call, f"{flag}={getattr(res, flag)!r} is not a boolean")
        if res.success and res.failure:
            raise self.violation(call, "success=True and failure=True at once")
        if (res.success or res.failure) and not res.done:
            raise self.violation(call, f"{'success' if res.success else 'failure'}=True on a step that is not "
                                       f"done (done=False)")
        if call == "reset" and res.done:
            raise self.violation(call, "done=True at the reset: the episode is over before its first action")
        va = res.valid_actions
        if va is not None and not (isinstance(va, list) and all(isinstance(a, str) for a in va)):
            raise self.violation(call, f"valid_actions {va!r:.80} is not None or a list of strings")
        if not isinstance(res.info, dict):
            raise self.violation(call, f"info {res.info!r:.80} is not a dict")
        return replace(res, info={**res.info, "env_s": round(seconds, 6)})

    def close(self) -> None:
        if self._hung is None:  # (its thread stays for a later call; it ends with this object)
            self._run("close", self.inner.close, task=False)
            return
        # its thread is still inside the call that hung: close from another one, waited for a while
        _in_thread(self.inner.close, min(self.limits.call_timeout_s, 30.0), f"eto-env {self.adapter} close")
        self._stop()

    def __getattr__(self, attr: str) -> Any:  # an adapter's extras (check_playable, ...), bounded too
        value = super().__getattr__(attr)
        if attr.startswith("_") or not inspect.ismethod(value):
            return value

        def bounded(*args: Any, **kwargs: Any) -> Any:
            return self._run(f"{attr}()", lambda: value(*args, **kwargs), task=False)[0]
        return bounded


__all__ = ["GuardedEnv", "Limits", "declared_range",
           "env_seconds"]
