"""Stage `dpo` (ETO step 4): DPO on the pairs, action tokens only, against the explorer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from ... import layout
from ...config import Config, DPOSection
from ...distributed import world_size
from ...manifest import Stage
from ...model.load import policy_ref
from ...pairs import Pair, check_pairs_policy
from ...runtime import config_hash, setup_runtime, to_plain
from ...training import recipe

# what the stage writes in its folder (a rerun of a finished DPO replaces exactly these, when it has its own)
OUTPUTS = [*layout.TRAINING_OUTPUTS, layout.PAIRS_DATASET]


def last_dpo_log(log_history: list[dict]) -> dict:
    """The newest log entry with TRL's DPO metrics (``rewards/accuracies``, ``logps/chosen``, ...).

    TRL keeps the metrics of the steps since the last log and adds them to the next one
    (trl/trainer/dpo_trainer.py ``DPOTrainer.log``); when training ends before a logging step
    (a run of fewer steps than ``logging_steps``, e.g. a single step) that is the Trainer's
    final entry, which has ``train_loss`` but no ``loss``: a summary of the ``loss`` entries only
    found nothing and printed NaN."""
    dpo = [h for h in log_history if "rewards/accuracies" in h]
    if dpo:
        return dpo[-1]
    losses = [h for h in log_history if "loss" in h]
    return losses[-1] if losses else {}


@dataclass
class DPOResult:
    """A DPO stage's result: the new policy's folder, the ``eto.dpo`` settings it trained with
    (``later`` applied), its metrics."""

    policy: str
    section: DPOSection
    metrics: dict[str, Any]


def run(cfg: Config, iteration: int, policy_path: str, pairs: list[Pair], out: Path) -> DPOResult:
    """Train from ``policy_path`` (also the frozen reference) in ``out``/dpo on ``pairs`` (never empty: no
    pair, no DPO, loop.explore_pair_train decides), with ``eto.dpo``'s settings; from iteration 2 on,
    ``eto.dpo.later``'s (beta, learning_rate) replace its own."""
    console = Console(markup=False)
    setup_runtime(cfg.runtime.train_threads)
    section = cfg.eto.dpo.at(iteration)
    d = {k: v for k, v in section.plain().items() if k != "later"}  # what this iteration trains with
    stage_dir = layout.dpo_dir(out)
    result = DPOResult(str(layout.policy(stage_dir)), section, {})
    stage = Stage(f"dpo/iter{iteration}", stage_dir, {"dpo": d, "seed": cfg.seed},
                  inputs={"policy": policy_path, "pairs": layout.pairs_file(out)}, outputs=OUTPUTS)
    if stage.done():
        result.metrics = stage.metrics
        return result
    # The same DPO (config, starting policy and pairs, by content) already trained by another job
    # of a sweep, or by `make eto` for `make compare-contrast`'s trajectory variant: take it.
    # One process only: the others of `accelerate launch` would skip a collective.
    cached = layout.RunLayout.of(cfg).cache("dpo", config_hash({"c": stage.config, "i": stage.input_hashes}))
    if world_size() == 1 and stage.reuse(cached, [layout.POLICY]):
        result.metrics = stage.metrics
        return result

    with recipe.held(stage):  # cleanup: the stage's lock is released whatever happens
        # -- setup: the pairs' explorer checked before anything is written
        # pairs explored by another policy than this reference would make the DPO objective wrong
        check_pairs_policy(pairs, policy_ref(policy_path).id, source=str(layout.pairs_file(out)))
        rows = [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs]
        from ...training.dpo import dpo_arguments  # TRL: imported when a DPO trains

        args = dpo_arguments(section, layout.checkpoints(stage.work), cfg.seed)
        job = recipe.DPOJob(stage.name, policy_path, rows, args, to_plain(cfg.model), cfg.trust_remote_code)
        # -- train and save: a killed run resumes from its last checkpoint; the policy in dpo/model
        trained = recipe.train(job, stage.work, begin=stage.begin, console=console)
        # -- the manifest with the run's metrics
        logs = trained.loss_logs()
        recipe.finish(stage, trained, {"pairs": trained.rows, "first_log": logs[0] if logs else {},
                                       "last_log": last_dpo_log(trained.trainer.state.log_history)})
    if world_size() == 1:
        stage.publish(cached, [layout.POLICY])
    result.metrics = trained.metrics or stage.metrics
    if trained.metrics:
        last = trained.metrics["last_log"]
        console.print(f"[dpo] iteration {iteration}: {trained.rows} pairs, {trained.optimizer_steps} steps, loss "
                      f"{trained.metrics['train_loss']:.4f}; last: reward acc "
                      f"{last.get('rewards/accuracies', float('nan')):.2f}, chosen logp "
                      f"{last.get('logps/chosen', float('nan')):.2f}, rejected logp "
                      f"{last.get('logps/rejected', float('nan')):.2f}")
    return result
