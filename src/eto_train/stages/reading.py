"""Stage `reading` (make reading): does each policy read its observation? ETO's precondition.

Each policy of ``reading.policies`` plays ``reading.split`` (an ordinary eval stage under
``runs/<run>/eval/<tag>/<split>``, reused when it has been played already); then its first
mapreader move and its first twc take are tested against the chance line of its own mix
(src/eto_train/reading.py). Result: ``runs/<run>/reading/<split>.json`` and a table. On a finished,
read-only run folder nothing is written there: the evaluations are up to date (looked at without
their locks, manifest.Stage.done), and a result that differs from the one kept goes to
``$TMPDIR/eto-train-reading/<run_name>/`` (report.writable_place).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..config import Config, require
from ..envs import check_splits, make_env
from ..reading import first_move_test, first_take_test, right_answers
from .. import layout
from ..store import read_episodes, write_json_if_changed
from .evaluate import evaluate_policy
from .report import writable_place


def policies_of(cfg) -> dict[str, str]:
    """``reading.policies``: tag -> checkpoint. A value naming an ETO loop's ``result.json``
    (``eto_best: ${paths.eto}/result.json``, as scripts/demo.sh passes) stands for the policy that
    loop kept, and its tag is left out when the loop kept BC (no iteration beat it on dev)."""
    out = {}
    for tag, path in cfg.reading.policies.items():
        if (p := Path(str(path))).name == layout.RESULT and p.is_file():
            result = json.loads(p.read_text())
            if not result.get("best_iteration"):
                continue
            path = result["best_policy"]
        out[tag] = str(path)
    return out


def run(cfg: Config) -> dict[str, Any]:
    """Each policy of :func:`policies_of` on ``reading.split``. BC's episodes are BC's evaluation
    (``paths.bc_eval``), the others' ``eval/<tag>``."""
    require(cfg, "eto_train.stages.reading.run")
    r = cfg.reading
    check_splits(cfg.env.plain(), {"reading.split": r.split})
    env = make_env(cfg.env.plain())
    try:
        tasks = env.tasks(r.split)
        gold_move, takeable = right_answers(env, tasks)
    finally:
        env.close()
    runs, results = layout.RunLayout.of(cfg), {}
    for tag, path in policies_of(cfg).items():
        root = runs.evaluation(tag)
        evaluate_policy(cfg, str(path), tag, [r.split], root)
        eps = read_episodes(layout.episodes(root, r.split))
        by_game = lambda g: [e for e in eps if e.game == g]  # noqa: E731
        kw = {"permutations": int(r.permutations), "seed": int(cfg.seed)}
        results[tag] = {"policy": eps[0].policy.id if eps else str(path),
                        "success": {g: sum(e.success for e in by_game(g)) / max(1, len(by_game(g)))
                                    for g in sorted({e.game for e in eps})},
                        "first_move": first_move_test(by_game("mapreader"), gold_move, **kw)
                        if by_game("mapreader") else None,
                        "first_take": first_take_test(by_game("twc"), takeable, **kw) if by_game("twc") else None}
    report = {"split": r.split, "alpha": r.alpha, "policies": results}
    out = runs.reading(r.split)
    if not _holds(out, report):
        write_json_if_changed(writable_place(cfg, out.parent, layout.READING) / out.name, report)
    Console(width=140, markup=False).print(table(report))
    return report


def _holds(path, report: dict[str, Any]) -> bool:
    """Whether ``path`` already holds this very result (then a rerun writes nothing)."""
    try:
        return json.loads(path.read_text()) == json.loads(json.dumps(report, default=str))
    except (OSError, ValueError):
        return False


def table(report: dict[str, Any]) -> Table:
    t = Table(title=f"Does the policy read? first moves / takes on {report['split']} "
                    f"(one-sided permutation test; holds at p < {report['alpha']})")
    for col in ("policy", "test", "n", "right", "chance line", "p", "holds", "its choices"):
        t.add_column(col)
    for tag, res in report["policies"].items():
        for name, key in (("mapreader first move", "first_move"), ("twc first take in the room", "first_take")):
            x = res[key]
            if x is None:
                continue
            choices = ", ".join(f"{c} {k}" for c, k in list(x["choices"].items())[:5])
            t.add_row(tag, name, str(x["n"]), str(x["hits"]), f"{x['expected']:.1f}", f"{x['p']:.2g}",
                      "yes" if x["p"] < report["alpha"] else "no", choices)
    return t
