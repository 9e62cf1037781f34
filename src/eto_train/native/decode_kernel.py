"""The KV engine's decode attention in C++ (decode_attention.cpp beside this file; its caller:
rollouts/kvbatch.py), built at first use on a CPU (:mod:`eto_train.native`; ``runtime.cpu_kernels``)."""

from __future__ import annotations

from pathlib import Path

import torch

from .. import native

SOURCE = Path(__file__).with_name("decode_attention.cpp")
DTYPES = (torch.float32, torch.bfloat16)  # the key/value dtypes it reads


def load():
    """The extension (``decode_attention(q, k, v, slots, lengths, start, scale)``), or None: torch's kernel (also
    where it is the faster on this CPU: without AVX-512, :func:`eto_train.native.faster`)."""
    return native.load(SOURCE, "decode steps use torch's flash kernel (slower, the same answers to rounding)")
