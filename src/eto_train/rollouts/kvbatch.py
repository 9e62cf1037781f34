"""A batch of conversations whose KV cache persists across turns, in slots, with shared prompt prefixes.

Each row (an episode in play) owns a *slot* of pre-allocated key/value buffers, one per layer, of
shape ``[slots, kv_heads, capacity, head_dim]``; the row's tokens sit at positions 0..n-1 of its
slot, with no padding. Nothing is ever concatenated or re-copied per token:

- a turn feeds each row only what its conversation gained (the observation turn and the next
  assistant header), written in place at the row's own positions; a decode step writes one
  column per row (``SlotCache.update``);
- rows join (a new episode takes the next free slot) and leave (a finished one frees its slot;
  the last slot's row moves into the hole, one row copied, so the slots in use stay
  ``0..n-1`` and a batched step of a model with its own attention reads them as one view,
  ``K[:n, :, :span]``);
- the prompt every episode of a play starts with (the instruction, the in-context example) is
  computed once: a fresh row whose prompt shares a prefix with one already computed copies that
  prefix's keys and values into its slot (:class:`PrefixStore`) and feeds only the rest.

A decode step reads every row's keys and values once, and that, not the weights, is what grows
with the context (at batch 32 and 1,400 tokens, 2 GB a step). The play's first prompt is kept as
its *shared prefix*: every row that starts with it holds a copy in its slot, but a decode step of
plain-attention models (:data:`PLAIN_ATTENTION`) reads that part once for all rows, one matmul
against the shared keys, and only the rest from each slot (:func:`decode_attention`), each row to its
own length; and it feeds only the rows still answering (a row whose answer ended waits for the turn's
longest without costing a step).

Masks are built here (4-D boolean, ``[rows, 1, queries, keys]``) from each row's length, and
positions are each row's own, so a row computes what it would alone. A new chunk of a row
(a fresh prompt, an observation) is fed as that row alone: no padding to the batch's longest
chunk (chunks here run from 20 to 600 tokens), and the row's slot is a view. Decoding feeds
the rows at once. Each turn the whole prompt is tokenized as HF ``generate`` would get it, and a
row's cache is kept only where its tokens are a prefix of that prompt, so the answers equal
``generate`` on the whole conversation whatever the chat template does.

Written by hand: transformers' ``DynamicCache`` concatenates per token and its ``StaticCache`` has
a fixed batch rows cannot join or leave; its continuous-batching engine (paged attention, prefix
blocks) ran 3.7x slower than this on the CPU (8 conversations, SmolLM2-135M, one thread: 133 s
against 36 s for the first turn, before prefix sharing); vLLM is a separate engine
(``rollout.backend=vllm``).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time

import torch

from ..model import PLAIN_ATTENTION  # their decode steps use decode_attention; any other keeps its own
from ..prompting import chat_ids  # the prompt's ids: no message text read as a control token
from ..native.decode_kernel import DTYPES as KERNEL_DTYPES
from ..native.decode_kernel import load as load_decode_kernel

MIN_SHARED = 16       # a prompt prefix shorter than this is computed, not copied
DECODE_ATTENTION = "eto_slots_decode"
PACKED_ATTENTION = "eto_slots_packed"
PACK_TOKENS = 4096    # new prompt tokens of a turn's rows fed in one packed forward, at most
# A decode step's rows in adjacent slots share one attention call per layer (masked to each row's length)
# while their lengths differ by at most this many positions: one call more costs about as much as a row reading
# ~300 positions more (batch 32, 1,400-token slots: every row live, one call a row took 417 ms a step against
# 390 ms for one masked call over all rows; 13 rows live, one call a row 277 ms; docs/lab/bench.md)
RUN_SPREAD = 256
_forward = threading.local()  # the SlotCache of the forward in progress (decode_attention reads its shared prefix)
STORE_ENTRIES = 8     # prompt prefixes kept per play
GROW = 256            # capacity grows by at least this many positions


def decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention of one new token per row (a decode step) over [the shared prefix | the row's own slot].

    ``key``/``value`` are the slots (``[rows, kv_heads, span, d]`` views); the forward's
    :class:`SlotCache` says how many leading positions every row shares with the play's shared prefix
    (``shared``, 0: none). Those are read once, from the shared keys, for all rows (rows x query heads
    against the prefix); the rest per row. The two parts are joined by their log-sum-exps: the result
    is the attention over the whole slot. Query heads are grouped by key-value head (GQA), so nothing
    is repeated: a key-value head's query heads are its "queries". Written by hand: torch's SDPA and
    transformers' attention functions read every row's whole cache (no prefix shared across a batch on
    the CPU).

    When the cache feeds rows by slot (``fed``: a decode step of the rows still answering, see
    :meth:`KVBatch._decode`), ``key``/``value`` are the whole buffers and each row reads its own slot to its own
    length: in one call of the C++ kernel (``cache.kernel``, :mod:`eto_train.native.decode_kernel`) on a CPU, else
    in runs (``fed_runs``, :func:`_runs`): rows in adjacent slots of similar lengths in one call of torch's kernel,
    masked to each row's length, so that neither a finished row nor a long row's tail is read by the others."""
    b, heads, q, d = query.shape
    kv_heads = key.shape[1]
    g = heads // kv_heads * q
    cache = getattr(_forward, "cache", None)
    m = cache.shared if cache is not None else 0
    grouped = query.reshape(b, kv_heads, g, d)
    scale = scaling if scaling is not None else d ** -0.5
    if cache is not None and cache.fed is not None and cache.kernel is not None:
        # rows fed by slot, in the C++ kernel: each reads its own slot to its own length, all in one call
        out, lse = cache.kernel.decode_attention(grouped, key, value, cache.fed_index, cache.fed_ends, m, scale)
    elif cache is not None and cache.fed is not None:  # rows fed by slot: each reads its own slot to its length
        parts = [_attend(grouped[i:j], key[s:s + j - i, :, m:n], value[s:s + j - i, :, m:n], run_mask, scale)
                 for i, j, s, n, run_mask in cache.fed_runs]
        out, lse = (parts[0] if len(parts) == 1 else
                    (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])))
    else:
        mask = attention_mask[..., m:] if attention_mask is not None else None
        out, lse = _attend(grouped, key[:, :, m:], value[:, :, m:], mask, scale)
    if m:
        pk, pv = cache.shared_kv[module.layer_idx]  # [kv_heads, >= m, d]
        rows = grouped.permute(1, 0, 2, 3).reshape(1, kv_heads, b * g, d)
        pre, pre_lse = _attend(rows, pk[None, :, :m], pv[None, :, :m], None, scale)
        pre = pre.reshape(kv_heads, b, g, d).permute(1, 0, 2, 3)
        pre_lse = pre_lse.reshape(kv_heads, b, g).permute(1, 0, 2)
        total = torch.logaddexp(lse, pre_lse)
        out = out * (lse - total).exp_()[..., None] + pre * (pre_lse - total).exp_()[..., None]
    return out.to(query.dtype).reshape(b, heads, q, d).transpose(1, 2).contiguous(), None


def _runs(fed: list[int], lengths: list[int], shared: int) -> list[tuple]:
    """A decode step's fed rows (their slots ``fed``, ascending, and lengths after the step's token) in
    runs of adjacent slots whose lengths differ by at most :data:`RUN_SPREAD`: (first row, row past the last,
    first slot, the longest length, None or the boolean mask ``[rows, 1, 1, longest - shared]`` of each row's
    positions past ``shared``)."""
    runs, i = [], 0
    while i < len(fed):
        j, lo, hi = i + 1, lengths[i], lengths[i]
        while (j < len(fed) and fed[j] == fed[j - 1] + 1
               and max(hi, lengths[j]) - min(lo, lengths[j]) <= RUN_SPREAD):
            lo, hi = min(lo, lengths[j]), max(hi, lengths[j])
            j += 1
        mask = None
        if lo != hi:
            mask = (torch.arange(shared, hi)[None, :] < torch.tensor(lengths[i:j])[:, None])[:, None, None]
        runs.append((i, j, fed[i], hi, mask))
        i = j
    return runs


def _attend(q, k, v, mask, scale):
    """(softmax(q k^T * scale) v, its log-sum-exp over the keys) for ``[batch, heads, queries, d]``;
    ``mask`` (boolean, broadcast over heads and queries; True: attend), an additive float mask (0 or -inf) or
    None. On the CPU, torch's
    flash-attention kernel (a private op, the one SDPA calls there; it returns the log-sum-exp);
    elsewhere, or where this torch lacks it, two matmuls. A decode step is bound by reading the
    cache: the kernel took the attention 20-30% below the matmuls alone, a whole decode step 2-3%
    (batch 32, 885-token slots, docs/lab/bench.md)."""
    if q.device.type == "cpu" and _CPU_FLASH is not None:
        bias = None
        if mask is not None:
            bias = mask if mask.is_floating_point() else _bias(mask, q.dtype)
        out, lse = _CPU_FLASH(q, k, v, 0.0, False, attn_mask=bias, scale=scale)
        return out, lse  # the log-sum-exp in fp32 whatever the dtype: the parts are joined in fp32
    s = torch.matmul(q, k.transpose(-1, -2)).float().mul_(scale)
    if mask is not None:
        s = s + mask if mask.is_floating_point() else s.masked_fill_(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul((s - lse[..., None]).exp_().to(v.dtype), v), lse


def _bias(mask: torch.Tensor, dtype) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention of a packed forward: one sequence of several rows' new prompt chunks (``query``
    ``[1, heads, tokens, d]``), each chunk over its own row's slot up to its end, causally.

    ``key``/``value`` are the whole buffers (``[slots, kv_heads, capacity, d]``); the forward's
    :class:`SlotCache` lists the chunks (``packed``: slot, first position, length, offset in the sequence,
    the chunk's additive mask). Query heads are grouped by key-value head (GQA) as in
    :func:`decode_attention`. Written by hand for the same reason: transformers' attention functions take
    one cache row per sequence row, and a packed sequence holds many rows."""
    cache = _forward.cache
    _, heads, _, d = query.shape
    kv_heads = key.shape[1]
    g = heads // kv_heads
    scale = scaling if scaling is not None else d ** -0.5
    outs = []
    for slot, start, n, off, bias in cache.packed:
        q = query[0, :, off:off + n].reshape(1, kv_heads, g * n, d)
        out, _ = _attend(q, key[slot:slot + 1, :, :start + n], value[slot:slot + 1, :, :start + n], bias, scale)
        outs.append(out.reshape(heads, n, d))
    return torch.cat(outs, dim=1).to(query.dtype).transpose(0, 1)[None].contiguous(), None


def _register_attention() -> None:
    from transformers import AttentionInterface

    for name, fn in ((DECODE_ATTENTION, decode_attention), (PACKED_ATTENTION, packed_attention)):
        if name not in AttentionInterface._global_mapping:
            AttentionInterface.register(name, fn)


class SlotCache:
    """Key/value buffers in slots, the cache object the model's attention layers update.

    Before each forward the caller says which slots it feeds (``start``, a contiguous range of
    ``n`` slots, so the buffers are read as views) and where each fed token goes (``positions``,
    ``[n, width]``); ``update`` writes the layer's new keys and values there and returns the
    slots' keys and values up to ``span`` positions."""

    def __init__(self) -> None:
        self.k: list[torch.Tensor | None] = []
        self.v: list[torch.Tensor | None] = []
        self.slots = 0
        self.capacity = 0
        self.start, self.positions, self.span = 0, None, 0
        self.is_compileable = False
        self.shared_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # the play's shared prefix
        self.shared = 0  # positions every row of the forward holds from it (decode_attention reads them there)
        # a forward of some rows by slot (a decode step of the live rows): their slots and, after the step's
        # token is written, their lengths; None: the contiguous slots start..start+n
        self.fed: list[int] | None = None
        self.fed_lengths: list[int] | None = None
        self.fed_index: torch.Tensor | None = None  # ``fed`` as a ``[rows, 1]`` index
        self.fed_ends: torch.Tensor | None = None  # ``fed_lengths`` as a tensor (the C++ kernel's)
        self.kernel = None  # the C++ decode-attention kernel (decode_kernel.load()), None: torch's
        self.fed_runs: list[tuple] | None = None  # ``fed`` in runs of adjacent slots (:func:`_runs`)
        # a packed forward (several rows' chunks in one sequence): (slot, first position, length, offset,
        # additive mask) per chunk and, per token, its slot and position (None: not packed)
        self.packed: list[tuple] | None = None
        self.packed_slots: torch.Tensor | None = None

    # -- the attention layers' side -------------------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        while len(self.k) <= layer_idx:
            self.k.append(None)
            self.v.append(None)
        if self.k[layer_idx] is None:  # the first forward: the layer's buffers, as reserve() sized them
            _, h, _, d = key_states.shape
            shape = (self.slots, h, self.capacity, d)
            self.k[layer_idx] = key_states.new_zeros(shape)
            self.v[layer_idx] = value_states.new_zeros(shape)
        n = key_states.shape[0]
        if self.packed is not None:  # one sequence of several rows' chunks: each token to its slot and position
            k, v = self.k[layer_idx], self.v[layer_idx]
            k[self.packed_slots, :, self.positions[0], :] = key_states[0].transpose(0, 1)
            v[self.packed_slots, :, self.positions[0], :] = value_states[0].transpose(0, 1)
            return k, v
        if self.fed is not None:  # rows by slot: written at their slots, the whole buffers returned
            k, v = self.k[layer_idx], self.v[layer_idx]
            k[self.fed_index, :, self.positions, :] = key_states.permute(0, 2, 1, 3)
            v[self.fed_index, :, self.positions, :] = value_states.permute(0, 2, 1, 3)
            return k, v
        k, v = self.k[layer_idx][self.start:self.start + n], self.v[layer_idx][self.start:self.start + n]
        rows = torch.arange(n, device=key_states.device)[:, None]
        k[rows, :, self.positions, :] = key_states.permute(0, 2, 1, 3)  # in place: k is a view of the buffer
        v[rows, :, self.positions, :] = value_states.permute(0, 2, 1, 3)
        return k[:, :, :self.span], v[:, :, :self.span]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.span

    # -- the batch's side ---------------------------------------------------------------------
    def reserve(self, slots: int, capacity: int) -> None:
        """Room for ``slots`` rows of ``capacity`` positions (buffers grow, never shrink)."""
        grow_s, grow_c = slots > self.slots, capacity > self.capacity
        if not (grow_s or grow_c):
            return
        new_s = max(slots, self.slots)
        new_c = max(capacity, self.capacity + self.capacity // 2, GROW) if grow_c else max(self.capacity, GROW)
        for store in (self.k, self.v):
            for i, t in enumerate(store):
                if t is None:
                    continue
                bigger = t.new_zeros((new_s, t.shape[1], new_c, t.shape[3]))
                bigger[:t.shape[0], :, :t.shape[2]] = t
                store[i] = bigger
        self.slots, self.capacity = new_s, new_c

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst``."""
        for store in (self.k, self.v):
            for t in store:
                if t is not None and length:
                    t[dst, :, :length] = t[src, :, :length]

    def read(self, slot: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of every layer's keys and values of ``slot``'s first ``length`` positions."""
        return [(k[slot, :, :length].clone(), v[slot, :, :length].clone()) for k, v in zip(self.k, self.v)]

    def write(self, slot: int, kv: list[tuple[torch.Tensor, torch.Tensor]], length: int) -> None:
        """Put the first ``length`` positions of ``kv`` (from :meth:`read`) into ``slot``."""
        for (k, v), (pk, pv) in zip(zip(self.k, self.v), kv):
            k[slot, :, :length] = pk[:, :length]
            v[slot, :, :length] = pv[:, :length]


class PrefixStore:
    """Prompt prefixes already computed in this play: token ids and their keys and values.

    A fresh row takes the longest prefix its prompt shares with an entry (at least
    :data:`MIN_SHARED` tokens) instead of computing it. Entries are the whole prompts of rows that
    found no long match, so the first row of a play stores the instruction, the example and its
    own task; the next rows share the instruction and the example. At most :data:`STORE_ENTRIES`
    entries, the least recently used dropped first."""

    def __init__(self) -> None:
        self.entries: list[tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self.shared_tokens = 0  # prompt tokens copied instead of computed, over the play

    @staticmethod
    def _common(a: list[int], b: list[int]) -> int:
        n = min(len(a), len(b))
        i = 0
        while i < n and a[i] == b[i]:
            i += 1
        return i

    def match(self, ids: list[int]) -> tuple[int, list | None]:
        """(shared length, the entry's keys and values) of the best entry; at most len(ids) - 1
        tokens are shared, so that the row still computes its last prompt token's logits."""
        best, kv, at = 0, None, -1
        for i, (pids, pkv) in enumerate(self.entries):
            m = min(self._common(ids, pids), len(ids) - 1)
            if m > best:
                best, kv, at = m, pkv, i
        if best < MIN_SHARED:
            return 0, None
        self.entries.append(self.entries.pop(at))  # most recently used last
        return best, kv

    def add(self, ids: list[int], kv) -> None:
        self.entries.append((list(ids), kv))
        if len(self.entries) > STORE_ENTRIES:
            self.entries.pop(0)


class KVBatch:
    def __init__(self, model, tok, max_new_tokens: int, budget: int, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0, encode_full=None, stop_ids=None,
                 share_prefixes: bool = True, decode_kernel: bool = True):
        self.model, self.tok = model, tok
        self.max_new, self.budget = max_new_tokens, budget
        self.do_sample, self.temperature, self.top_p = do_sample, temperature, top_p
        self.encode_full = encode_full or self._encode  # conv -> (ids, turns dropped): a fitted prompt
        self.stop = set(stop_ids) if stop_ids else {tok.eos_token_id}  # every end-of-turn id
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.cache = SlotCache()
        self.prefixes = PrefixStore() if share_prefixes else None
        self.slot: list[int] = []            # row -> its slot (the slots in use are 0..rows-1)
        self.held: list[list[int] | None] = []  # row -> the token ids its slot holds (None: start anew)
        self.length: list[int] = []          # slot -> tokens it holds
        self.reencoded = 0  # rows whose history stopped being a prefix of the new prompt
        self.computed_tokens = 0  # prompt and generated tokens fed through the model
        # what the play cost (make bench reads it): prompt tokens fed row by row, decode steps and the
        # tokens they generated, and the seconds of each
        self.stats = {"prefill_tokens": 0, "prefill_s": 0.0, "decode_steps": 0, "decode_tokens": 0, "decode_s": 0.0}
        self.device = next(model.parameters()).device
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._decode_attention = getattr(model.config, "model_type", None) in PLAIN_ATTENTION
        if self._decode_attention:
            _register_attention()
            dtype = next(model.parameters()).dtype  # the cache's (fp16 on a CPU: torch's kernel)
            if decode_kernel and self.device.type == "cpu" and dtype in KERNEL_DTYPES:
                self.cache.kernel = load_decode_kernel()  # None where runtime.cpu_kernels is off
        self.shared_ids: list[int] | None = None  # the play's shared prefix (its first stored prompt)
        self.shares: list[int] = []  # slot -> positions it holds from the shared prefix

    def _encode(self, conv):
        return chat_ids(self.tok, conv), 0

    # -- rows (the buffers are inference tensors: every change to them runs in inference mode) --
    @torch.inference_mode()
    def add_row(self) -> None:
        n = len(self.slot)
        self.slot.append(n)
        self.held.append(None)
        if len(self.length) <= n:
            self.length.append(0)
            self.shares.append(0)
        self.length[n] = self.shares[n] = 0
        self.cache.reserve(n + 1, self.cache.capacity)

    @torch.inference_mode()
    def keep(self, rows: list[int]) -> None:
        """Keep these rows, in this order; the others' slots are freed. The slots in use stay
        ``0..len(rows)-1``: a kept row whose slot lies beyond moves into a freed one."""
        slots = [self.slot[r] for r in rows]
        self.held = [self.held[r] for r in rows]
        n = len(rows)
        free = sorted(set(range(n)) - set(slots))
        for i, s in enumerate(slots):
            if s >= n:
                dst = free.pop(0)
                self.cache.move(s, dst, self.length[s])
                self.length[dst], self.shares[dst] = self.length[s], self.shares[s]
                slots[i] = dst
        self.slot = slots
        del self.length[n:], self.shares[n:]

    def _reset_row(self, i: int) -> None:
        self.length[self.slot[i]] = self.shares[self.slot[i]] = 0
        self.held[i] = None

    # -- forward --------------------------------------------------------------------------------
    def _run(self, start: int, ids: torch.Tensor, positions: torch.Tensor, span: int,
             fed: list[int] | None = None) -> torch.Tensor:
        """One forward of rows ``start..start+len(ids)-1`` (slots), or of the slots ``fed`` (a decode step
        through :func:`decode_attention` only), on ``ids`` at ``positions`` (both ``[rows, width]``); keys
        up to ``span``. Returns the last position's logits per row."""
        c = self.cache
        c.start, c.positions, c.span = start, positions.to(self.device), span
        keys = torch.arange(span, device=self.device)
        mask = (keys[None, None, :] <= c.positions[:, :, None])[:, None]  # [rows, 1, width, span]
        decoding = self._decode_attention and ids.shape[1] == 1
        if decoding:
            slots = fed if fed is not None else range(start, start + ids.shape[0])
            rows = [self.shares[s] for s in slots]
            c.shared = min(rows) if c.shared_kv is not None and rows else 0
            if fed is not None:
                c.fed, c.fed_lengths = list(fed), (positions[:, -1] + 1).tolist()
                c.fed_index = torch.tensor(fed, device=self.device)[:, None]
                if c.kernel is not None:
                    c.fed_ends = torch.tensor(c.fed_lengths)
                else:
                    dtype = next(self.model.parameters()).dtype  # each run's mask made additive once, not per layer
                    c.fed_runs = [(i, j, s, n, m if m is None else _bias(m.to(self.device), dtype))
                                  for i, j, s, n, m in _runs(c.fed, c.fed_lengths, c.shared)]
        try:
            with self._attention(DECODE_ATTENTION if decoding else None):
                out = self.model(input_ids=ids.to(self.device), attention_mask=mask, position_ids=c.positions,
                                 use_cache=True, logits_to_keep=1, **{self._cache_kw: c})
        finally:
            c.fed = c.fed_lengths = c.fed_index = c.fed_ends = c.fed_runs = None
        self.computed_tokens += ids.numel()
        return out.logits[:, -1, :].float()

    @contextlib.contextmanager
    def _attention(self, name: str | None):
        """The attention function ``name`` (registered here) for one forward, reading this batch's cache,
        then the model's own again; None: the model's own."""
        config = self.model.config
        own = config._attn_implementation_internal
        if name is not None:
            config._attn_implementation_internal = name
            _forward.cache = self.cache
        try:
            yield
        finally:
            config._attn_implementation_internal = own
            _forward.cache = None

    def _prefill(self, row: int, chunk: list[int]) -> torch.Tensor:
        """Feed ``chunk`` to ``row`` alone (its slot is a view; no padding); its last logits."""
        t0 = time.perf_counter()
        s = self.slot[row]
        start = self.length[s]
        self.cache.reserve(len(self.slot), start + len(chunk) + self.max_new)
        pos = torch.arange(start, start + len(chunk))[None]
        logits = self._run(s, torch.tensor([chunk]), pos, start + len(chunk))
        self.length[s] += len(chunk)
        self.stats["prefill_tokens"] += len(chunk)
        self.stats["prefill_s"] += time.perf_counter() - t0
        return logits[0]

    def _prefill_packed(self, chunks: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """Feed several rows' chunks (``(row, token ids)``) in packed forwards of at most
        :data:`PACK_TOKENS` tokens: one sequence, no padding, each chunk at its row's own positions over its
        own slot (:func:`packed_attention`). Returns each chunk's last logits.

        Why: a turn's new prompt tokens come in chunks of 20-100 tokens per row (an observation, a task
        after the shared prefix), and a forward of one chunk runs the linear layers on that many rows; one
        forward of a turn's chunks runs them on ~1,500 (1.45x faster there; a real-model play's prefill
        1.7-1.8x, docs/lab/bench.md). Padding the chunks to a batch instead was tried and lost what it gained
        (commit 480bde3)."""
        out: list[torch.Tensor] = []
        group: list[tuple[int, list[int]]] = []
        for row, chunk in chunks:
            if group and sum(len(c) for _, c in group) + len(chunk) > PACK_TOKENS:
                out += self._run_packed(group)
                group = []
            group.append((row, chunk))
        if group:
            out += self._run_packed(group)
        return out

    def _run_packed(self, group: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        t0 = time.perf_counter()
        c, dev = self.cache, self.device
        starts = [self.length[self.slot[r]] for r, _ in group]
        c.reserve(len(self.slot), max(s + len(ch) for s, (_, ch) in zip(starts, group)) + self.max_new)
        group_size = self.model.config.num_attention_heads // self.model.config.num_key_value_heads
        dtype = next(self.model.parameters()).dtype
        packed, slots, positions, ids, off = [], [], [], [], 0
        for (row, chunk), start in zip(group, starts):
            s, n = self.slot[row], len(chunk)
            keys = torch.arange(start + n, device=dev)
            allowed = keys[None, :] <= torch.arange(start, start + n, device=dev)[:, None]  # [n, start + n]
            packed.append((s, start, n, off, _bias(allowed.repeat(group_size, 1), dtype)))  # heads grouped
            slots += [s] * n
            positions += range(start, start + n)
            ids += chunk
            off += n
        c.packed, c.packed_slots = packed, torch.tensor(slots, device=dev)
        c.positions = torch.tensor([positions], device=dev)
        last = torch.tensor([o + n - 1 for _, _, n, o, _ in packed], device=dev)
        try:  # the 4-D mask is a placeholder: packed_attention masks each chunk itself
            with self._attention(PACKED_ATTENTION):
                res = self.model(input_ids=torch.tensor([ids], device=dev), attention_mask=torch.ones(
                    1, 1, 1, 1, dtype=torch.bool, device=dev), position_ids=c.positions, use_cache=True,
                    logits_to_keep=last, **{self._cache_kw: c})
        finally:
            c.packed = c.packed_slots = None
        for (row, chunk) in group:
            self.length[self.slot[row]] += len(chunk)
        self.computed_tokens += len(ids)
        self.stats["prefill_tokens"] += len(ids)
        self.stats["prefill_s"] += time.perf_counter() - t0
        return list(res.logits[0].float())

    def _decode(self, tokens: list[int], live: list[bool]) -> torch.Tensor:
        """One token per row still answering (``live``); returns logits per row, in row order (a finished
        row's are not computed: zeros, never read).

        A plain-attention model feeds the live rows alone, by slot (:func:`decode_attention` reads their own
        slots, adjacent ones in one call): a row whose answer ended costs nothing while the longest answer of
        the turn goes on. In an agent's turn that is most of the batch: on TextWorldExpress (answers of 5-8
        tokens of the 16 allowed) 12.7 rows of 32 were still answering per decode step (docs/lab/bench.md).
        Other models feed every row, in slot order, through their own attention over contiguous slots (a
        finished row's token lands past its end, masked, and is overwritten later)."""
        if self._decode_attention:
            return self._decode_live(tokens, live)
        t0 = time.perf_counter()
        n = len(self.slot)
        ids = torch.full((n, 1), self.pad, dtype=torch.long)
        pos = torch.zeros((n, 1), dtype=torch.long)
        for row, s in enumerate(self.slot):
            ids[s, 0], pos[s, 0] = tokens[row], self.length[s]
        span = max(self.length[:n]) + 1
        self.cache.reserve(n, span)
        logits = self._run(0, ids, pos, span)
        for row, s in enumerate(self.slot):
            if live[row]:
                self.length[s] += 1
        self.stats["decode_steps"] += 1
        self.stats["decode_tokens"] += sum(live)
        self.stats["decode_s"] += time.perf_counter() - t0
        return logits[torch.tensor(self.slot)]  # back in row order

    def _decode_live(self, tokens: list[int], live: list[bool]) -> torch.Tensor:
        t0 = time.perf_counter()
        rows = sorted((r for r, alive in enumerate(live) if alive), key=self.slot.__getitem__)  # slot order: runs
        assert rows, "a decode step with no row answering"
        fed = [self.slot[r] for r in rows]
        ids = torch.tensor([[tokens[r]] for r in rows], dtype=torch.long)
        pos = torch.tensor([[self.length[s]] for s in fed], dtype=torch.long)
        span = int(pos.max()) + 1
        self.cache.reserve(len(self.slot), span)
        got = self._run(0, ids, pos, span, fed=fed)
        for s in fed:
            self.length[s] += 1
        logits = got.new_zeros((len(live), got.shape[-1]))
        logits[rows] = got
        self.stats["decode_steps"] += 1
        self.stats["decode_tokens"] += len(rows)
        self.stats["decode_s"] += time.perf_counter() - t0
        return logits

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.do_sample:
            return logits.argmax(-1)
        probs = torch.softmax(logits / max(self.temperature, 1e-6), dim=-1)
        if self.top_p < 1.0:
            sp, si = probs.sort(-1, descending=True)
            drop = sp.cumsum(-1) - sp > self.top_p
            sp[drop] = 0
            probs = torch.zeros_like(probs).scatter(-1, si, sp)
        return torch.multinomial(probs / probs.sum(-1, keepdim=True), 1).squeeze(-1)

    # -- one turn for every row -----------------------------------------------------------------
    @torch.inference_mode()
    def step(self, convs: list[list[dict[str, str]]], on_row=None) -> list[tuple[str, int, int, int]]:
        """Generate each row's next assistant turn: (text, prompt tokens, new tokens, turns dropped).

        ``on_row(i, text)``, when given, is called as soon as row ``i`` has its answer, while the
        other rows may still decode (the rollout steps that row's environment meanwhile)."""
        assert len(convs) == len(self.slot), "one conversation per row"
        n = len(convs)
        first, dropped, prompt_tokens = [], [], []
        pending: list[tuple[int, list[int]]] = []  # (row, new prompt tokens) to feed packed
        for i, conv in enumerate(convs):
            # The prompt exactly as HF generate on the whole conversation would get it; the row's
            # cache is kept when its tokens are a prefix of it. They are not when the template
            # rewrites history, the generated tokens are not the tokenizer's own split of their
            # text, or the prompt was fitted to the context: then the row is encoded anew.
            ids, d = self.encode_full(conv)
            prev = self.held[i]
            fresh = not (prev is not None and d == 0 and len(ids) > len(prev) and ids[:len(prev)] == prev)
            if not fresh:
                new = ids[len(prev):]
            else:
                if prev is not None:
                    self.reencoded += 1
                self._reset_row(i)
                new = ids
                if self.prefixes is not None:
                    m, kv = self.prefixes.match(ids)
                    if kv is not None:
                        self.cache.reserve(n, len(ids) + self.max_new)
                        self.cache.write(self.slot[i], kv, m)
                        self.length[self.slot[i]] = m
                        self.prefixes.shared_tokens += m
                        new = ids[m:]
            store = self.prefixes is not None and 2 * len(new) > len(ids)  # little shared: a prefix for later rows
            if store or not self._decode_attention:  # fed now, alone (a stored prefix serves this turn's next rows)
                logits = self._prefill(i, new)
            else:  # fed with the turn's other chunks in one packed forward, after this loop
                logits = None
                pending.append((i, new))
            if store:
                kv = self.cache.read(self.slot[i], len(ids))
                self.prefixes.add(ids, kv)
                if self.shared_ids is None:  # the play's first prompt: its shared prefix
                    self.shared_ids, self.cache.shared_kv = list(ids), kv
            if fresh and self.shared_ids is not None:  # what the slot holds of the play's shared prefix
                self.shares[self.slot[i]] = PrefixStore._common(ids, self.shared_ids)
            self.held[i] = list(ids) if d == 0 else None  # a cut prompt cannot be extended later
            first.append(logits)
            dropped.append(d)
            prompt_tokens.append(len(ids))
        if pending:
            for (i, _), logits in zip(pending, self._prefill_packed(pending)):
                first[i] = logits
        out: list[list[int]] = [[] for _ in range(n)]
        done = [False] * n
        nxt = self._pick(torch.stack(first)).tolist()
        while True:
            for i in range(n):
                if done[i]:
                    continue
                out[i].append(nxt[i])
                if nxt[i] in self.stop or len(out[i]) >= self.max_new:
                    done[i] = True
                    if on_row is not None:
                        on_row(i, self.tok.decode(out[i], skip_special_tokens=True).strip())
            if all(done):
                break
            # every row's latest token enters its cache but a finished row's (see held below)
            nxt = self._pick(self._decode([o[-1] for o in out], [not d for d in done])).tolist()
        results = []
        for i in range(n):
            # the slot holds the prompt and the generated tokens but the last one (a finished row's
            # last token is never fed): the next turn's prompt supplies it
            if self.held[i] is not None:
                self.held[i] += out[i][:-1]
            text = self.tok.decode(out[i], skip_special_tokens=True).strip()
            results.append((text, prompt_tokens[i], len(out[i]), dropped[i]))
        return results
