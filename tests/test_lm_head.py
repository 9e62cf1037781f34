"""TRL's fused LM head on the CPU, labelled positions only (eto_train.training.lm_head)."""

from __future__ import annotations

import pytest
import torch
import trl.trainer.utils as trl_utils
from trl.trainer.utils import add_fused_lm_head

from eto_train.model.load import load_model
from eto_train.training.lm_head import score_labelled_only


@pytest.fixture
def restore_trl():
    yield
    score_labelled_only(False)


def _loss_and_grads(model, ids, labels):
    model.zero_grad()
    out = model(input_ids=ids, labels=labels, fused_lm_head=True)
    out.loss.backward()
    return out.log_probs.detach().clone(), out.loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                              if p.grad is not None}


def test_the_head_projects_only_labelled_positions_and_computes_the_same(tiny_model_dir, monkeypatch, restore_trl):
    """Two conversations of 12 tokens, 5 of them labelled in all (a prompt and observations masked, as in
    an agent's conversation): TRL's own choice on the CPU sends all 2 x 11 shifted positions through the
    head, the patched one the 5 labelled ones; log-probs, loss and every gradient are the same."""
    model = load_model(str(tiny_model_dir))
    add_fused_lm_head(model)
    torch.manual_seed(0)
    ids = torch.randint(5, 300, (2, 12))
    labels = torch.full_like(ids, -100)
    labels[0, 4:6] = ids[0, 4:6]   # the agent's turns: positions 4-5 of row 0, 8-10 of row 1
    labels[1, 8:11] = ids[1, 8:11]
    rows = []
    real_apply = trl_utils._ChunkedLogProbFunction.apply

    def spy(hidden, *args):
        rows.append(hidden.shape[0])
        return real_apply(hidden, *args)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", spy)
    assert score_labelled_only(False) is False
    before = _loss_and_grads(model, ids, labels)
    assert score_labelled_only() is True and score_labelled_only() is True  # idempotent
    after = _loss_and_grads(model, ids, labels)
    assert rows == [2 * 11, 5]
    torch.testing.assert_close(after[0], before[0])
    assert after[0][labels[:, 1:] == -100].abs().sum() == 0  # masked positions: log-prob 0, as before
    assert after[1] == pytest.approx(before[1], rel=1e-6)
    assert before[2].keys() == after[2].keys() and before[2]
    for name, grad in before[2].items():
        torch.testing.assert_close(after[2][name], grad, rtol=1e-5, atol=1e-7)


def test_restoring_gives_trl_its_own_choice_back(restore_trl):
    original = getattr(trl_utils._use_triton, "__wrapped__", trl_utils._use_triton)
    score_labelled_only()
    assert trl_utils._use_triton(torch.device("cpu")) is True
    score_labelled_only(False)
    assert trl_utils._use_triton is original
    assert trl_utils._use_triton(torch.device("cpu")) is False  # TRL: the torch tiles over every position
