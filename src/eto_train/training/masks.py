"""Which tokens of a rendered conversation are the assistant's (its actions).

Works for any chat template, with or without ``{% generation %}`` markers: the conversation
is rendered once per assistant turn, and the tokens an assistant turn adds to the rendering
of everything before it (after the generation prompt) are that turn's tokens. Written by hand
because TRL's ``return_assistant_tokens_mask`` needs generation markers that most public chat
templates (Llama-2, Llama-3, Qwen) do not have.
"""

from __future__ import annotations


def _ids(tok, messages, add_generation_prompt=False) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tok(text, add_special_tokens=False)["input_ids"]


def assistant_token_mask(tok, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """(input ids of the whole conversation, 1 for each assistant token else 0)."""
    full = _ids(tok, messages)
    mask = [0] * len(full)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(_ids(tok, messages[:i], add_generation_prompt=True))
        end = len(_ids(tok, messages[: i + 1]))
        # Templates may append a separator after the end-of-turn token (ChatML's "\n"); the
        # turn's own tokens end at its end-of-turn token when it has one.
        turn = full[start:end]
        if tok.eos_token_id in turn:
            end = start + turn.index(tok.eos_token_id) + 1
        for j in range(start, min(end, len(full))):
            mask[j] = 1
    return full, mask
