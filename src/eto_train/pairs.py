"""Failure/success contrast pairs (ETO step 3).

Trajectory level (the paper's rule): per task, the agent's final reward against the expert's.
The lower one is rejected and the higher chosen (an agent that beats the expert is chosen);
ties are dropped. The prompt is the system turn and the task with its first observation; the
completions are the rest of each conversation, both ending on an action, and the rejected
side is cut to the expert's length plus ``extra_turns`` (5) turns.

Step level (paper App. B): with the expert's first t-1 steps fixed, the policy acts from step
t to the end; when its final reward is below the expert's, its action at t is rejected against
the expert's a_t, both conditioned on the instruction and the expert prefix.

Episodes whose status says the policy was not at fault (environment, orchestrator or
evaluator failures) never become negatives.

The expert's reward in these comparisons (``eto.pairs.expert_reward``): ``file``, the expert
episode's own final score (a gold path's, or the ``reward`` of an imported file entry);
``authors``, the rule of the authors' ``construct_preference.py`` (repository
Yifan-Song793/ETO, ``build_preference`` and ``build_preference_alfworld``): the gold
trajectory scores 1.0 in ScienceWorld and ALFWorld, and the file's ``reward`` in WebShop (and,
beyond their three environments, the episode's own score). See :func:`pairing_reward`.

The pairs file (``pairs.jsonl``, as ``stages.eto.pairs`` writes it) is read back checked
(:func:`read_pairs` / :func:`pair_from_dict` name the line and the field of a bad record), and
:func:`check_pairs_policy` checks that the pairs were explored by the DPO reference policy.
"""

from __future__ import annotations

import copy
import hashlib
import os
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable

from .records import NOT_POLICY_FAULT, Episode, RecordError, context_length, to_messages
from .store import read_jsonl

ROLES = ("system", "user", "assistant")
PAIR_KINDS = ("trajectory", "step", "self", "step_value", "anchor")
EXPERT_REWARDS = ("file", "authors")  # eto.pairs.expert_reward
# environments where the authors' construct_preference.py fixes the gold reward at 1.0
# (build_preference: ``if args.task == 'sciworld'``; build_preference_alfworld: sciworld or alfworld)
AUTHORS_GOLD_ONE = ("sciworld", "alfworld")


@dataclass
class Pair:
    pair_id: str
    task_id: str
    kind: str  # "trajectory", "step" or "self"
    step: int | None  # step-level: the 0-based index t of the contrasted action
    chosen_policy: str
    rejected_policy: str
    chosen_score: float
    rejected_score: float
    prompt: list[dict[str, str]]
    chosen: list[dict[str, str]]
    rejected: list[dict[str, str]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pairing_reward(expert: Episode, rule: str = "file") -> float:
    """The expert's reward that an agent episode is compared with (``eto.pairs.expert_reward``).

    ``file``: the expert episode's final score. ``authors``: 1.0 in ScienceWorld and ALFWorld
    whatever the file says (an imported entry at 0.72 counts as 1.0, so an agent at 0.8 is
    rejected and one at 0.72 is a pair), the episode's score elsewhere (WebShop's file reward).
    """
    if rule not in EXPERT_REWARDS:
        raise ValueError(f"eto.pairs.expert_reward={rule!r}: one of {list(EXPERT_REWARDS)}")
    return 1.0 if rule == "authors" and expert.env in AUTHORS_GOLD_ONE else expert.final_score


def for_pairing(expert: Episode, rule: str = "file") -> Episode:
    """``expert`` with its final score set to :func:`pairing_reward` (a copy; the record is untouched)."""
    score = pairing_reward(expert, rule)
    if score == expert.final_score:
        return expert
    out = copy.copy(expert)
    out.final_score = score
    return out


def _pid(*parts: Any) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:16]


def _split(ep: Episode, max_turns: int | None = None) -> tuple[list[dict], list[dict]]:
    """(prompt = the opening and the task turn, completion = the trajectory from the first action)."""
    msgs = to_messages(ep, max_turns=max_turns)
    n = context_length(ep)
    return msgs[:n], msgs[n:]


def trajectory_pair(expert: Episode, agent: Episode, extra_turns: int | None = 5,
                    rejected_cut: str = "expert_length") -> Pair | None:
    """The paper's trajectory-level pair for one task, or None (tie, unusable episode).

    As the authors' ``construct_preference.py``: a rejected agent trajectory is cut to the
    expert's length plus ``extra_turns`` turns (``None``: not cut, their ALFWorld rule); an
    agent that beats the expert is chosen whole. ``rejected_cut="first_divergence"`` (beyond
    the paper) ends a rejected agent trajectory on its first action that differs from the
    expert's instead.
    """
    if expert.task_id != agent.task_id:
        raise ValueError(f"pair of different tasks: {expert.task_id} vs {agent.task_id}")
    if agent.status in NOT_POLICY_FAULT or not agent.steps or not expert.steps:
        return None
    if agent.final_score == expert.final_score:
        return None  # ties are dropped
    chosen, rejected = (expert, agent) if expert.final_score > agent.final_score else (agent, expert)
    limit = None if extra_turns is None else expert.num_steps + extra_turns
    if rejected_cut == "first_divergence" and rejected is agent:
        t = first_divergence(expert, agent)
        t = (t if t is not None else min(expert.num_steps, agent.num_steps)) + 1
        limit = t if limit is None else min(limit, t)
    elif rejected_cut != "expert_length":
        raise ValueError(f"eto.pairs.rejected_cut={rejected_cut!r}: expert_length or first_divergence")
    prompt, chosen_msgs = _split(chosen)
    _, rejected_msgs = _split(rejected, max_turns=limit if rejected is agent else None)
    return Pair(pair_id=_pid("traj", agent.episode_id, expert.episode_id), task_id=agent.task_id,
                kind="trajectory", step=None, chosen_policy=chosen.policy.id, rejected_policy=rejected.policy.id,
                chosen_score=chosen.final_score, rejected_score=rejected.final_score,
                prompt=prompt, chosen=chosen_msgs, rejected=rejected_msgs)


def self_pair(best: Episode, worst: Episode, extra_turns: int | None = 5) -> Pair | None:
    """On-policy pair (beyond the paper): the policy's own best against its worst on one task."""
    if best.task_id != worst.task_id:
        raise ValueError(f"pair of different tasks: {best.task_id} vs {worst.task_id}")
    if best.status in NOT_POLICY_FAULT or worst.status in NOT_POLICY_FAULT:
        return None
    if best.final_score <= worst.final_score or not best.steps or not worst.steps:
        return None
    prompt, chosen = _split(best)
    _, rejected = _split(worst, max_turns=None if extra_turns is None else best.num_steps + extra_turns)
    return Pair(pair_id=_pid("self", best.episode_id, worst.episode_id), task_id=best.task_id, kind="self",
                step=None, chosen_policy=best.policy.id, rejected_policy=worst.policy.id,
                chosen_score=best.final_score, rejected_score=worst.final_score,
                prompt=prompt, chosen=chosen, rejected=rejected)


def first_divergence(expert: Episode, agent: Episode) -> int | None:
    """The first step where the agent's action differs from the expert's (None: never)."""
    for t, (e, a) in enumerate(zip(expert.steps, agent.steps)):
        if e.action != a.action:
            return t
    return None


def step_pair(expert: Episode, continuation: Episode, t: int) -> Pair | None:
    """Step-level pair: the expert's a_t against the policy's action at t after the expert prefix.

    ``continuation`` is an episode whose first ``t`` steps are the expert's (replayed) and whose
    later steps the policy took. No pair when the policy's final reward is not below the
    expert's, or when its action at t is the expert's own.
    """
    if continuation.status in NOT_POLICY_FAULT or len(continuation.steps) <= t or len(expert.steps) <= t:
        return None
    if continuation.final_score >= expert.final_score:
        return None
    if continuation.steps[t].action == expert.steps[t].action:
        return None
    if [s.action for s in continuation.steps[:t]] != [s.action for s in expert.steps[:t]]:
        raise ValueError(f"{expert.task_id}: continuation does not start with the expert's first {t} actions")
    prefix = to_messages(expert, max_turns=t + 1)[:-1]  # instruction + expert steps < t, ends on a user turn
    if t == 0:
        prefix = prefix[:context_length(expert)]
    chosen = [{"role": "assistant", "content": expert.steps[t].raw_output}]
    rejected = [{"role": "assistant", "content": continuation.steps[t].raw_output}]
    return Pair(pair_id=_pid("step", continuation.episode_id, expert.episode_id, t), task_id=expert.task_id,
                kind="step", step=t, chosen_policy=expert.policy.id, rejected_policy=continuation.policy.id,
                chosen_score=expert.final_score, rejected_score=continuation.final_score,
                prompt=prefix, chosen=chosen, rejected=rejected)


def pair_stats(pairs: list[Pair], tasks: Iterable[str]) -> dict[str, Any]:
    """Win/tie/lose counts seen from the agent, and length statistics of the pairs.
    ``no_pair`` counts the ``tasks`` (explored task ids) that gave no pair of any kind: ties,
    or failures that are not the policy's."""
    tasks = set(tasks)
    vs_expert = [p for p in pairs if "expert" in (p.chosen_policy, p.rejected_policy)]
    agent_won = sum(p.chosen_policy != "expert" for p in vs_expert)
    agent_lost = len(vs_expert) - agent_won

    def turns(msgs):
        return sum(m["role"] == "assistant" for m in msgs)

    ch = [turns(p.chosen) for p in pairs] or [0]
    rj = [turns(p.rejected) for p in pairs] or [0]
    return {"tasks": len(tasks), "pairs": len(pairs), "agent_lost": agent_lost, "agent_won": agent_won,
            "no_pair": len(tasks - {p.task_id for p in pairs}), "by_kind": {k: sum(p.kind == k for p in pairs)
                                                          for k in PAIR_KINDS},
            "chosen_turns_mean": sum(ch) / len(ch), "rejected_turns_mean": sum(rj) / len(rj),
            "rejected_turns_max": max(rj)}


# -- pairs files ------------------------------------------------------------------------------
def _check_messages(msgs: Any, name: str, ends_with: str | None, need_assistant: bool) -> None:
    if not isinstance(msgs, list) or not msgs:
        raise ValueError(f"{name}: expected a non-empty list of messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise ValueError(f"{name}[{i}]: expected a message object, got {type(m).__name__}")
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise ValueError(f"{name}[{i}]: unknown key(s) {extra}")
        if m.get("role") not in ROLES:
            raise ValueError(f"{name}[{i}].role: unknown role {m.get('role')!r} (one of {list(ROLES)})")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"{name}[{i}].content: expected a string")
    if need_assistant and not any(m["role"] == "assistant" for m in msgs):
        raise ValueError(f"{name}: no assistant turn (nothing to train on)")
    if ends_with and msgs[-1]["role"] != ends_with:
        raise ValueError(f"{name}[{len(msgs) - 1}].role: must end on a {ends_with} turn, got {msgs[-1]['role']!r}")


def pair_from_dict(d: Any) -> Pair:
    """A checked :class:`Pair`; ``ValueError`` names the bad field."""
    if not isinstance(d, dict):
        raise ValueError(f"a pair must be a JSON object, got {type(d).__name__}")
    names = [f.name for f in fields(Pair)]
    unknown, missing = sorted(set(d) - set(names)), sorted(set(names) - set(d))
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}")
    if missing:
        raise ValueError(f"missing field(s) {missing}")
    if d["kind"] not in PAIR_KINDS:
        raise ValueError(f"kind: {d['kind']!r} is not one of {list(PAIR_KINDS)}")
    for k in ("pair_id", "task_id", "chosen_policy", "rejected_policy"):
        if not isinstance(d[k], str) or not d[k]:
            raise ValueError(f"{k}: expected a non-empty string, got {d[k]!r}")
    for k in ("chosen_score", "rejected_score"):
        if not isinstance(d[k], (int, float)) or isinstance(d[k], bool):
            raise ValueError(f"{k}: expected a number, got {d[k]!r}")
    _check_messages(d["prompt"], "prompt", ends_with="user", need_assistant=False)
    _check_messages(d["chosen"], "chosen", ends_with="assistant", need_assistant=True)
    _check_messages(d["rejected"], "rejected", ends_with="assistant", need_assistant=True)
    for side in ("chosen", "rejected"):
        for i, m in enumerate(d[side]):
            if m["role"] == "assistant" and not m["content"].strip():
                raise ValueError(f"{side}[{i}].content: empty assistant turn (an empty action)")
    return Pair(**d)


def read_pairs(path: str | os.PathLike) -> list[Pair]:
    out = []
    for lineno, obj in read_jsonl(path):
        try:
            out.append(pair_from_dict(obj))
        except (ValueError, TypeError) as exc:
            raise RecordError(f"{path}:{lineno}: not a pair record: {exc}") from None
    return out


class PairsPolicyError(ValueError):
    """Pairs explored by another policy than the DPO reference."""


def _weights_tag(policy_id: str) -> str:
    """The part of ``<name>@<weights sha256[:12]>`` that names the weights (names differ by stage)."""
    return policy_id.rsplit("@", 1)[1] if "@" in policy_id else policy_id


def check_pairs_policy(pairs: Iterable[Pair], reference_id: str, source: str = "pairs") -> None:
    """Every non-expert side of every pair was produced by the reference policy.

    DPO's implicit reward is log pi/pi_ref; rejected turns sampled from another policy are
    off-policy for the reference the trainer uses. ``reference_id`` is
    ``model.load.policy_ref(reference_path).id``. Policy ids are compared by their weights hash
    (the name before ``@`` differs between stages); hub ids (``...@hub``) must match whole.
    Line numbers count the pairs in order, as ``pairs.jsonl`` stores them.
    """
    ref_tag = _weights_tag(reference_id)
    for line, p in enumerate(pairs, start=1):
        for side in ("chosen_policy", "rejected_policy"):
            pid = getattr(p, side)
            if pid == "expert":
                continue
            same = pid == reference_id if ref_tag == "hub" else _weights_tag(pid) == ref_tag
            if not same:
                raise PairsPolicyError(
                    f"{source}:{line}: pair {p.pair_id}: {side} is {pid!r}, but the DPO reference is "
                    f"{reference_id!r}: these pairs were explored by another policy (rebuild them from the "
                    f"reference: rerun explore and pairs for this iteration)")
