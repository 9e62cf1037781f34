"""Gather a Hydra sweep's results into one table (make sweep-table ARGS="run_name=<sweep>").

With a sweep from another run's BC, pass the same ``paths.base`` (its BC dev evaluation is the
baseline of the dev column); on a plug-in environment, the same ``env=<name>`` (the config composes
as `eto-train`'s does: plug-ins' sections, $ETO_TRAIN_CONFIGS).

Every job of `make eto ARGS="-m run_name=<sweep> eto.dpo.beta=0.1,0.5 ..."` leaves
runs/<sweep>/<its overrides>/eto/result.json, and the sweep records its jobs in runs/<sweep>/sweep.json
before the first runs (src/eto_train/sweeps.py); this writes runs/<sweep>/sweep.md (and prints it): a row
for every job with its status (done; failed or stopped, and in which stage; missing: never ran), and for
each finished one dev success per iteration, the best iteration, and the best policy against BC on each
test split, paired on the same seeds.
"""

import json
import sys
from pathlib import Path

import hydra
from rich.console import Console
from rich.table import Table

from eto_train.evaluation import paired, successes
from eto_train.interrupt import interruptible
from eto_train.reporting import pct
from eto_train.store import write_atomic
from eto_train.sweeps import jobs_of


def main(cfg) -> None:
    with interruptible(cfg, resume=False):  # Ctrl-C: one line, exit 130
        _table(cfg)


def _table(cfg) -> None:
    sweep = Path(cfg.paths.run)
    found = jobs_of(sweep)
    if not found:
        raise SystemExit(f"{sweep}: no sweep job (no sweep.json, no */eto/result.json); run the sweep first")
    splits = list(cfg.eval.splits)
    if cfg.eto.dev_split is None:
        raise SystemExit("sweep table: it compares iterations on the dev split, and eto.dev_split is null "
                         "(the paper's profile); sweep with a profile that has one (eto=cpu)")
    shared_bc_dev = Path(cfg.paths.bc_eval) / cfg.eto.dev_split / "episodes.jsonl"  # paths.base=<the BC run>
    head = ["job (overrides)", "status", "dev success by iteration (BC, 1, 2, ...)",
            "dev: last iteration vs BC [95% CI], p", "best"]
    head += [f"{s}: best vs BC [95% CI], p" for s in splits]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    table = Table(title=f"sweep {sweep}")
    for h in head:
        table.add_column(h)
    for row in found:
        r = row.result
        if r is None:
            cells = [row.folder, row.status] + ["-"] * (len(head) - 2)
            lines.append("| " + " | ".join(cells) + " |")
            table.add_row(*cells)
            continue
        own = sweep / row.folder / "eval" / "bc" / cfg.eto.dev_split / "episodes.jsonl"  # a job's own BC evaluation
        bc_dev = own if own.exists() else shared_bc_dev
        dev = ", ".join(f"{100 * h['dev']['success_rate']:.0f}" for h in r["history"])
        last = Path(r["history"][-1]["policy"]).parent.parent / "eval" / cfg.eto.dev_split / "episodes.jsonl"
        d = paired(successes(bc_dev), successes(last), cfg.compare.bootstrap, cfg.seed) \
            if len(r["history"]) > 1 and bc_dev.exists() and last.exists() else None
        cells = [row.folder, row.status, dev + f" (n={r['history'][0]['dev']['scored_episodes']})",
                 f"{pct(d['diff'], d['diff_ci95'], True)}, p={d['mcnemar_p']:.3f}" if d else "-", str(r["best_iteration"])]
        for s in splits:
            d = r.get("best_vs_bc", {}).get(s)
            cells.append(f"{pct(r['test'][s]['success_rate'])} vs {pct(r['bc_test'][s]['success_rate'])}: "
                         f"{pct(d['diff'], d['diff_ci95'], True)}, p={d['mcnemar_p']:.3f} (n={d['n']})" if d else "-")
        lines.append("| " + " | ".join(cells) + " |")
        table.add_row(*cells)
    done = [row for row in found if row.status == "done"]
    rest = [row for row in found if row.status != "done"]
    summary = f"{len(done)} of {len(found)} jobs done" + (
        "; not done: " + ", ".join(row.name for row in rest) if rest else "")
    write_atomic(sweep / "sweep.md", "\n".join(lines) + f"\n\n{summary}\n")
    Console(width=200, markup=False).print(table)
    print(summary)
    print(f"-> {sweep / 'sweep.md'}")


def _run() -> None:
    """Hydra's main on eto-train's configs, as `eto-train` composes them: plug-ins' env sections stored
    first (env=<plug-in>), the folder $ETO_TRAIN_CONFIGS when set."""
    from eto_train.cli import configs_dir
    from eto_train.envs.registry import check_requested, store_plugin_configs

    store_plugin_configs(configs_dir())
    check_requested([a for a in sys.argv[1:] if "=" in a and not a.startswith("-")])
    hydra.main(config_path=configs_dir(), config_name="config", version_base="1.3")(main)()


if __name__ == "__main__":
    with interruptible(resume=False):  # and while Hydra starts up
        _run()
