"""Stage `explore` (ETO step 2): the current policy acts on the training tasks.

Every episode is recorded with the id of the policy that produced it. For step-level contrast
with ``step_positions`` = all | sample, the policy also plays on from expert prefixes.
"""

from __future__ import annotations

import random
from pathlib import Path

from ... import layout
from ...config import typed
from ...experts import read_experts, usable
from ...model.load import policy_ref
from ...records import Episode
from ...rollouts.loop import WorkItem
from ...rollouts.play import Rollouts
from ...runtime import setup_runtime


def explore_tasks(rollouts: Rollouts, split: str, per_game: int | None):
    tasks, counts = [], {}
    for t in rollouts.tasks(split):
        counts[t.game] = counts.get(t.game, 0) + 1
        if per_game is None or counts[t.game] <= per_game:
            tasks.append(t)
    return tasks


def step_positions(expert: Episode, how: str, samples: int, rng: random.Random) -> list[int]:
    """Positions t at which the policy takes over from the expert (t = 0 is the first action)."""
    n = expert.num_steps
    if how == "all":
        return list(range(n))
    if how == "sample":
        return sorted(rng.sample(range(n), min(samples, n)))
    raise ValueError(f"eto.pairs.step_positions={how!r} needs no extra rollouts or is unknown")


def run(cfg, iteration: int, policy_path: str, out: Path) -> tuple[list[Episode], list[Episode]]:
    """(episodes of the policy on the training tasks, continuations from expert prefixes), played
    with ``rollout.*`` merged with ``eto.explore.rollout`` (exploration's own settings)."""
    cfg = typed(cfg)
    setup_runtime(cfg.runtime.rollout_threads)
    ex = cfg.eto.explore
    ref = policy_ref(policy_path, name=f"iter{iteration - 1}" if iteration > 1 else "bc")
    rollouts = Rollouts(cfg, policy_path, ref, cfg.rollout.merged(ex.rollout))
    tasks = explore_tasks(rollouts, ex.split, ex.tasks_per_game)
    work = [WorkItem(t, s) for t in tasks for s in range(ex.samples)]
    share = layout.RunLayout.of(cfg).cache("explore")  # sweep jobs exploring the same policy share it
    episodes = rollouts.play(f"explore/iter{iteration}", layout.explore_dir(out), work,
                             extra_config={"explore": ex.plain()}, share=share)
    continuations: list[Episode] = []
    pc = cfg.eto.pairs
    if pc.contrast in ("step", "mixture") and pc.step_positions != "first_divergence":
        ids = {t.task_id for t in tasks}
        experts = {e.task_id: e for e in read_experts(cfg.paths.experts, cfg.env.name)
                   if e.task_id in ids and usable(e)}
        rng = random.Random(cfg.seed + iteration)
        by_id = {t.task_id: t for t in tasks}
        prefix_work = [WorkItem(by_id[tid], 0, tuple(s.action for s in e.steps[:t]))
                       for tid, e in sorted(experts.items())
                       for t in step_positions(e, pc.step_positions, pc.step_samples, rng)
                       if t < e.env_params.get("max_steps", t + 1)]  # gold paths may exceed the limit
        continuations = rollouts.play(f"explore-step/iter{iteration}", layout.explore_step_dir(out), prefix_work,
                                      extra_config={"explore": ex.plain(), "positions": pc.step_positions},
                                      share=share)
    rollouts.close()  # DPO comes next: free the GPU the engine held
    return episodes, continuations
