"""Right-padded training batches run packed, without their padding (eto_train.training.right_padding)."""

from __future__ import annotations

import copy

import pytest
import torch

from eto_train.model.load import load_model
from eto_train.training import right_padding
from eto_train.training.right_padding import SPANS, is_right_padding, unpad_right_padding


@pytest.fixture
def unhook():
    hooked = []
    yield hooked
    for m in hooked:
        unpad_right_padding(m, enabled=False)


def test_right_padding_is_ones_then_zeros():
    assert is_right_padding(torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]))
    assert is_right_padding(torch.tensor([[True, False]]))
    assert not is_right_padding(torch.tensor([[0, 1, 1, 1]]))        # left padding
    assert not is_right_padding(torch.tensor([[1, 1, 0, 1]]))        # a hole (packed rows)
    assert not is_right_padding(torch.tensor([[1, 2, 0, 0]]))        # not a 0/1 mask
    assert not is_right_padding(torch.ones(2, 1, 4, 4))              # already 4-D
    assert not is_right_padding(None)


def _batch():
    """Three rows of 9, 5 and 7 real tokens, padded on the right to 9; labels on some real tokens only."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 300, (3, 9), generator=g)
    mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4, [1] * 7 + [0] * 2])
    ids[mask == 0] = 0
    labels = torch.full_like(ids, -100)
    labels[0, 3:7], labels[1, 2:5], labels[2, 1:7] = ids[0, 3:7], ids[1, 2:5], ids[2, 1:7]
    return ids, mask, labels


def _run(model, ids, mask, labels):
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    return out.logits.detach(), out.loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                   if p.grad is not None}


def _sdpa_calls(monkeypatch, model, ids, mask, labels):
    """:func:`_run`, and each SDPA call's (query length, is_causal) in it."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, *a, **k: calls.append((q.shape[2], k.get("is_causal"))) or sdpa(q, *a, **k))
    try:
        return calls, _run(model, ids, mask, labels)
    finally:
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)


def _spy(monkeypatch, decoder):
    """What the decoder's own forward receives (after the pre-hook)."""
    seen = []
    forward = decoder.forward
    monkeypatch.setattr(decoder, "forward", lambda *a, **k: seen.append(k) or forward(*a, **k))
    return seen


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_real_tokens_compute_the_same_packed(tiny_model_dir, monkeypatch, unhook, checkpointing):
    """The same batch padded under its mask and packed: every real position's logits, the loss and every
    gradient equal (fp32), also when activation checkpointing recomputes the layers in the backward (they
    must attend per row again). Packed, the decoder gets one row of the 21 real tokens, their positions
    restarting at each row, and no mask; padding positions come back as the LM head of zeros."""
    model = load_model(str(tiny_model_dir))
    if checkpointing:
        model.activation_checkpointing_enable()
        model.train()
    ids, mask, labels = _batch()
    seen = _spy(monkeypatch, model.get_decoder())
    assert unpad_right_padding(model, enabled=False) is False
    before = _run(model, ids, mask, labels)
    assert unpad_right_padding(model) is True and unpad_right_padding(model) is True  # idempotent
    unhook.append(model)
    calls, after = _sdpa_calls(monkeypatch, model, ids, mask, labels)
    layers = model.config.num_hidden_layers  # each layer attends per row, causally (recomputed: once more)
    assert calls == [(9, True), (5, True), (7, True)] * layers * (2 if checkpointing else 1)
    assert seen[0]["attention_mask"] is mask and seen[0]["input_ids"].shape == (3, 9)
    assert seen[1]["attention_mask"] is None and seen[1]["input_ids"].tolist() == [ids[mask.bool()].tolist()]
    assert seen[1]["position_ids"].tolist() == [list(range(9)) + list(range(5)) + list(range(7))]
    assert seen[1][SPANS] == [(0, 9), (9, 14), (14, 21)]
    real = mask.bool()
    torch.testing.assert_close(after[0][real], before[0][real], rtol=1e-5, atol=1e-5)
    bias = model.lm_head(torch.zeros(1, model.config.hidden_size)).detach()
    torch.testing.assert_close(after[0][~real], bias.expand(int((~real).sum()), -1))  # padding: hidden states 0
    assert after[1] == pytest.approx(before[1], rel=1e-6)
    assert before[2].keys() == after[2].keys() and before[2]
    for name, grad in before[2].items():
        torch.testing.assert_close(after[2][name], grad, rtol=1e-4, atol=1e-6)
    assert unpad_right_padding(model, enabled=False) is False  # removed: the batch reaches the decoder as it is
    _run(model, ids, mask, labels)
    assert seen[2]["attention_mask"] is mask and SPANS not in seen[2]


def test_other_batches_and_calls_are_left_as_they_are(tiny_model_dir, monkeypatch, unhook):
    """Left padding, explicit positions, a batch without padding and a model on another attention
    implementation reach the decoder unchanged."""
    model = load_model(str(tiny_model_dir))
    seen = _spy(monkeypatch, model.get_decoder())
    unpad_right_padding(model)
    unhook.append(model)
    ids, mask, _ = _batch()
    left = mask.flip(1)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=left)
        model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(9).expand(3, 9))
        model(input_ids=ids, attention_mask=torch.ones_like(mask))
    assert [k["input_ids"].shape for k in seen] == [(3, 9)] * 3
    assert seen[0]["attention_mask"] is left and SPANS not in seen[1] and SPANS not in seen[2]
    monkeypatch.setattr(right_padding, "ATTENTION", frozenset({"eager"}))  # as if this model ran another one
    assert unpad_right_padding(model) is False  # and the hooks are gone
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    assert seen[3]["attention_mask"] is mask
    monkeypatch.undo()
    assert unpad_right_padding(model) is True
    model.config.sliding_window = 4  # a window: rows packed would attend past it
    assert unpad_right_padding(model) is False
    model.config.sliding_window = None
    model.config.model_type = "gemma2"  # soft-capping: not plain attention
    assert unpad_right_padding(model) is False


def test_a_copy_packs_its_own_rows_and_a_failed_forward_leaves_nothing_behind(tiny_model_dir, unhook):
    """A deep copy (a DPO reference made from the policy) runs its own weights packed; a forward that
    raises leaves no packed state on the decoder, and the next call is packed afresh."""
    model = load_model(str(tiny_model_dir))
    unpad_right_padding(model)
    unhook.append(model)
    ref = copy.deepcopy(model)
    with torch.no_grad():
        ref.get_decoder().norm.weight.mul_(2.0)
    ids, mask, _ = _batch()
    real = mask.bool()
    with torch.no_grad():
        a, b = model(input_ids=ids, attention_mask=mask).logits, ref(input_ids=ids, attention_mask=mask).logits
        padded = ref(input_ids=ids, attention_mask=mask.clone().fill_(1)).logits  # no padding: not packed
    assert not torch.allclose(a[real], b[real])
    torch.testing.assert_close(b[0], padded[0], rtol=1e-5, atol=1e-5)  # row 0 has no padding: the same either way
    decoder = model.get_decoder()
    layer = decoder.layers[0]
    boom = layer.register_forward_pre_hook(lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        model(input_ids=ids, attention_mask=mask)
    boom.remove()
    assert "_eto_packed" not in decoder.__dict__
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, a)


def test_a_peft_model_is_packed_on_its_decoder(tiny_model_dir, unhook):
    """PEFT's tuner calls the causal LM's forward directly: the hooks sit on the decoder it calls as a module."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(load_model(str(tiny_model_dir)), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    ids, mask, labels = _batch()
    with_mask = model(input_ids=ids, attention_mask=mask, labels=labels)
    assert unpad_right_padding(model) is True
    unhook.append(model)
    packed = model(input_ids=ids, attention_mask=mask, labels=labels)
    real = mask.bool()
    torch.testing.assert_close(packed.logits[real], with_mask.logits[real], rtol=1e-5, atol=1e-5)
    assert packed.loss.item() == pytest.approx(with_mask.loss.item(), rel=1e-6)


def _sharing_batch():
    """Five rows: 0 = P + A, 1 = P + B (P: 40 tokens in common), 2 = its own, 3 = the first 45 tokens of
    row 0 (inside it), 4 = row 1 + C (shares 46 tokens with row 1, 40 with row 0); padded on the right."""
    g = torch.Generator().manual_seed(1)
    tok = lambda n: torch.randint(5, 300, (n,), generator=g).tolist()  # noqa: E731
    p, a, b, c = tok(40), tok(12), tok(6), tok(9)
    rows = [p + a, p + b, tok(30), (p + a)[:45], p + b + c]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
    labels[:, :38] = -100  # a loss on the shared positions' next tokens too (38, 39) and after them
    return ids, mask, labels


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_prefix_rows_have_in_common_is_computed_once(tiny_model_dir, monkeypatch, unhook, checkpointing):
    """Rows that begin alike (the instruction and example of every row; a DPO pair's prompt) compute that
    prefix once: logits at every real position, the loss and every gradient equal the padded batch's under
    its mask (fp32). The decoder gets each row's new tokens only (positions from where the shared prefix
    ends); a row attends with all its positions, the shared keys gathered from the row that computed them."""
    model = load_model(str(tiny_model_dir))
    if checkpointing:
        model.activation_checkpointing_enable()
        model.train()
    ids, mask, labels = _sharing_batch()
    before = _run(model, ids, mask, labels)
    seen = _spy(monkeypatch, model.get_decoder())
    unpad_right_padding(model)
    unhook.append(model)
    calls, after = _sdpa_calls(monkeypatch, model, ids, mask, labels)
    # row 3 lies inside row 0: no new token, no attention of its own
    layers = model.config.num_hidden_layers
    assert calls == [(52, True), (46, True), (30, True), (55, True)] * layers * (2 if checkpointing else 1)
    new = [52, 6, 30, 0, 9]
    assert seen[0]["input_ids"].shape == (1, sum(new))
    positions = seen[0]["position_ids"][0].tolist()
    assert positions == list(range(52)) + list(range(40, 46)) + list(range(30)) + list(range(46, 55))
    spans = seen[0][SPANS]
    assert spans[0] == (0, 52) and spans[2] == (58, 88)
    assert spans[1][:2] == (52, 58) and spans[1][2].tolist() == list(range(40)) + list(range(52, 58))
    assert spans[3][:2] == (88, 88) and spans[3][2].tolist() == list(range(45))
    assert spans[4][:2] == (88, 97) and spans[4][2].tolist() == list(range(40)) + list(range(52, 58)) + list(range(88, 97))
    assert right_padding.token_counts(model) == {"tokens": int(mask.sum()), "computed": sum(new)}
    real = mask.bool()
    torch.testing.assert_close(after[0][real], before[0][real], rtol=1e-5, atol=1e-5)
    assert after[1] == pytest.approx(before[1], rel=1e-6)
    assert before[2].keys() == after[2].keys() and before[2]
    for name, grad in before[2].items():
        torch.testing.assert_close(after[2][name], grad, rtol=1e-4, atol=1e-6)
    right_padding.reset_token_counts(model)
    assert right_padding.token_counts(model) == {"tokens": 0, "computed": 0}
    unpad_right_padding(model, share_prefixes=False)  # each row computes its own prefix again
    _run(model, ids, mask, labels)
    assert seen[1]["input_ids"].shape == (1, int(mask.sum())) and all(len(s) == 2 for s in seen[1][SPANS])


def test_a_short_prefix_in_common_and_an_unpadded_batch(tiny_model_dir, monkeypatch, unhook):
    """A prefix in common shorter than MIN_SHARED is computed in each row; a batch without padding whose rows
    share a long one is packed all the same (nothing to unpad, the prefix to share)."""
    model = load_model(str(tiny_model_dir))
    seen = _spy(monkeypatch, model.get_decoder())
    unpad_right_padding(model)
    unhook.append(model)
    ids, mask, _ = _sharing_batch()
    short = ids.clone()
    short[1:, right_padding.MIN_SHARED - 1] = 7  # every row differs from row 0 just before MIN_SHARED
    short[0, right_padding.MIN_SHARED - 1] = 8
    even = torch.stack([ids[0, :50], ids[1, :50]])  # the two rows share 40 tokens, no padding
    with torch.no_grad():
        model(input_ids=short[:3], attention_mask=mask[:3])
        unpadded = model(input_ids=even).logits  # no mask: left alone
        packed = model(input_ids=even, attention_mask=torch.ones_like(even)).logits
    assert all(len(s) == 2 for s in seen[0][SPANS])
    assert SPANS not in seen[1]
    assert seen[2]["input_ids"].shape == (1, 60)
    torch.testing.assert_close(packed, unpadded, rtol=1e-5, atol=1e-5)


def test_a_model_with_dropout_shares_prefixes_only_out_of_training(tiny_model_dir, monkeypatch, unhook):
    """Rows padded draw their dropout apart; a prefix computed once would draw it once for all of them. With
    attention dropout the rows compute their own prefixes in training and share them in eval (DPO's
    reference pass)."""
    model = load_model(str(tiny_model_dir))
    model.config.attention_dropout = 0.1
    seen = _spy(monkeypatch, model.get_decoder())
    unpad_right_padding(model)
    unhook.append(model)
    ids, mask, _ = _sharing_batch()
    model.train()
    model(input_ids=ids, attention_mask=mask)
    model.eval()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    assert seen[0]["input_ids"].shape == (1, int(mask.sum())) and all(len(s) == 2 for s in seen[0][SPANS])
    assert seen[1]["input_ids"].shape == (1, 97)


@pytest.mark.parametrize("setting, accelerator, hooked", [
    ("cpu", False, True),    # the default, training on the CPU: packed
    ("cpu", True, False),    # the default on a GPU box: transformers as it is
    (True, True, True),      # runtime.library_hooks=true: on any device
    (False, False, False),   # runtime.library_hooks=false: never, the CPU included
])
def test_the_hooks_follow_runtime_library_hooks(tiny_model_dir, monkeypatch, unhook, setting, accelerator, hooked):
    """Called as the trainers call them (no ``enabled``), both hooks into the libraries (this one and
    training/lm_head.py's) go in as runtime.library_hooks says, read once by runtime.configure."""
    from types import SimpleNamespace

    import trl.trainer.utils as trl_utils

    from eto_train import native, runtime
    from eto_train.training.lm_head import score_labelled_only

    monkeypatch.setattr(runtime, "_library_hooks", list(runtime._library_hooks))
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: accelerator)
    kernels = native.enabled()
    try:
        runtime.configure(SimpleNamespace(cpu_kernels=kernels, library_hooks=setting))
        assert runtime.library_hooks() is hooked
        model = load_model(str(tiny_model_dir))
        unhook.append(model)
        assert unpad_right_padding(model) is hooked
        assert hasattr(model.get_decoder(), right_padding._HOOKED) is hooked
        assert score_labelled_only() is hooked
        assert hasattr(trl_utils._use_triton, "__wrapped__") is hooked
        assert runtime.versions()["library_hooks"] == (f"{'on' if hooked else 'off'} "
                                                       f"(runtime.library_hooks={str(setting).lower()})")
    finally:
        score_labelled_only(False)
        native.enable(kernels)


def test_runtime_library_hooks_in_the_config():
    """The shipped config says cpu; true and false are taken, anything else is one error naming the key."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from eto_train.config import ConfigError, load

    root = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(str(root), version_base="1.3"):
        assert load(compose("config")).runtime.library_hooks == "cpu"
        for value, want in (("true", True), ("false", False)):
            assert load(compose("config", overrides=[f"runtime.library_hooks={value}"])).runtime.library_hooks is want
        bad = compose("config", overrides=["runtime.library_hooks=sometimes"])
    with pytest.raises(ConfigError, match=r"runtime.library_hooks='sometimes': .*one of 'cpu', true, false"):
        load(bad)
