"""The rollout engine as it was at commit 577f8ab (src/eto_train/rollouts/kvbatch.py then), kept for `make bench`
only: the baseline of the real-model section (bench.real), which measures today's engine against it on the
same episodes. Not used by any stage. Its cache grows per row in spare buffers; rows joining, leaving and
fresh prompts re-copy the whole batch (keep/_compact/_append), and every episode prefills its whole prompt.
"""

from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import DynamicLayer


class SpareLayer(DynamicLayer):
    """A cache layer whose keys and values are views into buffers with spare room on the
    sequence axis: a decode step writes its column in place instead of concatenating (copying)
    the whole cache, which took about a fifth of a batched CPU rollout (profiled: 1.9 of 9.0 s).

    Anything else that replaces ``keys``/``values`` (rows added, dropped or compacted by
    :class:`KVBatch`) is noticed on the next update, which moves the cache into a new buffer.
    Written by hand: transformers' ``DynamicLayer`` concatenates on every update, and its
    ``StaticCache`` has a fixed batch that rows cannot join or leave.
    """

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        old = self.keys.shape[-2] if self.keys is not None and self.keys.numel() else 0
        need = old + key_states.shape[-2]
        kb, vb = getattr(self, "_kbuf", None), getattr(self, "_vbuf", None)
        ours = kb is not None and self.keys is self._kview and self.values is self._vview
        if not ours or kb.shape[-2] < need or kb.shape[0] != key_states.shape[0]:
            shape = list(key_states.shape)
            shape[-2] = need + max(128, need // 2)  # room for the next turn's tokens
            kb, vb = key_states.new_empty(shape), value_states.new_empty(shape)
            if old:
                kb[..., :old, :] = self.keys
                vb[..., :old, :] = self.values
            self._kbuf, self._vbuf = kb, vb
        kb[..., old:need, :] = key_states
        vb[..., old:need, :] = value_states
        self.keys, self.values = kb[..., :need, :], vb[..., :need, :]
        self._kview, self._vview = self.keys, self.values
        return self.keys, self.values


class KVBatch:
    def __init__(self, model, tok, max_new_tokens: int, budget: int, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0, encode_full=None, stop_ids=None):
        self.model, self.tok = model, tok
        self.max_new, self.budget = max_new_tokens, budget
        self.do_sample, self.temperature, self.top_p = do_sample, temperature, top_p
        self.encode_full = encode_full or self._encode  # conv -> (ids, turns dropped): a fitted prompt
        self.stop = set(stop_ids) if stop_ids else {tok.eos_token_id}  # every end-of-turn id
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.cache = None
        self.mask = torch.zeros((0, 0), dtype=torch.long)  # [rows, cached positions]
        self.length: list[int] = []  # real tokens per row (its next position id)
        self.held: list[list[int] | None] = []  # the token ids the row's cache holds (None: start anew)
        self.reencoded = 0  # rows whose history stopped being a prefix of the new prompt
        self.device = next(model.parameters()).device
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def _encode(self, conv):
        ids = self.tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        return self.tok(ids, add_special_tokens=False)["input_ids"], 0

    # -- rows ---------------------------------------------------------------------------------
    def add_row(self) -> None:
        self.mask = torch.cat([self.mask, torch.zeros((1, self.mask.shape[1]), dtype=torch.long)])
        self.length.append(0)
        self.held.append(None)
        for layer in self._layers():
            layer.keys = torch.cat([layer.keys, torch.zeros_like(layer.keys[:1])])
            layer.values = torch.cat([layer.values, torch.zeros_like(layer.values[:1])])

    def keep(self, rows: list[int]) -> None:
        if rows == list(range(len(self.length))):
            return  # every row stays, in order: nothing to select
        idx = torch.tensor(rows, dtype=torch.long)
        self.mask = self.mask[idx]
        self.length = [self.length[i] for i in rows]
        self.held = [self.held[i] for i in rows]
        if self.cache is not None:
            if rows:
                self.cache.batch_select_indices(idx.to(self.device))
            else:
                self.cache, self.mask = None, torch.zeros((0, 0), dtype=torch.long)
        self._compact()

    def _reset_row(self, i: int) -> None:
        self.mask[i] = 0
        self.length[i] = 0
        self.held[i] = None

    def _compact(self) -> None:
        """Drop cached positions no row attends to any more, keeping rows left-padded."""
        if self.cache is None or not self.mask.numel():
            return
        real = self.mask.sum(1)
        width = int(real.max())
        if self.mask.shape[1] - width < 32:  # few holes: not worth a copy
            return
        gather = torch.zeros((self.mask.shape[0], width), dtype=torch.long)
        new_mask = torch.zeros_like(gather)
        for i in range(self.mask.shape[0]):
            pos = self.mask[i].nonzero().flatten()
            if len(pos):
                gather[i, width - len(pos):] = pos
                new_mask[i, width - len(pos):] = 1
        g = gather.to(self.device)
        for layer in self._layers():
            gi = g[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = torch.gather(layer.keys, 2, gi)
            layer.values = torch.gather(layer.values, 2, gi)
        self.mask = new_mask

    def _layers(self):
        return [l for l in (self.cache.layers if self.cache is not None else [])
                if getattr(l, "keys", None) is not None and l.keys.numel()]

    def _take(self, rows: list[int]) -> "KVBatch":
        """A new KVBatch holding ``rows`` (cache included); this one keeps the others."""
        other = KVBatch.__new__(KVBatch)
        other.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("cache", "mask", "length", "held")})
        other.cache, other.mask = None, torch.zeros((len(rows), 0), dtype=torch.long)
        other.length = [0] * len(rows)
        other.held = [self.held[i] for i in rows]
        rest = [i for i in range(len(self.length)) if i not in set(rows)]
        self.keep(rest)
        return other

    def _append(self, other: "KVBatch") -> None:
        """Put ``other``'s rows after this batch's rows, left-padding the shorter cache."""
        if other.cache is None:
            return
        if self.cache is None or not self.length:
            self.cache, self.mask, self.length, self.held = other.cache, other.mask, other.length, other.held
            return
        width = max(self.mask.shape[1], other.mask.shape[1])

        def lpad(t, w, dim):
            if t.shape[dim] == w:
                return t
            shape = list(t.shape)
            shape[dim] = w - t.shape[dim]
            return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)

        for a, b in zip(self._layers(), other._layers()):
            a.keys = torch.cat([lpad(a.keys, width, 2), lpad(b.keys, width, 2)])
            a.values = torch.cat([lpad(a.values, width, 2), lpad(b.values, width, 2)])
        self.mask = torch.cat([lpad(self.mask, width, 1), lpad(other.mask, width, 1)])
        self.length += other.length
        self.held += other.held

    # -- forward --------------------------------------------------------------------------------
    def _forward(self, chunks: list[list[int]]) -> torch.Tensor:
        """Feed one chunk per row (right-aligned); returns the last position's logits per row."""
        width = max(1, max(len(c) for c in chunks))
        n = len(chunks)
        ids = torch.full((n, width), self.pad, dtype=torch.long)
        cmask = torch.zeros((n, width), dtype=torch.long)
        pos = torch.zeros((n, width), dtype=torch.long)
        for i, c in enumerate(chunks):
            if c:
                ids[i, width - len(c):] = torch.tensor(c)
                cmask[i, width - len(c):] = 1
                pos[i, width - len(c):] = torch.arange(self.length[i], self.length[i] + len(c))
                self.length[i] += len(c)
        self.mask = torch.cat([self.mask, cmask], dim=1)
        if self.cache is None:
            from transformers import DynamicCache
            self.cache = DynamicCache(config=self.model.config)
            self.cache.layers = [SpareLayer() if type(l) is DynamicLayer else l for l in self.cache.layers]
        out = self.model(input_ids=ids.to(self.device), attention_mask=self.mask.to(self.device),
                         position_ids=pos.to(self.device), use_cache=True, logits_to_keep=1,
                         **{self._cache_kw: self.cache})
        self.cache = getattr(out, "cache", None) or out.past_key_values
        if max(len(c) for c in chunks) > 1:
            self._compact()  # a long chunk (a new episode's prompt) padded every other row
        return out.logits[:, -1, :].float()

    def _prefill(self, chunks: list[list[int]]) -> torch.Tensor:
        """Feed the chunks; long ones (fresh prompts) in their own sub-batch so that the other
        rows are not padded to their width, then merge back in the original row order."""
        n = len(chunks)
        fresh = [i for i, c in enumerate(chunks) if len(c) > 4 * self.max_new and self.length[i] == 0]
        if not fresh or len(fresh) == n:
            return self._forward(chunks)
        cont = [i for i in range(n) if i not in set(fresh)]
        sub = self._take(fresh)
        logits_fresh = sub._forward([chunks[i] for i in fresh])
        logits_cont = self._forward([chunks[i] for i in cont])
        self._append(sub)
        order = cont + fresh  # current row order; restore the caller's
        inverse = [order.index(i) for i in range(n)]
        self.keep(inverse)
        return torch.cat([logits_cont, logits_fresh])[torch.tensor(inverse)]

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
        assert len(convs) == len(self.length), "one conversation per row"
        chunks, dropped = [], []
        for i, conv in enumerate(convs):
            # The prompt exactly as HF generate on the whole conversation would get it; the row's
            # cache is kept when its tokens are a prefix of it. They are not when the template
            # rewrites history, the generated tokens are not the tokenizer's own split of their
            # text, or the prompt was fitted to the context: then the row is encoded anew.
            ids, d = self.encode_full(conv)
            prev = self.held[i]
            if prev is not None and d == 0 and len(ids) > len(prev) and ids[:len(prev)] == prev:
                new = ids[len(prev):]
            else:
                if prev is not None:
                    self.reencoded += 1
                self._reset_row(i)
                new = ids
            self.held[i] = list(ids) if d == 0 else None  # a cut prompt cannot be extended later
            chunks.append(new)
            dropped.append(d)
        prompt_tokens = [self.length[i] + len(c) for i, c in enumerate(chunks)]
        logits = self._prefill(chunks)
        n = len(convs)
        out = [[] for _ in range(n)]
        done = [False] * n
        nxt = self._pick(logits).tolist()
        while True:
            feed = []
            for i in range(n):
                if done[i]:
                    feed.append([])
                    continue
                out[i].append(nxt[i])
                feed.append([nxt[i]])
                if nxt[i] in self.stop or len(out[i]) >= self.max_new:
                    done[i] = True
                    if on_row is not None:
                        on_row(i, self.tok.decode(out[i], skip_special_tokens=True).strip())
            logits = self._forward(feed)  # every produced token enters the cache
            if all(done):
                break
            nxt = self._pick(logits).tolist()
        results = []
        for i in range(n):
            if self.held[i] is not None:
                self.held[i] += out[i]
            text = self.tok.decode(out[i], skip_special_tokens=True).strip()
            results.append((text, prompt_tokens[i], len(out[i]), dropped[i]))
        return results
