"""Stage `bc`: behavior cloning on the expert trajectories (TRL SFTTrainer, action tokens only)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from .. import faultpoints
from ..distributed import is_main, wait_for_manifest, with_grad_accum
from ..model.load import check_quantization, is_local, load_model, load_tokenizer
from ..stage import Stage, config_hash, setup_runtime, setup_wandb, to_plain
from ..store import read_episodes
from ..training.resume import resume_checkpoint
from ..training.save import save_policy
from ..training.sft import make_trainer, sft_config, sft_dataset


def run(cfg) -> None:
    console = Console(markup=False)
    check_quantization(cfg.model.get("quantization"))  # before anything is written
    setup_runtime(cfg.runtime.train_threads)
    out = Path(cfg.paths.bc)
    inputs = {"experts": cfg.paths.experts}
    if is_local(cfg.model.path):
        inputs["base_model"] = cfg.model.path
    stage = Stage("bc", out, {"model": to_plain(cfg.model), "bc": to_plain(cfg.bc), "seed": cfg.seed,
                              "prompt": to_plain(cfg.prompt)}, inputs=inputs)
    if stage.done():
        return
    resume = stage.begin()
    report_to = setup_wandb(to_plain(cfg.wandb), out)

    # -- setup ------------------------------------------------------------------------------
    tokenizer = load_tokenizer(cfg.model.path, trust_remote_code=cfg.trust_remote_code,
                               chat_template=cfg.model.get("chat_template"))
    dataset = sft_dataset(read_episodes(cfg.paths.experts), tokenizer, only_success=cfg.bc.only_success)
    model = load_model(cfg.model.path, dtype=cfg.model.dtype, trust_remote_code=cfg.trust_remote_code,
                       quantization=cfg.model.get("quantization"))
    peft_config = None
    if cfg.model.lora:
        from peft import LoraConfig
        peft_config = LoraConfig(task_type="CAUSAL_LM", **to_plain(cfg.model.lora))
    trainer = make_trainer(model, tokenizer, dataset,
                           sft_config(str(out / "checkpoints"), with_grad_accum(to_plain(cfg.bc)), cfg.seed, report_to),
                           peft_config)

    # -- train (resumes from the last checkpoint of an interrupted run) -----------------------
    if (kill := faultpoints.trainer_callback("bc")) is not None:  # tests only
        trainer.add_callback(kill)
    ckpt = resume_checkpoint(out / "checkpoints", resume)
    if ckpt:
        console.print(f"[bc] resuming from the last checkpoint {ckpt} (optimizer, scheduler, RNG)")
    result = trainer.train(resume_from_checkpoint=ckpt)

    # -- save ------------------------------------------------------------------------------
    # one plain checkpoint downstream (adapters merged; gathered from all GPUs)
    save_policy(trainer, tokenizer, out / "model", cfg.model.path, cfg.model.dtype, cfg.trust_remote_code)
    if not is_main():  # under accelerate: the main process writes the manifest once the model is saved
        wait_for_manifest(stage.manifest_path, config_hash(stage.config))
        return
    tokens = sum(len(x) for x in trainer.train_dataset["input_ids"])
    epochs = result.metrics.get("epoch", cfg.bc.epochs)
    metrics = {"train_loss": result.training_loss, "optimizer_steps": result.global_step,
               "train_seconds": result.metrics["train_runtime"], "epochs": epochs,
               "trajectories": len(dataset), "tokens_per_epoch": tokens,
               "tokens_per_second": tokens * epochs / result.metrics["train_runtime"]}
    if ckpt:  # then train_loss, train_seconds and tokens_per_second cover the steps after the resume
        metrics["resumed_from"] = Path(ckpt).name
    stage.finish(metrics, output=str(out / "model"))
    console.print(f"[bc] loss {metrics['train_loss']:.4f} after {metrics['optimizer_steps']} steps, "
                  f"{metrics['tokens_per_second']:.0f} tokens/s -> {out / 'model'}")
