"""Stage `compare`: trajectory vs step vs mixture contrast from one BC checkpoint, made fair.

All variants start from the same BC policy and share one exploration (same data, same seeds).
A control continues BC with SFT on the same chosen trajectories for the same number of
optimizer steps as one variant's DPO (``compare.control_of``, the trajectory variant by
default), so that a gain cannot come from extra training alone. Every policy is evaluated on
the same held-out seeds; each variant's difference to BC and to the control is reported per
split, overall and per game, with a paired bootstrap 95% interval and an exact McNemar
p-value, in a table (JSON + markdown) and a PNG chart.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict
from rich.console import Console
from rich.table import Table

from ..stage import Stage, setup_runtime, setup_wandb, to_plain
from ..evaluation import comparison
from ..store import write_atomic, write_json
from . import dpo, explore, pairs
from .eto import prepare_bc
from .evaluate import evaluate_policy
from .report import table_rows


def _with(cfg, **updates):
    c = copy.deepcopy(cfg)
    with open_dict(c):
        for k, v in updates.items():
            OmegaConf.update(c, k, v, merge=False)
    return c


def sft_control(cfg, policy_path: str, chosen: list[list[dict]], steps: int, out: Path) -> str:
    """Continue ``policy_path`` with SFT on ``chosen`` conversations for exactly ``steps`` steps."""
    from ..model.load import load_model, load_tokenizer
    from ..training.sft import conversation_dataset, make_trainer, sft_config

    setup_runtime(cfg.runtime.train_threads)
    d = dpo.hyperparameters(cfg, 1)
    train = {**to_plain(cfg.bc), "lr": d["lr"], "batch_size": d["batch_size"], "grad_accum": d["grad_accum"],
             "max_steps": steps, "save_strategy": "no", "scheduler": d["scheduler"], "warmup_ratio": d["warmup_ratio"]}
    stage = Stage("compare/control", out, {"train": train, "seed": cfg.seed, "conversations": len(chosen)},
                  inputs={"policy": policy_path})
    if stage.done():
        return str(out / "model")
    stage.begin()
    tok = load_tokenizer(policy_path)
    trainer = make_trainer(load_model(policy_path, dtype=cfg.model.dtype), tok,
                           conversation_dataset(chosen, tok),
                           sft_config(str(out / "checkpoints"), train, cfg.seed, setup_wandb(to_plain(cfg.wandb), out)))
    result = trainer.train()
    trainer.model.save_pretrained(out / "model", safe_serialization=True)
    tok.save_pretrained(out / "model")
    stage.finish({"optimizer_steps": result.global_step, "train_loss": result.training_loss})
    return str(out / "model")


def run(cfg) -> dict[str, Any]:
    console = Console(width=120, markup=False)
    cc = cfg.compare
    control_of = cc.control_of
    if cc.control and control_of not in cc.variants:
        raise ValueError(f"compare.control_of={control_of!r} is not one of compare.variants={list(cc.variants)}: "
                         "the control matches that variant's chosen side and optimizer steps")
    prepare_bc(cfg)
    bc_policy = str(Path(cfg.paths.bc) / "model")
    out = Path(cfg.paths.compare)

    # -- one shared exploration (with step continuations when a variant needs them) ------------
    needs_step = any(v in ("step", "mixture") for v in cc.variants)
    shared = _with(cfg, **{"eto.pairs.contrast": "mixture" if needs_step else "trajectory"})
    explored, continuations = explore.run(shared, 1, bc_policy, out)

    # -- one DPO run per variant, all from BC --------------------------------------------------
    policies = {"bc": bc_policy}
    steps: dict[str, int] = {}
    chosen_for_control: list[list[dict]] = []
    for v in cc.variants:
        vcfg = _with(cfg, **{"eto.pairs.contrast": v})
        vpairs = pairs.run(vcfg, 1, explored, continuations if v != "trajectory" else [], out / v)
        policies[v] = dpo.run(vcfg, 1, bc_policy, vpairs, out / v)
        steps[v] = json.loads((out / v / "dpo" / "manifest.json").read_text())["metrics"]["optimizer_steps"]
        if v == control_of:
            chosen_for_control = [p.prompt + p.chosen for p in vpairs]
    if cc.control and chosen_for_control:
        policies["control"] = sft_control(cfg, bc_policy, chosen_for_control, steps[control_of], out / "control")

    # -- the same held-out seeds for every policy ------------------------------------------------
    splits = list(cc.splits)
    results: dict[str, Any] = {"policies": policies, "dpo_steps": steps, "control_of": control_of, "splits": {}}
    evals = {n: Path(cfg.paths.bc_eval) if n == "bc" else out / "eval" / n for n in policies}
    for name, path in policies.items():  # BC's evaluation is shared with `make eto` (done once)
        evaluate_policy(cfg, path, "bc" if name == "bc" else f"compare-{name}", splits, evals[name])
    for split in splits:
        results["splits"][split] = comparison({n: evals[n] / split / "episodes.jsonl" for n in policies},
                                              cc.bootstrap, cfg.seed)
    write_json(out / "compare.json", results)
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
