"""Which tokens of a rendered conversation are the assistant's (its actions).

Works for any chat template, with or without ``{% generation %}`` markers: the conversation
is rendered once per assistant turn, and the text an assistant turn adds to the rendering of
everything before it (after the generation prompt) is that turn's text. Written by hand
because TRL's ``return_assistant_tokens_mask`` needs generation markers that most public chat
templates (Llama-2, Llama-3, Qwen) do not have.

With a fast tokenizer the whole conversation is tokenized once and each token is placed by
its character offsets (rendering is cheap, tokenizing is not: DPO pairs of 15 turns took 5 s
per 141 pairs when every prefix was tokenized); otherwise every prefix is tokenized.
"""

from __future__ import annotations

from bisect import bisect_left


def _render(tok, messages, add_generation_prompt=False) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def assistant_token_mask(tok, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """(input ids of the whole conversation, 1 for each assistant token else 0)."""
    text = _render(tok, messages)
    # per assistant turn: (the text before it, generation prompt included; the text up to its end)
    spans = [(_render(tok, messages[:i], add_generation_prompt=True), _render(tok, messages[: i + 1]))
             for i, m in enumerate(messages) if m["role"] == "assistant"]
    if getattr(tok, "is_fast", False) and all(text.startswith(t) for span in spans for t in span):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        full, starts = enc["input_ids"], [s for s, _ in enc["offset_mapping"]]
        # a turn's tokens: from the first token starting at its first character to the first after it
        bounds = [(bisect_left(starts, len(before)), bisect_left(starts, len(upto))) for before, upto in spans]
    else:
        full = _ids(tok, text)
        bounds = [(len(_ids(tok, before)), len(_ids(tok, upto))) for before, upto in spans]
    mask = [0] * len(full)
    for start, end in bounds:
        # Templates may append a separator after the end-of-turn token (ChatML's "\n"); the
        # turn's own tokens end at its end-of-turn token when it has one.
        turn = full[start:end]
        if tok.eos_token_id in turn:
            end = start + turn.index(tok.eos_token_id) + 1
        for j in range(start, min(end, len(full))):
            mask[j] = 1
    return full, mask
