"""Stage `dpo` (ETO step 4): DPO on the pairs, action tokens only, against the explorer."""

from __future__ import annotations

from pathlib import Path

from datasets import Dataset
from rich.console import Console

from .. import faultpoints
from ..dataio import check_pairs_policy
from ..distributed import is_main, wait_for_manifest, with_grad_accum, world_size
from ..model.load import load_model, load_tokenizer, policy_ref
from ..pairs import Pair
from ..stage import Stage, config_hash, copy_outputs, setup_runtime, setup_wandb, to_plain
from ..training.dpo import dpo_config, make_dpo_trainer
from ..training.resume import resume_checkpoint
from ..training.save import finite_guard, save_policy

# what the stage writes in its folder (a rerun of a finished DPO replaces exactly these, when it has its own)
OUTPUTS = ["model", "checkpoints", "adapter", "pairs_dataset"]


def hyperparameters(cfg, iteration: int) -> dict:
    """This iteration's DPO settings: iteration 1 uses dpo.beta/lr, later ones dpo.later."""
    d = to_plain(cfg.eto.dpo)
    later = d.pop("later") or {}
    if iteration > 1:
        d.update(later)
    return d


def run(cfg, iteration: int, policy_path: str, pairs: list[Pair], out: Path) -> str:
    """Train from ``policy_path`` (also the frozen reference); returns the new policy's folder."""
    console = Console(markup=False)
    setup_runtime(cfg.runtime.train_threads)
    d = hyperparameters(cfg, iteration)
    stage_dir = out / "dpo"
    stage = Stage(f"dpo/iter{iteration}", stage_dir, {"dpo": d, "seed": cfg.seed},
                  inputs={"policy": policy_path, "pairs": out / "pairs" / "pairs.jsonl"}, outputs=OUTPUTS)
    if stage.done():
        return str(stage_dir / "model")
    try:
        # The same DPO (config, starting policy and pairs, by content) already trained by another
        # job of a sweep, or by `make eto` for `make compare-contrast`'s trajectory variant: copy it.
        cached = Path(cfg.paths.base) / "cache" / "dpo" / config_hash({"c": stage.config, "i": stage.input_hashes})
        if world_size() == 1 and Stage(stage.name, cached, stage.config, stage.inputs).done(lock=False):  # one process: no collective to skip
            console.print(f"[dpo] the same training already ran: reusing {cached}")
            stage.adopt(cached, ["model"])
            return str(stage_dir / "model")
        # -- check, then touch: pairs, reference policy, tokenizer and training arguments, before
        # the stage writes anything (a finished DPO stays in place while a rerun trains in .next) --
        if not pairs:
            raise ValueError(f"iteration {iteration}: no pairs to train on (see {out / 'pairs' / 'stats.json'})")
        # pairs explored by another policy than this reference would make the DPO objective wrong
        check_pairs_policy(pairs, policy_ref(policy_path).id, source=str(out / "pairs" / "pairs.jsonl"))
        work = stage.work
        report_to = setup_wandb(to_plain(cfg.wandb), stage_dir)
        args = dpo_config(str(work / "checkpoints"), with_grad_accum(d), cfg.seed, report_to)
        tok = load_tokenizer(policy_path, trust_remote_code=cfg.trust_remote_code)
        model = load_model(policy_path, dtype=cfg.model.dtype, trust_remote_code=cfg.trust_remote_code,
                           quantization=cfg.model.get("quantization"))
        peft_config = None
        if cfg.model.lora:  # the reference is then the adapter-disabled model: no second copy
            from peft import LoraConfig
            peft_config = LoraConfig(task_type="CAUSAL_LM", **to_plain(cfg.model.lora))
        ds = Dataset.from_list([{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs])
        resume = stage.begin()
        if world_size() > 1:
            # TRL caches the precomputed reference log-probs beside the dataset's files; an in-memory
            # dataset has a temporary folder per process, so the others would not find rank 0's cache.
            from accelerate import PartialState

            with PartialState().main_process_first():
                ds = ds.flatten_indices(cache_file_name=str(work / "pairs_dataset" / "pairs.arrow"))
        # ref_model=None: TRL uses the starting weights (the explorer) as the frozen reference.
        trainer = make_dpo_trainer(model, None, tok, ds, args, peft_config)
        trainer.add_callback(finite_guard(stage.name))  # a NaN/Inf loss or weight stops the stage
        ckpt = resume_checkpoint(work / "checkpoints", resume)
        if ckpt:
            console.print(f"[dpo] resuming from the last checkpoint {ckpt} (optimizer, scheduler, RNG)")
        if (kill := faultpoints.trainer_callback(stage.name)) is not None:  # tests only
            trainer.add_callback(kill)
        result = trainer.train(resume_from_checkpoint=ckpt)
        save_policy(trainer, tok, work / "model", policy_path, cfg.model.dtype, cfg.trust_remote_code,
                    stage=stage.name)
        if not is_main():  # under accelerate: wait for the main process to save and finish
            wait_for_manifest(stage.manifest_path, config_hash(stage.config))
            return str(stage_dir / "model")
        logs = [h for h in trainer.state.log_history if "loss" in h]
        metrics = {"train_loss": result.training_loss, "optimizer_steps": result.global_step,
                   "train_seconds": result.metrics["train_runtime"], "pairs": len(ds),
                   "first_log": logs[0] if logs else {}, "last_log": logs[-1] if logs else {}}
        if ckpt:  # then train_loss and train_seconds cover the steps after the resume
            metrics["resumed_from"] = Path(ckpt).name
        stage.finish(metrics, output=str(stage_dir / "model"))
    finally:
        stage.release()  # an error: the next run (of this or another process) may take the stage
    if world_size() == 1:
        copy_outputs(stage_dir, cached, ["model"])
    last = metrics["last_log"]
    console.print(f"[dpo] iteration {iteration}: {len(ds)} pairs, {result.global_step} steps, loss "
                  f"{result.training_loss:.4f}; last: reward acc {last.get('rewards/accuracies', float('nan')):.2f}, "
                  f"chosen logp {last.get('logps/chosen', float('nan')):.2f}, "
                  f"rejected logp {last.get('logps/rejected', float('nan')):.2f}")
    return str(stage_dir / "model")
