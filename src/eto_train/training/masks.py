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


def _render(tok, messages, add_generation_prompt=False) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def _ids(tok, messages, add_generation_prompt=False) -> list[int]:
    return tok(_render(tok, messages, add_generation_prompt), add_special_tokens=False)["input_ids"]


def _turn_spans(tok, messages) -> list[tuple[str, str]]:
    """(text before the turn incl. the generation prompt, text up to the turn's end) per assistant turn."""
    return [(_render(tok, messages[:i], add_generation_prompt=True), _render(tok, messages[: i + 1]))
            for i, m in enumerate(messages) if m["role"] == "assistant"]


def _clip(full: list[int], start: int, end: int, eos) -> int:
    # Templates may append a separator after the end-of-turn token (ChatML's "\n"); the
    # turn's own tokens end at its end-of-turn token when it has one.
    turn = full[start:end]
    return start + turn.index(eos) + 1 if eos in turn else end


def assistant_token_mask(tok, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """(input ids of the whole conversation, 1 for each assistant token else 0)."""
    text = _render(tok, messages)
    spans = _turn_spans(tok, messages)
    if getattr(tok, "is_fast", False) and all(text.startswith(b) for pair in spans for b in pair):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        full, starts = enc["input_ids"], [s for s, _ in enc["offset_mapping"]]
        bounds = []
        for before, upto in spans:  # character spans -> token spans (first token starting at/after)
            a = next((j for j, s in enumerate(starts) if s >= len(before)), len(full))
            b = next((j for j, s in enumerate(starts) if s >= len(upto)), len(full))
            bounds.append((a, b))
    else:
        full = _ids(tok, messages)
        bounds = [(len(_ids(tok, messages[:i], add_generation_prompt=True)), len(_ids(tok, messages[: i + 1])))
                  for i, m in enumerate(messages) if m["role"] == "assistant"]
    mask = [0] * len(full)
    for start, end in bounds:
        for j in range(start, min(_clip(full, start, end, tok.eos_token_id), len(full))):
            mask[j] = 1
    return full, mask
