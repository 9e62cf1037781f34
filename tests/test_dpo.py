"""Masked multi-turn DPO: only action tokens count, checked against a hand computation."""

from __future__ import annotations

import math

import torch
from datasets import Dataset

from eto_train.config import DPOSection
from eto_train.model.load import load_model, load_tokenizer
from eto_train.pairs import trajectory_pair
from eto_train.records import Episode
from eto_train.training.dpo import dpo_arguments, make_dpo_trainer, tokenize_pair
from eto_train.training.masks import assistant_token_mask
from eto_train.training.right_padding import token_counts

DPO = {"beta": 0.1, "loss_type": ["sigmoid"], "learning_rate": 1e-3, "num_train_epochs": 1, "max_steps": 2,
       "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "lr_scheduler_type": "constant",
       "warmup_steps": 0.0, "max_length": 1024,
       "precompute_ref_log_probs": True, "logging_steps": 1, "save_strategy": "no", "save_steps": 500, "save_total_limit": 1,
       "loss_weights": None,
       "bf16": False, "use_cpu": True, "activation_checkpointing": False}


def _two_turn_pair(expert: Episode):
    """Expert (2 actions) against a clone whose 2nd action is wrong and scores lower."""
    exp = Episode.from_dict(expert.to_dict())
    exp.steps = exp.steps[:2]
    exp.finish("success")
    agent = Episode.from_dict(exp.to_dict())
    agent.episode_id, agent.policy.id = "agent-ep", "agent@0"
    agent.steps[1].raw_output, agent.steps[1].action = "Action: inventory", "inventory"
    agent.steps[1].observation = "You are carrying nothing."
    agent.steps[1].reward = 0.0
    agent.finish("failure")
    return trajectory_pair(exp, agent)


def _hand_logp(model, ids: list[int], mask: list[int]) -> float:
    """Sum of log p(token | previous tokens) over the masked (action) positions."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return sum(logp[i - 1, ids[i]].item() for i in range(1, len(ids)) if mask[i])


def test_action_mask_marks_assistant_turns_only(tiny_model_dir, expert_episodes):
    tok = load_tokenizer(str(tiny_model_dir))
    pair = _two_turn_pair(expert_episodes[0])
    ids, mask = assistant_token_mask(tok, pair.prompt + pair.chosen)
    kept = tok.decode([i for i, m in zip(ids, mask) if m])
    expected = "".join(m["content"] + "<|im_end|>" for m in pair.chosen if m["role"] == "assistant")
    assert kept == expected
    # the generic mask agrees with the chat template's own {% generation %} mask
    out = tok.apply_chat_template(pair.prompt + pair.chosen, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    assert out["input_ids"] == ids and list(out["assistant_masks"]) == mask


class _SlowTokenizer:
    """The same tokenizer, seen as a slow one: the mask then tokenizes every prefix."""

    is_fast = False

    def __init__(self, tok):
        self._tok = tok

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __call__(self, *args, **kwargs):
        return self._tok(*args, **kwargs)


def test_offset_mask_equals_the_mask_from_tokenizing_every_prefix(tiny_model_dir, expert_episodes):
    tok = load_tokenizer(str(tiny_model_dir))
    assert tok.is_fast
    checked = 0
    for ep in expert_episodes[:6]:
        pair = _two_turn_pair(ep)
        for msgs in (pair.prompt + pair.chosen, pair.prompt + pair.rejected):
            ids, mask = assistant_token_mask(tok, msgs)
            assert (ids, mask) == assistant_token_mask(_SlowTokenizer(tok), msgs)
            assert sum(mask) > 0
            checked += 1
    assert checked == 12


def test_masked_logps_match_hand_computation_and_step0_loss_is_log2(tmp_path, tiny_model_dir, expert_episodes):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir))
    pairs = [_two_turn_pair(e) for e in expert_episodes[:2]]
    assert all(p is not None and p.rejected_policy == "agent@0" for p in pairs)
    ds = Dataset.from_list([{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs])
    trainer = make_dpo_trainer(model, None, tok, ds, dpo_arguments(DPOSection.model_validate(DPO), tmp_path, 0))
    # the reference pass went packed, each pair's prompt (and the rows' instruction) computed once
    # (training/right_padding.py): the hand computation below runs every row alone
    counts = token_counts(model)
    assert 0 < counts["computed"] < counts["tokens"]

    # reference log-probs TRL precomputed through our collator == hand computation on action tokens
    for row, p in zip(trainer.train_dataset, pairs):
        t = tokenize_pair(tok, p.prompt, p.chosen, p.rejected)
        c_ids, r_ids = t["prompt_ids"] + t["chosen_ids"], t["prompt_ids"] + t["rejected_ids"]
        c_mask = [0] * len(t["prompt_ids"]) + t["chosen_action_mask"]
        r_mask = [0] * len(t["prompt_ids"]) + t["rejected_action_mask"]
        assert abs(row["ref_chosen_logps"] - _hand_logp(model, c_ids, c_mask)) < 1e-5
        assert abs(row["ref_rejected_logps"] - _hand_logp(model, r_ids, r_mask)) < 1e-5
        # observations are not in the completion mask: counting all completion tokens differs
        all_tokens = [0] * len(t["prompt_ids"]) + [1] * len(t["chosen_ids"])
        assert abs(row["ref_chosen_logps"] - _hand_logp(model, c_ids, all_tokens)) > 1e-3

    # step 0: policy == reference, so the sigmoid loss is log 2
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, batch)
    assert abs(loss.item() - math.log(2)) < 1e-5


def test_activation_checkpointing_changes_memory_not_the_weights(tmp_path, tiny_model_dir, expert_episodes):
    """``activation_checkpointing`` recomputes each layer's forward in the backward instead of keeping its
    activations: two DPO steps (bf16 autocast, as the real-model profiles train) end in the same weights, bit for
    bit, with it and without it. A run may turn it on to fit memory without changing any number."""
    tok = load_tokenizer(str(tiny_model_dir))
    pairs = [_two_turn_pair(e) for e in expert_episodes[:4]]
    ds = Dataset.from_list([{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs])
    weights = []
    for on in (False, True):
        torch.manual_seed(0)
        cfg = DPOSection.model_validate({**DPO, "bf16": True, "activation_checkpointing": on})
        trainer = make_dpo_trainer(load_model(str(tiny_model_dir)), None, tok, ds,
                                   dpo_arguments(cfg, tmp_path / str(on), 0))
        assert trainer.args.gradient_checkpointing == on
        trainer.train()
        weights.append({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
    start = load_model(str(tiny_model_dir)).state_dict()
    assert any(not torch.equal(weights[0][k], start[k]) for k in start)  # the steps moved the weights
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
