"""Result tables and plots, shared by the report and compare stages and ``scripts/sweep_table.py``.

Rates in percent (:func:`pct`), the table cells of ``evaluation.comparison`` rows
(:func:`table_rows`), the environment faults of a run's rollout stages (:func:`env_failures`,
:func:`fault_accounts`) and the plot of success against ETO iteration (:func:`iteration_plot`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import layout
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
