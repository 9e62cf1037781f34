"""Failure/success contrast pairs (ETO step 3).

Trajectory level (the paper's rule): per task, the agent's final reward against the expert's.
The lower one is rejected and the higher chosen (an agent that beats the expert is chosen);
ties are dropped. The prompt is the system turn and the task with its first observation; the
completions are the rest of each conversation, both ending on an action, and the rejected
side is cut to the expert's length plus ``extra_turns`` (5) turns.

Step level (paper App. B): with the expert's first t-1 steps fixed, the policy acts from step
t to the end; when its final reward is below the expert's, its action at t is rejected against
the expert's a_t, both conditioned on the instruction and the expert prefix.

Anchor states (``contrast=anchor``, beyond the paper): where several samples of one task share
their whole history, the best action taken there (by the mean final score of its episodes)
is chosen against the worst, one action in its context, no expert side (:func:`anchor_pairs`).

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

from .config import EXPERT_REWARDS
from .records import NOT_POLICY_FAULT, Episode, RecordError, action_key, context_length, to_messages
from .store import read_jsonl

ROLES = ("system", "user", "assistant")
PAIR_KINDS = ("trajectory", "step", "self", "step_value", "anchor")
# environments where the authors' construct_preference.py fixes the gold reward at 1.0
# (build_preference: ``if args.task == 'sciworld'``; build_preference_alfworld: sciworld or alfworld)
AUTHORS_GOLD_ONE = ("sciworld", "alfworld")


@dataclass
class Pair:
    pair_id: str
    task_id: str
    kind: str  # one of PAIR_KINDS
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


def _max_turns(base: Episode, extra_turns: int | None) -> int | None:
    """The actions a rejected side keeps (``max_turns`` of :func:`_split`): ``base``'s (the expert's; for a
    self pair the best episode's) plus ``extra_turns`` (``eto.pairs.extra_turns``); None (not cut) when that
    is None."""
    return None if extra_turns is None else base.num_steps + extra_turns


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
    max_turns = _max_turns(expert, extra_turns)
    if rejected_cut == "first_divergence" and rejected is agent:
        t = first_divergence(expert, agent)
        t = (t if t is not None else min(expert.num_steps, agent.num_steps)) + 1
        max_turns = t if max_turns is None else min(max_turns, t)
    elif rejected_cut != "expert_length":
        raise ValueError(f"eto.pairs.rejected_cut={rejected_cut!r}: expert_length or first_divergence")
    prompt, chosen_msgs = _split(chosen)
    _, rejected_msgs = _split(rejected, max_turns=max_turns if rejected is agent else None)
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
    _, rejected = _split(worst, max_turns=_max_turns(best, extra_turns))
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
    prefix = _step_prompt(expert, t)  # instruction + expert steps < t, ends on a user turn
    chosen = [{"role": "assistant", "content": expert.steps[t].raw_output}]
    rejected = [{"role": "assistant", "content": continuation.steps[t].raw_output}]
    return Pair(pair_id=_pid("step", continuation.episode_id, expert.episode_id, t), task_id=expert.task_id,
                kind="step", step=t, chosen_policy=expert.policy.id, rejected_policy=continuation.policy.id,
                chosen_score=expert.final_score, rejected_score=continuation.final_score,
                prompt=prefix, chosen=chosen, rejected=rejected)


def anchor_pairs(episodes: list[Episode]) -> list[Pair]:
    """Anchor-state pairs (beyond the paper; the anchor states of GiGPO) from the episodes of one task.

    A state at depth t is a whole history: the first observation and the (action, observation)
    of steps 0..t-1, actions compared by :func:`action_key`. The episodes that reach one history
    are grouped; each action taken there is worth the mean final score of the episodes that took
    it. The best action (then the smallest action text) is chosen against the worst (then the
    smallest action text) when their values differ: ties give nothing, and so does a state where
    one action was taken. Each such state, at any depth, gives at most one pair, a single action
    in its context as :func:`step_pair`; ``chosen_score``/``rejected_score`` are the two values.
    Both sides are one assistant turn, the ``raw_output`` of a representative: for the chosen
    action its best-scoring episode, for the rejected action its worst-scoring one (then the
    lowest ``episode_id``); the prompt is the chosen representative's conversation up to the user
    turn showing the state (the episodes sharing the history took the same actions, but their
    raw outputs may differ). Episodes whose status is in ``NOT_POLICY_FAULT`` never count. No
    extra rollouts: the samples of a task (``eto.explore.samples``) are the data.
    """
    eps = [e for e in episodes if e.status not in NOT_POLICY_FAULT and e.steps]
    if len({e.task_id for e in eps}) > 1:
        raise ValueError(f"anchor pairs of different tasks: {sorted({e.task_id for e in eps})}")
    states: dict[tuple[str, ...], list[Episode]] = {}  # history -> the episodes that reached it
    for e in eps:
        history: tuple[str, ...] = (e.first_observation,)
        for s in e.steps:
            states.setdefault(history, []).append(e)
            history += (action_key(s), s.observation)
    out = []
    for history, group in states.items():
        t = (len(history) - 1) // 2
        by_action: dict[str, list[Episode]] = {}
        for e in group:
            by_action.setdefault(action_key(e.steps[t]), []).append(e)
        value = {a: sum(e.final_score for e in g) / len(g) for a, g in by_action.items()}
        best = min(by_action, key=lambda a: (-value[a], a))
        worst = min(by_action, key=lambda a: (value[a], a))
        if value[best] == value[worst]:
            continue  # one action taken, or a tie
        chosen = min(by_action[best], key=lambda e: (-e.final_score, e.episode_id))
        rejected = min(by_action[worst], key=lambda e: (e.final_score, e.episode_id))
        out.append(Pair(pair_id=_pid("anchor", chosen.task_id, t, _pid(*history)), task_id=chosen.task_id,
                        kind="anchor", step=t, chosen_policy=chosen.policy.id, rejected_policy=rejected.policy.id,
                        chosen_score=value[best], rejected_score=value[worst],
                        prompt=to_messages(chosen, max_turns=t + 1)[:-1],
                        chosen=[{"role": "assistant", "content": chosen.steps[t].raw_output}],
                        rejected=[{"role": "assistant", "content": rejected.steps[t].raw_output}]))
    return sorted(out, key=lambda p: (p.step, p.pair_id))


# -- step values (eto.pairs.contrast=step_value; beyond the paper, as IPR's step rewards) --------------
VALUE_BRANCHES = ("agent", "expert")  # whose action at t a value continuation starts with


@dataclass
class ValueState:
    """A state valued by Monte Carlo: the expert's first ``t`` steps on a task, where the agent
    took ``agent.steps[t]`` (an episode whose first ``t`` actions are the expert's)."""

    task_id: str
    t: int
    agent: Episode


def value_parent(ep: Episode) -> dict[str, Any]:
    """The step a value continuation belongs to (``env_params["parent"]``; {} for other episodes)."""
    parent = ep.env_params.get("parent") or {}
    return parent if parent.get("contrast") == "step_value" else {}


def value_states(experts: dict[str, Episode], explored: list[Episode], continuations: list[Episode],
                 positions: str) -> list[ValueState]:
    """The states to value, in order, each (task, t, agent action) once. ``first_divergence``: the
    explored episodes' first divergence from the expert (the agent's own first t actions are the
    expert's); ``all`` / ``sample``: the App. B continuations from an expert prefix of t steps, whose
    step t is what the policy did there. A state whose agent action is the expert's, or did not
    parse (compared by :func:`action_key`), has nothing to value."""
    agents = explored if positions == "first_divergence" else [c for c in continuations if not value_parent(c)]
    out, seen = [], set()
    for a in agents:
        e = experts.get(a.task_id)
        if e is None:
            continue
        t = first_divergence(e, a) if positions == "first_divergence" else a.env_params.get("expert_prefix", 0)
        if t is None or t >= min(len(a.steps), len(e.steps)) or any(s.action is None for s in e.steps[:t + 1]):
            continue  # (an imported expert step that does not parse cannot be replayed)
        act = action_key(a.steps[t])
        if act == e.steps[t].action or (a.task_id, t, act) in seen:
            continue
        seen.add((a.task_id, t, act))
        out.append(ValueState(a.task_id, t, a))
    return out


def value_sides(expert: Episode, state: ValueState) -> list[tuple[str, str, tuple[str, ...], str | None, float | None]]:
    """For the agent's and the expert's action at ``state``: (branch, the action (:func:`action_key`),
    the actions a continuation replays, the unparsed output it replays after them (an agent output
    that did not parse; else None), the value when it is known). An action that ends the episode
    (done, or the step limit) needs no continuation: its value is the score recorded after it;
    else the value is ``None`` (sampled)."""
    t, agent = state.t, state.agent
    limit = agent.env_params.get("max_steps", expert.env_params.get("max_steps"))
    prefix = tuple(s.action for s in expert.steps[:t])
    out = []
    for branch, step in (("agent", agent.steps[t]), ("expert", expert.steps[t])):
        ends = step.done or (limit is not None and t + 1 >= limit)
        replay = prefix if step.action is None else prefix + (step.action,)
        out.append((branch, action_key(step), replay, step.raw_output if step.action is None else None,
                    step.reward if ends else None))
    return out


def value_scores(continuations: Iterable[Episode]) -> dict[tuple[str, int, str, str], list[float]]:
    """(task, step, branch, action) -> the final scores of its value continuations; episodes whose
    status says the policy was not at fault are left out."""
    out: dict[tuple[str, int, str, str], list[float]] = {}
    for c in continuations:
        if (p := value_parent(c)):
            scores = out.setdefault((c.task_id, p["step"], p["branch"], p["action"]), [])
            if c.status not in NOT_POLICY_FAULT:
                scores.append(c.final_score)
    return out


def step_value_pair(expert: Episode, agent: Episode, t: int, agent_values: list[float],
                    expert_values: list[float], margin: float) -> Pair | None:
    """Step-value pair: the expert's a_t against the agent's action at t (``agent.steps[t]``) in the
    state of the expert's first t steps, when V(expert's) - V(agent's) > ``margin``, each V the mean
    of its ``*_values`` (continuation scores). None: the same action, a side without a value (every
    continuation an environment failure), or a difference within the margin (or the agent's better)."""
    if len(agent.steps) <= t or len(expert.steps) <= t or agent.steps[t].action == expert.steps[t].action:
        return None
    if not agent_values or not expert_values:
        return None
    v_agent, v_expert = sum(agent_values) / len(agent_values), sum(expert_values) / len(expert_values)
    if not v_expert - v_agent > margin:
        return None
    return Pair(pair_id=_pid("step_value", agent.episode_id, expert.episode_id, t), task_id=expert.task_id,
                kind="step_value", step=t, chosen_policy=expert.policy.id, rejected_policy=agent.policy.id,
                chosen_score=v_expert, rejected_score=v_agent, prompt=_step_prompt(expert, t),
                chosen=[{"role": "assistant", "content": expert.steps[t].raw_output}],
                rejected=[{"role": "assistant", "content": agent.steps[t].raw_output}])


def _step_prompt(expert: Episode, t: int) -> list[dict[str, str]]:
    """The instruction and the expert's steps before t, ending on the user turn that shows step t's state."""
    prefix = to_messages(expert, max_turns=t + 1)[:-1]
    return prefix[:context_length(expert)] if t == 0 else prefix


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
