"""Prompt format (ReAct-style, as in the ETO paper) and action parsing.

A conversation is: an opening that states the instruction (a system turn, or, as in the ETO
paper, a user turn with the instruction answered by an assistant "OK"); at rollout time only,
an optional in-context example (whole exchanges, as the paper's one-shot example); a user turn
with the task (and the first observation); then alternating assistant turns (``Thought: ...``
optional, then ``Action: ...``) and user turns carrying the environment's observation.

Profiles live in ``configs/prompt/``: ``react`` (the project's own) and ``<env>_eto`` (the
paper's instruction, one-shot example and observation prefix, per environment).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PROMPT_VERSION = "react-v1"
OPENINGS = ("system", "instruction_ok")
OK = "OK"  # the assistant's answer to the instruction turn in the paper's opening

_ACTION_RE = re.compile(r"^\s*Action\s*:\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class PromptConfig:
    system: str = ("You are an agent in a text environment. Each turn, answer with one line "
                   "'Action: <action>'. Actions you can use: {actions}.")
    task_template: str = "Task: {task}\nObservation: {observation}"
    invalid_format: str = "Invalid format. Answer with one line 'Action: <action>'."
    thought: bool = False  # expert turns carry a 'Thought:' line when the data has one
    version: str = PROMPT_VERSION
    # system: the instruction is a system turn; instruction_ok: a user turn answered "OK" (the paper)
    opening: str = "system"
    observation_template: str = "{observation}"  # each later observation turn (the paper: "Observation: ...")
    # in-context example: user/assistant turns after the opening, in rollouts only (never trained on)
    example: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.opening not in OPENINGS:
            raise ValueError(f"prompt.opening: {self.opening!r} is not one of {list(OPENINGS)}")
        for key in ("task_template", "observation_template"):
            try:
                getattr(self, key).format(task="", observation="")
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"prompt.{key}: {getattr(self, key)!r} is not a template of "
                                 f"{{task}} and {{observation}}: {exc}") from None
        roles = ["user", "assistant"] * (len(self.example) // 2 + 1)
        for i, m in enumerate(self.example):
            if not isinstance(m, dict) or set(m) != {"role", "content"} or not isinstance(m.get("content"), str):
                raise ValueError(f"prompt.example[{i}]: expected {{role, content}} with a string content")
            if m["role"] != roles[i]:
                raise ValueError(f"prompt.example[{i}].role: {m['role']!r}, expected {roles[i]!r} "
                                 "(the example alternates user and assistant turns, starting with the task)")
        if self.example and self.example[-1]["role"] != "assistant":
            raise ValueError("prompt.example: must end on an assistant turn (the next turn is the task)")


def opening_messages(opening: str, system: str) -> list[dict[str, str]]:
    """The turns that state the instruction: a system turn, or the paper's user turn + "OK"."""
    if not system:
        return []
    if opening == "instruction_ok":
        return [{"role": "user", "content": system}, {"role": "assistant", "content": OK}]
    return [{"role": "system", "content": system}]


def system_message(cfg: PromptConfig, action_forms: list[str]) -> dict[str, str]:
    return {"role": "system", "content": cfg.system.format(actions="; ".join(action_forms))}


def first_user_message(cfg: PromptConfig, task: str, observation: str) -> dict[str, str]:
    return {"role": "user", "content": cfg.task_template.format(task=task, observation=observation)}


def render_observation(cfg: PromptConfig, observation: str) -> str:
    """The user turn that carries an environment observation."""
    return cfg.observation_template.format(observation=observation, task="")


def rollout_context(cfg: PromptConfig, system: str, first_user: str) -> list[dict[str, str]]:
    """What the policy sees before its first action: opening, in-context example, task."""
    return [*opening_messages(cfg.opening, system), *[dict(m) for m in cfg.example],
            {"role": "user", "content": first_user}]


def format_action(action: str, thought: str | None = None) -> str:
    """The assistant turn for an action (the expert's, or a canonical rewrite)."""
    return (f"Thought: {thought}\nAction: {action}" if thought else f"Action: {action}")


def parse_action(text: str) -> str | None:
    """The action in a model output, or None when it does not parse.

    The last ``Action:`` line wins (a thought may mention the word). The action is lower-cased
    and whitespace-normalised, as the text games expect; an empty action does not parse.
    """
    matches = _ACTION_RE.findall(text or "")
    if not matches:
        return None
    action = " ".join(matches[-1].split()).lower()
    return action or None
