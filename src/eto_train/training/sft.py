"""Behavior cloning: TRL's SFTTrainer on expert conversations, loss on assistant tokens only.

The conversations are tokenized here with the template-agnostic assistant mask of
:mod:`eto_train.training.masks` (the same one DPO uses) and handed to TRL pre-tokenized
(``input_ids`` + ``assistant_masks``), so any chat template trains: TRL turns the mask into
labels of -100 on system, task, observations, template scaffolding and padding.

The stages train through :mod:`eto_train.training.recipe` (setup, train, save, cleanup) with an
:class:`~eto_train.training.recipe.SFTJob`, whose dataset, arguments and trainer come from here
(``bc`` on the expert trajectories, ``compare``'s SFT control on a DPO variant's chosen sides).
"""

from __future__ import annotations

from pathlib import Path

from ..config import BCSection
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


# What the recipe sets itself, whatever a section says (besides output_dir, seed, data_seed and report_to)
FIXED = {
    "assistant_only_loss": False,    # the rows carry their own assistant mask (any chat template)
    "logging_nan_inf_filter": False,  # a NaN/Inf loss is logged as it is, and stops training (save.finite_guard)
    "disable_tqdm": True,            # rich progress instead
    "dataloader_num_workers": 0,
}


def sft_arguments(section: BCSection, out_dir: str | Path, seed: int):
    """TRL's ``SFTConfig`` of a bc-style ``section`` (``bc``, or the SFT control's), whose keys are
    SFTConfig's own but eto-train's (``BCSection.trl_arguments``), with the accumulation that reaches
    ``effective_batch`` on this many processes; checkpoints go to ``out_dir``."""
    from trl import SFTConfig

    from .. import tracking
    from ..distributed import grad_accum

    return SFTConfig(**{**section.trl_arguments(), "gradient_accumulation_steps": grad_accum(section)}, **FIXED,
                     output_dir=str(out_dir), seed=seed, data_seed=seed, report_to=tracking.report_to())


def make_trainer(model, tokenizer, dataset, args, peft_config=None):
    from trl import SFTTrainer
    from trl.trainer.callbacks import RichProgressCallback

    from .lm_head import score_labelled_only
    from .right_padding import unpad_right_padding

    score_labelled_only()  # the agent's turns only through the LM head on a CPU (lm_head.py; runtime.library_hooks)
    unpad_right_padding(model)  # the collator pads on the right: the rows packed, no padding (right_padding.py)
    return SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                      peft_config=peft_config, callbacks=[RichProgressCallback()])
