"""The C++ decode-attention kernel (rollouts/decode_kernel.py, decode_attention.cpp): each row's attention over
its own slot, checked against softmax attention computed in float64; its build name; the fallback where it
cannot be built."""

from __future__ import annotations

import pytest
import torch

from eto_train.rollouts import decode_kernel


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


def test_a_kernel_that_cannot_be_built_leaves_torchs_kernel_with_one_warning(monkeypatch, capsys, tiny_model_dir):
    """No compiler (the build raises): load() says why, once, and returns None every time after without building
    again; a KV session then decodes with torch's kernel (cache.kernel None)."""
    import torch.utils.cpp_extension as ext

    from eto_train.model.load import load_model, load_tokenizer
    from eto_train.rollouts.kvbatch import KVBatch

    tries = []
    monkeypatch.setattr(decode_kernel, "_built", {})

    def broken(*a, **kw):
        tries.append(a)
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(ext, "load", broken)
    assert decode_kernel.load() is None and decode_kernel.load() is None and len(tries) == 1
    out = capsys.readouterr().out
    assert out.count("warning: the C++ decode-attention kernel could not be built") == 1
    assert "Ninja is required" in out and "rollout.decode_kernel=false" in out
    session = KVBatch(load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)), 4, 256)
    assert session.cache.kernel is None and len(tries) == 1
    off = KVBatch(session.model, session.tok, 4, 256, decode_kernel=False)  # never builds
    assert off.cache.kernel is None and len(tries) == 1


def test_the_build_name_changes_with_the_source_the_flags_and_the_cpu(monkeypatch):
    """-march=native builds for this CPU: another CPU (or source, or flags, or torch install: another venv) must
    not reuse the build."""
    first = decode_kernel.name()
    assert first.startswith("eto_decode_attention_") and first == decode_kernel.name()
    monkeypatch.setattr(decode_kernel, "_cpu", lambda: "model name: another CPU\nflags: sse2")
    assert decode_kernel.name() != first
    monkeypatch.undo()
    monkeypatch.setattr(decode_kernel, "CFLAGS", [*decode_kernel.CFLAGS, "-DX"])
    assert decode_kernel.name() != first
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__file__", "/another/venv/torch/__init__.py")
    assert decode_kernel.name() != first


def test_rollout_decode_kernel_reaches_the_kv_engine(tiny_model_dir):
    """The shipped config builds the kernel (rollout.decode_kernel: true); eval.rollout.decode_kernel=false
    reaches the policy and its sessions (torch's kernel), and the config refuses a value that is not a flag."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from eto_train.config import ConfigError, typed
    from eto_train.rollouts import play

    root = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(str(root), version_base="1.3"):
        cfg = typed(compose("config", overrides=["rollout.backend=hf"]))
        off = typed(compose("config", overrides=["rollout.backend=hf", "+eval.rollout.decode_kernel=false"]))
        bad = compose("config", overrides=["rollout.decode_kernel=sometimes"])
    assert cfg.rollout.decode_kernel is True
    on_policy = play.make_policy(cfg, str(tiny_model_dir), cfg.rollout.merged(cfg.eval.rollout))
    off_policy = play.make_policy(off, str(tiny_model_dir), off.rollout.merged(off.eval.rollout))
    assert on_policy.session().cache.kernel is not None and off_policy.session().cache.kernel is None
    with pytest.raises(ConfigError, match=r"rollout.decode_kernel"):
        typed(bad)
