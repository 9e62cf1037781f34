"""Which tokens of a rendered conversation are the assistant's (its actions): the labels of
behavior cloning and the completion mask of DPO.

Works for any chat template, with or without ``{% generation %}`` markers, and for templates
that rewrite history (Qwen3 adds an empty thinking block to the last assistant turn only).
The conversation is rendered once; each message's content (trimmed, as templates trim it) is
found in that text in order, so an assistant turn's characters are known exactly. Its tokens
are those that overlap its content, plus what follows up to and including the turn's
end-of-turn token (Llama-2's " </s>", ChatML's "<|im_end|>", Gemma's "<end_of_turn>"): what the
model must generate to answer and stop. Role headers, thinking-block scaffolding, the separator
after the end-of-turn token and every other message count for nothing. Message text that spells a
control token (``<|im_end|>`` in an observation) is text here too, as in the rollout prompt
(:func:`eto_train.prompting.guard_messages`).

Written by hand because TRL's ``assistant_only_loss`` needs generation markers that most public
chat templates (Llama-2, Llama-3, Mistral, Qwen) do not have, and its template patching covers
only some families.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from ..prompting import guard_messages


class TemplateError(ValueError):
    """A chat template that does not render a message's content verbatim."""


def _render(tok, messages) -> str:
    return tok.apply_chat_template(messages, tokenize=False)


def content_spans(text: str, messages: list[dict[str, str]]) -> list[tuple[int, int, int]]:
    """(message index, start, end) of every non-empty message content in the rendered ``text``.

    Messages are searched in order, each after the previous one's end, so an action repeated
    in an earlier observation is never mistaken for the action itself."""
    spans, cursor = [], 0
    for i, m in enumerate(messages):
        needle = (m.get("content") or "").strip()
        if not needle:
            continue
        start = text.find(needle, cursor)
        if start < 0:
            raise TemplateError(
                f"the chat template does not render message {i} ({m['role']}) verbatim, so its tokens cannot "
                f"be located (content starts {needle[:60]!r}); set model.chat_template to a template that does")
        spans.append((i, start, start + len(needle)))
        cursor = start + len(needle)
    return spans


def assistant_token_mask(tok, messages: list[dict[str, str]],
                         stop_ids: set[int] | None = None) -> tuple[list[int], list[int]]:
    """(input ids of the whole conversation, 1 for each assistant token else 0).

    ``stop_ids``: the end-of-turn token ids (default: the tokenizer's eos). No message text becomes a
    control token: contents are escaped as the rollout prompt's are (:func:`eto_train.prompting.guard_messages`)."""
    stop = set(stop_ids) if stop_ids else {tok.eos_token_id}
    messages = guard_messages(tok, messages)
    text = _render(tok, messages)
    spans = content_spans(text, messages)
    if getattr(tok, "is_fast", False):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
    else:  # a slow tokenizer has no offsets: tokenize the text up to each boundary instead
        ids = tok(text, add_special_tokens=False)["input_ids"]
        offsets = None
    starts = [s for s, _ in offsets] if offsets else None
    ends = [e for _, e in offsets] if offsets else None

    def first_token_ending_after(c: int) -> int:
        if offsets:
            return bisect_right(ends, c)
        return len(tok(text[:c], add_special_tokens=False)["input_ids"])

    def first_token_starting_at(c: int) -> int:
        if offsets:
            return bisect_left(starts, c)
        return len(tok(text[:c], add_special_tokens=False)["input_ids"])

    mask = [0] * len(ids)
    for k, (i, a, b) in enumerate(spans):
        if messages[i]["role"] != "assistant":
            continue
        limit = first_token_starting_at(spans[k + 1][1]) if k + 1 < len(spans) else len(ids)
        lo, hi = first_token_ending_after(a), first_token_starting_at(b)
        # then up to and including the end-of-turn token, if the turn has one before the next message
        stop_at = next((j for j in range(hi, limit) if ids[j] in stop), None)
        if stop_at is not None:
            hi = stop_at + 1
        for j in range(lo, min(hi, len(ids))):
            mask[j] = 1
    return ids, mask
