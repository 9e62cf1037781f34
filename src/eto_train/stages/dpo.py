"""Stage `dpo` (ETO step 4): DPO on the pairs, action tokens only, against the explorer."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..distributed import world_size
from ..manifest import Stage
from ..model.load import policy_ref
from ..pairs import Pair, check_pairs_policy
from ..runtime import config_hash, setup_runtime, to_plain
from ..training import recipe

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
    # The same DPO (config, starting policy and pairs, by content) already trained by another job
    # of a sweep, or by `make eto` for `make compare-contrast`'s trajectory variant: take it.
    # One process only: the others of `accelerate launch` would skip a collective.
    cached = Path(cfg.paths.cache) / "dpo" / config_hash({"c": stage.config, "i": stage.input_hashes})
    if world_size() == 1 and stage.reuse(cached, ["model"]):
        return str(stage_dir / "model")

    def job() -> recipe.Job:  # check, then touch: pairs and their explorer before anything is written
        if not pairs:
            raise ValueError(f"iteration {iteration}: no pairs to train on (see {out / 'pairs' / 'stats.json'})")
        # pairs explored by another policy than this reference would make the DPO objective wrong
        check_pairs_policy(pairs, policy_ref(policy_path).id, source=str(out / "pairs" / "pairs.jsonl"))
        rows = [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs]
        return recipe.Job(stage.name, "dpo", policy_path, rows, d, to_plain(cfg.model), cfg.seed,
                          cfg.trust_remote_code)

    def metrics(t: recipe.Trained) -> dict:
        logs = t.loss_logs()
        return {"pairs": t.rows, "first_log": logs[0] if logs else {}, "last_log": logs[-1] if logs else {}}

    trained = recipe.run_stage(stage, job, metrics, console)
    if world_size() == 1:
        stage.publish(cached, ["model"])
    if trained.metrics:
        last = trained.metrics["last_log"]
        console.print(f"[dpo] iteration {iteration}: {trained.rows} pairs, {trained.optimizer_steps} steps, loss "
                      f"{trained.metrics['train_loss']:.4f}; last: reward acc "
                      f"{last.get('rewards/accuracies', float('nan')):.2f}, chosen logp "
                      f"{last.get('logps/chosen', float('nan')):.2f}, rejected logp "
                      f"{last.get('logps/rejected', float('nan')):.2f}")
    return str(stage_dir / "model")
