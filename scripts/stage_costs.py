"""What each stage of a run took, per seed: seconds and peak memory from the stages' manifests, as a markdown table.

    python scripts/stage_costs.py runs/real_study          # seed 0 in the run folder, seed k in seed<k>/
    python scripts/stage_costs.py runs/x --own-seed 3      # a run whose own seed is 3
    python scripts/stage_costs.py --units docs/results/real_study2   # a study played in units: a row per unit

A stage reused from another (the same result by content hash, e.g. the exploration the arms share) is
shown "(reused)" and counted once in the totals; unfinished stages show their status.
"""

import argparse
from pathlib import Path

from eto_train.reporting import stage_seconds, stage_seconds_markdown, unit_costs, unit_costs_markdown

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a run folder, or (--units) a study's results folder")
    p.add_argument("--own-seed", type=int, default=0, help="the seed whose stages are in the run folder itself")
    p.add_argument("--units", action="store_true", help="a results folder of units (seed<k>/<unit>/unit.json)")
    a = p.parse_args()
    if not a.run.is_dir():
        p.error(f"{a.run}: not a folder")
    if a.units:
        rows = unit_costs(a.run)
        if not rows:
            p.error(f"{a.run}: no seed<k>/<unit>/unit.json under it")
        print(unit_costs_markdown(rows), end="")
    else:
        print(stage_seconds_markdown(stage_seconds(a.run, a.own_seed)), end="")
