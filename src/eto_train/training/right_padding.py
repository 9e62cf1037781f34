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
padded under the mask, 1.19x faster than padded and causal; BC and DPO steps 1.06-1.32x (docs/lab/bench.md). Written by
hand: transformers unpads a masked batch itself only for flash-attention 2 (no CPU kernel), and takes packed
rows under SDPA through a block-diagonal mask over the whole sequence (every query against every key); TRL's
padding-free collation is SFT-only (off in its DPO, 1.16) and yields that packed form.

Rows that begin alike compute their common prefix once (``share_prefixes``, on): every row of a game's
batch starts with the same instruction and example (241 of ~640 tokens of a TWX demonstration, 347 of
ScienceWorld's), and both rows of a DPO pair with the same prompt. Under causal attention a position's
hidden states depend only on the tokens up to it, so a row's first ``s`` positions equal those of an earlier
row with the same first ``s`` tokens: only the rest of the row is packed, and its attention gathers the
shared keys and values from where the earlier row computed them (:func:`_rows`). The LM head sees every row
whole (the shared hidden states copied into each; their gradients add up). Written by hand: neither TRL nor
transformers shares prefixes in training (Liger-Kernel's issue 476 asks for it); prefix-sharing DPO
(arXiv 2410.20305) puts a pair in one sequence under a FlexAttention block mask, which needs torch.compile
on the CPU, and shares a pair's prompt only, not a batch's instruction.

Left alone: a mask that is not right padding (left padding, packed rows), a batch without padding (the
model attends causally already), a call with position ids, a cache, multimodal inputs or asking for
every layer's hidden states or attentions, attention implementations other than SDPA, and models whose
attention is not plain causal (:data:`eto_train.model.PLAIN_ATTENTION`) or has a sliding window.

Behind ``runtime.library_hooks`` (:func:`eto_train.runtime.library_hooks`): by default in place where training runs
on the CPU (where it was measured), not on a GPU (the batch goes through transformers as it is there).

Checked against transformers 5.24.0 and TRL 1.16.0. What it relies on in transformers: ``AttentionInterface``'s
class-wide ``_global_mapping["sdpa"]`` and ``register`` (transformers/modeling_utils.py:5243-5258,
utils/generic.py:1245), which every layer of the models in :data:`~eto_train.model.PLAIN_ATTENTION` looks up by the
config's ``_attn_implementation`` at every call and hands the decoder's keyword arguments (how :data:`SPANS`
reaches :func:`row_attention`); ``get_decoder()`` (modeling_utils.py:2264) and a decoder stack that takes
``input_ids``, ``attention_mask=None`` and ``position_ids`` as keywords and returns ``last_hidden_state``. In TRL:
the SFT collator pads on the right, and the DPO batches (this project's collator, training/dpo.py) are flushed
left and padded on the right. tests/test_right_padding.py checks the packed forward and backward against the
padded one; a transformers that changes any of these must be read again.
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
_SHARE = "_eto_share_prefixes"
COUNTS = "_eto_token_counts"
# a common prefix shorter than this is computed again in each row (a template's opening tokens are not worth a
# gather in every layer; a floor, not tuned: the prefixes that matter are hundreds of tokens)
MIN_SHARED = 32


def is_right_padding(mask) -> bool:
    """A 2-D 0/1 mask whose every row is ones then zeros (a row of all ones included)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.shape[1] < 2:
        return False
    m = mask.to(torch.int8)
    return bool(((m == 0) | (m == 1)).all()) and bool((m[:, 1:] <= m[:, :-1]).all())


def row_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' SDPA attention, but for a packed sequence (keyword :data:`SPANS`, see :func:`_rows`):
    each row's queries attend to its own keys causally, through SDPA's causal kernel (key-value heads shared
    as grouped-query attention), whatever mask transformers built. A row whose prefix another row computed
    gathers its keys from there and attends with all its positions (the shared ones' outputs are dropped:
    SDPA's causal kernel aligns a shorter query block top-left, and a lower-right mask would take the masked
    kernel, every query against every key)."""
    spans = kwargs.pop(SPANS, None)
    if spans is None:
        return _SDPA[0](module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    from ..native.attention_kernel import causal_attention

    gqa = query.shape[1] != key.shape[1]
    p = dropout if module.training else 0.0
    out = []
    for row in spans:
        a, b = row[0], row[1]
        if len(row) == 2:
            q, k, v = query[:, :, a:b], key[:, :, a:b], value[:, :, a:b]
        elif a == b:  # every position shared: nothing new to compute
            continue
        else:
            q, k, v = (x.index_select(2, row[2]) for x in (query, key, value))
        o = causal_attention(q, k, v, scale=scaling, dropout_p=p, enable_gqa=gqa)  # SDPA's, or the C++ kernel's
        out.append(o if len(row) == 2 else o[:, :, o.shape[2] - (b - a):])
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


def _register() -> None:
    """row_attention stands in for transformers' "sdpa" (the same function for every call without
    :data:`SPANS`): the layers pick their attention by the config's name at every call, activation
    checkpointing's recomputation included, and pass it the decoder's keywords."""
    from transformers import AttentionInterface

    if not _SDPA:
        _SDPA.append(AttentionInterface._global_mapping["sdpa"])
        AttentionInterface.register("sdpa", row_attention)


def _rows(ids, lengths: list[int], share: bool):
    """Each row's place in the packed sequence: ``(start, end)`` of its tokens, or, for a row whose first
    ``s`` tokens (``s >= MIN_SHARED``) equal an earlier row's (the longest such prefix), ``(start, end,
    index)``: only its tokens from ``s`` on are packed, in [start, end), and ``index`` gives every one of its
    positions in the packed sequence (the first ``s`` where the earlier row has them). Returns those, each
    row's ``s`` (0 for a row computed whole) and each row's positions in the packed sequence."""
    rows, firsts, index, at = [], [], [], 0
    for j, n in enumerate(lengths):
        s = i = 0
        if share and j:
            same = (ids[:j, :n] == ids[j, :n]).int().cumprod(1).sum(1)  # the prefix in common with each earlier row
            same = torch.minimum(same, same.new_tensor(lengths[:j]))  # (not into an earlier row's padding)
            s, i = (int(x) for x in same.max(0))
        s = s if s >= MIN_SHARED else 0
        own = torch.arange(at, at + n - s, device=ids.device)
        index.append(torch.cat([index[i][:s], own]) if s else own)
        rows.append((at, at + n - s, index[-1]) if s else (at, at + n))
        firsts.append(s)
        at += n - s
    return rows, firsts, index


def _pack(decoder, args, kwargs):
    """Forward pre-hook of the decoder stack: a right-padded batch becomes one packed sequence of each row's
    real tokens after the prefix it shares with an earlier row (all of them where it shares none)."""
    mask, ids = kwargs.get("attention_mask"), kwargs.get("input_ids")
    if (args or ids is None or any(kwargs.get(k) is not None and kwargs.get(k) is not False for k in KEEP_BATCH_WITH)
            or not is_right_padding(mask)):
        return None
    lengths = mask.sum(1).tolist()
    # with dropout, in training, every row computes its own prefix: padded, each row draws its own dropout
    share = getattr(decoder, _SHARE, None)
    rows, firsts, index = _rows(ids, lengths, share == "always" or (share == "without dropout" and not decoder.training))
    if bool(mask.all()) and not any(firsts):  # no padding, no prefix in common: the model is causal already
        return None
    width = ids.shape[1]
    new = torch.cat([torch.arange(j * width + s, j * width + n) for j, (s, n) in enumerate(zip(firsts, lengths))])
    new = new.to(ids.device)
    counts = decoder.__dict__.setdefault(COUNTS, {"tokens": 0, "computed": 0})
    counts["tokens"] += sum(lengths)
    counts["computed"] += len(new)
    decoder._eto_packed = (index, ids.shape)
    positions = torch.cat([torch.arange(s, n) for s, n in zip(firsts, lengths)])[None].to(ids.device)
    return args, {**kwargs, "input_ids": ids.reshape(-1)[new][None], "attention_mask": None,
                  "position_ids": positions, "use_cache": False, SPANS: rows}


def _unpack(decoder, args, kwargs, out):
    """Forward hook of the decoder stack (also when the forward raised): the packed hidden states back in
    the batch's padded shape (a shared prefix's in every row that has it; the gradients add up there)."""
    packed = decoder.__dict__.pop("_eto_packed", None)
    if packed is None or out is None:  # not packed; or the forward raised, and that propagates
        return None
    index, (rows, width) = packed
    h = out.last_hidden_state[0]
    pad = h.shape[0]  # a row of zeros after the packed ones stands for every padding position
    where = torch.cat([torch.nn.functional.pad(i, (0, width - len(i)), value=pad) for i in index])
    out.last_hidden_state = torch.cat([h, h.new_zeros(1, h.shape[-1])]).index_select(0, where).view(rows, width, -1)
    return out


def _base(model):
    """The transformers causal LM (under PEFT's tuner, its base model). Its decoder stack carries the hooks: the
    causal LM calls it as a module (PEFT's tuner calls the causal LM's ``forward`` itself), and the LM head
    must see the batch's shape."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def token_counts(model) -> dict:
    """The real tokens the model's packed forwards took, and the positions they computed (fewer where rows
    share a prefix), since the hooks went in or the last :func:`reset_token_counts`."""
    return dict(_base(model).get_decoder().__dict__.get(COUNTS, {"tokens": 0, "computed": 0}))


def reset_token_counts(model) -> None:
    _base(model).get_decoder().__dict__.pop(COUNTS, None)


def unpad_right_padding(model, enabled: bool | None = None, share_prefixes: bool = True) -> bool:
    """Make ``model`` (a transformers causal LM, or a PEFT model over one) run right-padded batches packed
    (``enabled``), or as transformers does again (``enabled=False``, the bench's baseline); ``None``: as
    ``runtime.library_hooks`` says (:func:`eto_train.runtime.library_hooks`). With ``share_prefixes`` a prefix
    that rows have in common is computed once (their instruction and example, a pair's prompt; in training only
    if the model has no dropout). Idempotent. Returns whether it is in place; False also for an attention
    implementation it leaves alone."""
    if enabled is None:
        from ..runtime import library_hooks

        enabled = library_hooks()
    base = _base(model)
    decoder = base.get_decoder()
    handles = getattr(decoder, _HOOKED, None)
    config = base.config
    if (not enabled or getattr(config, "_attn_implementation", None) not in ATTENTION
            or getattr(config, "model_type", None) not in PLAIN_ATTENTION or sliding_window(config)):
        if handles is not None:
            for h in handles:
                h.remove()
            delattr(decoder, _HOOKED)
            decoder.__dict__.pop(_SHARE, None)
        return False
    dropout = (float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0
               or any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in decoder.modules()))
    setattr(decoder, _SHARE, None if not share_prefixes else "without dropout" if dropout else "always")
    if handles is None:
        _register()
        # hooks, not a wrapped ``forward``: a deep copy of the model (a reference made from the policy) hooks
        # its own decoder
        setattr(decoder, _HOOKED, (decoder.register_forward_pre_hook(_pack, with_kwargs=True),
                                   decoder.register_forward_hook(_unpack, with_kwargs=True, always_call=True)))
    return True
