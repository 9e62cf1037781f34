"""Behavior cloning: TRL's SFTTrainer on expert conversations, loss on assistant tokens only.

The conversations are tokenized here with the template-agnostic assistant mask of
:mod:`eto_train.training.masks` (the same one DPO uses) and handed to TRL pre-tokenized
(``input_ids`` + ``assistant_masks``), so any chat template trains: TRL turns the mask into
labels of -100 on system, task, observations, template scaffolding and padding.

The stages train through :mod:`eto_train.training.recipe` (setup, train, save, cleanup), which
takes the dataset, arguments and trainer from here for SFT (``bc`` on the expert trajectories,
``compare``'s SFT control on a DPO variant's chosen sides).
"""

from __future__ import annotations

from typing import Any

from ..experts import usable
from ..records import Episode, to_messages
from .masks import assistant_token_mask


def sft_conversations(episodes: list[Episode], only_success: bool = True) -> list[list[dict[str, str]]]:
    """The chat conversations of the usable trajectories (with steps; with ``only_success``, the
    expert trajectories :func:`eto_train.experts.usable` names: gold paths that won, and every
    imported one, as the authors clone their whole file)."""
    convs = [to_messages(ep) for ep in episodes if ep.steps and (usable(ep) or not only_success)]
    if not convs:
        raise ValueError("no usable trajectories for behavior cloning (need successful episodes with steps)")
    return convs


def sft_dataset(episodes: list[Episode], tokenizer, only_success: bool = True):
    """One row per usable trajectory: its token ids and the assistant mask."""
    return conversation_dataset(sft_conversations(episodes, only_success), tokenizer)


def conversation_dataset(convs: list[list[dict[str, str]]], tokenizer):
    """Pre-tokenized rows (``input_ids``, ``assistant_masks``) of chat conversations."""
    from datasets import Dataset

    rows = []
    for conv in convs:
        ids, mask = assistant_token_mask(tokenizer, conv)
        rows.append({"input_ids": ids, "assistant_masks": mask})
    return Dataset.from_list(rows)


def sft_config(out_dir: str, train: dict[str, Any], seed: int, report_to: str):
    from trl import SFTConfig

    return SFTConfig(
        output_dir=out_dir,
        assistant_only_loss=False,  # the rows carry their own assistant mask (any chat template)
        max_length=train["max_length"],
        per_device_train_batch_size=train["batch_size"],
        gradient_accumulation_steps=train["grad_accum"],
        learning_rate=train["lr"],
        lr_scheduler_type=train["scheduler"],
        warmup_steps=train["warmup_ratio"],  # a float below 1 is a ratio of the total steps
        weight_decay=train["weight_decay"],
        num_train_epochs=train["epochs"],
        max_steps=train.get("max_steps") or -1,
        logging_steps=train["logging_steps"],
        logging_nan_inf_filter=False,  # a NaN/Inf loss is logged as it is, and stops training (save.finite_guard)
        save_strategy=train["save_strategy"],
        save_steps=train.get("save_steps") or 500,
        save_total_limit=train["save_total_limit"],
        bf16=train["bf16"],
        activation_checkpointing=train["gradient_checkpointing"],
        seed=seed,
        data_seed=seed,
        report_to=report_to,
        disable_tqdm=True,  # rich progress instead
        dataloader_num_workers=0,
        use_cpu=train["use_cpu"],
        **(train.get("trainer") or {}),  # any other SFTConfig argument, under TRL's name
    )


def make_trainer(model, tokenizer, dataset, args, peft_config=None):
    from trl import SFTTrainer
    from trl.trainer.callbacks import RichProgressCallback

    return SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                      peft_config=peft_config, callbacks=[RichProgressCallback()])
