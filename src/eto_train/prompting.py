"""Prompt format (ReAct-style, as in the ETO paper), action parsing, and fitting a prompt into the context.

A conversation is: an opening that states the instruction (a system turn, or, as in the ETO
paper, a user turn with the instruction answered by an assistant "OK"); at rollout time only,
an optional in-context example (whole exchanges, as the paper's one-shot example); a user turn
with the task (and the first observation); then alternating assistant turns (``Thought: ...``
optional, then ``Action: ...``) and user turns carrying the environment's observation.

Profiles live in ``configs/prompt/``: ``react`` (the project's own) and ``<env>_eto`` (the
paper's instruction, one-shot example and observation prefix, per environment).

Fitting a conversation into the model's context window, with a warning and a count
(:func:`fit_prompt`): the rollout prompt is the system turn, the task turn (task + first
observation) and the exchanges so far. When it does not fit: the oldest exchanges go first (never the system
turn, the task turn or the latest exchange, which holds the observation the model must act
on); if it still does not fit, the newest observation itself is cut at its end and marked
``[... N tokens truncated]``. Only when even that is not enough (the system and task turns
alone exceed the context) are tokens cut from the start, as a last resort. Every cut of text
warns (:class:`ContextTruncationWarning`); dropped exchanges and cuts are counted in the return
value (and so in each episode's ``truncated_turns``).

Token ids of a conversation (:func:`chat_ids`, and :func:`guard_messages` for the training masks): text
that is not the template's own (observations, task descriptions, imported trajectories, web pages, a
model's earlier output, the prompt profile's own turns) never becomes one of the tokenizer's special
tokens. A message content that contains a special token's string (``<|im_end|>``, ``<|eot_id|>``,
``<start_of_turn>``, ``</s>``, ...) has each occurrence broken with a zero-width space after its first
character before the template is rendered (:func:`escape_controls`), so it is tokenized as text and the
policy never sees a forged turn. Content without such strings is left as it is: its token ids are those
of the plain rendering.
"""

from __future__ import annotations

import re
import warnings
import weakref
from dataclasses import dataclass

OPENINGS = ("system", "instruction_ok")
OK = "OK"  # the assistant's answer to the instruction turn in the paper's opening

_ACTION_RE = re.compile(r"^\s*Action\s*:\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class PromptConfig:
    """A prompt profile's fields (configs/prompt/*.yaml, the ``prompt`` section; no values of its own)."""

    system: str  # the instruction; {actions}: the game's action forms
    task_template: str  # the first user turn: {task}, {observation}
    invalid_format: str  # the observation after an answer with no action to read
    thought: bool  # expert turns carry a 'Thought:' line when the data has one
    version: str
    # system: the instruction is a system turn; instruction_ok: a user turn answered "OK" (the paper)
    opening: str
    observation_template: str  # each later observation turn (the paper: "Observation: ...")
    # in-context example: user/assistant turns after the opening, in rollouts only (never trained on)
    example: list

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


def answer_room_warning(tok, example: list, max_new_tokens: int) -> str | None:
    """A line when the generation's ``max_new_tokens`` is shorter than the in-context example's
    longest answer: a policy that answers in the example's shape (e.g. "Thought: ... Action: ...")
    is then cut before its ``Action:`` line, every turn, and each cut answer counts as unparsed.
    None when every example answer fits (or there is no example)."""
    answers = [m["content"] for m in example if m.get("role") == "assistant"]
    if not answers:
        return None
    longest = max(len(tok(a, add_special_tokens=False)["input_ids"]) for a in answers) + 1  # + its end of turn
    if max_new_tokens >= longest:
        return None
    return (f"rollout.generation.max_new_tokens={max_new_tokens} is shorter than the longest answer of prompt.example "
            f"({longest} tokens with its end of turn): a policy that answers as the example does is cut before its "
            f"Action line (counted as unparsed); raise it to at least {longest}")


def format_action(action: str, thought: str | None = None) -> str:
    """The assistant turn for an action (the expert's, or a canonical rewrite)."""
    return (f"Thought: {thought}\nAction: {action}" if thought else f"Action: {action}")


def parse_action(text: str) -> str | None:
    """The action in a model output, or None when it does not parse.

    The last ``Action:`` line wins (a thought may mention the word). The action is lower-cased
    and whitespace-normalised, as the text games expect, and what a chat model adds around it
    is dropped: quotes or backticks around it and a sentence's closing period ("Action: take
    coin." is ``take coin``; no game action ends in one); an empty action does not parse.
    """
    matches = _ACTION_RE.findall(text or "")
    if not matches:
        return None
    action = " ".join(matches[-1].split()).lower().rstrip(".").strip("`'\" ").rstrip(".")
    return action or None


class ContextTruncationWarning(UserWarning):
    """An observation or prompt was cut to fit the model's context."""


MARKER = "\n[... {n} tokens truncated]"


# -- message text is never a control token ---------------------------------------------------
ZERO_WIDTH = "\u200b"  # breaks a special token's string; tokenizes as text in every family's vocabulary
_CONTROLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (its size, pattern)


def _trie_pattern(strings: list[str]) -> str:
    """One regex of ``strings`` as a trie of alternatives (leftmost-longest match, one branch per
    character: Mistral's 751 special tokens cost a character test at each position, not 751)."""
    trie: dict = {}
    for s in strings:
        node = trie
        for ch in s:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict) -> str:
        alts = [re.escape(ch) + build(node[ch]) for ch in sorted(k for k in node if k)]
        if not alts:
            return ""
        end = "" in node
        body = alts[0] if len(alts) == 1 and not end else "(?:" + "|".join(alts) + ")"
        return body + ("?" if end else "")

    return build(trie)


def _control_pattern(tok) -> re.Pattern | None:
    """The strings of the tokenizer's special tokens (its added tokens marked special: the chat
    template's control tokens, bos/eos, reserved ones) as one pattern; None when it has none.
    Non-special added tokens (Gemma's newline runs and HTML tags, Qwen's ``<think>``) are ordinary
    text to the tokenizer and stay so."""
    size = len(tok) if hasattr(type(tok), "__len__") else None  # a token added since: read them again
    cached = _CONTROLS.get(tok)
    if cached is not None and cached[0] == size:
        return cached[1]
    added = getattr(tok, "added_tokens_decoder", None)
    special = ({t.content for t in added.values() if getattr(t, "special", False)} if added is not None
               else set(getattr(tok, "all_special_tokens", ())))
    strings = sorted(s for s in special if len(s) > 1 and ZERO_WIDTH not in s)
    pattern = re.compile(_trie_pattern(strings)) if strings else None
    _CONTROLS[tok] = (size, pattern)
    return pattern


def escape_controls(tok, text: str) -> str:
    """``text`` with every occurrence of a special token's string broken by a zero-width space after
    its first character, so that the tokenizer reads it as text; ``text`` itself when it has none
    (its token ids unchanged). Repeated until nothing matches (a break may reveal a shorter token)."""
    pattern = _control_pattern(tok)
    if pattern is None or not text:
        return text
    n = 1
    while n:
        text, n = pattern.subn(lambda m: m[0][0] + ZERO_WIDTH + m[0][1:], text)
    return text


def guard_messages(tok, messages: list[dict]) -> list[dict]:
    """The messages with their contents escaped (:func:`escape_controls`): what every path renders
    with the chat template, so only the template's own text becomes control tokens."""
    return [{**m, "content": escape_controls(tok, m["content"])} if isinstance(m.get("content"), str) else m
            for m in messages]


def chat_ids(tok, conv: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of ``conv`` rendered with the chat template (by default ending on the assistant's
    header), no message text read as a control token. The rollout prompt of every engine (HF, KV,
    vLLM) is built here."""
    text = tok.apply_chat_template(guard_messages(tok, conv), tokenize=False,
                                   add_generation_prompt=add_generation_prompt)
    return tok(text, add_special_tokens=False)["input_ids"]


def fit_prompt(tok, conv: list[dict[str, str]], budget: int) -> tuple[list[int], int, int]:
    """(prompt token ids of at most ``budget``, exchanges dropped, tokens cut from the newest
    observation or, as a last resort, from the start of the prompt)."""
    if budget <= 0:
        raise ValueError(f"no room for a prompt: the context budget is {budget} tokens "
                         "(model.max_context minus the generation's max_new_tokens)")
    ids = chat_ids(tok, conv)
    if len(ids) <= budget:
        return ids, 0, 0
    total = len(ids)
    head = 2 if conv and conv[0]["role"] == "system" else 1
    dropped = 0
    while len(ids) > budget and len(conv) > head + 2:  # keep the latest (assistant, user) exchange
        conv = conv[:head] + conv[head + 2:]
        dropped += 1
        ids = chat_ids(tok, conv)
    cut = 0
    if len(ids) > budget:
        last = conv[-1]
        content_ids = tok(escape_controls(tok, last["content"]), add_special_tokens=False)["input_ids"]
        keep = len(content_ids) - (len(ids) - budget)
        while True:
            keep = max(keep, 0)
            n_cut = len(content_ids) - keep
            trial = conv[:-1] + [{**last, "content": tok.decode(content_ids[:keep]) + MARKER.format(n=n_cut)}]
            trial_ids = chat_ids(tok, trial)
            if len(trial_ids) <= budget or keep == 0:
                conv, ids, cut = trial, trial_ids, n_cut
                break
            keep -= len(trial_ids) - budget
    start_cut = 0
    if len(ids) > budget:  # the system and task turns alone do not fit: cut the start
        start_cut = len(ids) - budget
        ids = ids[-budget:]
    if cut or start_cut:  # dropping old exchanges alone is routine in long episodes: counted, not warned
        extra = f" and {start_cut} tokens from the prompt start (system/task turns too long)" if start_cut else ""
        warnings.warn(f"prompt of {total} tokens exceeds the context budget of {budget} tokens: dropped {dropped} "
                      f"oldest exchange(s), truncated {cut} tokens of the newest observation{extra}",
                      ContextTruncationWarning, stacklevel=2)
    return ids, dropped, cut + start_cut
