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

from ..evaluation import comparison
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
    console = Console(markup=False)
    prepare_bc(cfg)
    bc_policy = str(Path(cfg.paths.bc) / "model")
    dev_split, test_splits = cfg.eto.dev_split, list(cfg.eval.splits)
    # BC on dev (the baseline for early stopping) and on the test splits (the paired baseline)
    bc_res = evaluate_policy(cfg, bc_policy, "bc", [dev_split, *test_splits], Path(cfg.paths.bc_eval))
    history = [{"iteration": 0, "policy": bc_policy, "dev": bc_res[dev_split]["overall"]}]
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
    if best["iteration"] == 0:  # no iteration beat BC on dev: BC's own test evaluation stands
        best_eval, test = Path(cfg.paths.bc_eval), {s: bc_res[s] for s in test_splits}
    else:
        best_eval = Path(cfg.paths.run) / "eval" / "eto_best"
        test = evaluate_policy(cfg, best["policy"], "eto_best", test_splits, best_eval)
    vs_bc = {}
    for split in test_splits:
        rows = comparison({"bc": Path(cfg.paths.bc_eval) / split / "episodes.jsonl",
                           "best": best_eval / split / "episodes.jsonl"}, cfg.compare.bootstrap, cfg.seed)["best"]
        vs_bc[split] = {**rows["vs_bc"], "per_game": {g: r["vs_bc"] for g, r in rows["per_game"].items()}}
    result = {"best_iteration": best["iteration"], "best_policy": best["policy"], "best_eval": str(best_eval),
              "history": history,
              "test": {s: r["overall"] for s, r in test.items()},
              "bc_test": {s: bc_res[s]["overall"] for s in test_splits}, "best_vs_bc": vs_bc}
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
    for split, d in vs_bc.items():
        console.print(f"[eto] {split}: best iteration {best['iteration']} "
                      f"{100 * result['test'][split]['success_rate']:.1f}% vs BC "
                      f"{100 * result['bc_test'][split]['success_rate']:.1f}%, paired difference "
                      f"{100 * d['diff']:+.1f} [{100 * d['diff_ci95'][0]:+.1f}, {100 * d['diff_ci95'][1]:+.1f}] "
                      f"(n={d['n']}, McNemar p={d['mcnemar_p']:.3f})")
        for game, g in d["per_game"].items():
            console.print(f"[eto]   {game}: {100 * g['diff']:+.1f} [{100 * g['diff_ci95'][0]:+.1f}, "
                          f"{100 * g['diff_ci95'][1]:+.1f}] (n={g['n']}, McNemar p={g['mcnemar_p']:.3f})")
    return result
