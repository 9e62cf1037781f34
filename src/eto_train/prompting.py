"""Prompt format (ReAct-style, as in the ETO paper) and action parsing.

A conversation is: a system turn naming the environment's action forms; a user turn with the
task and the first observation; then alternating assistant turns (``Thought: ...`` optional,
then ``Action: ...``) and user turns carrying the environment's observation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PROMPT_VERSION = "react-v1"

_ACTION_RE = re.compile(r"^\s*Action\s*:\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class PromptConfig:
    system: str = ("You are an agent in a text environment. Each turn, answer with one line "
                   "'Action: <action>'. Actions you can use: {actions}.")
    task_template: str = "Task: {task}\nObservation: {observation}"
    invalid_format: str = "Invalid format. Answer with one line 'Action: <action>'."
    thought: bool = False  # expert turns carry a 'Thought:' line when the data has one
    version: str = PROMPT_VERSION


def system_message(cfg: PromptConfig, action_forms: list[str]) -> dict[str, str]:
    return {"role": "system", "content": cfg.system.format(actions="; ".join(action_forms))}


def first_user_message(cfg: PromptConfig, task: str, observation: str) -> dict[str, str]:
    return {"role": "user", "content": cfg.task_template.format(task=task, observation=observation)}


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
