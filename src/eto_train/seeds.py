"""Several seeds of `eto` and `compare`: each seed's whole run in its own folder, then their aggregate.

``seeds: [0, 1, 2, 3, 4]`` (root of the config; null: one run at ``seed``, as before) makes the
cli's ``eto`` and ``compare`` stages run once per seed, each as a plain run of its own with
``seed=k`` in ``<run>/seed<k>/`` (the run's own ``seed``: the run folder itself; :func:`seed_config`): its own experts, base model, BC, cache,
ETO iterations and compare arms, since BC's data order, exploration sampling and DPO's order all
follow the seed. The held-out tasks do not: the environments' splits are fixed by their
definitions (fold, start, count; envs/holdout.py for dev), never by ``seed``, so every seed plays
the same test tasks. Each seed's stages skip what their manifests say is done, so a rerun (or a
killed run started again) redoes only the unfinished seeds.

Then :func:`aggregate` writes ``<run>/seeds.json`` and ``seeds.md`` (one entry per stage:
``compare`` and ``eto``). For each arm (compare's variants and control; eto's kept policy) and
split: each seed's paired difference to BC (and to the control), as that seed's compare.json /
result.json has it (its task-bootstrap interval included), and over seeds the mean of the
per-seed differences with a 95% interval from a two-stage bootstrap (seeds resampled, then each
drawn seed's tasks, paired: :func:`eto_train.stats.two_stage_bootstrap_ci`).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from . import layout
from .config import Config, load
from .distributed import is_main
from .evaluation import BEHAVIOUR, behaviour, same_episodes, successes
from .reporting import pct
from .stats import two_stage_bootstrap_ci
from .store import write_atomic, write_json

LEVEL = 0.95
UNTUNED = layout.UNTUNED
RULE = ("mean over seeds of each seed's paired difference (on the tasks both policies played); 95% interval: "
        "two-stage percentile bootstrap (seeds resampled with replacement, then each drawn seed's tasks, the same "
        "task draw for both policies)")


def seed_config(cfg, seed: int) -> Config:
    """The config of seed ``seed``'s run: ``cfg`` (the composed DictConfig, interpolations
    unresolved) with ``seed=k``, no ``seeds``, and its run and base folders moved to
    ``<run>/seed<k>`` and ``<base>/seed<k>``; every path interpolated from them follows (experts,
    model, bc, eval, eto, compare, cache, reading's and export's defaults). The run's own ``seed``
    is the run itself (its folders unchanged): seeds added to a finished single run reuse it."""
    from omegaconf import OmegaConf, open_dict

    run, base = (str(OmegaConf.select(cfg, key)) for key in ("paths.run", "paths.base"))
    node = copy.deepcopy(cfg)
    with open_dict(node):
        node.seed, node.seeds = seed, None
        if seed == cfg.seed:
            return load(node)
        node.run_name = f"{cfg.run_name}/{layout.SEED_RUN.format(seed=seed)}"
        node.paths.run = str(layout.seed_run(run, seed))
        node.paths.base = str(layout.seed_run(base, seed))
    return load(node)


def run_seeds(stage: str, function: Callable[[Config], Any], cfg) -> dict[str, Any]:
    """The stage (``stage``: eto | compare) once per seed of ``cfg.seeds``, then the aggregate.
    Every seed's config is validated before the first one runs."""
    config = load(cfg)
    console = Console(markup=False)
    configs = {k: seed_config(cfg, k) for k in config.seeds}
    for i, (k, kcfg) in enumerate(configs.items(), 1):
        console.print(f"[seeds] {stage}: seed {k} ({i} of {len(configs)}) in {kcfg.paths.run}")
        function(kcfg)
    result = aggregate(stage, configs, config.compare.bootstrap, config.seed)
    if is_main():
        write(Path(config.paths.run), stage, result)
        console.print(markdown({stage: result}))
        console.print(f"-> {layout.seeds_file(config.paths.run, '.json')}, {layout.seeds_file(config.paths.run, '.md')}")
    return result


def paired_diffs(base: dict[str, bool], other: dict[str, bool]) -> list[float]:
    """``other`` minus ``base`` per task both played (sorted by task id), as evaluation.paired pairs them."""
    return [float(other[t]) - float(base[t]) for t in sorted(set(base) & set(other))]


def over_seeds(per_seed: dict[int, list[float]], n_boot: int, seed: int) -> dict[str, Any]:
    """The seeds' mean paired difference with its two-stage bootstrap interval (seeds with no task
    both policies played are left out, and counted)."""
    usable = {k: d for k, d in per_seed.items() if d}
    if not usable:
        return {"mean": None, "ci95": None, "seeds": 0, "tasks": 0}
    mean, lo, hi = two_stage_bootstrap_ci(list(usable.values()), n_boot, seed, LEVEL)
    return {"mean": mean, "ci95": [lo, hi], "seeds": len(usable), "tasks": sum(map(len, usable.values()))}


def verdict(ci95: list[float] | None) -> str | None:
    """One interval read as the rules read it (76994e1, 86a1f8c): lower end above 0 "beats", upper end below 0
    "loses", otherwise "tie" (no difference detected); no interval: None."""
    if ci95 is None:
        return None
    return "beats" if ci95[0] > 0 else "loses" if ci95[1] < 0 else "tie"


def claims(arms: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The rules' claim per arm: each split's verdict against BC and against the control, and ``helps``: the arm
    beats BC and the control on every split it was played on. The control (the comparator) and the untuned model
    (a descriptive row) make no claim; an arm never met with the control cannot hold it."""
    out: dict[str, dict[str, Any]] = {}
    for arm, by_split in arms.items():
        if arm in ("control", UNTUNED):
            continue
        splits = {split: {vs: verdict((d.get(vs) or {}).get("ci95")) for vs in ("vs_bc", "vs_control")}
                  for split, d in by_split.items()}
        out[arm] = {"splits": splits,
                    "helps": bool(splits) and all(v == "beats" for s in splits.values() for v in s.values())}
    return out


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _untuned(configs: dict[int, Config]) -> Path | None:
    """The untuned model's evaluation (``eto-train eval eval.tag=untuned``): a seed's own, else the
    first seed run that has one. Greedy play of the model before BC depends on no seed, so it is
    played once and paired with every seed's BC."""
    for kcfg in configs.values():
        folder = layout.RunLayout.of(kcfg).evaluation(UNTUNED)
        if folder.is_dir():
            return folder
    return None


def _read(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


@dataclass
class Source:
    """Where one seed's results are read from: its run folder (``layout``), or one unit of it kept in a
    study's results folder (results.py). ``resolve`` maps a path the run's JSON files record to where the
    file is now; ``untuned`` is the untuned model's evaluation to pair with this source's BC (None: none);
    ``required``: a missing compare.json / result.json is an error (a run folder), not a unit that played
    another part of its seed (a results folder)."""
    seed: int
    layout: layout.RunLayout
    resolve: Callable[[str], Path] = Path
    untuned: Path | None = None
    name: str = ""
    required: bool = True


def aggregate(stage: str, configs: dict[int, Config], n_boot: int, seed: int) -> dict[str, Any]:
    """``stage``'s per-seed results (each seed's compare.json or eto result.json) and their
    intervals over seeds: ``arms -> arm -> split -> vs_bc | vs_control -> {per_seed, mean, ci95}``."""
    untuned = _untuned(configs)
    sources = [Source(k, layout.RunLayout.of(kcfg), untuned=untuned) for k, kcfg in configs.items()]
    return aggregate_sources(stage, sources, n_boot, seed,
                             runs={str(k): str(c.paths.run) for k, c in configs.items()})


def aggregate_sources(stage: str, sources: list[Source], n_boot: int, seed: int,
                      runs: dict[str, str] | None = None) -> dict[str, Any]:
    """:func:`aggregate` over ``sources``: a seed's run folder each, or (a results folder) the units each
    seed was played in, every arm of a seed in one unit (two units with the same arm of a seed: an error)."""
    # per seed: the arm -> split -> {vs -> (its row as the seed's own result has it, its outcomes)}
    rows: dict[str, dict[str, dict[str, dict[int, tuple[dict, list[float]]]]]] = {}
    extra: dict[str, dict[str, Any]] = {}
    where: dict[tuple[str, int], str] = {}  # (arm, seed) -> the unit that played it

    def add(arm: str, split: str, vs: str, src: Source, row: dict, base: Path, other: Path) -> None:
        k = src.seed
        if where.setdefault((arm, k), src.name) != src.name:
            raise ValueError(f"seed {k}: arm {arm!r} was played in two units ({where[arm, k]} and {src.name}): "
                             f"a seed's arm is played once")
        rows.setdefault(arm, {}).setdefault(split, {}).setdefault(vs, {})[k] = (
            row, paired_diffs(successes(base), successes(other)))

    def play_key(name: str, split: str, k: int, unit: str) -> str:
        """seed k's key in a policy's play table: a second unit's BC (or untuned) of the same seed gets its own"""
        have = extra.get("play", {}).get(name, {}).get(split, {})
        return str(k) if str(k) not in have else f"{k} ({unit})"

    played: dict[int, list[tuple[str, dict[str, dict[str, dict[str, bool]]]]]] = {}  # seed -> [(unit, split -> policy -> task -> won)]
    for src in sources:
        k, runs_k = src.seed, src.layout
        if stage == "compare":
            file = layout.compare_file(runs_k.compare, ".json")
            if not file.exists() and not src.required:
                continue
            res = _read(file)
            evals = {n: src.resolve(p) for n, p in res["evaluations"].items()}
            untuned = src.untuned
            if untuned is not None:  # the model before BC, the same episodes for every seed: a row like an arm's
                evals[UNTUNED] = untuned
                for split, table in res["splits"].items():
                    episodes = layout.episodes(untuned, split)
                    if episodes.exists():
                        won = successes(episodes)
                        diffs = paired_diffs(successes(layout.episodes(evals["bc"], split)), won)
                        table[UNTUNED] = {"success": _mean([float(v) for v in won.values()]),
                                          "vs_bc": {"diff": _mean(diffs)}}
                        res.setdefault("behaviour", {}).setdefault(split, {})[UNTUNED] = behaviour(episodes)
            played.setdefault(k, []).append((src.name, {
                split: {n: successes(layout.episodes(evals[n], split)) for n in table if n != UNTUNED}
                for split, table in res["splits"].items()}))
            for split, table in res["splits"].items():
                for arm, r in table.items():
                    for vs, against in (("vs_bc", "bc"), ("vs_control", "control")):
                        if vs in r:
                            add(arm, split, vs, src, r[vs], layout.episodes(evals[against], split),
                                layout.episodes(evals[arm], split))
            for arm, c in (res.get("rollout_cost") or {}).items():
                extra.setdefault("rollout_cost", {}).setdefault(arm, {})[str(k)] = c
            # what each arm trained on (its pairs, its DPO steps) and how each policy played: success,
            # behaviour rates and the share of tasks it played exactly as BC did
            for arm, n_steps in (res.get("dpo_steps") or {}).items():
                stats = _read(layout.pairs_stats(runs_k.compare / arm))
                extra.setdefault("training", {}).setdefault(arm, {})[str(k)] = {"pairs": stats["pairs"],
                                                                               "dpo_steps": n_steps}
            for split, table in res["splits"].items():
                for name, r in table.items():
                    play = {"success": r["success"], **(res.get("behaviour", {}).get(split, {}).get(name) or {})}
                    if name != "bc":
                        play["same_as_bc"] = same_episodes(layout.episodes(evals["bc"], split),
                                                           layout.episodes(evals[name], split))["rate"]
                    by_split = extra.setdefault("play", {}).setdefault(name, {}).setdefault(split, {})
                    by_split[play_key(name, split, k, src.name)] = play
        else:  # eto: the kept policy (best on dev, or the last one) against BC
            if not runs_k.eto_result.exists() and not src.required:
                continue
            res = _read(runs_k.eto_result)
            for split, d in res["best_vs_bc"].items():
                row = {key: v for key, v in d.items() if key != "per_game"}
                add("eto", split, "vs_bc", src, row, layout.episodes(runs_k.evaluation("bc"), split),
                    layout.episodes(src.resolve(res["best_eval"]), split))
            extra.setdefault("best_iteration", {})[str(k)] = res["best_iteration"]
    if stage == "compare":
        across_units(rows, played)
    seeds = sorted({src.seed for src in sources})
    arms = {arm: {split: {vs: {"per_seed": {str(k): row for k, (row, _) in per.items()},
                               **over_seeds({k: d for k, (_, d) in per.items()}, n_boot, seed)}
                          for vs, per in by_vs.items()}
                  for split, by_vs in by_split.items()}
            for arm, by_split in rows.items()}
    out = {"seeds": seeds, "runs": runs if runs is not None else {}, "bootstrap": n_boot, "level": LEVEL,
           "rule": RULE, "arms": arms, "claim": claims(arms), **extra}
    if any(src.name for src in sources):
        out["units"] = {src.name: src.seed for src in sources}
    return out


def across_units(rows: dict, played: dict[int, list[tuple[str, dict]]]) -> None:
    """Arms played in another unit than their seed's control (a seed in units, each with its own BC): against the
    control through their paired differences to their own units' BCs, per task: (arm - its BC) - (control - its
    BC), on the tasks all four played (the control's unit's BC and the arm's unit's BC are each a unit's own)."""
    for k, units in played.items():
        home = [(name, by_split) for name, by_split in units if any("control" in t for t in by_split.values())]
        if len(home) != 1:
            continue
        ctrl_unit, ctrl = home[0]
        for name, by_split in units:
            if name == ctrl_unit:
                continue
            for split, table in by_split.items():
                if split not in ctrl or "control" not in ctrl[split]:
                    continue
                c, cb = ctrl[split]["control"], ctrl[split]["bc"]
                for arm, a in table.items():
                    if arm in ("bc", "control"):
                        continue
                    b = table["bc"]
                    tasks = sorted(set(a) & set(b) & set(c) & set(cb))
                    d = [(float(a[t]) - float(b[t])) - (float(c[t]) - float(cb[t])) for t in tasks]
                    row = {"diff": _mean(d), "tasks": len(tasks), "across_units": f"{name} against {ctrl_unit}"}
                    rows.setdefault(arm, {}).setdefault(split, {}).setdefault("vs_control", {})[k] = (row, d)


def write(run: Path, stage: str, result: dict[str, Any]) -> None:
    """``<run>/seeds.json`` (this stage's entry replaced, the other stage's kept) and ``seeds.md``."""
    from .distributed import is_main

    if not is_main():  # one writer per file: the main process
        return
    path = layout.seeds_file(run, ".json")
    try:
        every = _read(path) if path.exists() else {}
    except ValueError:  # a damaged aggregate: it is rebuilt from the seeds' own results
        every = {}
    every[stage] = result
    write_json(path, every)
    write_atomic(layout.seeds_file(run, ".md"), markdown(every))


def _mean_pct(rows, key: str) -> str:
    values = [r[key] for r in rows if r.get(key) is not None]
    return f"{100 * sum(values) / len(values):.1f}%" if values else "-"


def _cell(d: dict[str, Any] | None, seeds: list[str]) -> tuple[str, str]:
    if not d:
        return "-", "-"
    per = ", ".join(f"s{k} {pct(d['per_seed'][k]['diff'], signed=True)}" if k in d["per_seed"] else f"s{k} -"
                    for k in seeds)
    mean = "-" if d["mean"] is None else pct(d["mean"], d["ci95"], signed=True)
    return per, mean


def markdown(every: dict[str, dict[str, Any]]) -> str:
    """The seeds' tables, one per stage: arm, split, the per-seed differences and their mean
    [95% CI], against BC and (compare) against the control."""
    lines: list[str] = []
    for stage, res in every.items():
        seeds = [str(k) for k in res["seeds"]]
        lines += [f"## {stage}: seeds {', '.join(seeds)}", "", f"{res['rule']}; {res['bootstrap']} resamples.", "",
                  "| arm | split | vs BC per seed | vs BC mean [95% CI] | vs control per seed | vs control mean [95% CI] |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for arm, by_split in res["arms"].items():
            for split, d in by_split.items():
                lines.append("| " + " | ".join([arm, split, *_cell(d.get("vs_bc"), seeds),
                                                *_cell(d.get("vs_control"), seeds)]) + " |")
        if res.get("claim"):  # the rule's reading of the intervals above, arm by arm
            splits = list(dict.fromkeys(s for c in res["claim"].values() for s in c["splits"]))
            heads = [f"{s} vs {who}" for who in ("BC", "control") for s in splits]
            lines += ["", "the claim: beats = the interval's lower end above 0, loses = its upper end below 0, "
                      "tie otherwise; an arm helps when it beats BC and the control on every split", "",
                      "| arm | " + " | ".join(heads) + " | helps |", "| --- | " + " | ".join("---" for _ in heads)
                      + " | --- |"]
            for arm, c in res["claim"].items():
                cells = [c["splits"].get(s, {}).get(vs) or "-" for vs in ("vs_bc", "vs_control") for s in splits]
                lines.append(f"| {arm} | " + " | ".join(cells) + f" | {'yes' if c['helps'] else 'no'} |")
        if res.get("rollout_cost"):
            train = res.get("training") or {}

            def per_seed(d: dict[str, Any], key: str) -> str:
                return ", ".join(f"s{k} {d[k][key]}" for k in seeds if k in d) or "-"

            lines += ["", "| arm | rollouts per seed | pairs per seed | DPO steps per seed |", "| --- | --- | --- | --- |"]
            lines += [f"| {arm} | {per_seed(c, 'total')} | {per_seed(train.get(arm, {}), 'pairs')} | "
                      f"{per_seed(train.get(arm, {}), 'dpo_steps')} |" for arm, c in res["rollout_cost"].items()]
        if res.get("play"):  # means over seeds of each policy's success and behaviour
            cols = [("success", "success"), ("same_as_bc", "same episodes as BC"), *BEHAVIOUR]
            lines += ["", "means over seeds; same episodes as BC: the share of tasks played with exactly BC's actions",
                      "", "| policy | split | " + " | ".join(h for _, h in cols) + " |",
                      "| --- | --- | " + " | ".join("---" for _ in cols) + " |"]
            for name, by_split in res["play"].items():
                for split, rows in by_split.items():
                    lines.append(f"| {name} | {split} | " + " | ".join(_mean_pct(rows.values(), key) for key, _ in cols)
                                 + " |")
        if res.get("best_iteration"):
            lines += ["", "kept iteration per seed: " + ", ".join(f"s{k} {v}" for k, v in res["best_iteration"].items())]
        lines.append("")
    return "\n".join(lines)
