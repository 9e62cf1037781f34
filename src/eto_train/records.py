"""Typed episode records, their JSON form, chat messages for TRL and the ETO/ShareGPT format.

One :class:`Episode` per rollout. Everything needed to reproduce or audit it is on the record:
task, seed, environment version and parameters, the policy (path + weight hash), the prompt
format version, and per step the raw model output, the parsed action, validity, reward,
latency and token counts. Reward components are kept apart rather than summed.
"""

from __future__ import annotations

import hashlib
import re
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
    latency_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0


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
    system: str  # rendered system turn
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
    schema_version: int = SCHEMA_VERSION

    # -- derived --------------------------------------------------------------------------
    @property
    def success(self) -> bool:
        return self.status == "success"

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def finish(self, status: str, error: str | None = None) -> None:
        """Set the terminal status and the separate reward components."""
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
        return ep


def episode_key(policy_id: str, task_id: str, sample_index: int | str, seed: int) -> str:
    """Idempotency key of an episode: the same policy on the same task/sample/seed."""
    raw = f"{policy_id}|{task_id}|{sample_index}|{seed}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


# -- chat messages (TRL's conversational format) ------------------------------------------
def to_messages(ep: Episode, max_turns: int | None = None) -> list[dict[str, str]]:
    """The episode as chat messages ending on the assistant's last kept action.

    ``max_turns`` keeps the first ``max_turns`` actions (the ETO truncation rule cuts a
    rejected trajectory to the expert's length plus 5 turns).
    """
    msgs = []
    if ep.system:
        msgs.append({"role": "system", "content": ep.system})
    msgs.append({"role": "user", "content": ep.first_user})
    steps = ep.steps if max_turns is None else ep.steps[:max_turns]
    for i, s in enumerate(steps):
        msgs.append({"role": "assistant", "content": s.raw_output})
        if i + 1 < len(steps):
            msgs.append({"role": "user", "content": s.observation})
    return msgs


# -- ETO / ShareGPT format ----------------------------------------------------------------
def to_eto(ep: Episode) -> dict[str, Any]:
    """ETO's released trajectory format: ``conversations`` of ``from: human|gpt`` turns.

    ETO has no system role: the system text opens the first human turn.
    """
    conv = []
    for m in to_messages(ep):
        if m["role"] == "system":
            continue
        value = m["content"]
        if not conv and ep.system and m["role"] == "user":
            value = f"{ep.system}\n\n{value}"
        conv.append({"from": "human" if m["role"] == "user" else "gpt", "value": value})
    return {"id": ep.task_id, "conversations": conv, "reward": ep.final_score,
            "success": ep.success}


def from_eto(obj: dict[str, Any], env: str = "eto-import", split: str = "train") -> Episode:
    """Read one ETO/ShareGPT trajectory (``conversations`` with ``from: human|gpt``)."""
    from .prompting import parse_action  # local: records must not depend on prompting at import

    if not isinstance(obj, dict) or "conversations" not in obj:
        raise ValueError("expected an object with a 'conversations' list")
    conv = obj["conversations"]
    if not isinstance(conv, list) or not conv:
        raise ValueError("'conversations' must be a non-empty list")
    for i, turn in enumerate(conv):
        if not isinstance(turn, dict) or turn.get("from") not in ("human", "gpt"):
            raise ValueError(f"conversations[{i}].from must be 'human' or 'gpt', got "
                             f"{turn.get('from') if isinstance(turn, dict) else turn!r}")
        if not isinstance(turn.get("value"), str):
            raise ValueError(f"conversations[{i}].value must be a string")
    if conv[0]["from"] != "human":
        raise ValueError("conversations[0] must be a human turn (the instruction)")
    if not any(t["from"] == "gpt" for t in conv):
        raise ValueError("the trajectory has no gpt (assistant) turn")
    steps: list[Step] = []
    for i in range(1, len(conv)):
        turn = conv[i]
        if turn["from"] == "gpt":
            if conv[i - 1]["from"] != "human":
                raise ValueError(f"conversations[{i}]: two gpt turns in a row")
            obs = conv[i + 1]["value"] if i + 1 < len(conv) else ""
            action = parse_action(turn["value"])
            if action is None and re.search(r"(?im)^\s*action\s*:\s*$", turn["value"]):
                raise ValueError(f"conversations[{i}].value: empty action ('Action:' with nothing after it)")
            steps.append(Step(index=len(steps), raw_output=turn["value"], action=action,
                              valid=action is not None, observation=obs, reward=0.0, done=False))
    reward = float(obj.get("reward", 1.0 if obj.get("success", True) else 0.0))
    if steps:
        steps[-1].reward, steps[-1].done = reward, True
    tid = str(obj.get("id", obj.get("game_file", "unknown")))
    ep = Episode(episode_id=episode_key("expert", tid, 0, 0), task_id=tid, env=env, game="",
                 fold="", seed=0, split=split, env_version="imported",
                 policy=PolicyRef(id="expert"), prompt_version="eto", system="",
                 first_user=conv[0]["value"], instruction=conv[0]["value"],
                 first_observation="", steps=steps)
    ep.finish("success" if obj.get("success", reward > 0) else "failure")
    return ep
