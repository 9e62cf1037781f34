"""Behavior cloning: TRL's SFTTrainer on expert conversations, loss on assistant tokens only.

The conversations are tokenized here with the template-agnostic assistant mask of
:mod:`eto_train.training.masks` (the same one DPO uses) and handed to TRL pre-tokenized
(``input_ids`` + ``assistant_masks``), so any chat template trains: TRL turns the mask into
labels of -100 on system, task, observations, template scaffolding and padding.

:func:`train_sft` is the one SFT recipe (setup, train, save) of every stage that fine-tunes
with SFT: ``bc`` on the expert trajectories and ``compare``'s SFT control on a DPO variant's
chosen sides. Both thus load the model the same way (``model.lora`` adapters,
``model.quantization`` 4-bit base), resume a killed run from its last checkpoint and save one
plain merged checkpoint, on one process or under ``accelerate launch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

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
    )


def make_trainer(model, tokenizer, dataset, args, peft_config=None):
    from trl import SFTTrainer
    from trl.trainer.callbacks import RichProgressCallback

    return SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                      peft_config=peft_config, callbacks=[RichProgressCallback()])


# -- the SFT recipe shared by the stages -------------------------------------------------------

@dataclass
class SFTRun:
    """A finished :func:`train_sft` (on every process); the stage writes the manifest from it."""

    trainer: Any
    result: Any                 # the Trainer's TrainOutput
    resumed_from: str | None    # the checkpoint an interrupted run resumed from, else None
    conversations: int          # rows of the training set
    trainable_parameters: int   # adapters only with model.lora

    @property
    def optimizer_steps(self) -> int:
        return self.result.global_step

    @property
    def effective_batch(self) -> int:
        """Sequences per optimizer step over all processes, as the trainer ran."""
        a = self.trainer.args
        return a.per_device_train_batch_size * a.gradient_accumulation_steps * a.world_size

    @property
    def examples(self) -> int:
        """Sequences trained on (with repeats): effective batch x optimizer steps."""
        return self.effective_batch * self.optimizer_steps

    def tokens_per_epoch(self) -> int:
        return sum(len(x) for x in self.trainer.train_dataset["input_ids"])


def peft_config_of(lora: dict[str, Any] | None):
    """``model.lora`` (LoraConfig keywords) as a PEFT config, or None for full fine-tuning."""
    if not lora:
        return None
    from peft import LoraConfig

    return LoraConfig(task_type="CAUSAL_LM", **lora)


def train_sft(convs: list[list[dict[str, str]]], *, name: str, base: str, out: str | Path,
              train: dict[str, Any], model: dict[str, Any], seed: int, resume: bool = False,
              report_to: str = "none", trust_remote_code: bool = False, console=None,
              begin: Callable[[], bool] | None = None) -> SFTRun:
    """SFT of ``base`` on the chat conversations ``convs``: setup, train, save to ``out/model``.

    ``name`` is the stage's name (log prefix and test kill point, :mod:`eto_train.faultpoints`);
    ``train`` the bc-style hyperparameters (``effective_batch`` wins over ``grad_accum``,
    see :func:`eto_train.distributed.grad_accum`); ``model`` the config's model section
    (``dtype``, ``lora``, ``quantization``, ``chat_template``). Checkpoints go to
    ``out/checkpoints``; with ``resume`` (:meth:`eto_train.stage.Stage.begin`'s answer) the
    last complete one is resumed (weights, optimizer, scheduler, RNG), else they are removed.
    With ``begin`` (the stage's :meth:`~eto_train.stage.Stage.begin`), it is called once the
    tokenizer, the tokenized conversations, the training arguments and the model have loaded,
    before anything is written, and its answer replaces ``resume``: check, then touch.
    Training stops at the first non-finite loss or weight; the saved policy is one plain
    checkpoint (adapters merged; gathered from all processes), checked to load and be finite.
    """
    from .. import faultpoints
    from ..distributed import with_grad_accum
    from ..model.load import load_model, load_tokenizer
    from .resume import resume_checkpoint
    from .save import finite_guard, save_policy

    out = Path(out)
    if console is None:
        from rich.console import Console

        console = Console(markup=False)

    # -- setup: everything read and checked before the stage writes ------------------------------
    tokenizer = load_tokenizer(base, trust_remote_code=trust_remote_code,
                               chat_template=model.get("chat_template"))
    dataset = conversation_dataset(convs, tokenizer)
    args = sft_config(str(out / "checkpoints"), with_grad_accum(train), seed, report_to)
    policy = load_model(base, dtype=model["dtype"], trust_remote_code=trust_remote_code,
                        quantization=model.get("quantization"))
    if begin is not None:
        resume = begin()
    trainer = make_trainer(policy, tokenizer, dataset, args, peft_config_of(model.get("lora")))
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    trainer.add_callback(finite_guard(name))

    # -- train (resumes from the last checkpoint of an interrupted run) -------------------------
    if (kill := faultpoints.trainer_callback(name)) is not None:  # tests only
        trainer.add_callback(kill)
    ckpt = resume_checkpoint(out / "checkpoints", resume)
    if ckpt:
        console.print(f"[{name}] resuming from the last checkpoint {ckpt} (optimizer, scheduler, RNG)")
    result = trainer.train(resume_from_checkpoint=ckpt)

    # -- save: one plain checkpoint downstream (adapters merged; gathered from all processes) ---
    save_policy(trainer, tokenizer, out / "model", base, model["dtype"], trust_remote_code, stage=name)
    return SFTRun(trainer=trainer, result=result, resumed_from=ckpt, conversations=len(dataset),
                  trainable_parameters=trainable)
