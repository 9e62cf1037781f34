"""Stage `pairs` (ETO step 3): failure/success pairs by trajectory, step, mixture, self or anchor state."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

from rich.console import Console

from ...config import Config, Pairs
from ...contrasts import contrast_kind
from ...pairs import step_value_pair, value_parent, value_scores, value_sides, value_states
from ...pairs import Pair, anchor_pairs, first_divergence, for_pairing, pair_stats, self_pair, step_pair, trajectory_pair
from ...records import NOT_POLICY_FAULT, Episode
from ... import layout, tracking
from ...distributed import is_main
from ...store import MAIN_WRITE_WAIT_S, json_text, jsonl_text, write_main


def build_pairs(pc: Pairs, experts: dict[str, Episode], explored: list[Episode],
                continuations: list[Episode], seed: int) -> tuple[list[Pair], dict]:
    """(pairs, stats) under the ``eto.pairs`` settings ``pc``."""
    rule = pc.expert_reward  # the expert's reward as the comparisons see it
    paired = {tid: for_pairing(e, rule) for tid, e in experts.items()}
    raised = sorted(tid for tid in paired if paired[tid] is not experts[tid])  # file reward < 1 read as 1.0
    recorded, experts = experts, paired  # step values compare environment scores: the recorded ones
    by_task: dict[str, list[Episode]] = defaultdict(list)
    for e in explored:
        by_task[e.task_id].append(e)
    kind = contrast_kind(pc.contrast)
    traj, step, own, anchor = [], [], [], []
    if pc.chosen in ("expert", "both"):  # the contrast's pairs (anchor: the policy's own, no expert side)
        if kind.anchor:  # actions where several samples of a task share the whole history
            for tid, eps in sorted(by_task.items()):
                anchor += anchor_pairs(eps)
        for tid, eps in sorted(by_task.items()):
            if tid not in experts:
                continue
            for e in eps:
                if kind.trajectory:
                    if (p := trajectory_pair(experts[tid], e, pc.extra_turns, pc.rejected_cut)) is not None:
                        traj.append(p)
                if kind.step and pc.step_positions == "first_divergence":
                    t = first_divergence(experts[tid], e)
                    if t is not None and (p := step_pair(experts[tid], e, t)) is not None:
                        step.append(p)
        for c in continuations if kind.step else ():
            t = c.env_params.get("expert_prefix", 0)
            if c.task_id in experts and not value_parent(c) and (p := step_pair(experts[c.task_id], c, t)) is not None:
                step.append(p)
    value, vstats = [], {}
    if kind.values:  # expert-side pairs (none with chosen=self); their rollouts counted either way
        value, vstats = step_value_pairs(pc, recorded, explored, continuations)
        value = value if pc.chosen in ("expert", "both") else []
    if pc.chosen in ("self", "both"):
        for tid, eps in sorted(by_task.items()):
            ranked = sorted((e for e in eps if e.status not in NOT_POLICY_FAULT), key=lambda e: (e.final_score, -e.num_steps, e.episode_id))
            if len(ranked) >= 2 and (p := self_pair(ranked[-1], ranked[0], pc.extra_turns)) is not None:
                own.append(p)
    if kind.mixed and traj and step:
        # keep the step share at mixture_step_fraction of the union (deterministic subsample)
        f = pc.mixture_step_fraction
        want_step = min(len(step), round(f / (1 - f) * len(traj))) if f < 1 else len(step)
        step = sorted(random.Random(seed).sample(step, want_step), key=lambda p: p.pair_id)
    pairs = traj + step + own + anchor + value
    stats = pair_stats(pairs, {e.task_id for e in explored})
    stats["episodes"] = len(explored) + len(continuations)
    stats["environment_failures"] = sum(e.status in NOT_POLICY_FAULT for e in explored + continuations)
    stats["expert_reward"] = {"rule": rule, "experts_read_as_1": len(raised), "examples": raised[:5]}
    stats.update(vstats)
    return pairs, stats


def step_value_pairs(pc: Pairs, experts: dict[str, Episode], explored: list[Episode],
                     continuations: list[Episode]) -> tuple[list[Pair], dict]:
    """(step-value pairs, their stats): each state of ``pairs.value_states`` valued on both sides
    (``pairs.value_sides``: known, or the mean of its continuations' scores, ``pairs.value_scores``)."""
    scores = value_scores(continuations)
    out, values = [], []
    states = value_states(experts, explored, continuations, pc.step_positions)
    for st in states:
        expert = experts[st.task_id]
        v = {branch: [known] if known is not None else scores.get((st.task_id, st.t, branch, action), [])
             for branch, action, _, _, known in value_sides(expert, st)}
        p = step_value_pair(expert, st.agent, st.t, v["agent"], v["expert"], pc.value_margin)
        if p is not None:
            out.append(p)
            values.append({"task_id": st.task_id, "step": st.t, "agent": p.rejected_score, "expert": p.chosen_score})
    return out, {"value_states": len(states), "value_rollouts": sum(bool(value_parent(c)) for c in continuations),
                 "values": values}


def run(cfg: Config, iteration: int, experts: dict[str, Episode], explored: list[Episode],
        continuations: list[Episode], out: Path) -> list[Pair]:
    """The iteration's pairs under ``eto.pairs``, from the usable expert episodes by task id (``experts``,
    read once by the iteration), the explored episodes and their continuations; written to ``out``/pairs."""
    console = Console(markup=False)
    pairs, stats = build_pairs(cfg.eto.pairs, experts, explored, continuations, cfg.seed + iteration)
    stats["config"] = cfg.eto.pairs.plain()
    # rank 0 writes them (one writer per file); the others built the same pairs and wait for its file, which
    # DPO hashes as its input next
    write_main(layout.pairs_stats(out), json_text(stats))
    write_main(layout.pairs_file(out), jsonl_text(p.to_dict() for p in pairs), wait_s=MAIN_WRITE_WAIT_S)
    if is_main():
        tracking.record(f"pairs/iter{iteration}", stats["config"], stats, layout.pairs_file(out).parent)
    console.print(f"[pairs] iteration {iteration}: {stats['pairs']} pairs {stats['by_kind']} "
                  f"(agent lost {stats['agent_lost']}, won {stats['agent_won']}, no pair on {stats['no_pair']} of {stats['tasks']} tasks); "
                  f"rejected turns mean {stats['rejected_turns_mean']:.1f}")
    return pairs
