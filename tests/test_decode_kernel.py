"""The C++ decode-attention kernel (rollouts/decode_kernel.py, decode_attention.cpp): each row's attention over
its own slot, checked against softmax attention computed in float64 (its build and fallback: test_native.py)."""

from __future__ import annotations

import pytest
import torch

from eto_train.native import decode_kernel


def reference(q, k, v, slots, lengths, start, scale):
    """(out, log-sum-exp) per row, float64: row i's grouped queries over slot slots[i]'s positions start..end."""
    outs, lses = [], []
    for i, (s, n) in enumerate(zip(slots.tolist(), lengths.tolist())):
        if n <= start:
            outs.append(torch.zeros(q.shape[1:], dtype=torch.float64))
            lses.append(torch.full(q.shape[1:3], float("-inf"), dtype=torch.float64))
            continue
        kk, vv = k[s, :, start:n].double(), v[s, :, start:n].double()
        scores = q[i].double() @ kk.transpose(-1, -2) * scale  # [kv_heads, g, n]
        outs.append(scores.softmax(-1) @ vv)
        lses.append(scores.logsumexp(-1))
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("g", "d"), [(3, 64), (1, 64), (6, 32), (2, 24), (3, 8)],
                         ids=["smollm2", "one-query", "many-queries", "d24", "d8"])
def test_each_row_attends_over_its_own_slot_to_its_own_length(g, d, dtype):
    """Rows in any slot order, lengths that are and are not multiples of 16 (the kernel's blocks), one row with
    no position past ``start`` (zeros and -inf: the shared prefix is all it attends to), buffers wider than the
    rows read (a slice of the capacity, strided), head sizes the vector path takes (multiples of 16) and those
    it leaves to the plain loops (24, 8)."""
    kernel = decode_kernel.load()
    assert kernel is not None, "the C++ kernel was not built (a C++ compiler and ninja are needed)"
    gen = torch.Generator().manual_seed(g * 100 + d)
    slots_total, kv_heads, capacity, start = 6, 2, 90, 5
    k = torch.randn(slots_total, kv_heads, capacity + 7, d, generator=gen)[:, :, :capacity].to(dtype)
    v = torch.randn(slots_total, kv_heads, capacity + 7, d, generator=gen)[:, :, :capacity].to(dtype)
    slots = torch.tensor([4, 0, 5, 2])[:, None]  # as KVBatch passes them: [rows, 1]
    lengths = torch.tensor([90, 37, start, 21])  # 85 and 32 positions past start, none, 16
    q = torch.randn(4, kv_heads, g, d, generator=gen).to(dtype)
    out, lse = kernel.decode_attention(q, k, v, slots, lengths, start, 0.3)
    want_out, want_lse = reference(q, k, v, slots[:, 0], lengths, start, 0.3)
    assert out.dtype == lse.dtype == torch.float32 and out.shape == (4, kv_heads, g, d) and lse.shape == (4, kv_heads, g)
    assert torch.allclose(out.double(), want_out, atol=2e-6) and torch.equal(out[2], torch.zeros_like(out[2]))
    assert torch.allclose(lse[[0, 1, 3]].double(), want_lse[[0, 1, 3]], atol=2e-6)
    assert torch.isinf(lse[2]).all() and (lse[2] < 0).all()


def test_a_float16_model_decodes_with_torchs_kernel(tiny_model_dir):
    """The kernel reads fp32 and bf16 caches; a float16 model's session takes torch's kernel (no kernel in its
    cache) and answers as HF generate does."""
    from fixture_settings import generation

    from eto_train.model.load import load_model, load_tokenizer
    from eto_train.rollouts.loop import Policy

    tok, model = load_tokenizer(str(tiny_model_dir)), load_model(str(tiny_model_dir)).half()
    policy = Policy(model, tok, generation(max_new_tokens=4))
    session = policy.session()
    assert session.cache.kernel is None
    convs = [[{"role": "user", "content": f"Task: reach room {i}"}] for i in range(3)]
    for _ in convs:
        session.add_row()
    assert [r[0] for r in session.step(convs)] == [r[0] for r in policy.generate(convs)]


def test_the_engine_decodes_with_torchs_kernel_on_avx2_with_the_cpp_one_on_avx512(tiny_model_dir, monkeypatch):
    """The default per CPU (native.faster): on AVX2 flags a session has no kernel (torch's), on AVX-512 flags the
    C++ one, and both answer as HF generate does."""
    from fixture_settings import generation
    from test_native import AVX2, AVX512, as_cpu

    from eto_train.model.load import load_model, load_tokenizer
    from eto_train.rollouts.loop import Policy

    policy = Policy(load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)), generation(max_new_tokens=4))
    convs = [[{"role": "user", "content": f"Task: reach room {i}"}] for i in range(3)]
    answers = []
    for flags, has_kernel in ((AVX2, False), (AVX512, True)):
        as_cpu(monkeypatch, flags)
        session = policy.session()
        assert (session.cache.kernel is not None) == has_kernel
        for _ in convs:
            session.add_row()
        answers.append([r[0] for r in session.step(convs)])
    assert answers[0] == answers[1] == [r[0] for r in policy.generate(convs)]
