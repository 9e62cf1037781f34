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
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, *a, **k: calls.append((q.shape[2], k.get("is_causal"))) or sdpa(q, *a, **k))
    after = _run(model, ids, mask, labels)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
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
