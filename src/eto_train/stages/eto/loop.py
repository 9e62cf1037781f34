"""The ETO stage (`make eto`, `make eto-iter`): explore -> pairs -> dpo -> eval on dev, iterated up to a cap.

Its steps live beside it: :mod:`.explore`, :mod:`.pairs`, :mod:`.dpo` (each called with the
iteration, its starting policy and its folder).

``run_iteration`` is one iteration from a given policy (``run_next_iteration``, `make eto-iter`,
continues from the latest finished one); ``run`` does behavior cloning if needed, then the
iterations, and evaluates the resulting policy on the test splits (``eval.splits``).

Model selection never looks at a test split. With ``eto.early_stopping: true`` (the CPU
default) the loop stops at the first iteration whose dev figure does not beat the best so far
by more than ``eto.min_improvement`` and keeps the best policy (BC when none beats it). The
figure is the environment's ``env.metric``: ``success_rate``, or ``mean_score`` (average final
reward, ScienceWorld's metric in the paper). ``eto.dev_split`` must then name a split of the
environment that is no test split (checked before any work starts, :func:`check_selection`);
ScienceWorld and ALFWorld carve it from their training tasks (``env.dev_holdout``,
envs/holdout.py). With ``eto.early_stopping: false`` (the paper: a fixed number of iterations)
every iteration runs and the last policy is the result; ``eto.dev_split: null`` then skips the
dev evaluation altogether.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ... import layout, tracking
from ...distributed import is_main
from ...envs import check_playable, check_splits, make_env
from ...evaluation import comparison
from ...config import METRICS, Config, require
from ...experts import usable_experts
from ...store import json_text, write_main
from .. import bc, experts, model
from ..evaluate import evaluate_policy
from . import dpo, explore, pairs


@dataclass(frozen=True)
class Round:
    """What one round of ETO's data and training made from a policy (``explore_pair_train``)."""
    explored: list  # the policy's episodes (records.Episode)
    pairs: list  # the contrast pairs (pairs.Pair)
    trained: dpo.DPOResult | None  # None: no pair, so no DPO


class NoPairs(ValueError):
    """An ETO iteration whose pairs stage found no pair: there is nothing for DPO to train on."""

    def __init__(self, k: int, out: Path) -> None:
        super().__init__(f"iteration {k}: no pairs to train on (see {layout.pairs_stats(out)})")


def explore_pair_train(cfg: Config, k: int, policy_path: str, out: Path) -> Round:
    """Iteration ``k``'s explore -> pairs -> DPO from ``policy_path`` in ``out`` (an ETO iteration folder, or a
    compare arm's): the one sequence `make eto` and `make compare-contrast` share, and the one place that
    decides "no pair: no DPO" (what that means is the caller's: an error in ETO, an arm left at BC in compare).

    The expert trajectories are read once, here: exploration plays from their states (step-level
    contrasts), the pairs compare with them."""
    expert_episodes = usable_experts(cfg.paths.experts, cfg.env.name)
    explored, continuations = explore.run(cfg, k, policy_path, expert_episodes, out)
    pair_list = pairs.run(cfg, k, expert_episodes, explored, continuations, out)
    if not pair_list:
        return Round(explored, pair_list, None)
    return Round(explored, pair_list, dpo.run(cfg, k, policy_path, pair_list, out))


@dataclass(frozen=True)
class Selection:
    dev_split: str | None  # None: no dev evaluation
    metric: str  # a key of evaluate()'s "overall" metrics
    early_stopping: bool  # False: every iteration runs, the last policy is the result
    min_improvement: float

    def to_dict(self) -> dict[str, Any]:
        rule = (f"the best {self.metric} on {self.dev_split} (BC included), stopping at the first iteration that does "
                f"not beat it by more than {self.min_improvement}" if self.early_stopping
                else "none: a fixed number of iterations, the last policy is the result")
        return {"dev_split": self.dev_split, "metric": self.metric, "early_stopping": self.early_stopping,
                "min_improvement": self.min_improvement, "rule": rule}


def check_selection(cfg: Config) -> Selection:
    """The selection settings, with the checks that need the environment's tasks: the dev split
    exists, has tasks and shares none with training or test (the config schema decided the rest,
    by name, in config.eto_problems: env.metric, eto.dev_split against the test and training split
    names, early stopping without a dev split)."""
    e = cfg.eto
    sel = Selection(e.dev_split, cfg.env.metric, e.early_stopping, e.min_improvement)
    dev, train_split, test_splits = e.dev_split, e.explore.split, list(cfg.eval.splits)
    if dev is None:
        return sel
    if dev in test_splits:  # the schema lets eval.splits=[dev] alone through: `eto-train eval`'s dev play
        raise ValueError(f"eval.splits={test_splits}: the ETO loop selects on eto.dev_split={dev!r} and plays "
                         f"eval.splits as its test splits; eval.splits=[{dev}] alone is a dev play for `eto-train "
                         "eval`, not a test (set eval.splits to test splits, e.g. [seen,unseen])")
    env = make_env(cfg.env.plain())
    try:
        try:
            dev_tasks = env.tasks(dev)
        except KeyError:
            raise ValueError(f"eto.dev_split={dev!r}: the environment has no such split (env.splits: "
                             f"{sorted(cfg.env.splits)}; env.dev_holdout > 0 holds a 'dev' split out of the training "
                             f"tasks)") from None
        if not dev_tasks:
            raise ValueError(f"eto.dev_split={dev!r}: the split has no tasks")
        ids = {t.task_id for t in dev_tasks}
        for other in dict.fromkeys([*test_splits, train_split, "train"]):
            shared = ids & {t.task_id for t in env.tasks(other)}
            if shared:
                raise ValueError(f"eto.dev_split={dev!r} shares {len(shared)} tasks with the split {other!r} "
                                 f"(e.g. {sorted(shared)[:3]}): a dev split must be disjoint from training and test")
    finally:
        env.close()
    return sel


def latest_policy(cfg) -> tuple[int, str]:
    """(last finished iteration, its policy folder); (0, bc policy) before any iteration.

    An iteration is finished once :func:`run_iteration` wrote its summary (its last write, after DPO
    finished and the dev evaluation): not when its policy folder has a ``config.json``, which a
    DPO killed while saving leaves beside a cut or unchecked policy (tests/test_kill_during_save.py)."""
    runs, k = layout.RunLayout.of(cfg), 0
    while (runs.iteration(k + 1) / layout.SUMMARY).exists():
        k += 1
    return k, str(layout.policy(layout.dpo_dir(runs.iteration(k))) if k else runs.bc_policy)


def _finished(stage_dir: Path) -> bool:
    """The stage in ``stage_dir`` finished (its manifest says done); a damaged manifest is not
    (the stage's own rerun names it, manifest.DamagedManifest)."""
    try:
        m = json.loads(layout.manifest(stage_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and m.get("status") == "done"


def run_next_iteration(cfg: Config) -> dict[str, Any] | None:
    """`eto-train eto-iter`: the iteration after the latest finished one, from its policy (BC's
    before any); None, with a line saying so, once ``eto.iterations`` iterations are done."""
    from ...model.load import CheckpointError

    require(cfg, "eto_train.stages.eto.run_next_iteration")
    check_splits(cfg.env.plain(), {"eto.explore.split": cfg.eto.explore.split})  # before anything is loaded
    k, policy = latest_policy(cfg)
    if k >= cfg.eto.iterations:
        print(f"[eto-iter] {k} iterations done: the cap eto.iterations={cfg.eto.iterations} is reached")
        return None
    if not (Path(policy) / "config.json").exists():
        raise CheckpointError(f"{policy}: no behavior-cloned policy yet (run `make bc` or `eto-train bc` first)")
    if k == 0 and not _finished(Path(policy).parent):  # e.g. bc killed while saving: a policy never checked
        raise CheckpointError(f"{policy}: the bc stage that writes it has not finished ({Path(policy).parent}/"
                              f"manifest.json is not done): run `make bc` or `eto-train bc` again to finish it")
    return run_iteration(cfg, k + 1, policy)


def run_iteration(cfg: Config, k: int, policy_path: str, selection: Selection | None = None) -> dict[str, Any]:
    """One iteration from ``policy_path``; its policy is evaluated on the dev split, if one is set."""
    require(cfg, "eto_train.stages.eto.run_iteration")
    sel = selection or check_selection(cfg)
    out = layout.RunLayout.of(cfg).iteration(k)
    r = explore_pair_train(cfg, k, policy_path, out)
    if r.trained is None:
        raise NoPairs(k, out)
    explored, pair_list, new_policy = r.explored, r.pairs, r.trained.policy
    dev = None
    if sel.dev_split is not None:
        dev = evaluate_policy(cfg, new_policy, f"iter{k}", [sel.dev_split], layout.evaluations(out))[sel.dev_split]["overall"]
    summary = {"iteration": k, "policy": new_policy, "started_from": policy_path,
               "explore_success": sum(e.success for e in explored) / max(1, len(explored)),
               "pairs": len(pair_list), "dev_split": sel.dev_split, "dev": dev}
    write_main(out / layout.SUMMARY, json_text(summary))  # the main process's (one writer per file)
    return summary


def select(history: list[dict[str, Any]], sel: Selection) -> tuple[dict[str, Any], bool]:
    """(the policy kept among ``history`` so far, whether the loop stops after its last entry).

    ``history[0]`` is BC. Without early stopping the last entry is kept and the loop goes on;
    with it, the best dev ``sel.metric`` is kept and the loop stops at the first entry that does
    not beat the best before it by more than ``sel.min_improvement``."""
    if not sel.early_stopping:
        return history[-1], False
    best = history[0]
    for h in history[1:]:
        if h["dev"][sel.metric] > best["dev"][sel.metric] + sel.min_improvement:
            best = h
        else:
            return best, True
    return best, False


def prepare_bc(cfg) -> None:
    experts.run(cfg)
    model.run(cfg)
    bc.run(cfg)


def _fmt(metric: str, value: float) -> str:
    return f"{100 * value:.1f}%" if metric == "success_rate" else f"{value:.3f}"


def run(cfg: Config) -> dict[str, Any]:
    require(cfg, "eto_train.stages.eto.run")
    console = Console(markup=False)
    check_splits(cfg.env.plain(), {"eval.splits": list(cfg.eval.splits), "eto.explore.split": cfg.eto.explore.split})
    sel = check_selection(cfg)  # before any work: a bad selection setting must not cost a BC run
    metric, dev_split = sel.metric, sel.dev_split
    check_playable(cfg.env.plain())  # e.g. WebShop not installed: say so before BC, not after it
    prepare_bc(cfg)
    runs = layout.RunLayout.of(cfg)
    bc_policy = str(runs.bc_policy)
    test_splits = list(cfg.eval.splits)
    # BC on dev (the baseline for early stopping) and on the test splits (the paired baseline)
    bc_res = evaluate_policy(cfg, bc_policy, "bc", [*([dev_split] if dev_split else []), *test_splits],
                             runs.evaluation("bc"))
    history = [{"iteration": 0, "policy": bc_policy, "dev_split": dev_split,
                "dev": bc_res[dev_split]["overall"] if dev_split else None}]
    best, policy = history[0], bc_policy
    for k in range(1, cfg.eto.iterations + 1):
        summary = run_iteration(cfg, k, policy, sel)
        history.append(summary)
        policy = summary["policy"]
        best, stop = select(history, sel)
        if stop:
            console.print(f"[eto] iteration {k}: dev {metric} {_fmt(metric, summary['dev'][metric])} does not beat "
                          f"{_fmt(metric, best['dev'][metric])} + {sel.min_improvement}: stopping")
            break
    if best["iteration"] == 0:  # no iteration beat BC on dev (or none ran): BC's own test evaluation stands
        best_eval, test = runs.evaluation("bc"), {s: bc_res[s] for s in test_splits}
    else:
        best_eval = runs.evaluation("eto_best")
        test = evaluate_policy(cfg, best["policy"], "eto_best", test_splits, best_eval)
    vs_bc = {}
    for split in test_splits:
        rows = comparison({"bc": layout.episodes(runs.evaluation("bc"), split),
                           "best": layout.episodes(best_eval, split)}, cfg.compare.bootstrap, cfg.seed)["best"]
        vs_bc[split] = {**rows["vs_bc"], "per_game": {g: r["vs_bc"] for g, r in rows["per_game"].items()}}
    # best_*: the policy the loop returns (with early stopping the best on dev, else the last one)
    result = {"best_iteration": best["iteration"], "best_policy": best["policy"], "best_eval": str(best_eval),
              "selection": sel.to_dict(), "history": history,
              "test": {s: r["overall"] for s, r in test.items()},
              "bc_test": {s: bc_res[s]["overall"] for s in test_splits}, "best_vs_bc": vs_bc}
    last = history[-1]
    if cfg.eto.test_last_iteration and last["iteration"] not in (0, best["iteration"]):
        # the last iteration on the test splits too (dev kept another): beside the kept policy, in its own folder
        last_eval = layout.evaluations(Path(cfg.paths.eto) / f"iter{last['iteration']}")
        last_test = evaluate_policy(cfg, last["policy"], f"iter{last['iteration']}", test_splits, last_eval)
        result.update(last_iteration=last["iteration"], last_eval=str(last_eval),
                      last_test={s: r["overall"] for s, r in last_test.items()})
    write_main(runs.eto_result, json_text(result))
    if is_main():  # the loop's summary: dev success per iteration, the kept policy on test, paired vs BC
        tracking.record("eto", result["selection"], {
            "best_iteration": best["iteration"], "test": result["test"], "bc_test": result["bc_test"],
            "best_vs_bc": vs_bc, "pairs": {f"iter{h['iteration']}": h.get("pairs") for h in history},
            "dev": {f"iter{h['iteration']}": h["dev"] for h in history if h["dev"] is not None}}, runs.eto)
    how = (f"selected by dev {metric}, best: iteration {best['iteration']}" if sel.early_stopping
           else f"no selection: the last iteration ({best['iteration']}) is the result")
    t = Table(title=f"ETO on {dev_split} ({how})" if dev_split else f"ETO without a dev split ({how})")
    mark = {m: f" ({'selects' if sel.early_stopping else 'env.metric'})" if m == metric else "" for m in METRICS}
    for col in ("iteration", f"dev success_rate [95% CI]{mark['success_rate']}", f"dev mean_score{mark['mean_score']}",
                "pairs"):
        t.add_column(col)
    for h in history:
        m = h["dev"]
        cells = ["-", "-"] if m is None else [
            f"{100 * m['success_rate']:.1f}% [{100 * m['success_ci95'][0]:.1f}, {100 * m['success_ci95'][1]:.1f}] "
            f"(n={m['scored_episodes']})", f"{m['mean_score']:.3f}"]
        t.add_row(str(h["iteration"]), *cells, str(h.get("pairs", "-")))
    console.print(t)
    for split, d in vs_bc.items():
        now, then = result["test"][split]["mean_score"], result["bc_test"][split]["mean_score"]
        score = f" (mean score {now:.3f} vs {then:.3f})" if metric == "mean_score" else ""
        console.print(f"[eto] {split}: iteration {best['iteration']} "
                      f"{100 * result['test'][split]['success_rate']:.1f}% vs BC "
                      f"{100 * result['bc_test'][split]['success_rate']:.1f}%{score}, paired difference in success "
                      f"{100 * d['diff']:+.1f} [{100 * d['diff_ci95'][0]:+.1f}, {100 * d['diff_ci95'][1]:+.1f}] "
                      f"(n={d['n']}, McNemar p={d['mcnemar_p']:.3f})")
        for game, g in d["per_game"].items():
            console.print(f"[eto]   {game}: {100 * g['diff']:+.1f} [{100 * g['diff_ci95'][0]:+.1f}, "
                          f"{100 * g['diff_ci95'][1]:+.1f}] (n={g['n']}, McNemar p={g['mcnemar_p']:.3f})")
    return result
