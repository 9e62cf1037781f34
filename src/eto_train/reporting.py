"""Result tables and plots, shared by the report and compare stages and ``scripts/sweep_table.py``.

Rates in percent (:func:`pct`), the table cells of ``evaluation.comparison`` rows
(:func:`table_rows`), the environment faults of a run's rollout stages (:func:`env_failures`,
:func:`fault_accounts`), the seconds each stage of a run took per seed (:func:`stage_seconds`,
``scripts/stage_costs.py``) and the plot of success against ETO iteration (:func:`iteration_plot`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import layout
from .evaluation import BEHAVIOUR
from .manifest import NEXT, OLD
from .store import read_episodes


def env_failures(path: Path) -> int:
    return sum(e.status == "environment_failure" for e in read_episodes(path))


def fault_accounts(run: Path) -> list[dict[str, Any]]:
    """Per rollout stage of the run: environment errors met, episodes recovered, environment
    failures, and (when faults were injected) the injected count from the stage's manifest.
    ``cache/`` holds copies of stage outputs and is left out so nothing is counted twice."""
    rows = []
    for file in sorted(f for f in run.rglob(layout.EPISODES) if ".next" not in f.parts):  # not a rerun set aside
        rel = file.parent.relative_to(run)
        if rel.parts[0] == "cache":
            continue
        eps = read_episodes(file)
        manifest = layout.manifest(file.parent)
        injected = None
        if manifest.exists():
            injected = (json.loads(manifest.read_text()).get("metrics") or {}).get("faults", {}).get("injected_faults")
        rows.append({"stage": str(rel), "episodes": len(eps), "injected": injected,
                     "errors": sum(len(e.env_errors) for e in eps),
                     "recovered": sum(bool(e.env_errors) and e.status != "environment_failure" for e in eps),
                     "environment_failures": sum(e.status == "environment_failure" for e in eps)})
    return rows


# copies of stages (a run's cache, a study's dev diagnosis) and set-aside reruns: not stages of the run
SKIPPED = ("cache", "diag", NEXT, OLD)


def stage_seconds(run: Path, own_seed: int = 0, seen: set[tuple] | None = None) -> dict[int, dict[str, dict[str, Any]]]:
    """Per seed, per stage folder (its path inside the seed's folder): the manifest's status,
    seconds and peak memory (GB: the process's resident peak, its children's, the GPU's; None for a
    stage finished before manifests recorded it). The run folder is seed ``own_seed``'s (``seeds=`` puts seed k in ``<run>/seed<k>``).
    A stage whose manifest repeats one already met (the same stage, config hash and finish time: a
    result reused by content hash, e.g. the exploration every arm shares) is marked ``reused``, so
    a total counts its seconds once; the seed's own stages come before its compare arms. ``seen``: the stages met
    in earlier calls (a study's units, a folder each: a stage copied from an earlier unit is ``reused``)."""
    prefix = layout.SEED_RUN.format(seed="")
    folders = {own_seed: run, **{int(d.name[len(prefix):]): d for d in run.glob(f"{prefix}*")
                                 if d.name[len(prefix):].isdigit()}}
    seen = set() if seen is None else seen
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for seed, folder in sorted(folders.items()):
        found = []
        for m in folder.rglob(layout.MANIFEST):
            rel = m.parent.relative_to(folder)
            if rel.parts and (any(p in SKIPPED for p in rel.parts) or (folder == run and rel.parts[0].startswith(prefix))):
                continue
            found.append((rel.parts[0] == "compare", rel.as_posix(), m))
        rows = out.setdefault(seed, {})
        for _, rel, m in sorted(found):
            d = json.loads(m.read_text())
            key = (d.get("stage"), d.get("config_hash"), d.get("finished_at"))
            reused = d.get("status") == "done" and key in seen
            seen.add(key)
            mem = d.get("memory") or {}
            rows[rel] = {"status": d.get("status"), "seconds": d.get("seconds"), "reused": reused,
                         "peak_rss_gb": mem.get("peak_rss_gb"), "peak_children_rss_gb": mem.get("peak_children_rss_gb"),
                         "peak_device_gb": mem.get("peak_device_gb")}
    return out


def memory_cell(r: dict[str, Any]) -> str:
    """A stage's peak memory as a table cell's tail: `, 2.41 GB` (+ children's, + GPU's), or nothing."""
    if r.get("peak_rss_gb") is None:
        return ""
    out = f", {r['peak_rss_gb']:.2f} GB"
    if r.get("peak_children_rss_gb"):
        out += f" + {r['peak_children_rss_gb']:.2f} GB children"
    if r.get("peak_device_gb") is not None:
        out += f", GPU {r['peak_device_gb']:.2f} GB"
    return out


def stage_seconds_markdown(costs: dict[int, dict[str, dict[str, Any]]]) -> str:
    """:func:`stage_seconds` as one table: a row per stage folder, a column per seed (seconds, and the
    peak resident memory where recorded), and each seed's total (reused stages not counted again,
    unfinished ones not at all) with the largest peak."""
    seeds = sorted(costs)
    stages = sorted({rel for k in seeds for rel in costs[k]}, key=lambda rel: (rel.startswith("compare"), rel))

    def cell(r):
        if r is None:
            return "-"
        if r["status"] != "done":
            return str(r["status"])
        return f"{r['seconds']:,.0f} s{memory_cell(r)}" + (" (reused)" if r["reused"] else "")

    lines = ["| stage | " + " | ".join(f"seed {k}" for k in seeds) + " |", "| --- |" + " --- |" * len(seeds)]
    lines += [f"| {rel} | " + " | ".join(cell(costs[k].get(rel)) for k in seeds) + " |" for rel in stages]
    totals = [sum(r["seconds"] or 0 for r in costs[k].values() if r["status"] == "done" and not r["reused"])
              for k in seeds]
    peaks = [max((r["peak_rss_gb"] for r in costs[k].values() if r.get("peak_rss_gb") is not None), default=None)
             for k in seeds]
    lines.append("| total, each stage once (largest peak) | " + " | ".join(
        f"{t:,.0f} s ({t / 3600:.1f} h)" + ("" if p is None else f", {p:.2f} GB") for t, p in zip(totals, peaks)) + " |")
    return "\n".join(lines) + "\n"


def unit_costs(results: Path) -> list[dict[str, Any]]:
    """A study played in units (``results/seed<k>/<unit>/``, each with its ``unit.json``), in the order they were
    collected: each unit's machine, the seconds of the stages it ran itself (a stage copied from an earlier unit of
    the same seed is counted there), and its largest peak with the stage that reached it. A resumed stage's
    manifest has the seconds of its last part only."""
    units = sorted((json.loads(info.read_text()) | {"folder": info.parent}
                    for info in results.glob("seed*/*/unit.json")), key=lambda u: (u["collected_at"], u["seed"]))
    seen: dict[int, set[tuple]] = {}
    out = []
    for u in units:
        rows = stage_seconds(u["folder"], u["seed"], seen.setdefault(u["seed"], set()))[u["seed"]]
        own = {rel: r for rel, r in rows.items() if r["status"] == "done" and not r["reused"]}
        peak = max(((r["peak_rss_gb"], rel) for rel, r in own.items() if r.get("peak_rss_gb") is not None),
                   default=(None, None))
        machine = u["machine"]
        out.append({"seed": u["seed"], "unit": u["unit"], "cpu": f"{machine['cpu']} ({machine['cpu_capability']})",
                    "torch": machine["torch"], "commit": u["commit"][:7], "collected_at": u["collected_at"],
                    "stages": len(own), "copied": len(rows) - len(own),
                    "seconds": sum(r["seconds"] or 0 for r in own.values()), "peak_rss_gb": peak[0], "peak_stage": peak[1]})
    return out


def unit_costs_markdown(rows: list[dict[str, Any]]) -> str:
    """:func:`unit_costs` as one table, a row per unit."""
    lines = ["| seed | unit | CPU | torch | commit | collected | stages run (copied or reused) | seconds of its own stages | "
             "largest peak |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        peak = "-" if r["peak_rss_gb"] is None else f"{r['peak_rss_gb']:.2f} GB ({r['peak_stage']})"
        lines.append(f"| {r['seed']} | {r['unit']} | {r['cpu']} | {r['torch']} | {r['commit']} | "
                     f"{r['collected_at'][:16]} | {r['stages']} ({r['copied']}) | "
                     f"{r['seconds']:,.0f} s ({r['seconds'] / 60:.0f} min) | {peak} |")
    return "\n".join(lines) + "\n"


def pct(x: float, ci=None, signed: bool = False) -> str:
    """A rate in percent, or (signed) a difference of rates in percentage points."""
    f, unit = ("+.1f", " pts") if signed else (".1f", "%")
    return f"{100 * x:{f}}{unit}" + (f" [{100 * ci[0]:{f}}, {100 * ci[1]:{f}}]" if ci is not None else "")


def table_rows(splits: dict[str, dict[str, Any]], extra=None) -> list[list[str]]:
    """Table cells per (split, game, policy) of ``evaluation.comparison`` rows: all games first,
    then each game; ``extra(row, game)`` appends cells of its own."""
    def diff(d):
        return [pct(d["diff"], d["diff_ci95"], signed=True), f"{d['mcnemar_p']:.3f}"] if d else ["-", "-"]

    out = []
    for split, rows in splits.items():
        games = sorted({g for r in rows.values() for g in r["per_game"]})
        for game in ["all", *games]:
            for n, r in rows.items():
                g = r if game == "all" else r["per_game"][game]
                out.append([split, game, n, str(g["n"]), pct(g["success"], g["success_ci95"]),
                            *diff(g.get("vs_bc")), *diff(g.get("vs_control")), *(extra(r, game) if extra else [])])
    return out


def iteration_plot(history: list[dict[str, Any]], path: Path, split: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [h["iteration"] for h in history]
    ys = [100 * h["dev"]["success_rate"] for h in history]
    lo = [100 * (h["dev"]["success_rate"] - h["dev"]["success_ci95"][0]) for h in history]
    hi = [100 * (h["dev"]["success_ci95"][1] - h["dev"]["success_rate"]) for h in history]
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3)
    ax.set_xticks(xs, ["BC" if x == 0 else str(x) for x in xs])
    ax.set_xlabel("ETO iteration")
    ax.set_ylabel(f"{split} success (%)")
    ax.set_ylim(0, 100)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- make compare-contrast: its markdown, chart and console table ------------------------------------

def print_comparison(results: dict[str, Any], md: Path, png: Path) -> None:
    """`make compare-contrast`'s table on the console: each arm, the control and BC, paired on the same seeds."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="contrast arms vs BC and the control (paired on the same seeds)")
    for col in ("split", "game", "policy", "n", "success [95% CI]", "vs BC [95% CI]", "p", "vs control [95% CI]", "p"):
        t.add_column(col, no_wrap=True)
    for cells in table_rows(results["splits"]):
        t.add_row(*cells)
    console = Console(width=120, markup=False)
    console.print(t)
    console.print("rollouts per arm: " + ", ".join(f"{v} {c['total']}" for v, c in results["rollout_cost"].items()))
    console.print(f"-> {md}, {png}")


def comparison_markdown(results: dict[str, Any]) -> str:
    lines = ["| split | game | policy | n | success [95% CI] | vs BC [95% CI] | McNemar p | vs control [95% CI] | McNemar p |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(results["splits"])]
    cost = results.get("rollout_cost") or {}
    if cost:  # what each arm's data cost: the rollouts behind its pairs
        lines += ["", "| arm | episodes explored + continuations | value rollouts | rollouts in all |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| {v} | {c['episodes']} | {c['value_rollouts']} | {c['total']} |" for v, c in cost.items()]
    beh = results.get("behaviour") or {}
    if beh:  # how each policy fails, beside whether it succeeds (evaluation.behaviour)
        lines += ["", "| split | policy | " + " | ".join(h for _, h in BEHAVIOUR) + " |",
                  "| --- | --- | " + " | ".join("---" for _ in BEHAVIOUR) + " |"]
        lines += [f"| {split} | {n} | " + " | ".join(f"{100 * r.get(k, 0.0):.1f}%" for k, _ in BEHAVIOUR) + " |"
                  for split, rows in beh.items() for n, r in rows.items()]
    return "\n".join(lines) + "\n"


def comparison_chart(results: dict[str, Any], path: Path) -> None:
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
