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

import copy
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict
from rich.console import Console
from rich.table import Table

from .. import layout, tracking
from ..distributed import grad_accum, world_size
from ..evaluation import comparison
from ..manifest import Stage
from ..model.load import check_quantization
from ..pairs import Pair
from ..reporting import table_rows
from ..runtime import setup_runtime, to_plain
from ..store import write_atomic, write_json
from ..training import recipe
from ..validate import check_config
from . import dpo, explore, pairs
from .eto import prepare_bc
from .evaluate import evaluate_policy


def _with(cfg, **updates):
    c = copy.deepcopy(cfg)
    with open_dict(c):
        for k, v in updates.items():
            OmegaConf.update(c, k, v, merge=False)
    return c


def dpo_effective_batch(d: dict[str, Any]) -> int:
    """Pairs per optimizer step of a DPO run with settings ``d``, over all processes."""
    return int(d["batch_size"]) * grad_accum(d) * world_size()


def control_training(bc: dict[str, Any], d: dict[str, Any], steps: int) -> dict[str, Any]:
    """The SFT control's hyperparameters: as many optimizer steps (``steps``) of as many sequences
    as the matched DPO (its effective batch in pairs: the control trains on one chosen side per
    pair), with the DPO's schedule (lr, scheduler, warmup), sequence length, logging and checkpoint
    cadence. Memory settings are BC's (the same kind of training): the per-device batch is the
    largest one up to ``bc.batch_size`` that divides the DPO's batch per process, and gradient
    accumulation makes up the rest.
    """
    eb = dpo_effective_batch(d)
    per_process = eb // world_size()
    micro = max(b for b in range(1, min(int(bc["batch_size"]), per_process) + 1) if per_process % b == 0)
    return {**{k: bc[k] for k in ("weight_decay", "bf16", "gradient_checkpointing", "use_cpu")},
            **{k: d[k] for k in ("lr", "scheduler", "warmup_ratio", "max_length", "epochs", "logging_steps",
                                 "save_strategy", "save_steps", "save_total_limit")},
            "batch_size": micro, "grad_accum": per_process // micro, "effective_batch": eb, "max_steps": steps}


def sft_control(cfg, policy_path: str, vpairs: list[Pair], variant: dpo.Trained, variant_dir: Path,
                out: Path) -> str:
    """Continue ``policy_path`` with SFT on the chosen sides of one variant's ``vpairs`` for as many
    optimizer steps and examples as that variant's DPO (``variant``, in ``variant_dir``) took.

    The recipe of every training stage (:mod:`eto_train.training.recipe`), as bc and dpo:
    ``model.lora`` / ``model.quantization`` as configured, a killed run resumes from its last
    checkpoint, and the policy is saved as one plain merged checkpoint.
    """
    console = Console(markup=False)
    check_quantization(cfg.model.get("quantization"))  # before anything is written (the lock included)
    setup_runtime(cfg.runtime.train_threads)
    d, steps = variant.hyperparameters, int(variant.metrics["optimizer_steps"])
    train = control_training(to_plain(cfg.bc), d, steps)
    chosen = [p.prompt + p.chosen for p in vpairs]
    stage = Stage("compare/control", out, {"model": to_plain(cfg.model), "train": train, "seed": cfg.seed,
                                           "control_of": variant_dir.name, "conversations": len(chosen)},
                  inputs={"policy": policy_path, "pairs": layout.pairs_file(variant_dir)},
                  outputs=[layout.POLICY, "checkpoints", "adapter"])
    if stage.done():
        return str(layout.policy(out))
    eb = train["effective_batch"]

    def metrics(t: recipe.Trained) -> dict:
        m = {"effective_batch": t.effective_batch, "examples": t.examples, "per_device_batch": train["batch_size"],
             "grad_accum": t.trainer.args.gradient_accumulation_steps, "control_of": variant_dir.name,
             "dpo_optimizer_steps": steps, "dpo_effective_batch": eb, "dpo_examples": eb * steps,
             "conversations": t.rows, "lora": bool(cfg.model.get("lora")),
             "trainable_parameters": t.trainable_parameters}
        if (t.optimizer_steps, t.examples) != (steps, eb * steps):
            console.print(f"[{stage.name}] WARNING: {t.optimizer_steps} steps of {t.effective_batch} "
                          f"examples, but the {variant_dir.name} DPO took {steps} steps of {eb}")
        return m

    trained = recipe.run_stage(stage, lambda: recipe.Job(stage.name, "sft", policy_path, chosen, train,
                                                         to_plain(cfg.model), cfg.seed, cfg.trust_remote_code),
                               metrics, console)
    if trained.metrics:
        console.print(f"[{stage.name}] SFT on the {variant_dir.name} variant's {len(chosen)} chosen sides: "
                      f"{trained.optimizer_steps} steps x {trained.effective_batch} examples "
                      f"(as its DPO), loss {trained.metrics['train_loss']:.4f} -> {layout.policy(out)}")
    return str(layout.policy(out))


def run(cfg) -> dict[str, Any]:
    check_config(cfg)
    console = Console(width=120, markup=False)
    cc = cfg.compare
    control_of = cc.control_of
    if cc.control and control_of not in cc.variants:
        raise ValueError(f"compare.control_of={control_of!r} is not one of compare.variants={list(cc.variants)}: "
                         "the control matches that variant's chosen side and optimizer steps")
    prepare_bc(cfg)
    runs = layout.RunLayout.of(cfg)
    bc_policy, out = str(runs.bc_policy), runs.compare

    # -- one shared exploration (with step continuations when a variant needs them) ------------
    needs_step = any(v in ("step", "mixture") for v in cc.variants)
    shared = _with(cfg, **{"eto.pairs.contrast": "mixture" if needs_step else "trajectory"})
    explored, continuations = explore.run(shared, 1, bc_policy, out)

    # -- one DPO run per variant, all from BC --------------------------------------------------
    policies = {"bc": bc_policy}
    steps: dict[str, int] = {}
    control_pairs: list[Pair] = []
    for v in cc.variants:
        vcfg = _with(cfg, **{"eto.pairs.contrast": v})
        vpairs = pairs.run(vcfg, 1, explored, continuations if v != "trajectory" else [], out / v)
        trained = dpo.run(vcfg, 1, bc_policy, vpairs, out / v)
        policies[v], steps[v] = trained.policy, trained.metrics["optimizer_steps"]
        if v == control_of:
            control_pairs, control_variant = vpairs, trained
    if cc.control and control_pairs:
        policies["control"] = sft_control(cfg, bc_policy, control_pairs, control_variant, out / control_of,
                                          out / "control")

    # -- the same held-out seeds for every policy ------------------------------------------------
    splits = list(cc.splits)
    results: dict[str, Any] = {"policies": policies, "dpo_steps": steps, "control_of": control_of, "splits": {}}
    evals = {n: runs.evaluation("bc") if n == "bc" else out / "eval" / n for n in policies}
    for name, path in policies.items():  # BC's evaluation is shared with `make eto` (done once)
        evaluate_policy(cfg, path, "bc" if name == "bc" else f"compare-{name}", splits, evals[name])
    for split in splits:
        results["splits"][split] = comparison({n: layout.episodes(evals[n], split) for n in policies},
                                              cc.bootstrap, cfg.seed)
    write_json(out / "compare.json", results)
    tracking.record("compare", to_plain(cc), {s: {n: {"success_rate": r["success"], **({"vs_bc": r["vs_bc"]["diff"]}
                                                     if r.get("vs_bc") else {})} for n, r in rows.items()}
                                              for s, rows in results["splits"].items()}, out)
    write_atomic(out / "compare.md", markdown(results))
    chart(results, out / "compare.png")

    t = Table(title="contrast variants vs BC and the control (paired on the same seeds)")
    for col in ("split", "game", "policy", "n", "success [95% CI]", "vs BC [95% CI]", "p", "vs control [95% CI]", "p"):
        t.add_column(col, no_wrap=True)
    for cells in table_rows(results["splits"]):
        t.add_row(*cells)
    console.print(t)
    console.print(f"-> {out / 'compare.md'}, {out / 'compare.png'}")
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
