"""bf16 training's causal attention on the CPU through the project's C++ kernels (causal_attention.cpp beside
this file; :mod:`eto_train.native`, ``runtime.cpu_kernels``). Reached only through the packed rows of
training/right_padding.py (``runtime.library_hooks``): with those hooks off, training runs transformers' SDPA.

:func:`causal_attention` is what :func:`eto_train.training.right_padding.row_attention` calls for each packed row
(SDPA's ``is_causal`` semantics, grouped-query heads). On a CPU, for a row of at most :data:`MAX_LEN` tokens whose
attention runs in bf16 (bf16 tensors, or under CPU autocast to bf16, which casts SDPA's inputs so), it runs
:class:`KernelAttention`: the scores and the outputs as bf16 batched matmuls, each key-value head's query heads
stacked as one matrix (nothing repeated), the causal softmax in C++; the backward recomputes the probabilities
and runs five more matmuls around the softmax's backward in C++. Anything else (fp32, dropout, longer rows,
another device, no kernel built, a CPU without avx512f and avx512_bf16: :mod:`eto_train.native`) goes to SDPA.

Measured on SmolLM2-135M's shapes (9 query heads on 3, head size 64), two threads, forward + backward, against
torch's CPU flash kernel: 400 tokens 2.8 against 8.4 ms, 640 tokens 8.1 against 16.5, 1,024 tokens 18.7 against
30.1; 2,048 tokens 120 against 101 (the scores no longer stay in cache), hence :data:`MAX_LEN`. Errors against
float64 of the same order as the flash kernel's (docs/lab/bench.md).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from .. import native

SOURCE = Path(__file__).with_name("causal_attention.cpp")
MAX_LEN = 1024  # longer rows go to SDPA's flash kernel (measured above: at 2,048 tokens it is faster)


def load():
    """The extension (``causal_softmax_``, ``causal_softmax_backward_``), or None: SDPA's kernel (also where it is
    the faster on this CPU: without AVX-512 and bf16 dot products, :func:`eto_train.native.faster`)."""
    return native.load(SOURCE, "bf16 training's attention uses torch's flash kernel (slower, the same to rounding)")


class KernelAttention(torch.autograd.Function):
    """Causal attention of ``q`` ``[b, heads, L, d]`` over ``k``/``v`` ``[b, kv_heads, L, d]`` (bf16, contiguous
    in their last two dims), scale ``scale``; returns ``[b, heads, L, d]`` bf16."""

    @staticmethod
    def forward(ctx, q, k, v, scale, kernel):
        b, heads, n, d = q.shape
        kv_heads = k.shape[1]
        qg = q.reshape(b * kv_heads, heads // kv_heads * n, d)  # a key-value head's query heads, stacked
        kk, vv = k.reshape(b * kv_heads, n, d), v.reshape(b * kv_heads, n, d)
        p = torch.bmm(qg, kk.transpose(1, 2))
        kernel.causal_softmax_(p, scale)
        o = torch.bmm(p, vv)
        ctx.save_for_backward(qg, kk, vv, o)
        ctx.scale, ctx.kernel, ctx.shape = scale, kernel, (b, heads, n, d, kv_heads)
        return o.view(b, heads, n, d)

    @staticmethod
    def backward(ctx, grad):
        qg, kk, vv, o = ctx.saved_tensors
        b, heads, n, d, kv_heads = ctx.shape
        go = grad.to(qg.dtype).reshape(b * kv_heads, -1, d).contiguous()
        p = torch.bmm(qg, kk.transpose(1, 2))  # the probabilities again (not kept: [heads x L x L] a layer)
        ctx.kernel.causal_softmax_(p, ctx.scale)
        dv = torch.bmm(p.transpose(1, 2), go)
        ds = torch.bmm(go, vv.transpose(1, 2))
        ctx.kernel.causal_softmax_backward_(p, ds, (go.float() * o.float()).sum(-1), ctx.scale)  # ds: dS now
        dq = torch.bmm(ds, kk).view(b, heads, n, d)
        dk = torch.bmm(ds.transpose(1, 2), qg).view(b, kv_heads, n, d)
        return dq, dk, dv.view(b, kv_heads, n, d), None, None


def _bf16(q: torch.Tensor) -> bool:
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu") == torch.bfloat16
    return q.dtype == torch.bfloat16


def causal_attention(q, k, v, scale=None, dropout_p: float = 0.0, enable_gqa: bool = False):
    """``F.scaled_dot_product_attention(q, k, v, is_causal=True, ...)``, through :class:`KernelAttention` where it
    applies (see the module's docstring)."""
    n = q.shape[2]
    kernel = (load() if q.device.type == "cpu" and not dropout_p and n <= MAX_LEN and k.shape[2] == n
              and not q.shape[1] % k.shape[1] and _bf16(q) else None)  # None also where cpu_kernels is off
    if kernel is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale,
                                              enable_gqa=enable_gqa)
    q, k, v = (x.to(torch.bfloat16).contiguous() for x in (q, k, v))  # autocast's cast for SDPA, made here
    return KernelAttention.apply(q, k, v, scale if scale is not None else q.shape[-1] ** -0.5, kernel)
