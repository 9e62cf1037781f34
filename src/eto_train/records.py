"""Typed episode records, their JSON form and chat messages for TRL (the ETO/ShareGPT format: eto_format).

One :class:`Episode` per rollout. Everything needed to reproduce or audit it is on the record:
task, seed, environment version and parameters, the policy (path + weight hash), the prompt
format version, and per step the raw model output, the parsed action, validity, reward,
latency and token counts. Reward components are kept apart rather than summed.
"""

from __future__ import annotations

import hashlib
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

SCHEMA_VERSION = 1

STATUSES = ("success", "failure", "max_steps", "model_failure", "environment_failure",
            "orchestrator_failure", "evaluator_failure")
# Statuses where the policy was not at fault: such episodes are never negatives in training.
NOT_POLICY_FAULT = ("environment_failure", "orchestrator_failure", "evaluator_failure")


class RecordError(ValueError):
    """A record that cannot be read; the message names the file and line."""


@dataclass
class Step:
    index: int
    raw_output: str  # exactly what the model produced (the assistant turn)
    action: str | None  # parsed action, None when the output did not parse
    valid: bool  # parsed and accepted by the environment
    observation: str  # what the environment (or the format checker) answered
    reward: float  # cumulative normalised score after this step
    done: bool
    latency_s: float = 0.0  # the policy's time for the batched step this output came from
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # per-step credit (validity, progress, redundant, loop: :func:`step_credit`), set by Episode.finish;
    # None on records written before it (credit.credit_of computes it for those)
    credit: dict[str, float] | None = None
    # the environment's own time answering this step's action (envs/guard.py measures it where the
    # adapter runs: in a worker process, without the pipe); 0 for an output that did not parse and
    # on records written before it (issue 37)
    env_s: float = 0.0


@dataclass
class PolicyRef:
    id: str  # "<name>@<weights sha256[:12]>" or "expert"
    path: str = ""
    weights_sha256: str = ""


@dataclass
class Episode:
    episode_id: str
    task_id: str
    env: str
    game: str
    fold: str
    seed: int
    split: str
    env_version: str
    policy: PolicyRef
    prompt_version: str
    system: str  # rendered instruction (the system turn, or the paper's instruction turn: see ``opening``)
    first_user: str  # rendered first user turn (task + first observation)
    instruction: str  # the task as the environment stated it
    first_observation: str
    sample_index: int = 0
    env_params: dict[str, Any] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    status: str = "failure"
    final_score: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    env_errors: list[str] = field(default_factory=list)  # environment failures met (recovered or not)
    truncated_turns: int = 0  # turns dropped from the prompt to fit the context window
    opening: str = "system"  # how ``system`` opens the conversation: system | instruction_ok (user turn + "OK")
    schema_version: int = SCHEMA_VERSION

    # -- derived --------------------------------------------------------------------------
    @property
    def success(self) -> bool:
        return self.status == "success"

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def finish(self, status: str, error: str | None = None) -> None:
        """Set the terminal status, the separate reward components and each step's credit."""
        if status not in STATUSES:
            raise ValueError(f"unknown episode status {status!r}; one of {STATUSES}")
        self.status, self.error = status, error
        self.final_score = self.steps[-1].reward if self.steps else 0.0
        n = len(self.steps)
        self.reward_components = {
            "outcome": 1.0 if status == "success" else 0.0,
            "progress": self.final_score,
            "validity": (sum(s.valid for s in self.steps) / n) if n else 0.0,
            "cost": float(n),
        }
        for s, c in zip(self.steps, step_credit(self)):
            s.credit = c

    # -- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Episode":
        if not isinstance(d, dict):
            raise ValueError(f"an episode must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}")
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        missing = sorted(required - set(d))
        if missing:
            raise ValueError(f"missing field(s) {missing}")
        d = dict(d)
        d["policy"] = PolicyRef(**d["policy"])
        steps = []
        for i, s in enumerate(d.get("steps", [])):
            try:
                steps.append(Step(**s))
            except TypeError as exc:
                raise ValueError(f"steps[{i}]: {exc}") from None
            if steps[-1].action is not None and (not isinstance(steps[-1].action, str) or not steps[-1].action.strip()):
                raise ValueError(f"steps[{i}].action: empty action {steps[-1].action!r} "
                                 "(an action is a non-empty string, or null when the output did not parse)")
        d["steps"] = steps
        ep = cls(**d)
        if ep.status not in STATUSES:
            raise ValueError(f"status {ep.status!r} is not one of {STATUSES}")
        if ep.opening not in ("system", "instruction_ok"):
            raise ValueError(f"opening {ep.opening!r} is not one of ['system', 'instruction_ok']")
        return ep


def episode_key(policy_id: str, task_id: str, sample_index: int | str, seed: int) -> str:
    """Idempotency key of an episode: the same policy on the same task/sample/seed."""
    raw = f"{policy_id}|{task_id}|{sample_index}|{seed}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


# -- chat messages (TRL's conversational format) ------------------------------------------
def context_length(ep: Episode) -> int:
    """How many messages of :func:`to_messages` come before the first action (opening + task)."""
    return (0 if not ep.system else 2 if ep.opening == "instruction_ok" else 1) + 1


def to_messages(ep: Episode, max_turns: int | None = None) -> list[dict[str, str]]:
    """The episode as chat messages ending on the assistant's last kept action.

    The opening is a system turn, or the paper's instruction turn answered "OK"
    (``ep.opening``); the in-context example of a rollout prompt is never part of it.

    ``max_turns`` keeps the first ``max_turns`` actions (the ETO truncation rule cuts a
    rejected trajectory to the expert's length plus 5 turns).
    """
    from .prompting import opening_messages  # local: records must not depend on prompting at import

    msgs = opening_messages(ep.opening, ep.system)
    msgs.append({"role": "user", "content": ep.first_user})
    steps = ep.steps if max_turns is None else ep.steps[:max_turns]
    for i, s in enumerate(steps):
        msgs.append({"role": "assistant", "content": s.raw_output})
        if i + 1 < len(steps):
            msgs.append({"role": "user", "content": s.observation})
    return msgs


# -- per-step credit (what Episode.finish stores; the rates over episodes are credit.py's) ------------

def action_key(step: Step) -> str:
    """What an action is compared by: its parsed text, or the raw output when it did not parse."""
    return step.action if step.action is not None else step.raw_output


def loop_marks(keys: list[str], repeats: int = 3) -> list[bool]:
    """Per position: does it complete ``repeats`` equal keys in a row, or an A-B cycle ``repeats`` times?"""
    marks = [False] * len(keys)
    for i in range(len(keys) - repeats + 1):
        if len(set(keys[i:i + repeats])) == 1:
            marks[i + repeats - 1] = True
    for i in range(len(keys) - 2 * repeats + 1):
        w = keys[i:i + 2 * repeats]
        if w[0] != w[1] and w[0::2] == [w[0]] * repeats and w[1::2] == [w[1]] * repeats:
            marks[i + 2 * repeats - 1] = True
    return marks


def step_credit(ep: Episode, repeats: int = 3) -> list[dict[str, float]]:
    """The four components of every step of ``ep`` (defined in credit.py's docstring; stored by
    ``Episode.finish``, read back by ``credit.credit_of``)."""
    keys = [action_key(s) for s in ep.steps]
    states = [ep.first_observation] + [s.observation for s in ep.steps[:-1]]
    seen: set[tuple[str, str]] = set()
    out, before = [], 0.0
    for s, key, state, loop in zip(ep.steps, keys, states, loop_marks(keys, repeats)):
        out.append({"validity": float(s.valid), "progress": s.reward - before,
                    "redundant": float((state, key) in seen), "loop": float(loop)})
        seen.add((state, key))
        before = s.reward
    return out
