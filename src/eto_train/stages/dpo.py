"""Stage `dpo` (ETO step 4): DPO on the pairs, action tokens only, against the explorer."""

from __future__ import annotations

from pathlib import Path

from datasets import Dataset
from rich.console import Console

from ..model.load import load_model, load_tokenizer
from ..pairs import Pair
from ..stage import Stage, setup_runtime, setup_wandb, to_plain
from ..training.dpo import dpo_config, make_dpo_trainer


def hyperparameters(cfg, iteration: int) -> dict:
    """This iteration's DPO settings: iteration 1 uses dpo.beta/lr, later ones dpo.later."""
    d = to_plain(cfg.eto.dpo)
    later = d.pop("later") or {}
    if iteration > 1:
        d.update(later)
    return d


def run(cfg, iteration: int, policy_path: str, pairs: list[Pair], out: Path) -> str:
    """Train from ``policy_path`` (also the frozen reference); returns the new policy's folder."""
    console = Console()
    setup_runtime(cfg.runtime.train_threads)
    d = hyperparameters(cfg, iteration)
    stage_dir = out / "dpo"
    stage = Stage(f"dpo/iter{iteration}", stage_dir, {"dpo": d, "seed": cfg.seed},
                  inputs={"policy": policy_path, "pairs": out / "pairs" / "pairs.jsonl"})
    if stage.done():
        return str(stage_dir / "model")
    resume = stage.begin()
    if not pairs:
        raise ValueError(f"iteration {iteration}: no pairs to train on (see {out / 'pairs' / 'stats.json'})")
    report_to = setup_wandb(to_plain(cfg.wandb), stage_dir)
    tok = load_tokenizer(policy_path, trust_remote_code=cfg.trust_remote_code)
    model = load_model(policy_path, dtype=cfg.model.dtype, trust_remote_code=cfg.trust_remote_code)
    peft_config = None
    if cfg.model.lora:  # the reference is then the adapter-disabled model: no second copy
        from peft import LoraConfig
        peft_config = LoraConfig(task_type="CAUSAL_LM", **to_plain(cfg.model.lora))
    ds = Dataset.from_list([{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs])
    # ref_model=None: TRL uses the starting weights (the explorer) as the frozen reference.
    trainer = make_dpo_trainer(model, None, tok, ds, dpo_config(str(stage_dir / "checkpoints"), d, cfg.seed, report_to),
                               peft_config)
    has_ckpt = resume and any((stage_dir / "checkpoints").glob("checkpoint-*"))
    result = trainer.train(resume_from_checkpoint=True if has_ckpt else None)
    final = trainer.model.merge_and_unload() if peft_config is not None else trainer.model
    final.save_pretrained(stage_dir / "model", safe_serialization=True)
    tok.save_pretrained(stage_dir / "model")
    logs = [h for h in trainer.state.log_history if "loss" in h]
    metrics = {"train_loss": result.training_loss, "optimizer_steps": result.global_step,
               "train_seconds": result.metrics["train_runtime"], "pairs": len(ds),
               "first_log": logs[0] if logs else {}, "last_log": logs[-1] if logs else {}}
    stage.finish(metrics, output=str(stage_dir / "model"))
    last = metrics["last_log"]
    console.print(f"[dpo] iteration {iteration}: {len(ds)} pairs, {result.global_step} steps, loss "
                  f"{result.training_loss:.4f}; last: reward acc {last.get('rewards/accuracies', float('nan')):.2f}, "
                  f"chosen logp {last.get('logps/chosen', float('nan')):.2f}, "
                  f"rejected logp {last.get('logps/rejected', float('nan')):.2f}")
    return str(stage_dir / "model")
