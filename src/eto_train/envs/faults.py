"""Fault injection around any environment: timeouts, crashes and malformed observations.

``FaultyEnv`` wraps an :class:`~eto_train.envs.base.Environment` and, on ``reset`` and ``step``,
injects one of three faults, each with its own rate (probability per call) and seed:

- ``timeout``: the call raises :class:`EnvironmentTimeout` without reaching the simulator;
- ``crash``: the call raises :class:`EnvironmentFailure` without reaching the simulator;
- ``malformed``: the simulator answers, then its result is garbled (no text, undecodable
  bytes, NUL/replacement characters, a NaN reward).

Malformed results are never handed on. The wrapper validates every result it returns
(:func:`check_step_result`) and turns garbage into ``EnvironmentFailure``. Validating here,
not in each adapter, is the cleaner choice: the wrapper sees results *after* the adapter
returned them, so the adapter's own checks could never see an injected corruption; one
check at the wrapper covers every adapter alike, and catches real garbage as well as
injected garbage. The rollout engine then sees only the typed error it already handles
(retry with backoff on a fresh instance, then status ``environment_failure``).

Determinism. Whether a fault fires is a pure function of (kind's seed, task id, call index,
attempt), with call 0 = ``reset`` and call i = the i-th ``step`` of that episode, and
``attempt`` = the number of faults already injected at that call of that task (kept by a shared
:class:`FaultLedger`). So the order in which parallel episodes run does not change which faults
fire; a retried call draws afresh and can succeed; and when the rollout rebuilds an episode on
a fresh instance by replaying its actions, the replayed calls (which went through before) go
through again: every call the agent makes faults at the configured rate, once per attempt.
Episodes of one task (several samples, step-level continuations) share the counts in play
order; the work order is deterministic, so two runs of one config inject the same faults.
The counts belong to one play (one rollout stage, :func:`new_play`): every stage, whatever ran
before it in the process, meets the same faults on the same seeds. (A resumed play may draw
other faults for a task of which some episodes were recorded before the kill; the accounting
and the pair filter hold regardless.)

Gold-path replays are never faulted: after ``expert_actions(task)`` the next episode of that
task passes through untouched. The experts stage has no retry, and expert data is the chosen
side of every pair; faults are there to exercise the policy's rollouts.

Every injected fault is a :class:`FaultEvent` in the ledger (and in a process-wide log), so a
report can account for each one: retried successfully, or ended in ``environment_failure``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .base import Environment, EnvironmentFailure, EnvironmentTimeout, EnvWrapper, StepResult, Task

KINDS = ("timeout", "crash", "malformed")  # checked in this order; at most one fault per call


@dataclass(frozen=True)
class FaultSpec:
    rate: float = 0.0  # probability that a reset or step call gets this fault
    seed: int = 0


@dataclass(frozen=True)
class FaultConfig:
    timeout: FaultSpec = FaultSpec()
    crash: FaultSpec = FaultSpec()
    malformed: FaultSpec = FaultSpec()

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, where: str = "env.faults") -> FaultConfig:
        """Parse and check an ``env.faults`` block; errors name the key."""
        d = dict(d or {})
        unknown = sorted(set(d) - set(KINDS))
        if unknown:
            raise ValueError(f"{where}: unknown fault kind(s) {unknown}; known: {list(KINDS)}")
        specs = {}
        for kind in KINDS:
            spec = d.get(kind) or {}
            if not isinstance(spec, dict):
                raise ValueError(f"{where}.{kind}: expected {{rate: <0..1>, seed: <int>}}, got {spec!r}")
            bad = sorted(set(spec) - {"rate", "seed"})
            if bad:
                raise ValueError(f"{where}.{kind}: unknown key(s) {bad}; known: ['rate', 'seed']")
            try:
                rate, seed = float(spec.get("rate", 0.0)), int(spec.get("seed", 0))
            except (TypeError, ValueError):
                raise ValueError(f"{where}.{kind}: rate must be a number and seed an integer, got {spec!r}") from None
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{where}.{kind}.rate: {rate} is not a probability in [0, 1]")
            specs[kind] = FaultSpec(rate, seed)
        return cls(**specs)

    @property
    def enabled(self) -> bool:
        return any(getattr(self, k).rate > 0 for k in KINDS)

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True)
class FaultEvent:
    kind: str  # timeout | crash | malformed
    where: str  # reset | step
    task_id: str
    attempt: int  # faults already injected at this call of this task before this one
    call: int  # 0 = reset, i = the i-th step of the episode
    message: str


@dataclass
class FaultLedger:
    """The faults injected by every :class:`FaultyEnv` that shares this ledger, in order."""

    events: list[FaultEvent] = field(default_factory=list)
    _per_task: Counter = field(default_factory=Counter)
    _per_call: Counter = field(default_factory=Counter)

    def attempt(self, task_id: str, call: int) -> int:
        return self._per_call[task_id, call]

    def record(self, event: FaultEvent) -> None:
        self.events.append(event)
        self._per_task[event.task_id] += 1
        self._per_call[event.task_id, event.call] += 1
        INJECTED.append(event)

    def by_task(self) -> dict[str, int]:
        return dict(self._per_task)

    def counts(self) -> dict[str, int]:
        return summarize_faults(self.events)


# Process-wide log of injected faults (all ledgers), for stage reports: take ``fault_mark()``
# before a run of episodes and ``fault_summary(mark)`` after it.
INJECTED: list[FaultEvent] = []
_LEDGERS: dict[str, FaultLedger] = {}


def summarize_faults(events: list[FaultEvent]) -> dict[str, int]:
    out = {"injected_faults": len(events)}
    out.update({k: sum(e.kind == k for e in events) for k in KINDS})
    out.update({f"on_{w}": sum(e.where == w for e in events) for w in ("reset", "step")})
    return out


def fault_mark() -> int:
    return len(INJECTED)


def fault_summary(mark: int = 0) -> dict[str, int]:
    """Counts of the faults injected in this process since ``mark`` (see :func:`fault_mark`)."""
    return summarize_faults(INJECTED[mark:])


def ledger_for(cfg: FaultConfig) -> FaultLedger:
    """The process-wide ledger of one fault configuration (shared by all its instances,
    so that a retry on a fresh instance knows it is a retry)."""
    return _LEDGERS.setdefault(cfg.key(), FaultLedger())


def new_play() -> None:
    """Start every configuration's ledger afresh (the process-wide log is kept).

    Called at the start of each rollout stage: the attempt counts then belong to one play, so
    every stage (each policy, each split) meets faults at the configured rate, the same
    calls on the same seeds. A ledger kept across stages would have a later stage replay the
    counts of an earlier one and draw almost no faults on seeds already played."""
    _LEDGERS.clear()


def _draw(seed: int, kind: str, task_id: str, attempt: int, call: int) -> float:
    """A uniform number in [0, 1) fixed by its arguments (no RNG state, no call order)."""
    h = hashlib.sha256(f"{seed}|{kind}|{task_id}|{attempt}|{call}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0 ** 64


def check_step_result(res: Any, where: str) -> None:
    """Raise :class:`EnvironmentFailure` unless ``res`` is a well-formed :class:`StepResult`."""
    if not isinstance(res, StepResult):
        raise EnvironmentFailure(f"{where}: malformed result (not a StepResult): {type(res).__name__}")
    obs = res.observation
    if not isinstance(obs, str):
        raise EnvironmentFailure(f"{where}: malformed observation (not text): {obs!r:.80}")
    if "\x00" in obs or "\ufffd" in obs:
        raise EnvironmentFailure(f"{where}: malformed observation (NUL or undecodable characters): {obs!r:.80}")
    if not isinstance(res.reward, (int, float)) or isinstance(res.reward, bool) or not math.isfinite(res.reward):
        raise EnvironmentFailure(f"{where}: malformed reward {res.reward!r}")
    for name in ("done", "success", "failure"):
        if not isinstance(getattr(res, name), bool):
            raise EnvironmentFailure(f"{where}: malformed {name} flag {getattr(res, name)!r}")
    va = res.valid_actions
    if va is not None and not (isinstance(va, list) and all(isinstance(a, str) for a in va)):
        raise EnvironmentFailure(f"{where}: malformed valid_actions {va!r:.80}")


def _garble(res: StepResult, pick: float) -> StepResult:
    """One of four ways a simulator's answer can come back broken."""
    variant = int(pick * 4)
    if variant == 0:
        return replace(res, observation=None)  # type: ignore[arg-type]
    if variant == 1:
        return replace(res, observation=res.observation.encode("utf-8") + b"\xff\xfe")  # type: ignore[arg-type]
    if variant == 2:
        return replace(res, observation="\x00\ufffd\ufffd" + res.observation[: len(res.observation) // 2])
    return replace(res, reward=float("nan"))


class FaultyEnv(EnvWrapper):
    """An environment that injects configured faults into ``reset`` and ``step`` calls."""

    def __init__(self, env: Environment, faults: FaultConfig | dict[str, Any],
                 ledger: FaultLedger | None = None) -> None:
        super().__init__(env)
        self.faults = faults if isinstance(faults, FaultConfig) else FaultConfig.from_dict(faults)
        self.ledger = ledger if ledger is not None else ledger_for(self.faults)
        self._task: Task | None = None
        self._call = 0
        self._exempt = False  # this episode replays a gold path: no faults
        self._gold_task: str | None = None

    # -- pass-through (EnvWrapper), except that a gold path's replay is exempt from faults -----
    def expert_actions(self, task: Task) -> list[str]:
        self._gold_task = task.task_id
        return self.inner.expert_actions(task)

    # -- episode -----------------------------------------------------------------------------
    @property
    def _attempt(self) -> int:
        return self.ledger.attempt(self._task.task_id, self._call) if self._task else 0

    def _pick(self) -> str | None:
        if self._exempt or self._task is None:
            return None
        for kind in KINDS:
            spec: FaultSpec = getattr(self.faults, kind)
            if spec.rate > 0 and _draw(spec.seed, kind, self._task.task_id, self._attempt, self._call) < spec.rate:
                return kind
        return None

    def _inject(self, kind: str, where: str, message: str) -> None:
        assert self._task is not None
        self.ledger.record(FaultEvent(kind, where, self._task.task_id, self._attempt, self._call, message))

    def _before(self, where: str) -> str | None:
        """Raise an injected timeout or crash; return ``"malformed"`` when the answer is to be garbled."""
        kind = self._pick()
        label = f"{self.name} {where} on {self._task.task_id if self._task else '?'} (call {self._call})"
        if kind == "timeout":
            msg = f"injected fault: {label} timed out"
            self._inject(kind, where, msg)
            raise EnvironmentTimeout(msg)
        if kind == "crash":
            msg = f"injected fault: {label} crashed"
            self._inject(kind, where, msg)
            raise EnvironmentFailure(msg)
        return kind

    def _after(self, kind: str | None, where: str, res: StepResult) -> StepResult:
        label = f"{self.name} {where} on {self._task.task_id if self._task else '?'} (call {self._call})"
        if kind == "malformed":
            res = _garble(res, _draw(self.faults.malformed.seed, "variant", label, self._attempt, self._call))
            try:
                check_step_result(res, f"injected fault: {label}")
            except EnvironmentFailure as exc:
                self._inject(kind, where, str(exc))
                raise
            raise AssertionError("a garbled result passed validation")  # pragma: no cover
        check_step_result(res, label)  # real garbage from the simulator fails the same way
        return res

    def reset(self, task: Task, *args: Any, **kwargs: Any) -> tuple[str, StepResult]:
        self._task, self._call = task, 0
        self._exempt, self._gold_task = self._gold_task == task.task_id, None
        kind = self._before("reset")
        instruction, res = self.inner.reset(task, *args, **kwargs)
        if not isinstance(instruction, str):
            raise EnvironmentFailure(f"{self.name} reset on {task.task_id}: malformed instruction {instruction!r:.80}")
        return instruction, self._after(kind, "reset", res)

    def step(self, action: str) -> StepResult:
        self._call += 1
        kind = self._before("step")
        return self._after(kind, "step", self.inner.step(action))


def wrap_faults(env: Environment, faults: dict[str, Any] | None) -> Environment:
    """``env`` wrapped in a :class:`FaultyEnv` when an ``env.faults`` rate is above 0."""
    cfg = FaultConfig.from_dict(faults)
    return FaultyEnv(env, cfg) if cfg.enabled else env
