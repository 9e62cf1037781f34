"""Credit at the decision boundary: per step, the components agent-training practice keeps apart.

Per step ``t`` (:func:`eto_train.records.step_credit`, which ``Episode.finish`` stores on the record), each a
float so the record stays plain JSON:

- ``validity``: 1.0 when the output parsed and the environment accepted the action (``Step.valid``).
- ``progress``: the score change of this step, ``reward_t - reward_{t-1}`` with ``reward_{-1} = 0``
  (``Step.reward`` is the cumulative normalised score).
- ``redundant``: 1.0 when the same action was already taken earlier in the episode in the same
  state. The state is what the agent saw before acting: the first observation for ``t = 0``, else
  the previous step's observation (text games give no other state; two places that read the same
  count as one).
- ``loop``: 1.0 when this step completes a loop: the last of one action ``repeats`` times in a row,
  or the last of an A-B cycle repeated ``repeats`` times (A-B-A-B-A-B); ``evaluation.has_loop`` is
  "any step closes a loop".

An action is compared by its parsed text, or by the raw output when it did not parse. The
episode's outcome stays apart (``Episode.reward_components``). ``Episode.finish`` stores the
credit on each step; :func:`credit_of` reads it back, or computes it for records written before.

Rates over a policy's scored episodes (:func:`rates`; the environment, orchestrator and
evaluator failures of ``NOT_POLICY_FAULT`` are left out, as from the success rate):

- ``invalid_action_rate``: share of steps that are not valid.
- ``loop_rate``: share of episodes with a step that closes a loop.
- ``redundant_action_rate``: share of steps that are redundant.
- ``premature_stop_rate``: share of episodes that ended before the step limit without success on
  the policy's own account: status ``failure`` (the environment said done without a win) or
  ``model_failure``; ``max_steps`` (the limit reached) and ``success`` are not premature.
"""

from __future__ import annotations

from typing import Any

from .records import NOT_POLICY_FAULT, Episode, step_credit

KEYS = ("validity", "progress", "redundant", "loop")
PREMATURE = ("failure", "model_failure")  # the policy's own early end (records.STATUSES)


def credit_of(ep: Episode) -> list[dict[str, float]]:
    """The stored credit of ``ep``'s steps, or (a record from before it was stored) computed now."""
    if all(s.credit is not None for s in ep.steps):
        return [s.credit for s in ep.steps]
    return step_credit(ep)


def premature_stop(ep: Episode) -> bool:
    return ep.status in PREMATURE


def episode_rates(ep: Episode) -> dict[str, float]:
    """One episode's shares of invalid and redundant steps, whether it loops, whether it stopped early."""
    c, n = credit_of(ep), len(ep.steps)
    return {"invalid": sum(1 - x["validity"] for x in c) / n if n else 0.0,
            "redundant": sum(x["redundant"] for x in c) / n if n else 0.0,
            "loop": float(any(x["loop"] for x in c)), "premature_stop": float(premature_stop(ep))}


def rates(episodes: list[Episode]) -> dict[str, Any]:
    """The four behaviour rates over the policy-accountable episodes (see the module's docstring)."""
    scored = [e for e in episodes if e.status not in NOT_POLICY_FAULT]
    steps = [x for e in scored for x in credit_of(e)]
    n, m = len(scored), len(steps)
    return {"invalid_action_rate": sum(1 - x["validity"] for x in steps) / m if m else 0.0,
            "loop_rate": sum(any(x["loop"] for x in credit_of(e)) for e in scored) / n if n else 0.0,
            "redundant_action_rate": sum(x["redundant"] for x in steps) / m if m else 0.0,
            "premature_stop_rate": sum(premature_stop(e) for e in scored) / n if n else 0.0}
