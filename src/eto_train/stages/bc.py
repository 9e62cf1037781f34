"""Stage `bc`: behavior cloning on the expert trajectories (TRL SFTTrainer, action tokens only)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..distributed import is_main, wait_for_manifest
from ..experts import read_experts
from ..model.load import check_quantization, is_local
from ..stage import Stage, config_hash, setup_runtime, setup_wandb, to_plain
from ..training.sft import sft_conversations, train_sft
from ..validate import check_config

# what the stage writes in its folder (a rerun of a finished bc replaces exactly these, when it has its own)
OUTPUTS = ["model", "checkpoints", "adapter"]


def run(cfg) -> None:
    check_config(cfg)
    console = Console(markup=False)
    check_quantization(cfg.model.get("quantization"))  # before anything is written
    setup_runtime(cfg.runtime.train_threads)
    out = Path(cfg.paths.bc)
    inputs = {"experts": cfg.paths.experts}
    if is_local(cfg.model.path):
        inputs["base_model"] = cfg.model.path
    stage = Stage("bc", out, {"model": to_plain(cfg.model), "bc": to_plain(cfg.bc), "seed": cfg.seed,
                              "prompt": to_plain(cfg.prompt)}, inputs=inputs, outputs=OUTPUTS)
    if stage.done():
        return
    try:
        # -- check, then touch: the expert trajectories are read whole, the base model, its
        # tokenizer and the training arguments load, before the stage writes anything ------------
        convs = sft_conversations(read_experts(cfg.paths.experts), only_success=cfg.bc.only_success)

        # -- train and save (model.lora / model.quantization, resume, merged save: training/sft.py).
        # A finished BC stays in place while a rerun trains in stage.work (bc/.next) -------------
        trained = train_sft(convs, name="bc", base=cfg.model.path, out=stage.work, train=to_plain(cfg.bc),
                            model=to_plain(cfg.model), seed=cfg.seed, begin=stage.begin,
                            report_to=setup_wandb(to_plain(cfg.wandb), out),
                            trust_remote_code=cfg.trust_remote_code, console=console)

        # -- manifest (and the swap of a rerun's outputs into bc/) ----------------------------------
        if not is_main():  # under accelerate: the main process writes the manifest once the model is saved
            wait_for_manifest(stage.manifest_path, config_hash(stage.config))
            return
        result, tokens = trained.result, trained.tokens_per_epoch()
        epochs = result.metrics.get("epoch", cfg.bc.epochs)
        metrics = {"train_loss": result.training_loss, "optimizer_steps": result.global_step,
                   "train_seconds": result.metrics["train_runtime"], "epochs": epochs,
                   "trajectories": trained.conversations, "tokens_per_epoch": tokens,
                   "tokens_per_second": tokens * epochs / result.metrics["train_runtime"]}
        if trained.resumed_from:  # then train_loss, train_seconds and tokens_per_second cover the steps after the resume
            metrics["resumed_from"] = Path(trained.resumed_from).name
        stage.finish(metrics, output=str(out / "model"))
    finally:
        stage.release()  # an error: the next run (of this or another process) may take the stage
    console.print(f"[bc] loss {metrics['train_loss']:.4f} after {metrics['optimizer_steps']} steps, "
                  f"{metrics['tokens_per_second']:.0f} tokens/s -> {out / 'model'}")
