"""Fitting a conversation into the model's context window, with a warning and a count.

The rollout prompt is the system turn, the task turn (task + first observation) and the
exchanges so far. When it does not fit: the oldest exchanges go first (never the system
turn, the task turn or the latest exchange, which holds the observation the model must act
on); if it still does not fit, the newest observation itself is cut at its end and marked
``[... N tokens truncated]``. Only when even that is not enough (the system and task turns
alone exceed the context) are tokens cut from the start, as a last resort. Every cut of text
warns (:class:`ContextTruncationWarning`); dropped exchanges and cuts are counted in the return
value (and so in each episode's ``truncated_turns``).
"""

from __future__ import annotations

import warnings


class ContextTruncationWarning(UserWarning):
    """An observation or prompt was cut to fit the model's context."""


MARKER = "\n[... {n} tokens truncated]"


def _ids(tok, conv) -> list[int]:
    text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def fit_prompt(tok, conv: list[dict[str, str]], budget: int) -> tuple[list[int], int, int]:
    """(prompt token ids of at most ``budget``, exchanges dropped, tokens cut from the newest
    observation or, as a last resort, from the start of the prompt)."""
    if budget <= 0:
        raise ValueError(f"no room for a prompt: the context budget is {budget} tokens "
                         "(model.max_context minus the generation's max_new_tokens)")
    ids = _ids(tok, conv)
    if len(ids) <= budget:
        return ids, 0, 0
    total = len(ids)
    head = 2 if conv and conv[0]["role"] == "system" else 1
    dropped = 0
    while len(ids) > budget and len(conv) > head + 2:  # keep the latest (assistant, user) exchange
        conv = conv[:head] + conv[head + 2:]
        dropped += 1
        ids = _ids(tok, conv)
    cut = 0
    if len(ids) > budget:
        last = conv[-1]
        content_ids = tok(last["content"], add_special_tokens=False)["input_ids"]
        keep = len(content_ids) - (len(ids) - budget)
        while True:
            keep = max(keep, 0)
            n_cut = len(content_ids) - keep
            trial = conv[:-1] + [{**last, "content": tok.decode(content_ids[:keep]) + MARKER.format(n=n_cut)}]
            trial_ids = _ids(tok, trial)
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
