"""Does a policy read its observation? ETO's precondition, measured on played episodes.

In mapreader the first observation names the room behind each exit and the task names the room
the coin is in, so the first ``move`` decides the episode; in twc the first ``take`` must name an
object that lies in the room. A policy that ignores the observation still gets some right: it has
a default (its own mix of directions or objects), and that default is right as often as the tasks
that happen to need it. The test therefore compares the hits with that chance line, conditioned
on the policy's own mix: a permutation test that shuffles the policy's choices across tasks
(``hits`` among the shuffles that reach the observed count; hand-written, a few lines: SciPy has
no test of this exact statistic and the project does not depend on it).

``expected`` is the shuffles' mean, computed exactly: the sum over tasks of the policy's rate of
each choice that is right for the task (the findings' "expected if the move ignored the
observation" column).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any, Iterable

from .records import Episode


def first_action(ep: Episode, prefix: str) -> str | None:
    """What follows ``prefix`` in the episode's first action that starts with it (None: never)."""
    for s in ep.steps:
        if s.action and s.action.startswith(prefix):
            return s.action[len(prefix):].strip()
    return None


def chance_test(chosen: list[str | None], right: list[set[str]], permutations: int = 20000,
                seed: int = 0) -> dict[str, Any]:
    """Hits of ``chosen[i] in right[i]`` against the same choices shuffled across tasks.

    None (no such action in the episode) is a choice that is never right. Returns the hits, the
    exact chance line, the one-sided permutation p (add-one, so never 0) and the choice counts.
    """
    if len(chosen) != len(right) or not chosen:
        raise ValueError(f"chance_test: {len(chosen)} choices for {len(right)} tasks (need equal, > 0)")
    n = len(chosen)
    hit = lambda cs: sum(c is not None and c in r for c, r in zip(cs, right))
    observed = hit(chosen)
    counts = Counter(chosen)
    expected = sum(k / n * sum(c is not None and c in r for r in right) for c, k in counts.items())
    rng, shuffled, reach = random.Random(seed), list(chosen), 0
    for _ in range(permutations):
        rng.shuffle(shuffled)
        reach += hit(shuffled) >= observed
    return {"n": n, "hits": observed, "expected": expected, "p": (reach + 1) / (permutations + 1),
            "permutations": permutations,
            "choices": {("(none)" if c is None else c): k for c, k in counts.most_common()}}


def first_move_test(episodes: Iterable[Episode], gold_move: dict[str, str], **kw) -> dict[str, Any]:
    """Mapreader: the first ``move <dir>`` against the gold path's first move of each task."""
    eps = [e for e in episodes if e.task_id in gold_move]
    res = chance_test([first_action(e, "move ") for e in eps], [{gold_move[e.task_id]} for e in eps], **kw)
    res["needed"] = dict(Counter(gold_move[e.task_id] for e in eps).most_common())
    return res


def first_take_test(episodes: Iterable[Episode], takeable: dict[str, set[str]], **kw) -> dict[str, Any]:
    """Twc: the first ``take <object>`` against the objects that can be taken in the task's room."""
    eps = [e for e in episodes if e.task_id in takeable]
    return chance_test([first_action(e, "take ") for e in eps], [takeable[e.task_id] for e in eps], **kw)


def right_answers(env, tasks) -> tuple[dict[str, str], dict[str, set[str]]]:
    """From the environment: each task's gold first move and the objects its first room offers to
    ``take`` (the valid actions at reset; twc's default has one room)."""
    gold_move, takeable = {}, {}
    for t in tasks:
        move = next((a[5:] for a in env.expert_actions(t) if a.startswith("move ")), None)
        if move is not None:
            gold_move[t.task_id] = move
        _, first = env.reset(t)
        takeable[t.task_id] = {a[5:] for a in first.valid_actions if a.startswith("take ")}
    return gold_move, takeable
