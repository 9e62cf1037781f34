"""Stage `compare`: trajectory vs step vs mixture contrast from one BC checkpoint, made fair.

All variants start from the same BC policy and share one exploration (same data, same seeds).
A control continues BC with SFT on the same chosen trajectories for the same number of
optimizer steps and examples as one variant's DPO (``compare.control_of``, the trajectory
variant by default), so that a gain cannot come from extra training alone; it trains by the
bc stage's recipe (LoRA / QLoRA as configured, resumable, merged save). Every policy is
evaluated on the same held-out seeds; each variant's difference to BC and to the control is
reported per split, overall and per game, with a paired bootstrap 95% interval and an exact McNemar
p-value, in a table (JSON + markdown) and a PNG chart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .. import layout, tracking
from ..config import BCSection, DPOSection, typed
from ..distributed import grad_accum, world_size
from ..evaluation import comparison
from ..manifest import Stage
from ..model.load import check_quantization
from ..pairs import Pair
from ..reporting import table_rows
from ..runtime import setup_runtime, to_plain
from ..store import write_atomic, write_json
from ..training import recipe
from .eto import dpo, explore, pairs
from .eto import prepare_bc
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


def sft_control(cfg, policy_path: str, vpairs: list[Pair], variant: dpo.DPOResult, variant_dir: Path,
                out: Path) -> str:
    """Continue ``policy_path`` with SFT on the chosen sides of one variant's ``vpairs`` for as many
    optimizer steps and examples as that variant's DPO (``variant``, in ``variant_dir``) took.

    The recipe of every training stage (:mod:`eto_train.training.recipe`), as bc and dpo:
    ``model.lora`` / ``model.quantization`` as configured, a killed run resumes from its last
    checkpoint, and the policy is saved as one plain merged checkpoint.
    """
    cfg = typed(cfg)
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

    def metrics(t: recipe.Trained) -> dict:
        m = {"effective_batch": t.effective_batch, "examples": t.examples,
             "per_device_batch": t.trainer.args.per_device_train_batch_size,
             "grad_accum": t.trainer.args.gradient_accumulation_steps, "control_of": variant_dir.name,
             "dpo_optimizer_steps": steps, "dpo_effective_batch": eb, "dpo_examples": eb * steps,
             "conversations": t.rows, "lora": bool(cfg.model.lora),
             "trainable_parameters": t.trainable_parameters}
        if (t.optimizer_steps, t.examples) != (steps, eb * steps):
            console.print(f"[{stage.name}] WARNING: {t.optimizer_steps} steps of {t.effective_batch} "
                          f"examples, but the {variant_dir.name} DPO took {steps} steps of {eb}")
        return m

    def job() -> recipe.Job:
        from ..training.sft import sft_arguments

        args = sft_arguments(BCSection.model_validate(train), layout.checkpoints(stage.work), cfg.seed)
        return recipe.SFTJob(stage.name, policy_path, chosen, args, to_plain(cfg.model), cfg.trust_remote_code)

    trained = recipe.run_stage(stage, job, metrics, console)
    if trained.metrics:
        console.print(f"[{stage.name}] SFT on the {variant_dir.name} variant's {len(chosen)} chosen sides: "
                      f"{trained.optimizer_steps} steps x {trained.effective_batch} examples "
                      f"(as its DPO), loss {trained.metrics['train_loss']:.4f} -> {layout.policy(out)}")
    return str(layout.policy(out))


def run(cfg) -> dict[str, Any]:
    cfg = typed(cfg)  # compare.control_of among compare.variants: the schema's rule
    console = Console(width=120, markup=False)
    cc = cfg.compare
    control_of = cc.control_of
    prepare_bc(cfg)
    runs = layout.RunLayout.of(cfg)
    bc_policy, out = str(runs.bc_policy), runs.compare

    # -- one shared exploration (with step continuations when a variant needs them) ------------
    needs_step = any(v in ("step", "mixture") for v in cc.variants)
    shared = cfg.with_values({"eto.pairs.contrast": "mixture" if needs_step else "trajectory"})
    explored, continuations = explore.run(shared, 1, bc_policy, out)

    # -- one DPO run per variant, all from BC --------------------------------------------------
    policies = {"bc": bc_policy}
    steps: dict[str, int] = {}
    control_pairs: list[Pair] = []
    for v in cc.variants:
        vcfg = cfg.with_values({"eto.pairs.contrast": v})
        vpairs = pairs.run(vcfg, 1, explored, continuations if v != "trajectory" else [], out / v)
        trained = dpo.run(vcfg, 1, bc_policy, vpairs, out / v)
        policies[v], steps[v] = trained.policy, trained.metrics["optimizer_steps"]
        if v == control_of:
            control_pairs, control_variant = vpairs, trained
    if cc.control and control_pairs:
        policies["control"] = sft_control(cfg, bc_policy, control_pairs, control_variant, out / control_of,
                                          out / layout.CONTROL)

    # -- the same held-out seeds for every policy ------------------------------------------------
    splits = list(cc.splits)
    results: dict[str, Any] = {"policies": policies, "dpo_steps": steps, "control_of": control_of, "splits": {}}
    evals = {n: runs.evaluation("bc") if n == "bc" else layout.evaluations(out) / n for n in policies}
    for name, path in policies.items():  # BC's evaluation is shared with `make eto` (done once)
        evaluate_policy(cfg, path, "bc" if name == "bc" else f"compare-{name}", splits, evals[name])
    for split in splits:
        results["splits"][split] = comparison({n: layout.episodes(evals[n], split) for n in policies},
                                              cc.bootstrap, cfg.seed)
    write_json(layout.compare_file(out, ".json"), results)
    tracking.record("compare", to_plain(cc), {s: {n: {"success_rate": r["success"], **({"vs_bc": r["vs_bc"]["diff"]}
                                                     if r.get("vs_bc") else {})} for n, r in rows.items()}
                                              for s, rows in results["splits"].items()}, out)
    md, png = layout.compare_file(out, ".md"), layout.compare_file(out, ".png")
    write_atomic(md, markdown(results))
    chart(results, png)

    t = Table(title="contrast variants vs BC and the control (paired on the same seeds)")
    for col in ("split", "game", "policy", "n", "success [95% CI]", "vs BC [95% CI]", "p", "vs control [95% CI]", "p"):
        t.add_column(col, no_wrap=True)
    for cells in table_rows(results["splits"]):
        t.add_row(*cells)
    console.print(t)
    console.print(f"-> {md}, {png}")
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = ["| split | game | policy | n | success [95% CI] | vs BC [95% CI] | McNemar p | vs control [95% CI] | McNemar p |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(results["splits"])]
    return "\n".join(lines) + "\n"


def chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = list(results["splits"])
    names = list(next(iter(results["splits"].values()))) if splits else []
    fig, ax = plt.subplots(figsize=(1.6 * max(3, len(names)) + 1, 3.5))
    width = 0.8 / max(1, len(splits))
    for i, split in enumerate(splits):
        rows = results["splits"][split]
        ys = [100 * rows[n]["success"] for n in names]
        err = [[100 * (rows[n]["success"] - rows[n]["success_ci95"][0]) for n in names],
               [100 * (rows[n]["success_ci95"][1] - rows[n]["success"]) for n in names]]
        ax.bar([j + i * width for j in range(len(names))], ys, width, yerr=err, capsize=3, label=split)
    ax.set_xticks([j + width * (len(splits) - 1) / 2 for j in range(len(names))], names)
    ax.set_ylabel("success rate (%)")
    ax.set_ylim(0, 100)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
