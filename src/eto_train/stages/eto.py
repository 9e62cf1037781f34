"""The ETO loop: explore -> pairs -> dpo -> eval on dev, iterated up to a cap.

``run_iteration`` is one iteration from a given policy (`make eto-iter` continues from the
latest finished one); ``run`` does behavior cloning if needed, then iterations with early
stopping on dev success, keeps the best policy and evaluates it on the test splits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..store import write_json
from . import bc, dpo, experts, explore, model, pairs
from .evaluate import evaluate_policy


def iteration_dir(cfg, k: int) -> Path:
    return Path(cfg.paths.eto) / f"iter{k}"


def latest_policy(cfg) -> tuple[int, str]:
    """(last finished iteration, its policy folder); (0, bc policy) before any iteration."""
    k = 0
    while (iteration_dir(cfg, k + 1) / "dpo" / "model" / "config.json").exists():
        k += 1
    return k, (str(iteration_dir(cfg, k) / "dpo" / "model") if k else str(Path(cfg.paths.bc) / "model"))


def run_iteration(cfg, k: int, policy_path: str) -> dict[str, Any]:
    out = iteration_dir(cfg, k)
    explored, continuations = explore.run(cfg, k, policy_path, out)
    pair_list = pairs.run(cfg, k, explored, continuations, out)
    new_policy = dpo.run(cfg, k, policy_path, pair_list, out)
    dev = evaluate_policy(cfg, new_policy, f"iter{k}", [cfg.eto.dev_split], out / "eval")[cfg.eto.dev_split]
    summary = {"iteration": k, "policy": new_policy, "started_from": policy_path,
               "explore_success": sum(e.success for e in explored) / max(1, len(explored)),
               "pairs": len(pair_list), "dev": dev["overall"]}
    write_json(out / "summary.json", summary)
    return summary


def prepare_bc(cfg) -> None:
    experts.run(cfg)
    model.run(cfg)
    bc.run(cfg)


def run(cfg) -> dict[str, Any]:
    console = Console()
    prepare_bc(cfg)
    bc_policy = str(Path(cfg.paths.bc) / "model")
    dev_split = cfg.eto.dev_split
    bc_dev = evaluate_policy(cfg, bc_policy, "bc", [dev_split], Path(cfg.paths.run) / "eval" / "bc")[dev_split]
    history = [{"iteration": 0, "policy": bc_policy, "dev": bc_dev["overall"]}]
    best, policy = history[0], bc_policy
    for k in range(1, cfg.eto.iterations + 1):
        summary = run_iteration(cfg, k, policy)
        history.append(summary)
        policy = summary["policy"]
        if summary["dev"]["success_rate"] > best["dev"]["success_rate"] + cfg.eto.min_improvement:
            best = summary
        else:
            console.print(f"[eto] iteration {k}: dev success {summary['dev']['success_rate']:.3f} does not beat "
                          f"{best['dev']['success_rate']:.3f} + {cfg.eto.min_improvement}: stopping")
            break
    test = evaluate_policy(cfg, best["policy"], "eto_best", list(cfg.eval.splits), Path(cfg.paths.run) / "eval" / "eto_best")
    result = {"best_iteration": best["iteration"], "best_policy": best["policy"], "history": history,
              "test": {s: r["overall"] for s, r in test.items()}}
    write_json(Path(cfg.paths.eto) / "result.json", result)
    t = Table(title=f"ETO on {dev_split} (best: iteration {best['iteration']})")
    for col in ("iteration", "dev success [95% CI]", "score", "pairs"):
        t.add_column(col)
    for h in history:
        m = h["dev"]
        t.add_row(str(h["iteration"]), f"{100 * m['success_rate']:.1f}% [{100 * m['success_ci95'][0]:.1f}, "
                  f"{100 * m['success_ci95'][1]:.1f}] (n={m['scored_episodes']})", f"{m['mean_score']:.3f}",
                  str(h.get("pairs", "-")))
    console.print(t)
    console.print(json.dumps(result["test"], indent=1)[:2000])
    return result
