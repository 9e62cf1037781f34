"""Stage `explore` (ETO step 2): the current policy acts on the training tasks.

Every episode is recorded with the id of the policy that produced it. For step-level contrast
with ``step_positions`` = all | sample, the policy also plays on from expert prefixes; for
``contrast=step_value`` it then samples continuations that value the agent's and the expert's
action at each state (:func:`play_values`, in ``explore_value/``).
"""

from __future__ import annotations

import random
from pathlib import Path

from ... import layout
from ...config import Config, RolloutOverrides, RolloutSection
from ...contrasts import contrast_kind
from ...model.load import policy_ref
from ...pairs import value_sides, value_states
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


def run(cfg: Config, iteration: int, policy_path: str, experts: dict[str, Episode],
        out: Path) -> tuple[list[Episode], list[Episode]]:
    """(episodes of the policy on the training tasks, continuations from expert prefixes), played
    with ``rollout.*`` merged with ``eto.explore.rollout`` (exploration's own settings). ``experts``:
    the usable expert episodes by task id (read once by the iteration, loop.explore_pair_train).
    What is played beyond the policy's own episodes is the contrast kind's (contrasts.py): from
    expert states (step, step_value) with ``step_positions`` = all | sample, then, with
    ``contrast=step_value``, the value continuations (:func:`play_values`), told apart by their
    ``env_params["parent"]`` (``pairs.value_parent``)."""
    setup_runtime(cfg.runtime.rollout_threads)
    ex, pc = cfg.eto.explore, cfg.eto.pairs
    kind = contrast_kind(pc.contrast)
    # step values sample: a temperature of 0 is refused here, before the exploration, not after it
    sampled = value_settings(cfg) if kind.values else None
    ref = policy_ref(policy_path, name=f"iter{iteration - 1}" if iteration > 1 else "bc")
    rollouts = Rollouts(cfg, policy_path, ref, cfg.rollout.merged(ex.rollout))
    tasks = explore_tasks(rollouts, ex.split, ex.tasks_per_game)
    work = [WorkItem(t, s) for t in tasks for s in range(ex.samples)]
    share = layout.RunLayout.of(cfg).cache("explore")  # sweep jobs exploring the same policy share it
    episodes = rollouts.play(f"explore/iter{iteration}", layout.explore_dir(out), work,
                             extra_config={"explore": ex.plain()}, share=share)
    continuations: list[Episode] = []
    by_id = {t.task_id: t for t in tasks}
    experts = {tid: e for tid, e in experts.items() if tid in by_id}  # the explored tasks' experts
    if kind.expert_states and pc.step_positions != "first_divergence":
        rng = random.Random(cfg.seed + iteration)
        prefix_work = [WorkItem(by_id[tid], 0, tuple(s.action for s in e.steps[:t]))
                       for tid, e in sorted(experts.items())
                       for t in step_positions(e, pc.step_positions, pc.step_samples, rng)
                       if t < e.env_params.get("max_steps", t + 1)]  # gold paths may exceed the limit
        continuations = rollouts.play(f"explore-step/iter{iteration}", layout.explore_step_dir(out), prefix_work,
                                      extra_config={"explore": ex.plain(), "positions": pc.step_positions},
                                      share=share)
    rollouts.close()  # DPO comes next: free the GPU the engine held
    if kind.values:
        continuations = continuations + play_values(cfg, iteration, policy_path, ref, sampled, by_id, experts,
                                                    episodes, continuations, out, share)
    return episodes, continuations


def value_settings(cfg) -> RolloutSection:
    """The value continuations' rollout settings: exploration's, sampling (its temperature)."""
    return cfg.rollout.merged(cfg.eto.explore.rollout).merged(
        RolloutOverrides.model_validate({"generation": {"do_sample": True}}))


def play_values(cfg, iteration, policy_path, ref, sampled, by_id, experts, episodes, continuations, out,
                share) -> list[Episode]:
    """The value continuations of ``eto.pairs.contrast=step_value`` (pairs.value_states): for each
    state, ``value_rollouts`` sampled episodes after the agent's action and as many after the
    expert's (none for an action that ends the episode), each recorded with its parent step.

    They sample (``do_sample: true``, eto.explore.rollout's temperature) even when exploration is
    greedy. Seeded: the play seeds torch once (``seed``), and the k rollouts of one action are k rows
    drawing from that stream, so the same config, seed, machine and batch size give the same
    episodes; a resumed play draws the rest afresh (as any sampled play, rollouts/play.py)."""
    pc, ex = cfg.eto.pairs, cfg.eto.explore
    work, seen = [], set()
    for st in value_states(experts, episodes, continuations, pc.step_positions):
        for branch, action, prefix, unparsed, known in value_sides(experts[st.task_id], st):
            if known is not None or (st.task_id, st.t, branch, action) in seen:
                continue  # an action that ends the episode has its value; the expert's is shared
            seen.add((st.task_id, st.t, branch, action))
            work += [WorkItem(by_id[st.task_id], i, prefix, unparsed=unparsed, parent={
                "contrast": "step_value", "step": st.t, "branch": branch, "action": action, "rollout": i})
                for i in range(pc.value_rollouts)]
    if not work:  # no state to value (every action the expert's, or every valued action ends the episode)
        return []
    values = Rollouts(cfg, policy_path, ref, sampled)
    try:
        return values.play(f"explore-value/iter{iteration}", layout.explore_value_dir(out), work,
                           extra_config={"explore": ex.plain(), "positions": pc.step_positions,
                                         "value_rollouts": pc.value_rollouts}, share=share)
    finally:
        values.close()
