"""Right-padded training batches attend causally, without their padding mask.

TRL's SFT and DPO collators pad every row on the right (DPO flushes each prompt + completion to the
left first), and hand the model a 2-D padding mask. transformers turns that mask into a 4-D one and
SDPA then runs its masked kernel: every query against every key, with no causal block skipping
(torch's CPU flash-attention kernel skips the blocks above the diagonal only with ``is_causal``).
With right padding the mask changes nothing a loss reads: a real token at position i attends to
positions 0..i, all real, under plain causal attention; only the padding positions' outputs
differ, and they carry no label (SFT: -100) and no completion mask (DPO). Positions are the same
too (a row starts at 0 either way).

:func:`causal_right_padding` drops such a mask before the model sees it (a forward pre-hook), so
the model runs causal attention; the batch keeps its mask for everything else the trainer computes.
On SmolLM2-135M (batch 4, rows of 450-700 tokens, the CPU) the attention of a BC step takes about
30% less time; docs/bench.md has the trainers' figures. Neither transformers (it skips a mask only
when it has no padding at all, since padding positions' outputs may matter to a caller) nor TRL has
the option: written by hand.

Left alone: any mask that is not right padding (left padding, packed rows), a call with position ids,
a cache or multimodal inputs, and attention implementations other than SDPA and eager (flash-
attention 2 unpads a masked batch itself).
"""

from __future__ import annotations

import torch

_HOOKED = "_eto_causal_right_padding"
ATTENTION = frozenset({"sdpa", "eager"})
KEEP_MASK_WITH = ("position_ids", "cache", "past_key_values", "token_type_ids", "mm_token_type_ids", "pixel_values")


def is_right_padding(mask) -> bool:
    """A 2-D 0/1 mask whose every row is ones then zeros (a row of all ones included)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.shape[1] < 2:
        return False
    m = mask.to(torch.int8)
    return bool(((m == 0) | (m == 1)).all()) and bool((m[:, 1:] <= m[:, :-1]).all())


def _drop_right_padding_mask(module, args, kwargs):
    if any(kwargs.get(k) is not None for k in KEEP_MASK_WITH) or len(args) > 1:
        return None
    if is_right_padding(kwargs.get("attention_mask")):
        return args, {**kwargs, "attention_mask": None}
    return None


def causal_right_padding(model, enabled: bool = True) -> bool:
    """Make ``model`` (a transformers causal LM, or a PEFT model over one) attend causally to right-padded
    batches (``enabled``), or keep their masks again (``enabled=False``, the bench's baseline). Idempotent.
    Returns whether the hook is in place; False also for an attention implementation it leaves alone."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    # the hook sits on the decoder stack, which the causal LM calls as a module (PEFT's tuner calls the
    # causal LM's ``forward`` itself, past any hook of its own)
    decoder = base.get_decoder()
    handle = getattr(decoder, _HOOKED, None)
    if not enabled or getattr(base.config, "_attn_implementation", None) not in ATTENTION:
        if handle is not None:
            handle.remove()
            delattr(decoder, _HOOKED)
        return False
    if handle is None:
        setattr(decoder, _HOOKED, decoder.register_forward_pre_hook(_drop_right_padding_mask, with_kwargs=True))
    return True
