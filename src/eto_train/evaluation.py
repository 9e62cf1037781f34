"""Metrics over a set of episodes: per game and overall, with 95% confidence intervals.

Episodes that failed for reasons other than the policy (environment, orchestrator,
evaluator) are counted and reported but left out of the success rate's denominator.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection
from typing import Any

from .credit import rates
from .records import NOT_POLICY_FAULT, Episode, action_key, loop_marks
from .stats import wilson_ci


def has_loop(ep: Episode, repeats: int = 3) -> bool:
    """The agent repeated itself: one action ``repeats`` times in a row, or an A-B-A-B-A-B cycle
    (some step closes a loop: ``credit.loop_marks``)."""
    return any(loop_marks([action_key(s) for s in ep.steps], repeats))


def own_steps(ep: Episode) -> list:
    """The steps the policy itself took (an expert prefix replayed before it, step-level contrast, is not its)."""
    return ep.steps[int(ep.env_params.get("expert_prefix", 0) or 0):]


def unparsed_rate(episodes: list[Episode]) -> float:
    """Share of the policy's own outputs, over its accountable episodes, that did not parse into an
    action (``prompting.parse_action``: no ``Action:`` line, or an empty one). A real chat model writes
    free text; what could not be read as an action is counted here, apart from actions the game refused."""
    steps = [s for e in episodes if e.status not in NOT_POLICY_FAULT for s in own_steps(e)]
    return sum(s.action is None for s in steps) / len(steps) if steps else 0.0


def summarize(episodes: list[Episode]) -> dict[str, Any]:
    """Success, score and the behaviour rates (``credit.rates``: invalid, loop, redundant,
    premature stop) over the policy-accountable episodes, with the failures counted apart."""
    scored = [e for e in episodes if e.status not in NOT_POLICY_FAULT]
    n = len(scored)
    k = sum(e.success for e in scored)
    lo, hi = wilson_ci(k, n)
    return {
        "episodes": len(episodes),
        "scored_episodes": n,
        "successes": k,
        "success_rate": k / n if n else 0.0,
        "success_ci95": [lo, hi],
        "mean_score": sum(e.final_score for e in scored) / n if n else 0.0,
        "mean_steps": sum(e.num_steps for e in scored) / n if n else 0.0,
        **rates(episodes),  # invalid_action_rate, loop_rate, redundant_action_rate, premature_stop_rate
        "unparsed_rate": unparsed_rate(episodes),
        "max_steps_rate": sum(e.status == "max_steps" for e in scored) / n if n else 0.0,
        "environment_failures": sum(e.status == "environment_failure" for e in episodes),
        "environment_errors": sum(len(e.env_errors) for e in episodes),  # failed env calls, recovered or not
        "recovered_episodes": sum(bool(e.env_errors) and e.status != "environment_failure" for e in episodes),
        "other_failures": sum(e.status in ("orchestrator_failure", "evaluator_failure") for e in episodes),
        "model_failures": sum(e.status == "model_failure" for e in episodes),
        "truncated_episodes": sum(e.truncated_turns > 0 for e in episodes),
    }


def evaluate(episodes: list[Episode]) -> dict[str, Any]:
    by_game: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        by_game[e.game].append(e)
    return {"overall": summarize(episodes),
            "per_game": {g: summarize(eps) for g, eps in sorted(by_game.items())}}


def metrics_table(title: str, results: dict[str, dict[str, Any]]):
    """A rich table: one row per (split, game) with the headline numbers."""
    from rich.table import Table

    t = Table(title=title)
    # redund.: redundant-action rate, early: premature-stop rate (credit.rates); short to fit 120 columns
    for col in ("split", "game", "n", "success [95% CI]", "score", "invalid", "unparsed", "steps", "loops", "redund.",
                "early", "env fail"):
        t.add_column(col, justify="right" if col not in ("split", "game") else "left", no_wrap=True)
    for split, res in results.items():
        rows = list(res["per_game"].items()) + [("ALL", res["overall"])]
        for game, m in rows:
            lo, hi = m["success_ci95"]
            t.add_row(split, game, str(m["scored_episodes"]),
                      f"{100 * m['success_rate']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]",
                      f"{m['mean_score']:.3f}", f"{100 * m['invalid_action_rate']:.1f}%",
                      f"{100 * m.get('unparsed_rate', 0.0):.1f}%",
                      f"{m['mean_steps']:.1f}", f"{100 * m['loop_rate']:.1f}%",
                      f"{100 * m['redundant_action_rate']:.1f}%", f"{100 * m['premature_stop_rate']:.1f}%",
                      str(m["environment_failures"]))
    return t


def outcomes(path) -> dict[str, tuple[str, bool]]:
    """task id -> (game, success) in an episodes file, for the episodes the policy is accountable
    for (environment, orchestrator and evaluator failures are left out)."""
    from .store import read_episodes

    return {e.task_id: (e.game, e.success) for e in read_episodes(path) if e.status not in NOT_POLICY_FAULT}


# the behaviour rates as reports head them
BEHAVIOUR = (("invalid_action_rate", "invalid"), ("unparsed_rate", "unparsed"), ("loop_rate", "loops"),
             ("redundant_action_rate", "redundant"), ("premature_stop_rate", "premature stop"))


def behaviour(path, exclude: Collection[str] = ()) -> dict[str, float]:
    """The behaviour rates of an episodes file beside success (``credit.rates``): invalid_action_rate,
    loop_rate, redundant_action_rate, premature_stop_rate over the policy-accountable episodes, and
    unparsed_rate (:func:`unparsed_rate`); the episodes of the task ids in ``exclude`` left out."""
    from .store import read_episodes

    episodes = [e for e in read_episodes(path) if e.task_id not in exclude]
    return {**rates(episodes), "unparsed_rate": unparsed_rate(episodes)}


def same_episodes(base, other) -> dict[str, Any]:
    """How far a policy moved from another on the same tasks: the share of the tasks both played
    (policy-accountable episodes) on which its actions (``credit.action_key``, in order) are the
    other's exactly. A trained policy that plays every task as its start did cannot differ from it
    in success; this separates "training changed nothing" from "it changed play, not outcomes"."""
    from .store import read_episodes

    def actions(path) -> dict[str, tuple[str, ...]]:
        return {e.task_id: tuple(action_key(s) for s in e.steps)
                for e in read_episodes(path) if e.status not in NOT_POLICY_FAULT}

    a, b = actions(base), actions(other)
    common = sorted(set(a) & set(b))
    same = sum(a[t] == b[t] for t in common)
    return {"same": same, "tasks": len(common), "rate": same / len(common) if common else None}


def successes(path) -> dict[str, bool]:
    """task id -> success, for the episodes the policy is accountable for (see ``outcomes``)."""
    return {t: ok for t, (_, ok) in outcomes(path).items()}


def comparison(files: dict[str, Any], n_boot: int, seed: int, base: str = "bc",
               control: str = "control") -> dict[str, dict[str, Any]]:
    """Policies' episode files on one split -> a row per policy: success with its Wilson
    interval, the paired difference to ``base`` and (for the others) to ``control`` when it is
    there, overall and per game (``per_game``), each on the tasks both policies played."""
    res = {n: outcomes(f) for n, f in files.items()}

    def row(sel: dict[str, dict[str, bool]], name: str) -> dict[str, Any]:
        s = sel[name]
        k, m = sum(s.values()), len(s)
        r = {"success": k / m if m else 0.0, "success_ci95": list(wilson_ci(k, m)), "n": m}
        if name != base and base in sel:
            r["vs_bc"] = paired(sel[base], s, n_boot, seed)
        if name not in (base, control) and control in sel:
            r["vs_control"] = paired(sel[control], s, n_boot, seed)
        return r

    games = sorted({g for o in res.values() for g, _ in o.values()})
    overall = {n: {t: ok for t, (_, ok) in o.items()} for n, o in res.items()}
    by_game = {g: {n: {t: ok for t, (gg, ok) in o.items() if gg == g} for n, o in res.items()} for g in games}
    return {n: {**row(overall, n), "per_game": {g: row(by_game[g], n) for g in games}} for n in res}


def paired(base: dict[str, bool], other: dict[str, bool], n_boot: int, seed: int) -> dict[str, Any]:
    """``other`` minus ``base`` on the tasks both played: mean, bootstrap 95% CI, exact McNemar p."""
    from .stats import mcnemar_exact, paired_bootstrap_ci

    tasks = sorted(set(base) & set(other))
    a, b = [base[t] for t in tasks], [other[t] for t in tasks]
    mean, lo, hi = paired_bootstrap_ci([float(x) for x in a], [float(x) for x in b], n_boot=n_boot, seed=seed)
    return {"n": len(tasks), "diff": mean, "diff_ci95": [lo, hi], "mcnemar_p": mcnemar_exact(a, b)}


# -- the paper's ScienceWorld metric: average final score, each policy and the paired differences ---------------
SCORE_MIN_N = 5  # a task type's paired differences get an interval from this many tasks on


def scores(path) -> dict[str, tuple[str, float, bool]]:
    """task id -> (game, final score on the paper's 0-100 scale, success) in an episodes file, for the episodes
    the policy is accountable for (as :func:`outcomes`). An episode's ``final_score`` is its reward at its last
    step (ScienceWorld: the best score reached / 100, as ETO's evaluation keeps it)."""
    from .store import read_episodes

    return {e.task_id: (e.game, 100.0 * e.final_score, e.success) for e in read_episodes(path)
            if e.status not in NOT_POLICY_FAULT}


def _score_row(s: dict[str, tuple[str, float, bool]], n_boot: int, seed: int) -> dict[str, Any]:
    from .stats import paired_bootstrap_ci

    xs = [v[1] for v in s.values()]
    k = sum(v[2] for v in s.values())
    row: dict[str, Any] = {"n": len(xs), "mean_score": None, "mean_score_ci95": None,
                           "success": k / len(xs) if xs else None, "success_ci95": list(wilson_ci(k, len(xs)))}
    if xs:  # the mean's percentile bootstrap over tasks (the paired bootstrap against zeros)
        mean, lo, hi = paired_bootstrap_ci([0.0] * len(xs), xs, n_boot=n_boot, seed=seed)
        row |= {"mean_score": mean, "mean_score_ci95": [lo, hi]}
    return row


def _score_diff(a: dict[str, tuple[str, float, bool]], b: dict[str, tuple[str, float, bool]], n_boot: int,
                seed: int) -> dict[str, Any]:
    """``b`` minus ``a`` on the tasks both played: the score (points of 0-100) and success (points of 100%), each
    with its paired bootstrap 95% interval; success's exact McNemar p."""
    from .stats import mcnemar_exact, paired_bootstrap_ci

    tasks = sorted(set(a) & set(b))
    out: dict[str, Any] = {"n": len(tasks)}
    if not tasks:
        return out | {"score_diff": None, "score_diff_ci95": None, "success_diff": None, "success_diff_ci95": None,
                      "mcnemar_p": None}
    d, lo, hi = paired_bootstrap_ci([a[t][1] for t in tasks], [b[t][1] for t in tasks], n_boot=n_boot, seed=seed)
    wa, wb = [a[t][2] for t in tasks], [b[t][2] for t in tasks]
    sd, slo, shi = paired_bootstrap_ci([100.0 * x for x in wa], [100.0 * x for x in wb], n_boot=n_boot, seed=seed)
    return out | {"score_diff": d, "score_diff_ci95": [lo, hi], "success_diff": sd, "success_diff_ci95": [slo, shi],
                  "mcnemar_p": mcnemar_exact(wa, wb)}


def score_comparison(files: dict[str, Any], n_boot: int, seed: int, exclude: Collection[str] = ()) -> dict[str, Any]:
    """Policies' episode files on one split (in the order given: e.g. untuned, bc, eto) -> each policy's average
    final score (0-100) with a bootstrap 95% interval and its success with a Wilson interval; every later policy
    against every earlier one (``"<later> - <earlier>"``), paired on the tasks both played: the score difference in
    points and the success difference in points, each with a paired bootstrap 95% interval; the same per game
    (task type), where the intervals are left out below :data:`SCORE_MIN_N` tasks; and each policy's behaviour
    rates (:func:`behaviour`: invalid, unparsed, loops, redundant, premature stop). ``exclude``: task ids left out
    of every number (:func:`without_demonstrations`: the split less the tasks BC was shown)."""
    exclude = frozenset(exclude)
    res = {n: {t: v for t, v in scores(f).items() if t not in exclude} for n, f in files.items()}
    names = list(files)
    games = sorted({g for s in res.values() for g, _, _ in s.values()})

    def of(name: str, game: str | None) -> dict[str, tuple[str, float, bool]]:
        return {t: v for t, v in res[name].items() if game is None or v[0] == game}

    def table(game: str | None) -> dict[str, Any]:
        pol = {n: _score_row(of(n, game), n_boot, seed) for n in names}
        pairs = {}
        for i, later in enumerate(names):
            for earlier in names[:i]:
                d = _score_diff(of(earlier, game), of(later, game), n_boot, seed)
                if game is not None and d["n"] < SCORE_MIN_N:
                    d = {k: v for k, v in d.items() if not k.endswith("_ci95") and k != "mcnemar_p"}
                pairs[f"{later} - {earlier}"] = d
        return {"policies": pol, "pairs": pairs}

    return {**table(None), "per_game": {g: table(g) for g in games},
            "behaviour": {n: behaviour(f, exclude) for n, f in files.items()}}


def demonstrated_tasks(env, split: str, train: str = "train") -> list[str]:
    """The task ids of ``split`` that ``env``'s ``train`` split lists too, in ``split``'s order: the test tasks BC
    was shown a demonstration of. The one place the overlap is computed, from the task lists themselves.

    Why: ETO's ScienceWorld train list repeats variations of its ``seen`` list (54 over its 24 types:
    configs/env/sciworld.yaml), so a policy's seen score mixes tasks it was cloned on with tasks it was not. The rule of
    ScienceWorld on the real model (docs/lab/experiments.md, 2026-12-06) promises that the seen table says how
    many of its variations are also demonstrations and gives the score without them as well
    (:func:`without_demonstrations`). The expert stage plays (``experts.source: gold``) or binds (an imported
    file) exactly the training split's tasks, and a task is identified by its id (ScienceWorld:
    ``<task number>_<variation>``), so the overlap is the ids both lists hold; a gold path that did not win is
    counted as a demonstration still (it is in the experts file; BC's ``only_success`` skips it), which can only
    leave out more, never keep a demonstrated task in. A ``dev`` split held out of train (``env.dev_holdout``)
    never holds a test task (envs/holdout.py), so ``train`` here is what BC and exploration saw."""
    seen = {t.task_id for t in env.tasks(train)}
    out: list[str] = []
    for t in env.tasks(split):
        if t.task_id in seen and t.task_id not in out:
            out.append(t.task_id)
    return out


def without_demonstrations(files: dict[str, Any], demonstrated: Collection[str], n_boot: int,
                           seed: int) -> dict[str, Any]:
    """:func:`score_comparison` of the same files on the split's tasks less ``demonstrated`` (the ids
    :func:`demonstrated_tasks` gives), with ``tasks`` (how many tasks some policy played and is scored on),
    ``excluded`` (how many of those are demonstrated ones, left out) and ``excluded_ids`` (which, sorted)."""
    played = {t for f in files.values() for t in scores(f)}
    ids = sorted(played & set(demonstrated),
                 key=lambda t: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", t)])
    return {"tasks": len(played), "excluded": len(ids), "excluded_ids": ids,
            **score_comparison(files, n_boot, seed, exclude=ids)}


def score_markdown(by_split: dict[str, dict[str, Any]], level_note: str = "") -> str:
    """The tables of :func:`score_comparison` per split: each policy (score, success, behaviour rates), the paired
    differences, and per task type each policy's score with the differences. A split that holds tasks BC was
    shown (``without_demonstrations``, :func:`without_demonstrations`) says how many, and gives the same tables
    again without them."""
    def num(x, ci=None, signed=False) -> str:
        if x is None:
            return "-"
        s = f"{x:+.1f}" if signed else f"{x:.1f}"
        return s + (f" [{ci[0]:+.1f}, {ci[1]:+.1f}]" if signed and ci else f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")

    def tables(res: dict[str, Any]) -> list[str]:
        lines = ["| policy | n | average score (0-100) [95% CI] | success % [95% CI] | invalid | "
                 "unparsed | loops | redundant | premature stop |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, r in res["policies"].items():
            b = res["behaviour"].get(name, {})
            succ = None if r["success"] is None else 100 * r["success"]
            lines.append(f"| {name} | {r['n']} | {num(r['mean_score'], r['mean_score_ci95'])} | "
                         f"{num(succ, [100 * x for x in r['success_ci95']])} | "
                         + " | ".join(f"{100 * b[k]:.1f}%" if k in b else "-" for k, _ in BEHAVIOUR) + " |")
        if res["pairs"]:  # one policy alone (a study's first piece): no difference table
            lines += ["", "| difference | n | score points [95% CI] | success points [95% CI] | McNemar p |",
                      "| --- | --- | --- | --- | --- |"]
        for pair, d in res["pairs"].items():
            p = "-" if d.get("mcnemar_p") is None else f"{d['mcnemar_p']:.3g}"
            lines.append(f"| {pair} | {d['n']} | {num(d['score_diff'], d['score_diff_ci95'], True)} | "
                         f"{num(d['success_diff'], d['success_diff_ci95'], True)} | {p} |")
        if res["per_game"]:
            names, pairs = list(res["policies"]), list(res["pairs"])
            head = ["task type", "n", *(f"{n} score" for n in names), *(f"{p} [95% CI]" for p in pairs)]
            lines += ["", "| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
            for game, g in res["per_game"].items():
                n = max(r["n"] for r in g["policies"].values())
                cells = [game, str(n), *(num(g["policies"][x]["mean_score"]) for x in names),
                         *(num(g["pairs"][p]["score_diff"], g["pairs"][p].get("score_diff_ci95"), True) for p in pairs)]
                lines.append("| " + " | ".join(cells) + " |")
        return lines + [""]

    lines: list[str] = []
    for split, res in by_split.items():
        lines += [f"### {split}", ""]
        shown = res.get("without_demonstrations")
        if shown:
            lines += [f"{shown['excluded']} of the {shown['tasks']} {split} tasks are also BC demonstrations (the "
                      f"training list repeats them): the tables count them; \"{split} without demonstrations\" below "
                      f"leaves them out.", ""]
        lines += tables(res)
        if shown:
            lines += [f"### {split} without demonstrations", "",
                      f"The same tables without the {shown['excluded']} {split} tasks that are also BC demonstrations: "
                      + ", ".join(shown["excluded_ids"]) + ".", "", *tables(shown)]
    if level_note:
        lines += [level_note, ""]
    return "\n".join(lines)
