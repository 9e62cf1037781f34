"""TextWorldExpress adapter (package ``textworld-express``; one small JVM per instance).

Splits. The game's dev/test folds use object names that never occur in its train fold, so a
model trained from scratch cannot act there. The project therefore names two held-out splits:
``seen`` = held-out seeds of the train fold (disjoint from the training seeds) and ``unseen`` =
seeds of the dev or test fold. Seeds are positions in the game's own list of valid seeds for a
fold, so a config never names a seed the game cannot generate.
"""

from __future__ import annotations

import logging
from importlib.metadata import version as pkg_version
from typing import Any

from .base import EnvironmentFailure, StepResult, Task

# Action templates shown to the agent in the system prompt (from the games' valid-action lists).
ACTION_FORMS: dict[str, list[str]] = {
    "coin": ["move <direction>", "open door to <direction>", "take coin", "look around", "inventory"],
    "mapreader": ["move <direction>", "read map", "take <object>", "put <object> in <container>",
                  "task", "look around", "inventory"],
    "sorting": ["take <object>", "put <object> in box", "look around", "inventory"],
    "arithmetic": ["take <object>", "read <object>", "put <object> in box", "look around", "inventory"],
    "twc": ["move <direction>", "open <container>", "take <object>", "put <object> in <container>",
            "look around", "inventory"],
    "cookingworld": ["move <direction>", "open <container>", "take <object>", "read cookbook",
                     "slice/dice/chop <object>", "cook <object> in <appliance>", "prepare meal",
                     "eat meal", "look around", "inventory"],
    "simonsays": ["<verb> <object>"],
    "peckingorder": ["read instructions book", "take <object>", "look around", "inventory"],
}

FOLDS = ("train", "dev", "test")

logging.getLogger("py4j").setLevel(logging.ERROR)  # py4j logs every gateway start at INFO


class TextWorldExpressEnv:
    """One live TextWorldExpress game; implements :class:`eto_train.envs.base.Environment`."""

    name = "twx"

    def __init__(self, games: list[dict[str, Any]], splits: dict[str, dict[str, Any]],
                 step_limit: int, **_: Any) -> None:
        from textworld_express import TextWorldExpressEnv as _TWX  # JVM start: ~0.2 s

        self.games = {g["name"]: str(g.get("params", "") or "") for g in games}
        unknown = sorted(set(self.games) - set(ACTION_FORMS))
        if unknown:
            raise ValueError(f"env.games: unknown TextWorldExpress game(s) {unknown}; "
                             f"choose from {sorted(ACTION_FORMS)}")
        self.splits = splits
        self.step_limit = int(step_limit)
        self._check_splits()
        # The game's own step limit is set above ours so that our limit decides (max_steps status).
        self._env = _TWX(envStepLimit=self.step_limit + 10)
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
            getter = {"train": self._env.getValidSeedsTrain, "dev": self._env.getValidSeedsDev,
                      "test": self._env.getValidSeedsTest}[fold]
            self._seed_lists[key] = sorted(int(s) for s in getter())
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
            self._call(self._env.load, gameName=game, gameParams=key[1])
            self._loaded = key

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # py4j / JVM errors: the simulator, not the model, failed
            raise EnvironmentFailure(f"TextWorldExpress {fn.__name__} failed: {exc}") from exc

    def _result(self, obs: str, infos: dict[str, Any]) -> StepResult:
        if not isinstance(obs, str):
            raise EnvironmentFailure(f"TextWorldExpress returned a non-text observation: {obs!r}")
        return StepResult(
            observation=obs.strip(),
            reward=float(infos.get("score", 0.0)),
            done=bool(infos.get("done", False)) or bool(infos.get("tasksuccess")) or bool(infos.get("taskfailure")),
            success=bool(infos.get("tasksuccess", False)),
            failure=bool(infos.get("taskfailure", False)),
            valid_actions=list(infos.get("validActions", [])),
        )

    def reset(self, task: Task, gold: bool = False) -> tuple[str, StepResult]:
        self._load(task.game)
        obs, infos = self._call(self._env.reset, seed=task.seed, gameFold=task.fold, generateGoldPath=gold)
        return str(infos.get("taskDescription", "")).strip(), self._result(obs, infos)

    def step(self, action: str) -> StepResult:
        obs, _reward, _done, infos = self._call(self._env.step, action)
        return self._result(obs, infos)

    def expert_actions(self, task: Task) -> list[str]:
        self.reset(task, gold=True)
        return [str(a) for a in self._call(self._env.getGoldActionSequence)]

    def close(self) -> None:
        env, self._env = getattr(self, "_env", None), None
        if env is None:
            return
        try:
            env.close()
        except Exception:
            pass
        env.close = lambda: None  # the package's __del__ closes again; once is enough
