"""TextWorldExpress adapter (package ``textworld-express``; one small JVM per instance).

Splits. The game's dev/test folds use object names that never occur in its train fold, so a
model trained from scratch cannot act there. The project therefore names two held-out splits:
``seen`` = held-out seeds of the train fold (disjoint from the training seeds) and ``unseen`` =
seeds of the dev or test fold. Seeds are positions in the game's own list of valid seeds for a
fold, so a config never names a seed the game cannot generate.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
from collections import deque
from importlib.metadata import version as pkg_version
from typing import Annotated, Any, Optional

from pydantic import Field

from ..config import Choice, EnvSection, Int, Rule, Section
from .base import EnvironmentFailure, StepResult, Task
from .jvm import stop_jvm
from .twx_games import ACTION_FORMS

FOLDS = ("train", "dev", "test")

# The TextWorldExpress version whose game internals :meth:`TextWorldExpressEnv.twc_places` reads
# (TWCGame.locations/scorer, FastObject.canonicalLocations/currentContainer/contents, Room.location*).
TWC_INTERNALS_VERSION = "1.1.0"
_DIRECTIONS = ("North", "South", "East", "West")

logging.getLogger("py4j").setLevel(logging.ERROR)  # py4j logs every gateway start at INFO


class _Host:
    """The JVM of the package's jar, launched as the package launches it (same jar and options)
    but in its own process group, so that a Ctrl-C at the terminal reaches Python only: Python
    then stops the games and the JVM, rather than every call in flight failing under a JVM that
    died at once (see eto_train.interrupt). ``die_on_exit`` still ends it when Python is killed
    outright (its stdin closes). No callback server: the games never call back into Python."""

    def __init__(self) -> None:
        from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
        from textworld_express.constants import BASEPATH, JAR_PATH

        self._owner = os.getpid()  # a forked child that inherits this object must not stop the JVM
        port, proc = launch_gateway(classpath=JAR_PATH, die_on_exit=True, cwd=BASEPATH, javaopts=["-Xverify:none"],
                                    return_proc=True, create_new_process_group=True)
        try:
            self._gateway = JavaGateway(gateway_parameters=GatewayParameters(auto_field=True, port=port),
                                        java_process=proc)
        except Exception:
            _stop(proc, None)
            raise

    def close(self) -> None:
        if os.getpid() == self._owner:
            _stop(self._gateway.java_process, self._gateway)


def _stop(proc, gateway) -> None:
    """End the JVM quietly, whether it is alive or already gone."""
    stop_jvm(proc, [gateway] if gateway is not None else [])


class _SharedJVM:
    """One JVM per process hosts every game instance.

    The package starts a JVM per ``TextWorldExpressEnv`` (about 0.3 s, 50 MB, and a cold first
    ``load`` of about 0.5-0.9 s each). A pool of 32 parallel episodes then spent most of its
    time starting Java. Game objects (``PythonInterface``) are independent, so we create them
    all through one gateway to the package's jar (:class:`_Host`). A JVM that died is replaced
    on the next request; it is shut down at interpreter exit (and dies with the process anyway).
    """

    _host = None
    _at_exit = False

    @classmethod
    def new_game(cls):
        host = cls._host
        if host is None or host._gateway.java_process.poll() is not None:
            if host is not None:
                host.close()  # a JVM that died: free its sockets
            cls._host = host = _Host()
            if not cls._at_exit:
                atexit.register(cls.shutdown)
                cls._at_exit = True
        return host._gateway.jvm.textworldexpress.runtime.PythonInterface()

    @classmethod
    def shutdown(cls) -> None:
        host, cls._host = cls._host, None
        if host is not None:
            try:
                host.close()
            except Exception:
                pass


class TextWorldExpressEnv:
    """One live TextWorldExpress game; implements :class:`eto_train.envs.base.Environment`."""

    name = "twx"
    # the game's own score: a lost sorting, arithmetic, peckingorder or simonsays game scores -1
    # (the guard checks every reward against it, envs/guard.py)
    reward_range = (-1.0, 1.0)

    class Config(EnvSection):
        """The ``env`` section of configs/env/twx.yaml."""

        class Game(Section):
            name: Choice(tuple(ACTION_FORMS), what="a TextWorldExpress game")
            params: Annotated[Optional[str], Rule("a string of game parameters, e.g. 'numLocations=3'")] = ""

        class Split(Section):
            fold: Choice(FOLDS)
            start: Int(ge=0)
            count: Int(ge=1)

        step_limit: Int(ge=1, when=" (max steps per episode)")
        games: Annotated[list[Game], Field(min_length=1),
                         Rule(f"a non-empty list of {{name: <game>, params: <str>}}, game one of "
                              f"{', '.join(map(repr, ACTION_FORMS))}")]
        splits: Annotated[dict[str, Annotated[Split, Rule(f"{{fold: {'|'.join(FOLDS)}, start: <int >= 0>, "
                                                          "count: <int >= 1>}")]],
                          Field(min_length=1), Rule("a mapping of split name -> {fold, start, count}")]

    def __init__(self, games: list[dict[str, Any]], splits: dict[str, dict[str, Any]],
                 step_limit: int, **_: Any) -> None:
        self.games = {g["name"]: str(g.get("params", "") or "") for g in games}
        unknown = sorted(set(self.games) - set(ACTION_FORMS))
        if unknown:
            raise ValueError(f"env.games: unknown TextWorldExpress game(s) {unknown}; "
                             f"choose from {sorted(ACTION_FORMS)}")
        self.splits = splits
        self.step_limit = int(step_limit)
        self._check_splits()
        self._game = _SharedJVM.new_game()  # the Java game object; we drive it directly
        self._loaded: tuple[str, str] | None = None
        self._seed_lists: dict[tuple[str, str], list[int]] = {}

    # -- configuration ----------------------------------------------------------------------
    def _check_splits(self) -> None:
        ranges: dict[str, list[tuple[int, int, str]]] = {}
        for split, spec in self.splits.items():
            fold = spec.get("fold")
            if fold not in FOLDS:
                raise ValueError(f"env.splits.{split}.fold: {fold!r} is not one of {FOLDS}")
            start, count = int(spec["start"]), int(spec["count"])
            for other_start, other_end, other in ranges.get(fold, []):
                if start < other_end and other_start < start + count:
                    raise ValueError(
                        f"env.splits.{split} (fold {fold}, seeds {start}..{start + count - 1}) "
                        f"overlaps env.splits.{other}: held-out seeds must be disjoint from training seeds")
            ranges.setdefault(fold, []).append((start, start + count, split))

    @property
    def version(self) -> str:
        games = ",".join(f"{g}[{p}]" for g, p in sorted(self.games.items()))
        return f"textworld-express=={pkg_version('textworld-express')};games={games};step_limit={self.step_limit}"

    def _valid_seeds(self, game: str, fold: str) -> list[int]:
        key = (game, fold)
        if key not in self._seed_lists:
            self._load(game)
            getter = {"train": "getSeedsTrain", "dev": "getSeedsDev", "test": "getSeedsTest"}[fold]
            self._seed_lists[key] = sorted(int(s) for s in self._call(getter))
        return self._seed_lists[key]

    def tasks(self, split: str) -> list[Task]:
        if split not in self.splits:
            raise KeyError(f"env.splits has no split {split!r} (has {sorted(self.splits)})")
        spec = self.splits[split]
        fold, start, count = spec["fold"], int(spec["start"]), int(spec["count"])
        out = []
        for game in self.games:
            seeds = self._valid_seeds(game, fold)
            if start + count > len(seeds):
                raise ValueError(f"env.splits.{split}: {game} has only {len(seeds)} {fold} seeds, "
                                 f"asked for positions {start}..{start + count - 1}")
            out += [Task("twx", game, fold, seeds[i], split) for i in range(start, start + count)]
        return out

    def max_steps(self, task: Task) -> int:
        return self.step_limit

    def action_forms(self, game: str) -> list[str]:
        return ACTION_FORMS[game]

    # -- episode ----------------------------------------------------------------------------
    def _load(self, game: str) -> None:
        key = (game, self.games[game])
        if self._loaded != key:
            msg = self._call("load", game, key[1])
            if msg:
                raise ValueError(f"env.games: TextWorldExpress cannot load {game} with params {key[1]!r}: {msg}")
            self._loaded = key

    def _call(self, method: str, *args):
        if self._game is None:
            raise EnvironmentFailure("TextWorldExpress game used after close()")
        try:  # even the attribute lookup talks to the JVM
            return getattr(self._game, method)(*args)
        except Exception as exc:  # py4j / JVM errors: the simulator, not the model, failed
            raise EnvironmentFailure(f"TextWorldExpress {method} failed: {exc}") from exc

    def _infos(self, response: Any) -> dict[str, Any]:
        try:
            infos = json.loads(response)
            infos["observation"].strip()
        except Exception as exc:
            raise EnvironmentFailure(f"TextWorldExpress returned a malformed response: {str(response)[:200]!r}") from exc
        return infos

    def _result(self, infos: dict[str, Any]) -> StepResult:
        success, failure = bool(infos.get("tasksuccess")), bool(infos.get("taskfailure"))
        return StepResult(
            observation=infos["observation"].strip(),
            reward=float(infos.get("score", 0.0)),
            done=success or failure or float(infos.get("score", 0.0)) >= 1.0,
            success=success,
            failure=bool(infos.get("taskfailure", False)),
            valid_actions=list(infos.get("validActions", [])),
        )

    def reset(self, task: Task, gold: bool = False) -> tuple[str, StepResult]:
        self._load(task.game)
        infos = self._infos(self._call("generateNewGameJSON", task.seed, task.fold, gold))
        instruction = str(self._call("getTaskDescription")).strip()
        return instruction, self._result(infos)

    def step(self, action: str) -> StepResult:
        return self._result(self._infos(self._call("stepJSON", action)))

    def expert_actions(self, task: Task) -> list[str]:
        self.reset(task, gold=True)
        return [str(a) for a in self._call("getGoldActionSequence")]

    def twc_places(self, task: Task) -> dict[str, list[str]]:
        """Where each object of a TWC task may be put away: object -> the valid containers present
        in the game, preferred first, read from the game itself (deterministic for a seed).

        Valid containers are the object's ``canonicalLocations`` (the ones TextWorldExpress's scorer
        accepts). Preference: the container's room nearest the object's start room (shortest
        path over the room connections, doors ignored), then the game's own room order, then the
        order the room lists its contents. Where TextWorldExpress's gold agent has a single choice
        it makes the same one; where it has several at the same distance it picks one with an
        unseeded random walk, so its gold path cannot be used for reproducible data.

        Resets the game to ``task`` without a gold path (``reset(task)``: the game is rebuilt
        from its seed, exactly as the next ``reset`` rebuilds it) and leaves it at the start.
        The only place this adapter reads the Java game objects; they are those of
        textworld-express==1.1.0: another version raises rather than falling back to anything.
        """
        if task.game != "twc":
            raise ValueError(f"twc_places: {task.task_id} is a {task.game} task, not twc")
        self.reset(task)
        from py4j.protocol import Py4JNetworkError

        try:
            return self._twc_places()
        except Py4JNetworkError as exc:
            raise EnvironmentFailure(f"TextWorldExpress twc_places failed: {exc}") from exc
        except ValueError:
            raise
        except Exception as exc:  # a missing accessor (py4j: "... does not exist"), another layout
            raise RuntimeError(
                f"twc_places reads TextWorldExpress's TWC game objects through py4j as "
                f"textworld-express=={TWC_INTERNALS_VERSION} defines them; the installed "
                f"textworld-express=={pkg_version('textworld-express')} does not provide them "
                f"({type(exc).__name__}: {str(exc)[:300]}). Install textworld-express=="
                f"{TWC_INTERNALS_VERSION} (constraints.txt) or port twc_places: pretraining data "
                "must not fall back to TextWorldExpress's unseeded gold path.") from exc

    def _twc_places(self) -> dict[str, list[str]]:
        def seq(buf) -> list:  # a Scala ArrayBuffer through py4j
            return [buf.apply(i) for i in range(buf.length())]

        if self._game is None:
            raise EnvironmentFailure("TextWorldExpress game used after close()")
        game = self._game.game()
        kind = str(game.getClass().getName())
        if kind != "textworldexpress.games.TWCGame":
            raise ValueError(f"twc_places: the loaded game is {kind}, not TWC")
        rooms = list(game.locations())
        names = [str(r.name()) for r in rooms]
        contents = {n: [str(c.name()) for c in seq(r.contents())] for n, r in zip(names, rooms)}
        adjacent: dict[str, list[str]] = {}
        for n, r in zip(names, rooms):
            near = (getattr(r, f"location{d}")() for d in _DIRECTIONS)
            adjacent[n] = [str(x.name()) for x in near if x is not None and str(x.name()) in contents]
        out: dict[str, list[str]] = {}
        for obj in seq(game.scorer().taskObjects()):
            name = str(obj.name())
            valid = {str(c) for c in obj.canonicalLocations()}
            where = obj.currentContainer()
            while where is not None and str(where.name()) not in contents:  # up to its room
                where = where.currentContainer()
            if where is None:
                raise ValueError(f"twc_places: {name!r} lies in no room of the game")
            dist, todo = {str(where.name()): 0}, deque([str(where.name())])
            while todo:  # rooms by distance from the object's start room
                here = todo.popleft()
                for n in adjacent[here]:
                    if n not in dist:
                        dist[n] = dist[here] + 1
                        todo.append(n)
            ranked = sorted((dist[n], i, j, c) for i, n in enumerate(names) if n in dist
                            for j, c in enumerate(contents[n]) if c in valid and c != name)
            out[name] = list(dict.fromkeys(c for *_, c in ranked))
        return out

    def close(self) -> None:
        # The game object lives in the shared JVM; dropping our reference lets Java collect it.
        game, self._game = getattr(self, "_game", None), None
        if game is not None:
            try:
                game._detach()
            except Exception:
                pass
