"""ScienceWorld adapter (package ``scienceworld``, Java 17) with the ETO paper's splits.

Splits, step limits and task numbers are the paper's files in ``data/sciworld_eto``: train
(1483 variations: behavior cloning and exploration), ``seen`` (ETO's dev list, 194) and
``unseen`` (ETO's test list, 211). A task is ``Task(game=<ETO task name>, seed=<variation>)``;
its id has the paper's ``<task number>_<variation>`` form (:class:`SciWorldTask`).

Scoring as the paper: reward = score / 100 (the best reached so far, as ETO's evaluation keeps
the maximum), a negative score ends the episode as a failure, success = task completed.

Speed. The package's ``ScienceWorldEnv.step`` asks the simulator for every valid
action-object combination, the look and inventory texts on every call, several times the cost
of the step itself (``make bench`` measures both). The adapter drives the simulator's Java object
directly and reads only the score and the completion flag; ``valid_actions: true`` in the config
restores the action list.

JVMs. The package starts its JVM without a heap cap (the heap may then grow to a quarter of the
machine's memory) and offers no option for it, so the adapter launches the jar itself through
py4j with ``-Xmx``. One JVM hosts up to ``games_per_jvm`` adapters (a live game holds ~10 MB;
the JVM itself ~350 MB), because a pool of parallel episodes with one JVM each spends minutes
starting and warming Java on a small CPU box. A JVM stops when its last adapter closes, at
interpreter exit, or on a simulator error; py4j's ``die_on_exit`` also ends it when Python is
killed outright (its stdin closes).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
import weakref
from dataclasses import dataclass
from importlib.metadata import version as pkg_version
from pathlib import Path
from typing import Annotated, Any, Optional, Union

from pydantic import AfterValidator, Field

from ..config import EnvSection, Flag, Int, Num, Rule, Text, Texts, allowed, one_of
from ..layout import from_repo
from .base import EnvironmentFailure, EnvironmentTimeout, StepResult, Task
from .jvm import stop_jvm

logging.getLogger("py4j").setLevel(logging.ERROR)  # py4j logs every gateway start at INFO

# ETO's taskname2id.json skips number 5: by its alphabetical numbering that is the one task ETO
# left out of every split. Added so that all 30 tasks have a number.
EXTRA_TASK_NUMBERS = {"task-10-measure-melting-point-(unknown-substance)": 5}
NO_MATCH = "No known action matches that input."
ELECTRICAL = ("power-component", "conductivity")  # tasks that keep connect/disconnect under "easy"
SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                   "noElectricalAction")  # the jar accepts unknown labels at load, then fails each step


def _simplifications(v: str | None) -> str | None:
    bad = [s for s in (v or "").split(",") if s and s not in SIMPLIFICATIONS]
    if bad:
        raise allowed(f"comma-separated, each {one_of(SIMPLIFICATIONS)}")
    return v


@dataclass(frozen=True)
class SciWorldTask(Task):
    """A ScienceWorld variation; ``task_id`` is the paper's ``<task number>_<variation>``."""

    number: int = -1

    @property
    def task_id(self) -> str:
        return f"{self.number}_{self.seed}"


# -- JVM hosts ------------------------------------------------------------------------------
def _stop_jvm(proc: subprocess.Popen, gateways: list, owner: int) -> None:
    """End one simulator JVM (a module function: the finalizer must not hold the host)."""
    if os.getpid() != owner:  # a forked child inherited the finalizer: the JVM is not its own
        return
    stop_jvm(proc, gateways)


class _Host:
    """One simulator JVM and the games (Java ``PythonInterface`` objects) it hosts."""

    def __init__(self, key: tuple, heap_mb: int, options: list[str], timeout_s: float) -> None:
        from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
        from scienceworld.constants import BASEPATH, JAR_PATH

        self.key, self.games = key, 0
        # In its own process group: a Ctrl-C at the terminal reaches Python only, which then stops
        # the games and this JVM quietly (eto_train.interrupt) instead of every call in flight
        # failing under a JVM that died at once.
        port, self.proc = launch_gateway(classpath=JAR_PATH, javaopts=[f"-Xmx{heap_mb}m", *options],
                                         die_on_exit=True, cwd=BASEPATH, return_proc=True,
                                         create_new_process_group=True)
        gateways: list = []
        self._stop = weakref.finalize(self, _stop_jvm, self.proc, gateways, os.getpid())  # and at exit
        try:
            gateways.append(JavaGateway(gateway_parameters=GatewayParameters(
                port=port, auto_field=True, read_timeout=timeout_s), java_process=self.proc))
        except Exception:
            self.stop()
            raise
        self.gateway = gateways[0]

    @property
    def alive(self) -> bool:
        return self._stop.alive and self.proc.poll() is None

    def new_game(self):
        return self.gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()

    def stop(self) -> None:
        if self in _HOSTS:
            _HOSTS.remove(self)
        self._stop()


_HOSTS: list[_Host] = []


def _acquire(heap_mb: int, options: list[str], timeout_s: float, capacity: int) -> _Host:
    key = (heap_mb, tuple(options), timeout_s)
    host = next((h for h in _HOSTS if h.key == key and h.alive and h.games < capacity), None)
    if host is None:
        try:
            host = _Host(key, heap_mb, options, timeout_s)
        except Exception as exc:
            raise EnvironmentFailure(f"ScienceWorld JVM did not start: {exc}") from exc
        _HOSTS.append(host)
    host.games += 1
    return host


def _release(host: _Host) -> None:
    host.games -= 1
    if host.games <= 0:
        host.stop()


# The simulator's folds are contiguous ranges of variations: simulator task name -> (first dev
# variation, first test variation, number of variations), as scienceworld 1.2.3's jar reports them
# (getVariationsTrain/Dev/Test; tests/test_sciworld.py checks the table against the jar). A table,
# so that listing tasks needs no JVM.
FOLDS = {
    "boil": (14, 21, 30), "melt": (14, 21, 30), "freeze": (14, 21, 30),
    "change-the-state-of-matter-of": (14, 21, 30), "use-thermometer": (270, 405, 540),
    "measure-melting-point-known-substance": (218, 327, 436),
    "measure-melting-point-unknown-substance": (150, 225, 300), "power-component": (10, 15, 20),
    "power-component-renewable-vs-nonrenewable-energy": (10, 15, 20),
    "test-conductivity": (450, 675, 900), "test-conductivity-of-unknown-substances": (300, 450, 600),
    "find-living-thing": (150, 225, 300), "find-non-living-thing": (150, 225, 300),
    "find-plant": (150, 225, 300), "find-animal": (150, 225, 300), "grow-plant": (62, 93, 126),
    "grow-fruit": (62, 93, 126), "chemistry-mix": (16, 24, 32),
    "chemistry-mix-paint-secondary-color": (18, 27, 36), "chemistry-mix-paint-tertiary-color": (18, 27, 36),
    "lifespan-longest-lived": (62, 93, 125), "lifespan-shortest-lived": (62, 93, 125),
    "lifespan-longest-lived-then-shortest-lived": (62, 93, 125), "identify-life-stages-1": (6, 9, 14),
    "identify-life-stages-2": (4, 6, 10), "inclined-plane-determine-angle": (84, 126, 168),
    "inclined-plane-friction-named-surfaces": (692, 1038, 1386),
    "inclined-plane-friction-unnamed-surfaces": (80, 120, 162),
    "mendelian-genetics-known-plant": (60, 90, 120), "mendelian-genetics-unknown-plant": (240, 360, 480),
}


class ScienceWorldEnv:
    """One live ScienceWorld game; implements :class:`eto_train.envs.base.Environment`.

    Experts are the simulator's gold action sequences (``generateGoldPath``): actions only.
    The paper's expert data added a written thought before each action; import those
    trajectories (``records.from_eto``) where you have them.
    """

    name = "sciworld"

    class Config(EnvSection):
        """The ``env`` section of configs/env/sciworld.yaml."""

        step_limit: Int(ge=1, null="the paper's per-task limits, max_steps.json", when=" (max steps per episode)")
        default_step_limit: Int(ge=1)
        splits: Annotated[dict[str, Annotated[str, Field(min_length=1),
                                              Rule("a file of [task, variation] pairs in env.data_dir")]],
                          Field(min_length=1), Rule("a mapping of split name -> file")]
        data_dir: Text()
        simplifications: Annotated[Optional[str], AfterValidator(_simplifications),
                                   Rule(f"comma-separated, each {one_of(SIMPLIFICATIONS)}")]
        tasks: Annotated[Optional[list[Union[Annotated[str, Field(min_length=1)], int]]], Field(min_length=1),
                         Rule("a non-empty list of ETO task names or task numbers, or null (all tasks)")]
        limit_per_task: Int(ge=1, null="every variation")
        heap_mb: Int(ge=1)
        games_per_jvm: Int(ge=1)
        jvm_options: Texts(nonempty=False, null="none")
        timeout_s: Num(gt=0)
        valid_actions: Flag

    def __init__(self, splits: dict[str, str], data_dir: str = "data/sciworld_eto",
                 simplifications: str = "easy", tasks: list[str | int] | None = None,
                 limit_per_task: int | None = None, step_limit: int | None = None,
                 default_step_limit: int = 100, heap_mb: int = 512, games_per_jvm: int = 8,
                 jvm_options: list[str] | None = None, timeout_s: float = 120.0,
                 valid_actions: bool = False, **_: Any) -> None:
        from scienceworld.utils import infer_task

        self.data_dir = self._find(data_dir)
        self.numbers: dict[str, int] = {**self._read("taskname2id.json"), **EXTRA_TASK_NUMBERS}
        self.limits: dict[str, int] = self._read("max_steps.json")
        self.splits = dict(splits)
        for split, f in self.splits.items():
            if not (self.data_dir / f).is_file():
                raise ValueError(f"env.splits.{split}: no file {f} in {self.data_dir}")
        self.sim_names = {t: infer_task(t) for t in self.numbers}  # ETO name -> simulator name
        self.keep = self._task_filter(tasks)
        self.limit_per_task = None if limit_per_task is None else int(limit_per_task)
        self.step_limit = None if step_limit is None else int(step_limit)
        self.default_step_limit = int(default_step_limit)
        self.simplifications = str(simplifications or "")
        bad = [s for s in self.simplifications.split(",") if s and s not in SIMPLIFICATIONS]
        if bad:
            raise ValueError(f"env.simplifications: unknown {bad}; comma-separated from {SIMPLIFICATIONS}")
        self.heap_mb, self.jvm_options = int(heap_mb), list(jvm_options or [])
        self.timeout_s, self.games_per_jvm = float(timeout_s), max(1, int(games_per_jvm))
        self.list_valid = bool(valid_actions)
        self._host: _Host | None = None
        self._game = None  # the Java game object, started on first use
        self._best = 0.0

    # -- configuration ----------------------------------------------------------------------
    @staticmethod
    def _find(data_dir: str) -> Path:
        p = from_repo(data_dir, Path.is_dir)
        if not (p / "taskname2id.json").is_file():
            raise ValueError(f"env.data_dir: {data_dir} has no taskname2id.json (the ETO split files)")
        return p

    def _read(self, name: str) -> Any:
        return json.loads((self.data_dir / name).read_text())

    def _task_filter(self, tasks: list[str | int] | None) -> set[str] | None:
        if not tasks:
            return None
        by_number = {str(n): t for t, n in self.numbers.items()}
        keep = {t if t in self.numbers else by_number.get(str(t), "") for t in tasks}
        if "" in keep:
            bad = [t for t in tasks if t not in self.numbers and str(t) not in by_number]
            raise ValueError(f"env.tasks: unknown ScienceWorld task(s) {bad}; use ETO task names "
                             f"or numbers: {sorted(self.numbers, key=self.numbers.get)}")
        return keep

    @property
    def version(self) -> str:
        limits = "eto" if self.step_limit is None else str(self.step_limit)
        return (f"scienceworld=={pkg_version('scienceworld')};simplifications={self.simplifications};"
                f"step_limits={limits};valid_actions={self.list_valid}")

    def all_games(self) -> list[str]:
        """The 30 tasks by ETO name, in task-number order."""
        return sorted(self.numbers, key=self.numbers.get)

    def tasks(self, split: str) -> list[Task]:
        if split not in self.splits:
            raise KeyError(f"env.splits has no split {split!r} (has {sorted(self.splits)})")
        pairs = self._read(self.splits[split])
        taken: dict[str, int] = {}
        out = []
        for game, variation in pairs:
            if self.keep is not None and game not in self.keep:
                continue
            if self.limit_per_task is not None and taken.get(game, 0) >= self.limit_per_task:
                continue
            taken[game] = taken.get(game, 0) + 1
            out.append(SciWorldTask("sciworld", game, self._fold(game, int(variation)), int(variation),
                                    split, number=self.numbers[game]))
        return out

    def _fold(self, game: str, variation: int) -> str:
        """The simulator's own fold of a variation (ETO's train list also draws on dev ones)."""
        dev, test, total = FOLDS[self.sim_names[game]]
        if not 0 <= variation < total:
            raise ValueError(f"{game} has variations 0..{total - 1}, the split lists {variation}")
        return "train" if variation < dev else "dev" if variation < test else "test"

    def max_steps(self, task: Task) -> int:
        if self.step_limit is not None:
            return self.step_limit
        return int(self.limits.get(task.game, self.default_step_limit))

    def action_forms(self, game: str) -> list[str]:
        simpl = self.simplifications
        forms = ["look around", "look at <object>", "look in <container>", "read <object>",
                 "go to <location>", "open <object>", "close <object>", "pick up <object>",
                 "put down <object>", "move <object> to <container>", "pour <object> into <container>",
                 "dunk <object> into <container>", "mix <container>", "activate <device>",
                 "deactivate <device>", "use <device> on <object>", "eat <object>", "flush <object>",
                 "focus on <object>", "wait", "wait1", "inventory", "task"]
        if "easy" in simpl or "teleportAction" in simpl:
            forms.insert(5, "teleport to <location>")
        no_electric = "easy" in simpl or "noElectricalAction" in simpl
        if not no_electric or any(e in self.sim_names.get(game, game) for e in ELECTRICAL):
            forms[-5:-5] = ["connect <object> to <object>", "disconnect <object>"]
        return forms

    # -- the simulator ----------------------------------------------------------------------
    def _call(self, method: str, *args):
        if self._game is None:
            raise EnvironmentFailure("ScienceWorld: no live game (closed, or failed earlier: reset first)")
        t0 = time.monotonic()
        try:  # even the attribute lookup talks to the JVM
            return getattr(self._game, method)(*args)
        except Exception as exc:  # py4j / JVM errors: the simulator, not the model, failed
            from py4j.protocol import Py4JJavaError

            slow = time.monotonic() - t0 >= self.timeout_s
            # A Java exception leaves the JVM sound but this game in an unknown state; a network
            # error or a timeout may leave the JVM itself broken: stop it (a new one starts on reset).
            self._drop(stop_jvm=not isinstance(exc, Py4JJavaError))
            kind = EnvironmentTimeout if slow else EnvironmentFailure
            raise kind(f"ScienceWorld {method}{args!r:.120} failed: {str(exc)[:300]}") from exc

    def _load(self, game: str, variation: int, gold: bool) -> None:
        if game not in self.sim_names:
            raise ValueError(f"unknown ScienceWorld task {game!r}")
        if self._game is None:
            self._host = _acquire(self.heap_mb, self.jvm_options, self.timeout_s, self.games_per_jvm)
            try:
                self._game = self._host.new_game()
            except Exception as exc:
                self._drop(stop_jvm=True)
                raise EnvironmentFailure(f"ScienceWorld game could not start: {exc}") from exc
        # load() builds a fresh game; the package's reset() would regenerate the gold path again.
        msg = self._call("load", self.sim_names[game], variation, self.simplifications, gold)
        if msg:  # a variation out of range: the data, not the simulator, is wrong
            raise ValueError(f"ScienceWorld cannot load {game} variation {variation}: {msg}")

    def _drop(self, stop_jvm: bool = False) -> None:
        game, host, self._game, self._host = self._game, self._host, None, None
        if game is not None:
            try:
                game._detach()  # lets Java collect the game
            except Exception:
                pass
        if host is not None:
            if stop_jvm:
                host.stop()
            _release(host)

    def _result(self, observation: Any) -> StepResult:
        if not isinstance(observation, str):
            raise EnvironmentFailure(f"ScienceWorld returned a non-text observation: {observation!r:.200}")
        score = float(self._call("getScore"))
        completed = bool(self._call("getCompleted"))
        failure = score < 0
        self._best = max(self._best, score)
        valid = [str(a) for a in self._call("getValidActionObjectCombinations")] if self.list_valid else None
        return StepResult(observation=observation.strip(), reward=self._best, done=completed or failure,
                          success=completed and not failure, failure=failure, valid_actions=valid,
                          info={"score": round(100 * score), "recognized": observation.strip() != NO_MATCH})

    # -- episode ----------------------------------------------------------------------------
    def reset(self, task: Task) -> tuple[str, StepResult]:
        self._load(task.game, task.seed, gold=False)
        self._best = 0.0
        instruction = str(self._call("getTaskDescription")).strip()
        # As the package's reset: the first observation is that of "look around".
        return instruction, self._result(self._call("step", "look around"))

    def step(self, action: str) -> StepResult:
        return self._result(self._call("step", action))

    def expert_actions(self, task: Task) -> list[str]:
        self._load(task.game, task.seed, gold=True)
        return [str(a) for a in self._call("getGoldActionSequence")]

    def close(self) -> None:
        self._drop()

    def __del__(self) -> None:  # an adapter dropped without close() still frees its JVM share
        try:
            self._drop()
        except Exception:
            pass
