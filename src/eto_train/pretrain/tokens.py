"""The tokenizer and the token stream of the pretraining transcripts.

The tokenizer is :func:`eto_train.model.tiny.train_tokenizer` (byte-level BPE, digits split,
ChatML template) trained on a sample of the training transcripts' messages. Every transcript is
rendered through that chat template and tokenized; the ids of all transcripts, one after the
other, go to one flat binary file (``uint16`` while the vocabulary fits, else ``uint32``),
written shard by shard, so millions of tokens never sit in memory. Training reads it
memory-mapped as packed blocks of ``seq_len`` tokens (:class:`PackedBlocks`): next-token loss on
every token, blocks cut across transcript boundaries as in ordinary LM pretraining (each
transcript starts with ``<|im_start|>system``, so the model sees where one begins).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from .transcripts import read_transcripts, render

ROLES = ("system", "user", "assistant")


def sample_texts(shards: list[Path], limit: int | None) -> Iterator[str]:
    """Message contents of up to ``limit`` transcripts, taken evenly from every shard (the
    shards are already shuffled), plus the role names the template writes."""
    yield from ROLES
    if not shards:
        return
    per_shard = None if limit is None else max(1, -(-int(limit) // len(shards)))
    for path in shards:
        for k, t in enumerate(read_transcripts([path])):
            if per_shard is not None and k >= per_shard:
                break
            for m in t["messages"]:
                yield m["content"]


def dtype_for(vocab_size: int):
    return np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32


def write_tokens(shards: Iterable[Path], tokenizer, out_path: str | Path, batch: int = 256) -> int:
    """Render, tokenize and append every transcript of ``shards`` to ``out_path`` (written under a
    temporary name, then renamed); returns the number of tokens."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    dtype = dtype_for(len(tokenizer))
    n = 0
    with open(tmp, "wb") as f:
        texts: list[str] = []

        def flush() -> None:
            nonlocal n
            if not texts:
                return
            ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
            flat = np.fromiter((i for row in ids for i in row), dtype=dtype)
            f.write(flat.tobytes())
            n += len(flat)
            texts.clear()

        for t in read_transcripts(shards):
            texts.append(render(tokenizer, t["messages"]))
            if len(texts) >= batch:
                flush()
        flush()
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out_path)
    return n


def read_tokens(path: str | Path, vocab_size: int) -> np.ndarray:
    return np.memmap(path, dtype=dtype_for(vocab_size), mode="r")


class PackedBlocks:
    """Consecutive ``seq_len``-token blocks of a token file (the remainder is dropped); each item
    is ``input_ids`` = ``labels`` (the model shifts them: loss on every token)."""

    def __init__(self, path: str | Path, vocab_size: int, seq_len: int, limit: int | None = None):
        self.path, self.vocab_size, self.seq_len = str(path), int(vocab_size), int(seq_len)
        n = len(read_tokens(self.path, self.vocab_size)) // self.seq_len
        self.n = n if limit is None else min(n, int(limit))
        self._data = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        if self._data is None:  # opened lazily: the dataset stays picklable
            self._data = read_tokens(self.path, self.vocab_size)
        if not 0 <= i < self.n:
            raise IndexError(i)
        block = torch.from_numpy(np.asarray(self._data[i * self.seq_len:(i + 1) * self.seq_len], dtype=np.int64))
        return {"input_ids": block, "labels": block.clone()}

    def __getstate__(self):
        return {**self.__dict__, "_data": None}
