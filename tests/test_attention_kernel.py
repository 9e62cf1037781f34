"""bf16 training's causal attention through the C++ kernels (training/attention_kernel.py, causal_attention.cpp):
the softmax and its backward by hand, the attention and its gradients against float64, what goes to SDPA instead,
and a packed bf16 training step of the tiny model against the same step through SDPA."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from eto_train import native
from eto_train.native import attention_kernel
from eto_train.native.attention_kernel import KernelAttention, causal_attention


@pytest.fixture(scope="module")
def kernel():
    k = attention_kernel.load()
    assert k is not None, "the C++ kernel was not built (a C++ compiler and ninja are needed)"
    return k


def test_the_causal_softmax_and_its_backward_by_hand(kernel):
    """Two positions, one head, scale ln 3: row 0 sees key 0 only (P = [1, 0], whatever its score for key 1); row 1
    sees both, scores 0 and 1, so ln 3 apart: P = [1/4, 3/4]. Backward with dP = [[5, 9], [1, 0]], D = rowsum(dO o O)
    given as [5, 1/4] and scale 1: dS = P (dP - D) = [[0, 0], [1/4 x 3/4, 3/4 x -1/4]]."""
    s = torch.tensor([[[2.0, 7.0], [0.0, 1.0]]]).bfloat16()
    kernel.causal_softmax_(s, math.log(3))
    assert s.float().tolist() == [[[1.0, 0.0], [0.25, 0.75]]]
    dp = torch.tensor([[[5.0, 9.0], [1.0, 0.0]]]).bfloat16()
    kernel.causal_softmax_backward_(s, dp, torch.tensor([5.0, 0.25]), 1.0)
    assert dp.float().tolist() == [[[0.0, 0.0], [0.1875, -0.1875]]]


def reference(q, k, v, scale):
    """Causal attention and its inputs' gradients in float64 (each key-value head repeated for its query heads)."""
    g = q.shape[1] // k.shape[1]
    qq, kk, vv = (x.detach().double().requires_grad_() for x in (q, k, v))
    o = F.scaled_dot_product_attention(qq, kk.repeat_interleave(g, 1), vv.repeat_interleave(g, 1), is_causal=True,
                                       scale=scale)
    return o, qq, kk, vv


@pytest.mark.parametrize(("heads", "kv_heads", "n"), [(9, 3, 1), (9, 3, 5), (9, 3, 40), (4, 4, 33), (6, 2, 130)])
def test_attention_and_its_gradients_against_float64(kernel, heads, kv_heads, n):
    """Grouped query heads (SmolLM2's 9 on 3) and plain ones, lengths that are and are not multiples of 16 (the
    kernel's vectors): the output and the gradients of q, k and v within bf16's rounding of float64's, and no
    further from them than torch's flash kernel in bf16 is (twice its error, at least 0.03: both round to bf16)."""
    gen = torch.Generator().manual_seed(heads * 1000 + n)
    q, k, v = (torch.randn(2, h, n, 16, generator=gen).bfloat16().requires_grad_()
               for h in (heads, kv_heads, kv_heads))
    grad = torch.randn(2, heads, n, 16, generator=gen)
    ref, rq, rk, rv = reference(q, k, v, 0.25)
    ref.backward(grad.double())
    out = KernelAttention.apply(q, k, v, 0.25, kernel)
    out.float().backward(grad)
    ours = [out.detach(), q.grad, k.grad, v.grad]
    q.grad = k.grad = v.grad = None
    flash = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25, enable_gqa=heads != kv_heads)
    flash.float().backward(grad)
    theirs = [flash.detach(), q.grad, k.grad, v.grad]
    for a, b, want in zip(ours, theirs, [ref.detach(), rq.grad, rk.grad, rv.grad]):
        err, flash_err = ((x.double() - want).abs().max().item() for x in (a, b))
        assert a.dtype == torch.bfloat16 and err <= max(2 * flash_err, 0.03), (err, flash_err)


def test_what_goes_to_sdpa(kernel, monkeypatch):
    """fp32 attention, dropout, a row longer than MAX_LEN, keys of another length and runtime.cpu_kernels=false all
    go to SDPA (equal to its own result); bf16 tensors and fp32 ones under bf16 autocast (as a trainer's bf16 runs
    them: autocast casts SDPA's inputs) take the kernel."""
    taken = []
    real_apply = KernelAttention.apply
    monkeypatch.setattr(KernelAttention, "apply", lambda *a: taken.append(a[0].shape) or real_apply(*a))
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 6, 20, 8, generator=gen), torch.randn(1, 2, 20, 8, generator=gen), torch.randn(
        1, 2, 20, 8, generator=gen)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(causal_attention(q, k, v, enable_gqa=True), sdpa) and not taken  # fp32
    b16 = [x.bfloat16() for x in (q, k, v)]
    assert not taken
    torch.manual_seed(0)
    dropped = causal_attention(*b16, dropout_p=0.5, enable_gqa=True)
    torch.manual_seed(0)
    assert torch.equal(dropped, F.scaled_dot_product_attention(*b16, dropout_p=0.5, is_causal=True, enable_gqa=True))
    assert not taken
    causal_attention(b16[0], b16[1][:, :, :10], b16[2][:, :, :10], enable_gqa=True)  # 20 queries, 10 keys
    assert not taken
    monkeypatch.setattr(attention_kernel, "MAX_LEN", 19)
    causal_attention(*b16, enable_gqa=True)
    assert not taken
    monkeypatch.setattr(attention_kernel, "MAX_LEN", 1024)
    native.enable(False)
    try:
        causal_attention(*b16, enable_gqa=True)
    finally:
        native.enable(True)
    assert not taken
    out = causal_attention(*b16, enable_gqa=True)
    assert len(taken) == 1 and out.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = causal_attention(q, k, v.bfloat16(), enable_gqa=True)
    assert len(taken) == 2 and out.dtype == torch.bfloat16
    assert (out.float() - sdpa).abs().max() < 0.05


def test_a_packed_bf16_training_step_matches_sdpas(kernel, tiny_model_dir, monkeypatch):
    """The tiny model, its rows packed (right_padding.py), bf16 autocast over fp32 weights as the trainers run it:
    the loss and every weight's gradient through the kernel within bf16's rounding of the same step through SDPA
    (runtime.cpu_kernels=false), and the kernel ran in every layer of every row."""
    from eto_train.model.load import load_model
    from eto_train.training.right_padding import unpad_right_padding

    taken = []
    real_apply = KernelAttention.apply
    monkeypatch.setattr(KernelAttention, "apply", lambda *a: taken.append(1) or real_apply(*a))
    model = load_model(str(tiny_model_dir))
    assert unpad_right_padding(model)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (3, 40), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    mask[2, 17:] = 0
    labels = ids.masked_fill(mask == 0, -100)

    def step(on: bool):
        native.enable(on)
        model.zero_grad()
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
        finally:
            native.enable(True)
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ours, ours_grads = step(True)
    layers = model.config.num_hidden_layers
    assert len(taken) == 3 * layers  # three rows a layer
    theirs, their_grads = step(False)
    assert len(taken) == 3 * layers
    assert abs(ours - theirs) < 0.02 * abs(theirs)
    for name, g in their_grads.items():
        scale = g.abs().max().item() or 1.0
        assert (ours_grads[name] - g).abs().max().item() <= 0.05 * scale, name


def test_bf16_attention_takes_the_kernel_only_on_a_cpu_with_avx512_bf16(kernel, monkeypatch):
    """The default per CPU (native.faster): AVX2 flags and AVX-512 without bf16 dot products go to SDPA (equal to
    its own result), AVX-512 with them to the kernel."""
    from test_native import AVX2, AVX512, AVX512_BF16, as_cpu

    taken = []
    real_apply = KernelAttention.apply
    monkeypatch.setattr(KernelAttention, "apply", lambda *a: taken.append(1) or real_apply(*a))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 20, 8, generator=gen).bfloat16() for h in (6, 2, 2))
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    for flags in (AVX2, AVX512):
        as_cpu(monkeypatch, flags)
        assert torch.equal(causal_attention(q, k, v, enable_gqa=True), sdpa) and not taken
    as_cpu(monkeypatch, AVX512_BF16)
    assert (causal_attention(q, k, v, enable_gqa=True).float() - sdpa.float()).abs().max() < 0.05 and taken == [1]
