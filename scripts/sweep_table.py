"""Gather a Hydra sweep's results into one table (make sweep-table ARGS="run_name=<sweep>").

With a sweep from another run's BC, pass the same ``paths.base`` (its BC dev evaluation is the
baseline of the dev column).

Every job of `make eto ARGS="-m run_name=<sweep> eto.dpo.beta=0.1,0.5 ..."` leaves
runs/<sweep>/<its overrides>/eto/result.json; this reads them all and writes
runs/<sweep>/sweep.md (and prints it): dev success per iteration, the best iteration, and
the best policy against BC on each test split, paired on the same seeds.
"""

import json
from pathlib import Path

import hydra
from rich.console import Console
from rich.table import Table

from eto_train.evaluation import paired, successes
from eto_train.interrupt import interruptible
from eto_train.reporting import pct
from eto_train.store import write_atomic


def rows(sweep: Path):
    for result in sorted(sweep.glob("*/eto/result.json")):
        yield result.parent.parent.name, json.loads(result.read_text())


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    with interruptible(cfg, resume=False):  # Ctrl-C: one line, exit 130
        _table(cfg)


def _table(cfg) -> None:
    sweep = Path(cfg.paths.run)
    found = list(rows(sweep))
    if not found:
        raise SystemExit(f"{sweep}: no finished sweep job (no */eto/result.json); run the sweep first")
    splits = list(cfg.eval.splits)
    if cfg.eto.dev_split is None:
        raise SystemExit("sweep table: it compares iterations on the dev split, and eto.dev_split is null "
                         "(the paper's profile); sweep with a profile that has one (eto=cpu)")
    bc_dev = Path(cfg.paths.bc_eval) / cfg.eto.dev_split / "episodes.jsonl"  # paths.base=<the BC run>
    head = ["job (overrides)", "dev success by iteration (BC, 1, 2, ...)", "dev: last iteration vs BC [95% CI], p", "best"]
    head += [f"{s}: best vs BC [95% CI], p" for s in splits]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    table = Table(title=f"sweep {sweep}")
    for h in head:
        table.add_column(h)
    for job, r in found:
        dev = ", ".join(f"{100 * h['dev']['success_rate']:.0f}" for h in r["history"])
        last = Path(r["history"][-1]["policy"]).parent.parent / "eval" / cfg.eto.dev_split / "episodes.jsonl"
        d = paired(successes(bc_dev), successes(last), cfg.compare.bootstrap, cfg.seed) \
            if len(r["history"]) > 1 and bc_dev.exists() and last.exists() else None
        cells = [job, dev + f" (n={r['history'][0]['dev']['scored_episodes']})",
                 f"{pct(d['diff'], d['diff_ci95'], True)}, p={d['mcnemar_p']:.3f}" if d else "-", str(r["best_iteration"])]
        for s in splits:
            d = r.get("best_vs_bc", {}).get(s)
            cells.append(f"{pct(r['test'][s]['success_rate'])} vs {pct(r['bc_test'][s]['success_rate'])}: "
                         f"{pct(d['diff'], d['diff_ci95'], True)}, p={d['mcnemar_p']:.3f} (n={d['n']})" if d else "-")
        lines.append("| " + " | ".join(cells) + " |")
        table.add_row(*cells)
    write_atomic(sweep / "sweep.md", "\n".join(lines) + "\n")
    Console(width=200, markup=False).print(table)
    print(f"-> {sweep / 'sweep.md'}")


if __name__ == "__main__":
    with interruptible(resume=False):  # and while Hydra starts up
        main()
