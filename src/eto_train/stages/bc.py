"""Stage `bc`: behavior cloning on the expert trajectories (TRL SFTTrainer, action tokens only)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..model.load import is_local, load_model, load_tokenizer
from ..stage import Stage, setup_runtime, setup_wandb, to_plain
from ..store import read_episodes
from ..training.sft import make_trainer, sft_config, sft_dataset


def run(cfg) -> None:
    console = Console()
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
    dataset = sft_dataset(read_episodes(cfg.paths.experts), only_success=cfg.bc.only_success)
    tokenizer = load_tokenizer(cfg.model.path, trust_remote_code=cfg.trust_remote_code)
    model = load_model(cfg.model.path, dtype=cfg.model.dtype, trust_remote_code=cfg.trust_remote_code)
    peft_config = None
    if cfg.model.lora:
        from peft import LoraConfig
        peft_config = LoraConfig(task_type="CAUSAL_LM", **to_plain(cfg.model.lora))
    trainer = make_trainer(model, tokenizer, dataset,
                           sft_config(str(out / "checkpoints"), to_plain(cfg.bc), cfg.seed, report_to), peft_config)

    # -- train (resumes from the last checkpoint of an interrupted run) -----------------------
    has_ckpt = resume and any((out / "checkpoints").glob("checkpoint-*"))
    if has_ckpt:
        console.print(f"[bc] resuming from the last checkpoint in {out / 'checkpoints'}")
    result = trainer.train(resume_from_checkpoint=True if has_ckpt else None)

    # -- save ------------------------------------------------------------------------------
    final = trainer.model.merge_and_unload() if peft_config is not None else trainer.model
    final.save_pretrained(out / "model", safe_serialization=True)  # one plain checkpoint downstream
    tokenizer.save_pretrained(out / "model")
    tokens = sum(len(x) for x in trainer.train_dataset["input_ids"])
    epochs = result.metrics.get("epoch", cfg.bc.epochs)
    metrics = {"train_loss": result.training_loss, "optimizer_steps": result.global_step,
               "train_seconds": result.metrics["train_runtime"], "epochs": epochs,
               "trajectories": len(dataset), "tokens_per_epoch": tokens,
               "tokens_per_second": tokens * epochs / result.metrics["train_runtime"]}
    stage.finish(metrics, output=str(out / "model"))
    console.print(f"[bc] loss {metrics['train_loss']:.4f} after {metrics['optimizer_steps']} steps, "
                  f"{metrics['tokens_per_second']:.0f} tokens/s -> {out / 'model'}")
