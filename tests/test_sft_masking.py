"""Behavior cloning trains on the agent's action tokens only (checked token by token)."""

from __future__ import annotations

import re

import torch

from eto_train.config import BCSection
from eto_train.model.load import load_model, load_tokenizer
from eto_train.records import to_messages
from eto_train.training.sft import make_trainer, sft_arguments, sft_dataset

BC = {"max_length": 1024, "per_device_train_batch_size": 3, "gradient_accumulation_steps": 1, "learning_rate": 1e-3,
      "lr_scheduler_type": "cosine", "warmup_steps": 0.0, "weight_decay": 0.0, "num_train_epochs": 1, "max_steps": 2, "logging_steps": 1,
      "save_strategy": "no", "save_total_limit": 1, "bf16": False, "activation_checkpointing": False,
      "use_cpu": True, "save_steps": 500, "only_success": True}


def _assistant_char_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of each assistant turn's content plus its closing <|im_end|>."""
    spans = []
    for m in re.finditer(r"<\|im_start\|>assistant\n", text):
        end = text.index("<|im_end|>", m.end()) + len("<|im_end|>")
        spans.append((m.end(), end))
    return spans


def test_labels_cover_exactly_the_assistant_tokens(tmp_path, tiny_model_dir, expert_episodes):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir))
    ds = sft_dataset(expert_episodes[:3], tok)
    trainer = make_trainer(model, tok, ds, sft_arguments(BCSection.model_validate(BC), tmp_path, seed=0))
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["input_ids"].shape[0] == 3
    rows_checked = 0
    convs = [to_messages(e) for e in expert_episodes[:3]]
    for row, labels in zip(batch["input_ids"], batch["labels"]):
        ids = [i for i in row.tolist() if i != tok.pad_token_id]
        keep = [i != tok.pad_token_id for i in row.tolist()]
        # the same conversation rendered independently, with character offsets per token
        text = next(tok.apply_chat_template(c, tokenize=False) for c in convs
                    if tok(tok.apply_chat_template(c, tokenize=False), add_special_tokens=False)["input_ids"] == ids)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        spans = _assistant_char_spans(text)
        expected = [any(a <= start < b for a, b in spans) for start, _ in enc["offset_mapping"]]
        got = [lab != -100 for lab, k in zip(labels.tolist(), keep) if k]
        assert got == expected
        assert sum(expected) > 0
        kept = tok.decode([i for i, k in zip(ids, expected) if k])
        assert kept.count("Action:") == kept.count("<|im_end|>") == len(spans)
        assert "Observation" not in kept and "Task:" not in kept
        rows_checked += 1
    assert rows_checked == 3
    # padding never carries a label
    pad = batch["input_ids"] == tok.pad_token_id
    assert torch.all(batch["labels"][pad] == -100)
