"""Environments hosted in worker processes (``env.workers: N``), stepped in parallel.

A rollout plays many episodes in lockstep; after each batched policy step every row's action
goes to its environment. In one process those calls run one after the other (a py4j call blocks
until its JVM answers, and one JVM's games cannot be called from two threads), so at GPU batch
sizes the simulators, not the model, set the pace (``make bench ARGS="bench.only=envsteps"``).
With ``env.workers: N`` the rollout (:func:`eto_train.rollouts.loop.run_rollouts`) hosts its
environments in N processes instead, each building them with the same factory (the env config,
so each worker starts its own simulators: its own JVMs), and sends each row's action to its
worker as soon as it has one (as the row finishes decoding with ``rollout.overlap_env`` and the KV
engine, else once the batch has); the N workers step at once and the rollout collects the
answers in row order. Resets are sent the same way.

- :class:`WorkerPool`: the processes (``multiprocessing``, spawn context). ``pool.env(slot)``
  builds an environment in worker ``slot % N`` and returns a :class:`WorkerEnv`.
- :class:`WorkerEnv`: the :class:`~eto_train.envs.base.Environment` protocol, forwarded over a
  pipe, plus ``step_async``/``reset_async`` (send now, ``.result()`` later). Each worker answers
  its requests in the order sent. ``max_steps``/``action_forms`` (functions of the config)
  are asked once per argument and kept for the pool.
- Errors. An exception raised in a worker comes back as its own type (EnvironmentFailure,
  EnvironmentTimeout, ValueError...) with the worker's traceback in the message, so the rollout
  handles it as it handles an in-process one. A worker that dies (or is killed) is an
  EnvironmentFailure naming it, for every call waiting on it and every later call to its
  environments; the next environment placed there starts a fresh process. Each worker builds
  its environments with :func:`eto_train.envs.registry.build`, so the guard (envs/guard.py) is
  there too: a call that does not answer within ``env.call_timeout_s`` is an EnvironmentTimeout
  naming the call, answered by the worker; a worker that answers nothing at all (stuck where the
  guard cannot help, e.g. holding the interpreter) within ``env.call_timeout_s`` plus
  :data:`GRACE_S` is killed: EnvironmentTimeout. Nothing waits forever. The guard's own errors
  (AdapterContractError, AdapterError) come back as one line, without the worker's traceback.
- Faults (``env.faults``) are injected here, in the rollout's process, around the worker's
  environment (:class:`FaultyWorkerEnv`): the fault ledger (envs/faults.py: attempt counts per
  task and call) is the process's own, draws happen in the order the rollout makes its calls,
  and a call whose fault is known when it is sent (timeout, crash, malformed) is answered at
  once, so the ledger sees the very sequence of events an in-process rollout produces:
  episodes, faults included, are the same with ``env.workers`` 0 or N. (Two exceptions: a
  real failure, read with the answer, is retried then, so its retry's draws may come later
  than in process; and a simulator whose answers depend on the other games in its process:
  two live TextWorldExpress games of one task in one JVM interfere.)
- Spawned workers import the main module again: a script that plays rollouts with workers
  keeps its work under ``if __name__ == "__main__":`` (the project's entry points do).
- Stopping. Workers ignore SIGINT (a Ctrl-C is the rollout's to handle); the rollout stops
  them when it ends, whether it finished, failed or was interrupted (:func:`hosting`): each
  closes its environments (their JVMs stop) and exits; one that does not within
  :data:`STOP_S` is terminated, its JVMs then end as their stdin closes (py4j's
  ``die_on_exit``). Workers are daemonic (gone when Python exits) and exit when the rollout's
  process dies (their pipe closes).

Written by hand: ``concurrent.futures.ProcessPoolExecutor`` hands each call to whichever process
is free, while an environment's state (a live game) lives in one process and its calls must go
there, in order.

``env.workers`` applies to rollouts: :func:`eto_train.envs.make_env` returns a worker's
environment only inside :func:`hosting` (which ``run_rollouts`` opens); listing tasks, gold
paths and the other stages build their environment in the process as before. Each worker builds
its environments with :func:`eto_train.envs.registry.build` (this module imports the registry,
never ``eto_train.envs`` itself: no cycle).
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import multiprocessing as mp
import pickle
import signal
import threading
import time
import traceback
from contextlib import contextmanager
from multiprocessing.connection import wait as wait_ready
from typing import Any, Callable, Iterator

from . import registry
from .base import AdapterContractError, AdapterError, Environment, EnvironmentFailure, EnvironmentTimeout, StepResult, Task
from .faults import FaultConfig, FaultyEnv

GRACE_S = 60.0  # on top of the env's call timeout: a worker's start (imports, a JVM launch), its queue
STOP_S = 15.0  # a stopping worker has this long to close its environments before it is terminated
_TRACE_CHARS = 2000  # the tail of a worker's traceback kept in the error message


# -- answers ------------------------------------------------------------------------------------
class Ready:
    """An answer known when asked for (the ``result()`` interface of a pending one)."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class Then:
    """``fn`` of another answer, once it is in."""

    def __init__(self, pending, fn: Callable[[Any], Any]) -> None:
        self.pending, self.fn = pending, fn

    def result(self) -> Any:
        return self.fn(self.pending.result())


class Pending:
    """A request sent to a worker; ``result()`` waits for its answer (or the worker's end)."""

    def __init__(self, worker: _Worker, what: str) -> None:
        self.worker, self.what = worker, what
        self.done, self.value, self.error = False, None, None

    def _settle(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error, self.done = value, error, True

    def result(self) -> Any:
        w = self.worker
        with w.cond:
            while not self.done:
                w.cond.wait(1.0)  # the reader thread settles it (an answer, a death, a timeout)
        if self.error is not None:
            raise self.error
        return self.value


def sends_async(env: Any) -> bool:
    """Whether ``env`` offers ``step_async``/``reset_async`` itself (a worker's environment, or
    faults around one), not through a wrapper's pass-through of unknown names."""
    return callable(getattr(type(env), "step_async", None))


# -- the worker process -------------------------------------------------------------------------
def _describe(exc: BaseException) -> dict[str, Any]:
    """What the rollout needs to raise ``exc`` again: the object if it pickles, its text, the traceback."""
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:
        blob = None
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"blob": blob, "type": type(exc).__name__, "text": str(exc), "traceback": tb[-_TRACE_CHARS:]}


def _serve(conn, factory: Callable[[], Environment], index: int) -> None:
    """A worker's main loop: build, call and close environments as asked, answer in order."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the rollout's: it stops this worker
    envs: dict[int, Environment] = {}
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the rollout's process is gone
                break
            op = msg[0]
            if op == "stop":
                break
            try:
                if op == "make":
                    env = envs[msg[1]] = factory()
                    value: Any = (env.name, env.version)
                elif op == "call":
                    _, env_id, method, args, kwargs = msg
                    value = getattr(envs[env_id], method)(*args, **kwargs)
                elif op == "close":
                    env = envs.pop(msg[1], None)
                    value = env.close() if env is not None else None
                else:
                    raise ValueError(f"env worker {index}: unknown request {op!r}")
                reply = ("ok", value)
            except BaseException as exc:
                reply = ("err", _describe(exc))
            try:
                conn.send(reply)
            except (EOFError, OSError):  # the rollout stopped listening
                break
            except Exception as exc:  # an answer that does not pickle (nothing was written)
                conn.send(("err", _describe(TypeError(f"env worker {index}: cannot send the answer back: {exc}"))))
    finally:
        for env in envs.values():
            try:
                env.close()
            except Exception:
                pass
        conn.close()


# -- the rollout's side of one worker -----------------------------------------------------------
def _exit_text(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _Worker:
    """One worker process, its pipe and the reader thread that settles its answers in order."""

    def __init__(self, ctx, factory: Callable[[], Environment], index: int, timeout_s: float) -> None:
        self.index, self.timeout_s = index, timeout_s
        ours, theirs = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_serve, args=(theirs, factory, index), name=f"eto-env-worker-{index}",
                                daemon=True)
        self.proc.start()
        theirs.close()
        self.conn = ours
        self.cond = threading.Condition()
        self.send_lock = threading.RLock()  # _fail takes it too, from a failed send
        self.waiting: collections.deque[Pending] = collections.deque()  # in the order sent
        self.broken: tuple[type, str] | None = None  # (error type, why) once it can no longer answer
        self.stopping = False
        self._since = time.monotonic()  # the last answer (or the first request after an idle spell)
        self.label = f"env worker {index} (pid {self.proc.pid})"
        self._reader = threading.Thread(target=self._read, name=f"eto-env-worker-{index}-reader", daemon=True)
        self._reader.start()

    # requests ------------------------------------------------------------------------------------
    def request(self, what: str, *msg: Any) -> Pending:
        with self.send_lock:  # requests are written, and listed as waiting, in one order
            with self.cond:
                if self.broken is not None:
                    kind, why = self.broken
                    raise kind(f"{why}; cannot send {what}")
                p = Pending(self, what)
                if not self.waiting:
                    self._since = time.monotonic()
                self.waiting.append(p)  # before it is sent: the answer may come at once
            try:
                self.conn.send(msg)  # not under cond: the reader thread settles answers meanwhile
            except BaseException as exc:
                with self.cond:
                    if p in self.waiting:  # still the last one (sends are serialised)
                        self.waiting.remove(p)
                if isinstance(exc, (OSError, ValueError)) and not isinstance(exc, pickle.PicklingError):
                    self._gone(f"{self.label}: its pipe is closed ({exc})")  # a worker that died, mostly
                    kind, why = self.broken or (EnvironmentFailure, self.label)
                    raise kind(f"{why}; cannot send {what}") from exc
                raise  # a request that does not pickle: nothing was written
            return p

    # answers (the reader thread) -----------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                try:
                    ready = wait_ready([self.conn, self.proc.sentinel], timeout=0.5)
                except (OSError, ValueError):  # the pipe was closed (the worker is being stopped)
                    self._fail(EnvironmentFailure, f"{self.label}: its pipe is closed")
                    return
                if self.conn in ready:
                    try:
                        status, body = self.conn.recv()
                    except (EOFError, OSError):
                        self._gone()
                        return
                    with self.cond:
                        if self.waiting:
                            p = self.waiting.popleft()
                            if status == "ok":
                                p._settle(body)
                            else:
                                p._settle(error=self._error(body, p.what))
                        self._since = time.monotonic()
                        self.cond.notify_all()
                elif ready:  # the process ended and left nothing more in the pipe
                    self._gone()
                    return
                else:
                    with self.cond:
                        hung = bool(self.waiting) and time.monotonic() - self._since > self.timeout_s
                    if hung:
                        self._fail(EnvironmentTimeout, f"{self.label} did not answer within {self.timeout_s:.0f} s "
                                                       f"(the environment's call timeout and a margin): stopped it")
                        return
        except BaseException as exc:  # never leave a waiting call hanging
            self._fail(EnvironmentFailure, f"{self.label}: reading its answers failed: {exc!r}")

    def _gone(self, otherwise: str | None = None) -> None:
        """The worker's pipe closed: it died (or was stopped); ``otherwise`` if it is still alive."""
        try:
            self.proc.join(2.0)  # reaps it (its pipe may close a moment before it can be)
        except Exception:
            pass
        code = self.proc.exitcode
        if code is None and otherwise is not None and not wait_ready([self.proc.sentinel], 0):
            why = otherwise
        else:
            why = f"{self.label} {'was stopped' if self.stopping else f'died ({_exit_text(code)})'}"
        self._fail(EnvironmentFailure, why)

    def _fail(self, kind: type, why: str) -> None:
        """Mark the worker broken and end it; every call still waiting on it fails with ``kind``."""
        with self.cond:
            if self.broken is None:
                self.broken = (kind, why)
            kind, why = self.broken
            while self.waiting:
                p = self.waiting.popleft()
                p._settle(None, kind(f"{why}, before answering {p.what}"))
            self.cond.notify_all()
        self._kill()  # first: a send blocked on a hung worker's full pipe then fails, and frees the lock
        with self.send_lock:  # no send is writing to the pipe as it closes
            try:
                self.conn.close()
            except OSError:
                pass

    def _error(self, info: dict[str, Any], what: str) -> BaseException:
        """The worker's exception as the same type, its message carrying the worker's traceback
        (the guard's own errors name adapter, call, task and step already: one line)."""
        original = None
        if info["blob"] is not None:
            try:
                original = pickle.loads(info["blob"])
            except Exception:
                original = None
        if isinstance(original, (AdapterContractError, AdapterError)):
            return type(original)(f"{info['text']} [in {self.label}]")
        text = (f"{info['text']} [in {self.label}, {what}; the worker's traceback:\n"
                f"{info['traceback'].rstrip()}]")
        if original is None:
            return EnvironmentFailure(f"{info['type']}: {text}")
        try:
            exc = type(original)(text)
        except Exception:  # a type that takes other arguments: the original, with the traceback as a note
            original.add_note(text)
            return original
        return exc

    def _kill(self) -> None:
        if self.proc.is_alive():
            try:
                self.proc.kill()
            except (OSError, ValueError):
                pass

    # stopping ------------------------------------------------------------------------------------
    def ask_to_stop(self) -> None:
        self.stopping = True
        with self.send_lock:
            if self.broken is None:
                try:
                    self.conn.send(("stop",))
                except (OSError, ValueError):
                    pass

    def finish_stop(self, timeout_s: float = STOP_S) -> None:
        """Wait for the worker to close its environments and exit; terminate it after ``timeout_s``."""
        self.proc.join(timeout_s)
        if self.proc.is_alive():
            self.proc.terminate()  # its JVMs end with it (their stdin closes)
            self.proc.join(5.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5.0)
        self._reader.join(5.0)
        self._fail(EnvironmentFailure, f"{self.label} was stopped")

    @property
    def pid(self) -> int | None:
        return self.proc.pid


# -- the pool -----------------------------------------------------------------------------------
_PLACE: list[int] = []  # the slot of the environment being built (set by the rollout, see placed())


@contextmanager
def placed(slot: int) -> Iterator[None]:
    """Environments built in this block go to worker ``slot % N`` (the rollout's slot i -> worker i % N)."""
    _PLACE.append(slot)
    try:
        yield
    finally:
        _PLACE.pop()


class WorkerPool:
    """``workers`` processes that host environments built by ``factory`` (picklable: spawn)."""

    def __init__(self, factory: Callable[[], Environment], workers: int, timeout_s: float | None = None,
                 grace_s: float = GRACE_S) -> None:
        """``timeout_s``: env.call_timeout_s (None, a pool built in code: configs/env_common.yaml's)."""
        if timeout_s is None:
            from .guard import shipped_limits

            timeout_s = shipped_limits().call_timeout_s
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"env.workers={workers!r}: a pool needs an integer number of processes >= 1")
        self.factory, self.n, self.timeout_s = factory, workers, float(timeout_s) + float(grace_s)
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker | None] = [None] * workers
        self._ids = itertools.count()
        self._rr = itertools.count()
        self._pure: dict[tuple, Any] = {}  # (method, argument) -> answer or Pending: max_steps, action_forms
        self.stopped = False

    def worker(self, i: int) -> _Worker:
        """Worker ``i``, started (again, when the previous one died or was stopped)."""
        if self.stopped:
            raise EnvironmentFailure("the environment worker pool was stopped")
        w = self._workers[i]
        if w is None or w.broken is not None:
            if w is not None:
                w.finish_stop(0.0)  # reap it
            w = self._workers[i] = _Worker(self._ctx, self.factory, i, self.timeout_s)
        return w

    def env(self, slot: int | None = None) -> WorkerEnv:
        """A new environment in worker ``slot % N``; ``slot`` defaults to the rollout's placement
        (:func:`placed`), else round robin."""
        if slot is None:
            slot = _PLACE[-1] if _PLACE else next(self._rr)
        w = self.worker(slot % self.n)
        env_id = next(self._ids)
        name, version = w.request("make (a new environment)", "make", env_id).result()
        return WorkerEnv(self, w, env_id, name, version)

    def pids(self) -> list[int]:
        """The live workers' process ids."""
        return [w.pid for w in self._workers if w is not None and w.proc.is_alive()]

    def stop(self) -> None:
        """Stop every worker (each closes its environments first); idempotent."""
        self.stopped = True
        live = [w for w in self._workers if w is not None]
        for w in live:
            w.ask_to_stop()  # all at once: they close their simulators in parallel
        for w in live:
            w.finish_stop()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # config-pure answers, asked once for the pool -------------------------------------------------
    def ask_pure(self, env: WorkerEnv, method: str, arg: Any, wait: bool = True) -> Any:
        key = (method, arg)
        for _ in range(2):
            got = self._pure.get(key)
            if got is None:
                got = self._pure[key] = env._send(method, arg)
            if not wait:
                return None
            if not isinstance(got, Pending):
                return got
            try:
                value = got.result()
            except EnvironmentFailure:
                self._pure.pop(key, None)
                if got.worker is env.worker:
                    raise
                continue  # asked of a worker that died since: ask this environment's
            self._pure[key] = value
            return value
        raise AssertionError("unreachable")  # pragma: no cover


class WorkerEnv:
    """An environment that lives in a worker process; implements :class:`Environment`, plus
    ``step_async``/``reset_async`` (the request is sent now; ``.result()`` is its answer)."""

    def __init__(self, pool: WorkerPool, worker: _Worker, env_id: int, name: str, version: str) -> None:
        self.pool, self.worker, self.env_id = pool, worker, env_id
        self.name, self._version = name, version
        self.closed = False

    @property
    def version(self) -> str:
        return self._version

    @property
    def pid(self) -> int | None:
        """The process that hosts this environment."""
        return self.worker.pid

    def _send(self, method: str, *args: Any, **kwargs: Any) -> Pending:
        what = f"{method}{args!r:.120}"
        return self.worker.request(what, "call", self.env_id, method, args, kwargs)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Any other method of the hosted environment (an adapter's extras)."""
        return self._send(method, *args, **kwargs).result()

    def tasks(self, split: str) -> list[Task]:
        return self.call("tasks", split)

    def max_steps(self, task: Task) -> int:
        return self.pool.ask_pure(self, "max_steps", task)

    def action_forms(self, game: str) -> list[str]:
        return self.pool.ask_pure(self, "action_forms", game)

    def expert_actions(self, task: Task) -> list[str]:
        return self.call("expert_actions", task)

    def reset_async(self, task: Task, *args: Any, **kwargs: Any) -> Pending:
        # what the rollout asks next (the episode's step limit and action forms), queued ahead of
        # the reset: the answers are in when the reset's is, without a round trip of their own
        self.pool.ask_pure(self, "max_steps", task, wait=False)
        self.pool.ask_pure(self, "action_forms", task.game, wait=False)
        return self._send("reset", task, *args, **kwargs)

    def reset(self, task: Task, *args: Any, **kwargs: Any) -> tuple[str, StepResult]:
        return self.reset_async(task, *args, **kwargs).result()

    def step_async(self, action: str) -> Pending:
        return self._send("step", action)

    def step(self, action: str) -> StepResult:
        return self.step_async(action).result()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.worker.broken is not None:  # its worker is gone, and the environment with it
            return
        try:
            self.worker.request(f"close of environment {self.env_id}", "close", self.env_id).result()
        except EnvironmentFailure:
            if self.worker.broken is None:  # the environment's own close failed, not its worker
                raise


class FaultyWorkerEnv(FaultyEnv):
    """Fault injection (envs/faults.py) around a worker's environment, in the rollout's process,
    with the asynchronous calls: a fault is drawn when the call is sent, as :class:`FaultyEnv`
    draws it when the call is made; a timeout or crash raises then (nothing is sent), and a
    malformed answer is waited for and raises then too, so the ledger records every injected
    fault at the point of the rollout's calls where an in-process rollout records it. (The
    sequence of ``FaultyEnv.reset``/``step``, split at the simulator's answer.)"""

    def reset_async(self, task: Task, *args: Any, **kwargs: Any):
        self._task, self._call = task, 0
        self._exempt, self._gold_task = self._gold_task == task.task_id, None
        kind = self._before("reset")
        pending = self.inner.reset_async(task, *args, **kwargs)

        def finish(answer):
            instruction, res = answer
            if not isinstance(instruction, str):
                raise EnvironmentFailure(f"{self.name} reset on {task.task_id}: malformed instruction "
                                         f"{instruction!r:.80}")
            return instruction, self._after(kind, "reset", res)
        return Ready(finish(pending.result())) if kind == "malformed" else Then(pending, finish)

    def step_async(self, action: str):
        self._call += 1
        kind = self._before("step")
        pending = self.inner.step_async(action)
        finish = functools.partial(self._after, kind, "step")
        return Ready(finish(pending.result())) if kind == "malformed" else Then(pending, finish)


# -- rollouts: env.workers in the env config ----------------------------------------------------
def worker_count(cfg: dict[str, Any]) -> int:
    """``env.workers`` (absent or null: 0), checked; errors name the key."""
    n = cfg.get("workers") or 0
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"env.workers={n!r}: the number of worker processes that host the environments must be "
                         f"an integer >= 0 (0: in the rollout's process)")
    return n


def _build_local(cfg: dict[str, Any]) -> Environment:
    """A worker's factory: the environment of ``cfg`` built in that process (faults are injected
    in the rollout's process, around the worker's environment)."""
    return registry.build(cfg)


class _Hosting:
    """The worker pools of one rollout, one per env config; stopped when the rollout ends."""

    def __init__(self) -> None:
        self.pools: dict[str, WorkerPool] = {}

    def env(self, cfg: dict[str, Any]) -> Environment:
        local = {k: v for k, v in cfg.items() if k not in ("workers", "faults")}
        key = json.dumps([worker_count(cfg), local], sort_keys=True, default=str)
        pool = self.pools.get(key)
        if pool is None:
            from .guard import Limits

            timeout = Limits.of(cfg).call_timeout_s  # the guard's bound in the worker; the pool adds GRACE_S
            pool = self.pools[key] = WorkerPool(functools.partial(_build_local, local), worker_count(cfg), timeout)
        env: Environment = pool.env()
        faults = FaultConfig.from_dict(cfg.get("faults"))
        return FaultyWorkerEnv(env, faults) if faults.enabled else env

    def stop(self) -> None:
        pools, self.pools = list(self.pools.values()), {}
        for pool in pools:
            pool.stop()

    def pids(self) -> list[int]:
        return [p for pool in self.pools.values() for p in pool.pids()]


_HOSTING: list[_Hosting] = []


@contextmanager
def hosting() -> Iterator[_Hosting]:
    """Within this block :func:`eto_train.envs.make_env` puts the environments of a config with
    ``workers`` > 0 in worker processes; they stop when the block ends (normally or not)."""
    scope = _Hosting()
    _HOSTING.append(scope)
    try:
        yield scope
    finally:
        _HOSTING.remove(scope)
        scope.stop()


def hosted_env(cfg: dict[str, Any]) -> Environment | None:
    """The environment of ``cfg`` in a worker process when a rollout hosts them (inside
    :func:`hosting`, ``env.workers`` > 0); else None (build it in this process)."""
    if not _HOSTING or worker_count(cfg) == 0:
        return None
    return _HOSTING[-1].env(cfg)


def live_worker_pids() -> list[int]:
    """The worker processes of the rollouts now running in this process (for tests and checks)."""
    return [p for scope in _HOSTING for p in scope.pids()]


__all__ = ["FaultyWorkerEnv", "Pending", "Ready", "Then", "WorkerEnv", "WorkerPool", "hosted_env", "hosting",
           "live_worker_pids", "placed", "sends_async", "worker_count"]
