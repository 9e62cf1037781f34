"""Right-padded training batches attend causally, without their mask (eto_train.training.right_padding)."""

from __future__ import annotations

import pytest
import torch

from eto_train.model.load import load_model
from eto_train.training import right_padding
from eto_train.training.right_padding import causal_right_padding, is_right_padding


def test_right_padding_is_ones_then_zeros():
    assert is_right_padding(torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]))
    assert is_right_padding(torch.tensor([[True, False]]))
    assert not is_right_padding(torch.tensor([[0, 1, 1, 1]]))        # left padding
    assert not is_right_padding(torch.tensor([[1, 1, 0, 1]]))        # a hole (packed rows)
    assert not is_right_padding(torch.tensor([[1, 2, 0, 0]]))        # not a 0/1 mask
    assert not is_right_padding(torch.ones(2, 1, 4, 4))              # already 4-D
    assert not is_right_padding(None)


def _batch():
    """Two rows of 9 and 5 real tokens, padded on the right to 9; labels on some real tokens only."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 300, (2, 9), generator=g)
    mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4])
    ids[1, 5:] = 0
    labels = torch.full_like(ids, -100)
    labels[0, 3:7], labels[1, 2:5] = ids[0, 3:7], ids[1, 2:5]
    return ids, mask, labels


def _run(model, ids, mask, labels):
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    return out.logits.detach(), out.loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                   if p.grad is not None}


def test_the_real_tokens_compute_the_same_without_the_mask(tiny_model_dir, monkeypatch):
    """The same batch with its padding mask and causally without it: every real position's logits, the loss
    and every gradient equal (fp32); only the padding positions' logits differ. The decoder sees no mask."""
    model = load_model(str(tiny_model_dir))
    ids, mask, labels = _batch()
    seen = []
    decoder = model.get_decoder()
    monkeypatch.setattr(decoder, "forward", lambda *a, _f=decoder.forward, **k: seen.append(k["attention_mask"])
                        or _f(*a, **k))
    assert causal_right_padding(model, enabled=False) is False
    before = _run(model, ids, mask, labels)
    assert causal_right_padding(model) is True and causal_right_padding(model) is True  # idempotent
    after = _run(model, ids, mask, labels)
    assert seen[0] is mask and seen[1] is None
    real = mask.bool()
    torch.testing.assert_close(after[0][real], before[0][real], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after[0][~real], before[0][~real])  # padding positions: attended causally now
    assert after[1] == pytest.approx(before[1], rel=1e-6)
    assert before[2].keys() == after[2].keys() and before[2]
    for name, grad in before[2].items():
        torch.testing.assert_close(after[2][name], grad, rtol=1e-4, atol=1e-6)
    assert causal_right_padding(model, enabled=False) is False  # removed: the mask reaches the decoder again
    _run(model, ids, mask, labels)
    assert seen[2] is mask


def test_other_masks_and_calls_keep_their_mask(tiny_model_dir, monkeypatch):
    """Left padding, explicit positions and a cache keep the mask; so does every call of an attention
    implementation other than SDPA and eager."""
    model = load_model(str(tiny_model_dir))
    decoder = model.get_decoder()
    seen = []
    monkeypatch.setattr(decoder, "forward", lambda *a, _f=decoder.forward, **k: seen.append(k["attention_mask"])
                        or _f(*a, **k))
    causal_right_padding(model)
    ids, mask, _ = _batch()
    left = mask.flip(1)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=left)
        model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(9).expand(2, 9))
        model(input_ids=ids, attention_mask=mask)
    assert seen[0] is left and seen[1] is mask and seen[2] is None
    monkeypatch.setattr(right_padding, "ATTENTION", frozenset({"eager"}))  # as if this model ran another one
    assert causal_right_padding(model) is False  # and the hook is gone
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    assert seen[3] is mask


def test_a_peft_model_is_hooked_on_its_decoder(tiny_model_dir):
    """PEFT's tuner calls the causal LM's forward directly: the hook sits on the decoder it calls as a module."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(load_model(str(tiny_model_dir)), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    ids, mask, labels = _batch()
    with_mask = model(input_ids=ids, attention_mask=mask, labels=labels)
    assert causal_right_padding(model) is True
    causal = model(input_ids=ids, attention_mask=mask, labels=labels)
    real = mask.bool()
    torch.testing.assert_close(causal.logits[real], with_mask.logits[real], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(causal.logits[~real], with_mask.logits[~real])
