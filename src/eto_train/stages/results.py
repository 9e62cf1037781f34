"""Stage `results`: a study's results kept outside its run folder, then the seeds' table from them alone.

    eto-train results experiment=real_study seed=0 seeds=null run_name=real_study/s0-a results.unit=a \\
        results.dir=docs/results/real_study           # after a unit finishes: collect it, aggregate
    eto-train results results.dir=docs/results/real_study results.collect=false   # a fresh clone: aggregate only

With ``env.metric: mean_score`` (ScienceWorld, WebShop) it writes ``scores.json`` / ``scores.md`` beside the seeds'
table too: each unit's policies (untuned, BC, ETO) by the paper's metric, average final score, with success, the
paired differences and the behaviour rates (results.scores); a split that repeats training tasks (ScienceWorld's
``seen``: ETO's train list holds some of its variations) gets the same tables without them as well
(:func:`demonstrated`). ``results.partial=true`` collects a run whose eto has not finished yet (a piece of a study
played in pieces, under its own unit name).

With ``seeds`` each seed's run folder (seeds.py) is collected as ``seed<k>/<results.unit or all>``; without,
the run folder is seed ``seed``'s unit. What is kept and why: :mod:`eto_train.results`.
"""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

from .. import layout, results
from ..config import Config
from ..errors import ConfigError


def _inside(run: Path, path: Path, key: str) -> str:
    rel = os.path.relpath(path, run)
    if rel.startswith(".."):
        raise ConfigError(f"{key}={path}: outside the run folder {run}; results collects a run folder, so its "
                          f"{key} has to be inside it (a sweep job shares BC's: collect the base run)")
    return rel


def demonstrated(cfg: Config, splits: list[str]) -> dict[str, list[str]]:
    """Each split's task ids that the training split (the demonstrations) lists too, from the environment's task
    lists (no simulator starts): :func:`eto_train.evaluation.demonstrated_tasks`."""
    from ..envs import make_env
    from ..evaluation import demonstrated_tasks

    env = make_env(cfg.env.plain())
    try:
        return {s: demonstrated_tasks(env, s) for s in splits}
    finally:
        env.close()


def run(cfg: Config) -> dict:
    r = cfg.results
    if r is None or r.dir is None:
        raise ConfigError("results.dir: null: name the folder that keeps the results (outside runs/, e.g. "
                          "docs/results/<study>)")
    folder = Path(r.dir)
    console = Console(markup=False)
    if r.collect:
        unit = r.unit or "all"
        runs = layout.RunLayout.of(cfg)
        # the run's layout inside its folder; a seed's run folder (seeds.seed_config: <run>/seed<k>, the run's own
        # seed the run itself) has the same one
        paths = {key: _inside(runs.run, getattr(runs, key), f"paths.{key}") for key in ("bc", "bc_eval", "eto",
                                                                                       "compare")}
        for k in cfg.seeds or [cfg.seed]:
            run_k = runs.run if k == cfg.seed else layout.seed_run(runs.run, k)
            dest = folder / layout.SEED_RUN.format(seed=k) / unit
            how = results.collect(run_k, dest, k, unit, paths, partial=bool(r.partial))
            console.print(f"[results] seed {k}, unit {unit}: {how} ({run_k} -> {dest})")
    every = results.aggregate(folder, cfg.compare.bootstrap, r.seed)  # not cfg.seed: a unit's own
    js, md = results.write(folder, every)
    console.print(f"[results] {', '.join(every)} over {len(results.sources(folder))} unit(s) -> {js}, {md}")
    if cfg.env.metric == "mean_score":  # the paper's metric there (ScienceWorld, WebShop): average final score
        splits = list(cfg.eval.splits)
        table = results.scores(folder, splits, cfg.compare.bootstrap, r.seed, demonstrated(cfg, splits))
        if table:
            js, md = results.write_scores(folder, table, cfg.compare.bootstrap)
            console.print(f"[results] average final score of {len(table)} unit(s) -> {js}, {md}")
    return every
