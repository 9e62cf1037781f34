"""Stage `compare`: the study's DPO arms from one BC checkpoint, made fair.

Every arm (``compare.arms``: a named set of ``eto`` overrides; ``compare.variants``: the arms
that run) starts from the same BC policy and runs explore -> pairs -> dpo with its own settings:
trajectory (the paper's), step (App. B), mixture, step_value (Monte-Carlo step values), anchor
(repeated states across sampled explorations), on_policy (the policy's own best vs worst).
Explorations with equal settings are played once (the run's content-hash cache), so the greedy
arms share ETO iteration 1's exploration and the sampled ones theirs; each arm's rollout cost is
recorded. A control continues BC with SFT on the same chosen trajectories for the same number of
optimizer steps and examples as one arm's DPO (``compare.control_of``, the trajectory arm by
default), so that a gain cannot come from extra training alone; it trains by the bc stage's
recipe (LoRA / QLoRA as configured, resumable, merged save). Every policy is evaluated on the
same held-out seeds; each arm's difference to BC and to the control is reported per split,
overall and per game, with a paired bootstrap 95% interval and an exact McNemar p-value, in a
table (JSON + markdown, with each policy's behaviour rates) and a PNG chart. Over several seeds
(``seeds``) see :mod:`eto_train.seeds`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from .. import layout, tracking
from ..config import BCSection, Config, DPOSection, dotted_overrides
from ..distributed import grad_accum, is_main, world_size
from ..envs import check_splits
from ..evaluation import behaviour, comparison
from ..manifest import Stage
from ..model.load import check_quantization
from ..pairs import Pair
from ..reporting import comparison_chart, comparison_markdown, print_comparison
from ..runtime import setup_runtime, to_plain
from ..store import write_atomic, write_json
from ..training import recipe
from .eto import dpo, explore_pair_train, prepare_bc
from .evaluate import evaluate_policy


def dpo_effective_batch(d: DPOSection) -> int:
    """Pairs per optimizer step of a DPO run with settings ``d``, over all processes."""
    return int(d["per_device_train_batch_size"]) * grad_accum(d) * world_size()


def control_training(bc: BCSection, d: DPOSection, steps: int) -> dict[str, Any]:
    """The SFT control's bc-style section: as many optimizer steps (``steps``) of as many sequences
    as the matched DPO (its effective batch in pairs: the control trains on one chosen side per
    pair), with the DPO's schedule (learning rate, scheduler, warmup), sequence length, logging and
    checkpoint cadence. Memory settings are BC's (the same kind of training): the per-device batch
    is the largest one up to ``bc.per_device_train_batch_size`` that divides the DPO's batch per
    process, and gradient accumulation makes up the rest.
    """
    eb = dpo_effective_batch(d)
    per_process = eb // world_size()
    micro = max(b for b in range(1, min(int(bc["per_device_train_batch_size"]), per_process) + 1)
                if per_process % b == 0)
    return {**{k: bc[k] for k in ("weight_decay", "bf16", "activation_checkpointing", "use_cpu")},
            **{k: d[k] for k in ("learning_rate", "lr_scheduler_type", "warmup_steps", "max_length",
                                 "num_train_epochs", "logging_steps", "save_strategy", "save_steps",
                                 "save_total_limit")},
            "per_device_train_batch_size": micro, "gradient_accumulation_steps": per_process // micro,
            "effective_batch": eb, "max_steps": steps}


def sft_control(cfg: Config, policy_path: str, vpairs: list[Pair], variant: dpo.DPOResult, variant_dir: Path,
                out: Path) -> str:
    """Continue ``policy_path`` with SFT on the chosen sides of one variant's ``vpairs`` for as many
    optimizer steps and examples as that variant's DPO (``variant``, in ``variant_dir``) took.

    The recipe of every training stage (:mod:`eto_train.training.recipe`), as bc and dpo:
    ``model.lora`` / ``model.quantization`` as configured, a killed run resumes from its last
    checkpoint, and the policy is saved as one plain merged checkpoint.
    """
    console = Console(markup=False)
    check_quantization(cfg.model.quantization)  # before anything is written (the lock included)
    setup_runtime(cfg.runtime.train_threads)
    steps = int(variant.metrics["optimizer_steps"])
    train = control_training(cfg.bc, variant.section, steps)
    chosen = [p.prompt + p.chosen for p in vpairs]
    stage = Stage("compare/control", out, {"model": to_plain(cfg.model), "train": train, "seed": cfg.seed,
                                           "control_of": variant_dir.name, "conversations": len(chosen)},
                  inputs={"policy": policy_path, "pairs": layout.pairs_file(variant_dir)},
                  outputs=list(layout.TRAINING_OUTPUTS))
    if stage.done():
        return str(layout.policy(out))
    eb = train["effective_batch"]
    with recipe.held(stage):  # cleanup: the stage's lock is released whatever happens
        # -- setup
        from ..training.sft import sft_arguments

        args = sft_arguments(BCSection.model_validate({**train, "only_success": True}), layout.checkpoints(stage.work),
                             cfg.seed)  # only_success: the chosen sides are trained whatever they scored
        job = recipe.SFTJob(stage.name, policy_path, chosen, args, to_plain(cfg.model), cfg.trust_remote_code)
        # -- train and save: a killed run resumes from its last checkpoint
        t = recipe.train(job, stage.work, begin=stage.begin, console=console)
        # -- the manifest with the run's metrics
        if (t.optimizer_steps, t.examples) != (steps, eb * steps) and is_main():
            console.print(f"[{stage.name}] WARNING: {t.optimizer_steps} steps of {t.effective_batch} "
                          f"examples, but the {variant_dir.name} DPO took {steps} steps of {eb}")
        recipe.finish(stage, t, {
            "effective_batch": t.effective_batch, "examples": t.examples,
            "per_device_batch": t.trainer.args.per_device_train_batch_size,
            "grad_accum": t.trainer.args.gradient_accumulation_steps, "control_of": variant_dir.name,
            "dpo_optimizer_steps": steps, "dpo_effective_batch": eb, "dpo_examples": eb * steps,
            "conversations": t.rows, "lora": bool(cfg.model.lora), "trainable_parameters": t.trainable_parameters})
    if t.metrics:
        console.print(f"[{stage.name}] SFT on the {variant_dir.name} variant's {len(chosen)} chosen sides: "
                      f"{t.optimizer_steps} steps x {t.effective_batch} examples "
                      f"(as its DPO), loss {t.metrics['train_loss']:.4f} -> {layout.policy(out)}")
    return str(layout.policy(out))


def arm_config(cfg: Config, name: str) -> Config:
    """The config arm ``name`` runs with: ``compare.arms.<name>``'s eto overrides applied."""
    return cfg.with_values(dotted_overrides(cfg.compare.arms[name], "eto"))


def rollout_cost(stats: dict[str, Any]) -> dict[str, int]:
    """An arm's rollouts, from its pairs stats: episodes explored and step continuations played
    (``episodes``), step_value's Monte-Carlo value rollouts (``value_rollouts``), and their sum
    (``total``; the stats' ``episodes`` counts every episode pairs.run was given, the value
    rollouts among them). What the arm costs on its own: an exploration shared with another arm
    through the cache counts for each."""
    total, value = int(stats.get("episodes", 0)), int(stats.get("value_rollouts", 0) or 0)
    return {"episodes": total - value, "value_rollouts": value, "total": total}


def run(cfg: Config) -> dict[str, Any]:
    # the CLI typed cfg: compare.control_of among compare.variants, the variants among compare.arms (the schema's rules)
    console = Console(width=120, markup=False)
    cc = cfg.compare
    control_of = cc.control_of
    arm_splits = {f"compare.arms.{v}.explore.split": split for v in cc.variants
                  if isinstance(split := (cc.arms[v].get("explore") or {}).get("split"), str)}
    check_splits(cfg.env.plain(), {"compare.splits": list(cc.splits), "eto.explore.split": cfg.eto.explore.split,
                                   **arm_splits})  # before BC or any arm runs
    prepare_bc(cfg)
    runs = layout.RunLayout.of(cfg)
    bc_policy, out = str(runs.bc_policy), runs.compare

    # -- one DPO run per arm, all from BC, each with its own eto settings ------------------------
    # Each arm explores in its own folder; explorations with equal settings (same policy, rollout
    # and explore settings) are played once and copied from the run's cache (explore.run's
    # ``share``): the greedy one is ETO iteration 1's, and the trajectory arm's DPO is then
    # iteration 1's too (dpo.run's cache)
    policies = {"bc": bc_policy}
    steps: dict[str, int] = {}
    cost: dict[str, dict[str, int]] = {}
    control_pairs: list[Pair] = []
    untrained: list[str] = []  # arms that found no pair
    for v in cc.variants:
        vcfg, vout = arm_config(cfg, v), out / v
        r = explore_pair_train(vcfg, 1, bc_policy, vout)
        cost[v] = rollout_cost(json.loads(layout.pairs_stats(vout).read_text(encoding="utf-8")))
        if r.trained is None:  # nothing to contrast: the arm leaves BC as it is (reported as BC, 0 steps)
            console.print(f"[compare] arm {v}: no pairs, so no DPO: the arm is BC itself")
            policies[v], steps[v] = bc_policy, 0
            untrained.append(v)
            continue
        policies[v], steps[v] = r.trained.policy, r.trained.metrics["optimizer_steps"]
        if v == control_of:
            control_pairs, control_variant = r.pairs, r.trained
    if cc.control and control_pairs:
        policies["control"] = sft_control(cfg, bc_policy, control_pairs, control_variant, out / control_of,
                                          out / layout.CONTROL)

    # -- the same held-out seeds for every policy ------------------------------------------------
    splits = list(cc.splits)
    evals = {n: runs.evaluation("bc") if n == "bc" or n in untrained else layout.evaluations(out) / n
             for n in policies}
    results: dict[str, Any] = {"policies": policies, "dpo_steps": steps, "control_of": control_of,
                               "arms": {v: cc.arms[v] for v in cc.variants}, "rollout_cost": cost,
                               "evaluations": {n: str(p) for n, p in evals.items()}, "seed": cfg.seed,
                               "no_pairs": untrained, "splits": {}, "behaviour": {}}
    for name, path in policies.items():  # BC's evaluation is shared with `make eto` (done once)
        if name in untrained:
            continue
        evaluate_policy(cfg, path, "bc" if name == "bc" else f"compare-{name}", splits, evals[name])
    for split in splits:
        files = {n: layout.episodes(evals[n], split) for n in policies}
        results["splits"][split] = comparison(files, cc.bootstrap, cfg.seed)
        results["behaviour"][split] = {n: behaviour(f) for n, f in files.items()}
    if not is_main():  # one writer per file: the main process writes the comparison
        return results
    write_json(layout.compare_file(out, ".json"), results)
    tracking.record("compare", to_plain(cc), {s: {n: {"success_rate": r["success"], **({"vs_bc": r["vs_bc"]["diff"]}
                                                     if r.get("vs_bc") else {})} for n, r in rows.items()}
                                              for s, rows in results["splits"].items()}, out)
    md, png = layout.compare_file(out, ".md"), layout.compare_file(out, ".png")
    write_atomic(md, comparison_markdown(results))
    comparison_chart(results, png)
    print_comparison(results, md, png)
    return results
