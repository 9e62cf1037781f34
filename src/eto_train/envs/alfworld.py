"""ALFWorld adapter (package ``alfworld``: TextWorld's PDDL engine with the ALFRED domain).

Data. ``alfworld-download`` (on a machine with internet) fills ``$ALFWORLD_DATA`` (default
``~/.cache/alfworld``); the games lie in ``json_2.1.1/<fold>/<task folder>/<trial>/`` as
``game.tw-pddl`` (PDDL domain, problem and text grammar in one JSON) with ``traj_data.json``.
``env.data_dir`` names the ``json_2.1.1`` folder; null means ``$ALFWORLD_DATA/json_2.1.1``.

Splits. train = the ``train`` fold, seen = ``valid_seen``, unseen = ``valid_unseen``, each with
ALFWorld's own filter (task types from config, no movable/sliced trials, solvable games only).
A split may name an id list: the paper's 134 unseen games are ``data/alfworld_eto/gamefile_id.txt``.
A task is ``ALFWorldTask(game=<task type>, seed=<position in the split>)``; its id is the
game's ``<task folder>/<trial>``, the form of the paper's list.

Episodes are played as ALFWorld's ``AlfredTWEnv`` plays them (its name demangler, no domain
randomisation), but on one in-process ``PddlEnv`` per adapter instead of TextWorld's gym
workers. Each ``PddlEnv`` loads its own copy of Fast Downward's library, so adapters in one
process do not share planner state. Reward 1 on a win, else 0 (ALFWorld has no lost state).

Expert. ``planner``: Fast Downward's plan from the initial state (TextWorld's ``policy_commands``);
``walkthrough``: the action list ``alfworld-generate`` stored in the game file (the package's
hand-coded expert), falling back to the planner where a game file has none.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from importlib.metadata import version as pkg_version
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import Field

from ..config import Choice, EnvSection, Int, Rule, Section, Text, one_of
from ..layout import from_repo
from .base import EnvironmentFailure, StepResult, Task

FOLDS = ("train", "valid_seen", "valid_unseen")
TASK_TYPES = {1: "pick_and_place_simple", 2: "look_at_obj_in_light", 3: "pick_clean_then_place_in_recep",
              4: "pick_heat_then_place_in_recep", 5: "pick_cool_then_place_in_recep",
              6: "pick_two_obj_and_place"}
# The command templates of the package's grammar (alfworld/data/alfred.twl2), one list for all
# task types: every game accepts all of them. Data made with alfworld < 0.4 says
# "put {obj} in/on {recep}" instead of "move ... to ..."; step() accepts either form.
ACTION_FORMS = ["go to {recep}", "open {recep}", "close {recep}", "take {obj} from {recep}",
                "move {obj} to {recep}", "use {obj}", "heat {obj} with {recep}",
                "cool {obj} with {recep}", "clean {obj} with {recep}", "examine {something}",
                "look", "inventory"]
_PUT_OLD = re.compile(r"put (.+) in/on (.+)")
_PUT_NEW = re.compile(r"move (.+) to (.+)")
_ARRIVE_LOC = re.compile(r"^You arrive at loc \d+\. ")  # old grammar; the paper's data drops it


@dataclass(frozen=True)
class ALFWorldTask(Task):
    """An ALFWorld game; ``task_id`` is its ``<task folder>/<trial>``, as in the paper's list."""

    trial: str = ""

    @property
    def task_id(self) -> str:
        return self.trial


def _data_dir(data_dir: str | None) -> Path:
    if data_dir is None:  # where alfworld-download puts it
        return Path(os.environ.get("ALFWORLD_DATA", "~/.cache/alfworld")).expanduser() / "json_2.1.1"
    return Path(data_dir).expanduser()


def _find_ids(ids_dir: str, name: str) -> Path:
    p = from_repo(Path(ids_dir) / name, Path.is_file)
    if not p.is_file():
        raise FileNotFoundError(f"env.splits: id list {name} not found in {ids_dir}")
    return p


def list_games(fold_dir: Path, task_types: set[str]) -> list[tuple[str, str]]:
    """(``<task folder>/<trial>``, task type) of one fold's playable games, in path order.

    The same filter as ALFWorld's ``AlfredTWEnv.collect_game_files``: its TextWorld version
    cannot play movable or sliced trials, and games that its expert could not solve carry
    ``"solvable": false`` in the game file.
    """
    out = []
    for traj in sorted(fold_dir.glob("*/*/traj_data.json")):
        trial = f"{traj.parent.parent.name}/{traj.parent.name}"
        game = traj.parent / "game.tw-pddl"
        if "movable" in trial or "Sliced" in trial or not game.is_file():
            continue
        task_type = json.loads(traj.read_text())["task_type"]
        if task_type in task_types and json.loads(game.read_text()).get("solvable"):
            out.append((trial, task_type))
    return out


class ALFWorldEnv:
    """One live ALFWorld game; implements :class:`eto_train.envs.base.Environment`."""

    name = "alfworld"

    class Config(EnvSection):
        """The ``env`` section of configs/env/alfworld.yaml."""

        class Split(Section):
            fold: Choice(FOLDS)
            ids: Text(null="every solvable game of the fold") = None

        step_limit: Int(ge=1, when=" (max steps per episode)")
        splits: Annotated[dict[str, Annotated[Split, Rule(f"{{fold: {'|'.join(FOLDS)}, ids: <file> (optional)}}")]],
                          Field(min_length=1), Rule("a mapping of split name -> {fold, ids}")]
        data_dir: Text(null="$ALFWORLD_DATA/json_2.1.1")
        ids_dir: Text()
        task_types: Annotated[Optional[list[Literal[tuple(TASK_TYPES)]]], Field(min_length=1),
                              Rule(f"a non-empty list of ALFWorld task types, each {one_of(sorted(TASK_TYPES))}, "
                                   "or null (all)")]
        expert: Choice(("planner", "walkthrough"))
        limit_per_type: Int(ge=1, null="every game")

    def __init__(self, splits: dict[str, dict[str, Any]], step_limit: int = 40,
                 data_dir: str | None = None, ids_dir: str = "data/alfworld_eto",
                 task_types: list[int] | None = None, expert: str = "planner",
                 limit_per_type: int | None = None, **_: Any) -> None:
        self.data_dir = _data_dir(data_dir)
        if not self.data_dir.is_dir():
            raise FileNotFoundError(
                f"ALFWorld data not found: {self.data_dir} is not a folder. Run `alfworld-download` "
                f"on a machine with internet (it fills $ALFWORLD_DATA, default ~/.cache/alfworld) and "
                f"set env.data_dir (or $ALFWORLD_DATA) to the json_2.1.1 folder holding {', '.join(FOLDS)}")
        for split, spec in splits.items():
            if spec.get("fold") not in FOLDS:
                raise ValueError(f"env.splits.{split}.fold: {spec.get('fold')!r} is not one of {FOLDS}")
        if expert not in ("planner", "walkthrough"):
            raise ValueError(f"env.expert: {expert!r} is not 'planner' or 'walkthrough'")
        bad = [t for t in (task_types or TASK_TYPES) if t not in TASK_TYPES]
        if bad:
            raise ValueError(f"env.task_types: unknown {bad}; choose from {TASK_TYPES}")
        self.splits, self.ids_dir, self.expert = splits, ids_dir, expert
        self.task_types = {TASK_TYPES[t] for t in (task_types or TASK_TYPES)}
        self.step_limit = int(step_limit)
        self.limit_per_type = limit_per_type
        try:
            import textworld
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
            from textworld.envs import PddlEnv
        except ImportError as exc:
            raise ImportError("env=alfworld needs the alfworld package: pip install 'eto-train[alfworld]'") from exc
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        self._pddl = PddlEnv(infos)  # loads its own copy of Fast Downward's library (~30 MB)
        self._env = AlfredInfos(AlfredDemangler(self._pddl, shuffle=False))
        self._loaded: Path | None = None
        self._admissible: list[str] = []

    # -- configuration ----------------------------------------------------------------------
    @property
    def version(self) -> str:
        return (f"alfworld=={pkg_version('alfworld')};textworld=={pkg_version('textworld')};"
                f"expert={self.expert};step_limit={self.step_limit}")

    def tasks(self, split: str) -> list[ALFWorldTask]:
        if split not in self.splits:
            raise KeyError(f"env.splits has no split {split!r} (has {sorted(self.splits)})")
        spec = self.splits[split]
        fold_dir = self.data_dir / spec["fold"]
        if not fold_dir.is_dir():
            raise FileNotFoundError(f"ALFWorld data: no {spec['fold']} folder in {self.data_dir} (env.splits.{split})")
        games = list_games(fold_dir, self.task_types)
        if spec.get("ids"):  # a fixed list (the paper's), in its order; every id must be there
            by_id = dict(games)
            ids = [ln.strip() for ln in _find_ids(self.ids_dir, spec["ids"]).read_text().splitlines() if ln.strip()]
            missing = [i for i in ids if i not in by_id]
            if missing:
                raise FileNotFoundError(f"env.splits.{split}: {len(missing)} of {len(ids)} games of {spec['ids']} "
                                        f"are not playable games in {fold_dir}, e.g. {missing[:3]}")
            games = [(i, by_id[i]) for i in ids]
        if self.limit_per_type:  # a small run: the first N games of each task type
            kept, count = [], Counter()
            for trial, ttype in games:
                count[ttype] += 1
                if count[ttype] <= self.limit_per_type:
                    kept.append((trial, ttype))
            games = kept
        return [ALFWorldTask("alfworld", ttype, spec["fold"], i, split, trial=trial)
                for i, (trial, ttype) in enumerate(games)]

    def max_steps(self, task: Task) -> int:
        return self.step_limit

    def action_forms(self, game: str) -> list[str]:
        return ACTION_FORMS

    # -- episode ----------------------------------------------------------------------------
    def _call(self, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:  # planner / grammar errors: the simulator, not the model, failed
            raise EnvironmentFailure(f"ALFWorld {getattr(fn, '__name__', fn)} failed: {exc}") from exc

    def _start(self, task: Task, plan: bool = False):
        if not getattr(task, "trial", ""):
            raise ValueError(f"{task.task_id}: not an ALFWorld task (take tasks from env.tasks(split))")
        path = self.data_dir / task.fold / task.trial / "game.tw-pddl"
        if self._loaded != path:
            if not path.is_file():
                raise FileNotFoundError(f"ALFWorld game file missing: {path}")
            self._call(self._env.load, str(path))  # parses domain and grammar: ~0.4 s
            self._loaded = path
        self._pddl.request_infos.policy_commands = plan  # replans on every step while set
        try:
            state = self._call(self._env.reset)
        finally:
            self._pddl.request_infos.policy_commands = False
        self._admissible = list(state["admissible_commands"])
        return state

    def _result(self, state) -> StepResult:
        self._admissible = list(state["admissible_commands"])
        won = bool(state["won"])
        return StepResult(observation=_ARRIVE_LOC.sub("", str(state.feedback).strip()),
                          reward=1.0 if won else 0.0, done=won, success=won,
                          valid_actions=list(self._admissible))

    def reset(self, task: Task) -> tuple[str, StepResult]:
        state = self._start(task)
        # The intro is "-= Welcome ... =-", the room, then "Your task is to: <goal>.".
        parts = [p.strip() for p in str(state.feedback).split("\n\n") if p.strip()]
        goal = next((p for p in parts if p.startswith("Your task is to:")), "")
        room = "\n".join(p for p in parts[1:] if p != goal)
        first = self._result(state)
        first.observation = room
        return goal.removeprefix("Your task is to:").strip(), first

    def step(self, action: str) -> StepResult:
        action = action.strip()
        if action not in self._admissible:  # the other grammar's form of the same put action
            for pat, form in ((_PUT_OLD, "move {} to {}"), (_PUT_NEW, "put {} in/on {}")):
                m = pat.fullmatch(action)
                if m and form.format(*m.groups()) in self._admissible:
                    action = form.format(*m.groups())
        state, _score, _done = self._call(self._env.step, action)
        return self._result(state)

    def expert_actions(self, task: Task) -> list[str]:
        if self.expert == "walkthrough":
            self._start(task)
            walkthrough = self._pddl._game_data.get("walkthrough")
            if walkthrough:
                return [str(a) for a in walkthrough]
        state = self._start(task, plan=True)
        plan = [str(a) for a in state["policy_commands"]]
        if not plan and not state["won"]:
            raise EnvironmentFailure(f"ALFWorld planner found no plan for {task.task_id}")
        return plan

    def close(self) -> None:
        pddl, self._pddl = getattr(self, "_pddl", None), None
        self._env = None
        if pddl is not None:
            # The planner library stays loaded until the process exits: unloading it (dlclose)
            # while TextWorld still holds references made the interpreter segfault at exit.
            pddl._pddl_state = None
