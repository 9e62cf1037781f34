"""Right-padded training batches run without their padding: the rows packed into one sequence.

TRL's SFT and DPO collators pad every row on the right to the batch's longest (DPO flushes each prompt +
completion to the left first) and hand the model a 2-D padding mask. transformers then computes every
padding position through every layer, and turns the mask into a 4-D one, so SDPA runs its masked kernel:
every query against every key, with no causal block skipping (torch's CPU flash-attention kernel skips
the blocks above the diagonal only with ``is_causal``). Nothing a loss reads comes from a padding
position: SFT labels them -100, DPO's completion mask is 0 there.

:func:`unpad_right_padding` makes the model's decoder stack take such a batch as one packed sequence of
its real tokens (each row's positions from 0), attend within each row causally (SDPA per row, its
``is_causal`` kernel: :func:`row_attention`, told the rows by a keyword every layer passes on, so
activation checkpointing recomputes the same), and put the hidden states back in the batch's padded
shape (zeros at padding) for the LM head and the trainer, which keep the batch's mask for the rest.
Every real token computes what it computes under the mask (fp32: equal to rounding). On SmolLM2-135M
(the CPU, bf16 autocast, 4 rows with 17.5% padding) the decoder's forward and backward ran 1.36x faster than
padded under the mask, 1.19x faster than padded and causal; BC and DPO steps 1.06-1.32x (docs/bench.md). Written by
hand: transformers unpads a masked batch itself only for flash-attention 2 (no CPU kernel), and takes packed
rows under SDPA through a block-diagonal mask over the whole sequence (every query against every key); TRL's
padding-free collation is SFT-only (off in its DPO, 1.16) and yields that packed form.

Left alone: a mask that is not right padding (left padding, packed rows), a batch without padding (the
model attends causally already), a call with position ids, a cache, multimodal inputs or asking for
every layer's hidden states or attentions, attention implementations other than SDPA, and models whose
attention is not plain causal (:data:`eto_train.model.PLAIN_ATTENTION`) or has a sliding window.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from ..model import PLAIN_ATTENTION, sliding_window

_HOOKED = "_eto_unpad_right_padding"
ATTENTION = frozenset({"sdpa"})
SPANS = "eto_row_spans"  # the keyword that carries a packed forward's rows to every attention call
KEEP_BATCH_WITH = ("position_ids", "cache", "past_key_values", "inputs_embeds", "token_type_ids",
                   "mm_token_type_ids", "pixel_values", "output_hidden_states", "output_attentions")
_SDPA: list = []  # transformers' own SDPA attention function, once row_attention stands in for it


def is_right_padding(mask) -> bool:
    """A 2-D 0/1 mask whose every row is ones then zeros (a row of all ones included)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.shape[1] < 2:
        return False
    m = mask.to(torch.int8)
    return bool(((m == 0) | (m == 1)).all()) and bool((m[:, 1:] <= m[:, :-1]).all())


def row_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' SDPA attention, but for a packed sequence (keyword :data:`SPANS`: each row's [start, end)
    in ``query`` ``[1, heads, tokens, d]``): each row's span attends to itself causally, through SDPA's causal
    kernel (key-value heads shared as grouped-query attention), whatever mask transformers built."""
    spans = kwargs.pop(SPANS, None)
    if spans is None:
        return _SDPA[0](module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    import torch.nn.functional as F

    gqa = query.shape[1] != key.shape[1]
    p = dropout if module.training else 0.0
    out = torch.cat([F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], dropout_p=p,
                                                     is_causal=True, scale=scaling, enable_gqa=gqa)
                     for a, b in spans], dim=2)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    """row_attention stands in for transformers' "sdpa" (the same function for every call without
    :data:`SPANS`): the layers pick their attention by the config's name at every call, activation
    checkpointing's recomputation included, and pass it the decoder's keywords."""
    from transformers import AttentionInterface

    if not _SDPA:
        _SDPA.append(AttentionInterface._global_mapping["sdpa"])
        AttentionInterface.register("sdpa", row_attention)


def _pack(decoder, args, kwargs):
    """Forward pre-hook of the decoder stack: a right-padded batch becomes one packed sequence."""
    mask, ids = kwargs.get("attention_mask"), kwargs.get("input_ids")
    if (args or ids is None or any(kwargs.get(k) is not None and kwargs.get(k) is not False for k in KEEP_BATCH_WITH)
            or not is_right_padding(mask) or bool(mask.all())):
        return None
    lengths = mask.sum(1).tolist()
    real = mask.reshape(-1).nonzero().squeeze(1)
    ends = list(accumulate(lengths))
    decoder._eto_packed = (real, ids.shape)
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(ids.device)
    return args, {**kwargs, "input_ids": ids.reshape(-1)[real][None], "attention_mask": None,
                  "position_ids": positions, "use_cache": False, SPANS: list(zip([0] + ends[:-1], ends))}


def _unpack(decoder, args, kwargs, out):
    """Forward hook of the decoder stack (also when the forward raised): the packed hidden states back in
    the batch's padded shape."""
    packed = decoder.__dict__.pop("_eto_packed", None)
    if packed is None or out is None:  # not packed; or the forward raised, and that propagates
        return None
    real, (rows, width) = packed
    h = out.last_hidden_state[0]
    out.last_hidden_state = h.new_zeros(rows * width, h.shape[-1]).index_copy(0, real, h).view(rows, width, -1)
    return out


def unpad_right_padding(model, enabled: bool = True) -> bool:
    """Make ``model`` (a transformers causal LM, or a PEFT model over one) run right-padded batches packed
    (``enabled``), or as transformers does again (``enabled=False``, the bench's baseline). Idempotent.
    Returns whether it is in place; False also for an attention implementation it leaves alone."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    # the decoder stack, which the causal LM calls as a module: PEFT's tuner calls the causal LM's
    # ``forward`` itself, and the LM head must see the batch's shape
    decoder = base.get_decoder()
    handles = getattr(decoder, _HOOKED, None)
    config = base.config
    if (not enabled or getattr(config, "_attn_implementation", None) not in ATTENTION
            or getattr(config, "model_type", None) not in PLAIN_ATTENTION or sliding_window(config)):
        if handles is not None:
            for h in handles:
                h.remove()
            delattr(decoder, _HOOKED)
        return False
    if handles is None:
        _register()
        # hooks, not a wrapped ``forward``: a deep copy of the model (a reference made from the policy) hooks
        # its own decoder
        setattr(decoder, _HOOKED, (decoder.register_forward_pre_hook(_pack, with_kwargs=True),
                                   decoder.register_forward_hook(_unpack, with_kwargs=True, always_call=True)))
    return True
