"""The one training recipe of every stage that trains a model: bc, dpo, the SFT control and pretrain.

torchtune's recipe shape, over TRL's trainers (which do the training itself):

- **setup**: tokenizer, dataset, training arguments and model are loaded and checked before the
  stage writes anything (check, then touch); ``model.lora`` adapters (PEFT), ``model.quantization``
  (a 4-bit base, QLoRA), ``model.attn_implementation``; under ``accelerate launch`` the trainer
  shards and gathers;
- **train**: a killed run resumes from its last complete checkpoint (weights, optimizer, scheduler,
  RNG); a non-finite loss or weight stops the stage; the tests' kill points hook in here;
- **save**: one plain checkpoint (adapters merged, shards gathered), checked to load and be finite;
- **cleanup**: the stage's manifest with the run's metrics (:func:`finish`: main process; the others
  wait for it), and the stage's lock released whatever happens (:func:`held`).

Each stage file reads in that order, top to bottom: ``if stage.done(): return``; ``with held(stage):``
setup (its inputs read and checked into a :class:`Job`), :func:`train` (which saves), :func:`finish`.

What differs between the stages is data only: SFT on chat conversations (:mod:`.sft`, the
assistant-token mask), DPO on prompt/chosen/rejected pairs (:mod:`.dpo`, the action mask,
the starting policy as the frozen reference), or next-token pretraining on packed blocks of a
fresh model (:class:`eto_train.pretrain.train.PretrainJob`, with its probe callbacks).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import killpoints, layout
from ..distributed import empty_model, is_main, loads_weights, wait_for_manifest, world_size
from ..model.load import check_quantization, fp32_trainable, load_model, load_tokenizer, model_kwargs, train_dtype


@dataclass
class Job:
    """What a stage trains: ``data`` from ``base`` with the TRL arguments ``args`` the stage built
    (:func:`.sft.sft_arguments`, :func:`.dpo.dpo_arguments`) and the config's ``model`` section.
    :class:`SFTJob` and :class:`DPOJob` say how the data becomes a dataset and which trainer runs."""

    name: str                       # the stage's name: log prefix and test kill point
    base: str
    data: list[Any]
    args: Any                       # trl.SFTConfig / trl.DPOConfig; its output_dir holds the checkpoints
    model: dict[str, Any]
    trust_remote_code: bool = False

    def tokenizer(self):
        """The tokenizer training reads with and saves beside the policy: ``base``'s."""
        return load_tokenizer(self.base, trust_remote_code=self.trust_remote_code,
                              chat_template=self.model.get("chat_template"))

    def policy(self):
        """The model training starts from: ``base``'s weights, fp32 master weights for full fine-tuning
        (bf16: true is autocast only), with LoRA the base in model.dtype; under FSDP with RAM-efficient
        loading only the main process reads the weights (distributed.loads_weights)."""
        m = self.model
        return (load_model if loads_weights(m) else empty_model)(self.base, dtype=train_dtype(m),
                                                                 trust_remote_code=self.trust_remote_code,
                                                                 quantization=m.get("quantization"), **model_kwargs(m))

    def dataset(self, tokenizer):
        """The training set of ``data`` (read and checked before the stage writes)."""
        raise NotImplementedError

    def shared(self, dataset, out: Path):
        """``dataset`` as every process of a run reads it (called after the stage's first write)."""
        return dataset

    def trainer(self, model, tokenizer, dataset, peft):
        raise NotImplementedError


class SFTJob(Job):
    """SFT on ``data`` = chat conversations (loss on the assistant tokens)."""

    def dataset(self, tokenizer):
        from .sft import conversation_dataset

        return conversation_dataset(self.data, tokenizer)

    def trainer(self, model, tokenizer, dataset, peft):
        from .sft import make_trainer

        return make_trainer(model, tokenizer, dataset, self.args, peft)


class DPOJob(Job):
    """DPO on ``data`` = rows with ``prompt``/``chosen``/``rejected`` message lists, against ``base``
    as the frozen reference."""

    def dataset(self, tokenizer):
        from datasets import Dataset

        return Dataset.from_list(self.data)

    def shared(self, dataset, out: Path):
        if world_size() == 1:
            return dataset
        # TRL caches the precomputed reference log-probs beside the dataset's files; an in-memory
        # dataset has a temporary folder per process, so the others would not find rank 0's cache.
        # One fingerprint on every rank (flatten_indices would draw a random one per process): TRL's maps of
        # it then have the same fingerprints everywhere, so the other ranks load the main process's cache files
        # instead of writing their own into the shared folder (its global-then-local-main-first order lets the
        # local main of every other machine run after it: with random fingerprints it wrote there too).
        import hashlib
        import json

        from accelerate import PartialState

        fingerprint = hashlib.sha256(json.dumps(self.data, sort_keys=True, default=str).encode()).hexdigest()[:16]
        with PartialState().main_process_first():
            return dataset.flatten_indices(cache_file_name=str(out / layout.PAIRS_DATASET / "pairs.arrow"),
                                           new_fingerprint=fingerprint)

    def trainer(self, model, tokenizer, dataset, peft):
        from .dpo import fsdp_reference, make_dpo_trainer

        # The frozen reference is the starting weights (the explorer): TRL's own choice (ref_model=None: the
        # policy itself before training, or the adapter-disabled model with LoRA), except under FSDP with full
        # fine-tuning, where the recipe loads it (dpo.fsdp_reference: TRL would spread it over every GPU)
        return make_dpo_trainer(model, fsdp_reference(self.base, self.model, self.trust_remote_code), tokenizer,
                                dataset, self.args, peft)


@dataclass
class Trained:
    """A finished :func:`train` (on every process)."""

    trainer: Any
    result: Any                     # the Trainer's TrainOutput
    resumed_from: str | None        # the checkpoint an interrupted run resumed from, else None
    rows: int                       # rows of the training set (conversations or pairs)
    trainable_parameters: int       # adapters only with model.lora
    metrics: dict[str, Any] = field(default_factory=dict)  # what the stage's manifest got

    @property
    def optimizer_steps(self) -> int:
        return self.result.global_step

    @property
    def effective_batch(self) -> int:
        """Rows per optimizer step over all processes, as the trainer ran."""
        a = self.trainer.args
        return a.per_device_train_batch_size * a.gradient_accumulation_steps * a.world_size

    @property
    def examples(self) -> int:
        """Rows trained on (with repeats): effective batch x optimizer steps."""
        return self.effective_batch * self.optimizer_steps

    def tokens_per_epoch(self) -> int:
        return sum(len(x) for x in self.trainer.train_dataset["input_ids"])

    def loss_logs(self) -> list[dict[str, Any]]:
        return [h for h in self.trainer.state.log_history if "loss" in h]


def peft_config_of(lora: dict[str, Any] | None):
    """``model.lora`` (LoraConfig keywords) as a PEFT config, or None for full fine-tuning."""
    if not lora:
        return None
    from peft import LoraConfig

    return LoraConfig(task_type="CAUSAL_LM", **lora)


def train(job: Job, out: str | Path, *, begin: Callable[[], bool] | None = None, resume: bool = False,
          console=None) -> Trained:
    """Setup, train and save ``job`` into ``out`` (the policy in ``out/model``; checkpoints where its
    TRL arguments say, ``job.args.output_dir``: the stages put them in ``out/checkpoints``).

    ``begin`` (the stage's :meth:`~eto_train.manifest.Stage.begin`) is called once everything has
    loaded, before the first write, and its answer replaces ``resume``: True resumes the last
    complete checkpoint, False removes old ones.
    """
    from .resume import resume_checkpoint
    from .save import finite_guard, save_policy

    out = Path(out)
    if console is None:
        from rich.console import Console

        console = Console(markup=False)

    # -- setup: everything read and checked before the stage writes -----------------------------
    m = job.model
    check_quantization(m.get("quantization"))
    tokenizer = job.tokenizer()
    dataset = job.dataset(tokenizer)
    policy = job.policy()
    if begin is not None:
        resume = begin()
    dataset = job.shared(dataset, out)
    trainer = job.trainer(policy, tokenizer, dataset, peft_config_of(m.get("lora")))
    if not trainer.is_deepspeed_enabled:  # ZeRO-3 keeps its own fp32 masters (and TRL bf16 adapters for it)
        fp32_trainable(trainer.model)      # QLoRA: TRL casts the adapters to bf16 (model/load.py)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    trainer.add_callback(finite_guard(job.name))  # a NaN/Inf loss or weight stops the stage
    if (kill := killpoints.trainer_callback(job.name)) is not None:  # tests only
        trainer.add_callback(kill)

    # -- train (resumes from the last checkpoint of an interrupted run) -------------------------
    ckpt = resume_checkpoint(job.args.output_dir, resume, name=job.name)
    if ckpt:
        console.print(f"[{job.name}] resuming from the last checkpoint {ckpt} (optimizer, scheduler, RNG)")
    with _disk_full_named(job.args.output_dir):  # torch's "unexpected pos": a checkpoint save on a full disk
        result = trainer.train(resume_from_checkpoint=ckpt)

    # -- save: one plain checkpoint downstream (adapters merged; gathered from all processes) ---
    with _disk_full_named(layout.policy(out)):
        save_policy(trainer, tokenizer, layout.policy(out), job.base, m["dtype"], job.trust_remote_code, stage=job.name)
    return Trained(trainer=trainer, result=result, resumed_from=ckpt, rows=len(dataset),
                   trainable_parameters=trainable)


@contextmanager
def _disk_full_named(folder: str | Path):
    """A write that failed for lack of space under ``folder`` (the Trainer's checkpoint save, the
    policy's save) raised as the OSError it is, naming the folder being written (the newest
    ``checkpoint-<n>``): the CLI prints one block with the path and the free space. A half-written
    checkpoint has no trainer_state.json: the next run removes it and resumes from the one before."""
    try:
        yield
    except Exception as exc:
        from ..errors import as_disk_error

        folder = Path(folder)
        newest = max(folder.glob("checkpoint-*"), key=lambda p: p.stat().st_mtime, default=folder) \
            if folder.is_dir() else folder
        full = as_disk_error(exc, newest)
        if full is None or full is exc:
            raise
        raise full from exc


@contextmanager
def held(stage):
    """Cleanup, as a context around a training stage's work once ``stage.done()`` said there is some:
    the stage's lock is released whatever happens (an error: the next run, of this or another
    process, may take the stage; a finished stage has released it already). A finished stage stays
    in place while a rerun trains aside (see :class:`eto_train.manifest.Stage`)."""
    try:
        yield stage
    finally:
        stage.release()


def finish(stage, trained: Trained, metrics: dict[str, Any], **record: Any) -> dict[str, Any]:
    """Write the stage's manifest with the run's metrics: ``train_loss``, ``optimizer_steps``,
    ``train_seconds``, ``resumed_from`` after a resume, then the stage's own ``metrics``
    (``record``: more manifest fields). The main process writes it; under ``accelerate launch`` the
    others wait for it and get ``{}``. Returns the metrics written (also in ``trained.metrics``)."""
    from ..runtime import config_hash

    if not is_main():  # the main process writes the manifest once the model is saved
        wait_for_manifest(stage.manifest_path, config_hash(stage.config))
        return {}
    r = trained.result
    trained.metrics = {"train_loss": r.training_loss, "optimizer_steps": r.global_step,
                       "train_seconds": r.metrics["train_runtime"], **metrics}
    if trained.resumed_from:  # then train_loss and train_seconds cover the steps after the resume
        trained.metrics["resumed_from"] = Path(trained.resumed_from).name
    stage.finish(trained.metrics, output=str(layout.policy(stage.dir)), **record)
    return trained.metrics
