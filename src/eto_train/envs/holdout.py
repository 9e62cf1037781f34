"""A ``dev`` split carved from the training tasks, for every environment alike.

Model selection (the ETO loop's early stopping, ``eto.dev_split``) must not look at a test
split, and the paper has no dev split: ScienceWorld's and ALFWorld's only held-out lists are
the ``seen`` and ``unseen`` test sets. ``env.dev_holdout: N`` (N > 0) holds N training tasks
out as the split ``dev``: ``env.tasks("train")`` no longer lists them (so neither behavior
cloning nor exploration sees them) and ``env.tasks("dev")`` does. ``train`` + ``dev`` is the
original training list; the held-out tasks keep their simulator fold and seed (``reset`` and
the expert play them as before) and carry ``split="dev"`` (so do their episode records).

The rule (deterministic; it does not depend on ``seed`` or on the order of the list):

1. Each game's (task family's) training tasks are ranked by ``sha256("<HOLDOUT_SEED>|<task id>")``.
2. Tasks that another split also lists (ScienceWorld's ETO train list shares 54 variations
   with its ``seen`` test list) are never held out: a dev task must not be a test task. Nor is
   a task the training list names twice (WebShop's repeats a goal): it stays in train.
3. A game gives at most half of its training tasks (rounded down), so every game keeps expert
   data for behavior cloning.
4. Round robin over the games in name order: each round takes the next-ranked task of every
   game that still has one to give, until N are taken. Games differ by at most one dev task
   unless one runs out. Asking for more than the games can give is an error naming the key.

Applied in :func:`eto_train.envs.make_env` around any adapter (TextWorldExpress keeps its own
disjoint ``dev`` seeds: ``dev_holdout: 0`` there). A config that sets both ``dev_holdout`` and
``splits.dev``, or whose ``splits.dev`` is the very same entry as another split (a test split),
is an error (:func:`check_dev_config`).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import replace
from typing import Any

from .base import Environment, EnvWrapper, Task

HOLDOUT_SEED = 0  # fixed: the dev split must not move when a run changes its training seed
SOURCE, DEV = "train", "dev"


def check_dev_config(cfg: dict[str, Any]) -> int:
    """``env.dev_holdout`` as an int after checking it against ``env.splits``; errors name the key."""
    raw = cfg.get("dev_holdout") or 0
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ValueError(f"env.dev_holdout: expected a number of training tasks >= 0, got {raw!r}")
    splits = cfg.get("splits") or {}
    if raw > 0:
        if DEV in splits:
            raise ValueError(f"env.dev_holdout={raw} carves a {DEV!r} split from the training tasks, but "
                             f"env.splits.{DEV} is set too: keep one (env.dev_holdout=0 or remove env.splits.{DEV})")
        if SOURCE not in splits:
            raise ValueError(f"env.dev_holdout={raw}: there is no env.splits.{SOURCE} to hold tasks out of")
    if DEV in splits:
        same = [s for s, spec in splits.items() if s != DEV and spec == splits[DEV]]
        if same:
            raise ValueError(f"env.splits.{DEV} is the same list as env.splits.{same[0]} ({splits[DEV]!r}): a dev "
                             f"split (model selection) must not be a test or training split; use env.dev_holdout "
                             f"to hold training tasks out instead")
    return raw


def _rank(task: Task) -> str:
    return hashlib.sha256(f"{HOLDOUT_SEED}|{task.task_id}".encode()).hexdigest()


def choose_holdout(train: list[Task], n: int, exclude: set[str] = frozenset()) -> set[str]:
    """Task ids of the ``n`` training tasks held out as dev (the rule in the module docstring)."""
    by_game: dict[str, list[Task]] = {}
    for t in train:
        by_game.setdefault(t.game, []).append(t)
    twice = {i for i, c in Counter(t.task_id for t in train).items() if c > 1}
    ranked = {g: sorted((t for t in ts if t.task_id not in exclude and t.task_id not in twice), key=_rank)
              for g, ts in by_game.items()}
    caps = {g: min(len(ranked[g]), len(ts) // 2) for g, ts in by_game.items()}
    if n > sum(caps.values()):
        raise ValueError(
            f"env.dev_holdout={n}: the training split has {len(train)} tasks in {len(by_game)} game(s), of which at "
            f"most {sum(caps.values())} can be held out (half of each game's, none that another split lists or "
            f"that train lists twice); "
            f"lower env.dev_holdout (0: no dev split)")
    chosen: list[str] = []
    for r in range(max(caps.values(), default=0)):
        for g in sorted(by_game):
            if len(chosen) < n and r < caps[g]:
                chosen.append(ranked[g][r].task_id)
    return set(chosen)


class HoldoutEnv(EnvWrapper):
    """An environment whose ``dev`` split is ``n`` tasks held out of its ``train`` split."""

    def __init__(self, env: Environment, n: int, other_splits: list[str]) -> None:
        super().__init__(env)
        self.n = int(n)
        self.other_splits = [s for s in other_splits if s not in (SOURCE, DEV)]
        self._split: tuple[list[Task], list[Task]] | None = None

    def _train_dev(self) -> tuple[list[Task], list[Task]]:
        if self._split is None:
            train = self.inner.tasks(SOURCE)
            elsewhere = {t.task_id for s in self.other_splits for t in self.inner.tasks(s)}
            dev_ids = choose_holdout(train, self.n, elsewhere)
            self._split = ([t for t in train if t.task_id not in dev_ids],
                           [replace(t, split=DEV) for t in train if t.task_id in dev_ids])
        return self._split

    def tasks(self, split: str) -> list[Task]:
        if split == SOURCE:
            return list(self._train_dev()[0])
        if split == DEV:
            return list(self._train_dev()[1])
        return self.inner.tasks(split)


def wrap_holdout(env: Environment, cfg: dict[str, Any]) -> Environment:
    """``env`` with a held-out ``dev`` split when ``cfg["dev_holdout"]`` > 0 (see :func:`check_dev_config`)."""
    n = check_dev_config(cfg)
    return HoldoutEnv(env, n, list(cfg.get("splits") or {})) if n > 0 else env
