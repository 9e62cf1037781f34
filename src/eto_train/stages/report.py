"""Stage `report`: the demo's markdown report, written from what the other stages left on disk.

It reads the ETO loop's result (`eto/result.json`, per-iteration dev metrics), the comparison
(`compare/compare.json` and its evaluations) and the best iteration's test evaluation, pairs
every policy with BC and with the SFT control on the same held-out seeds, and writes
``report.md`` with a plot of success against iteration, the configs and the versions.
Nothing here trains or plays: a report can be rebuilt at any time from a finished run, read-only
included: its files then go to ``$TMPDIR/eto-train-report/<run_name>/`` (:func:`writable_place`).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ..config import Config, require
from ..errors import writable
from ..evaluation import behaviour, comparison
from ..reporting import env_failures, fault_accounts, iteration_plot, pct, stage_seconds, stage_seconds_markdown, table_rows
from .. import layout
from ..runtime import versions
from ..store import write_atomic, write_json

UNTUNED = layout.UNTUNED

def build(cfg) -> dict[str, Any]:
    runs = layout.RunLayout.of(cfg)
    eto = json.loads(runs.eto_result.read_text())
    cmp_dir = runs.compare
    cmp_file = layout.compare_file(cmp_dir, ".json")
    # a run without compare (the real-model demo: BC, ETO, the test splits) reports BC, the kept iteration
    # and, when it was played, the untuned model
    cmp = json.loads(cmp_file.read_text()) if cmp_file.exists() else {"policies": [], "splits": list(cfg.eval.splits)}
    n_boot, seed = cfg.compare.bootstrap, cfg.seed
    # Every policy evaluated on the same test seeds: the untuned model (eval.tag=untuned, when played),
    # BC, control and variants by compare, the best ETO iteration by eto (its test evaluation).
    evals = {UNTUNED: runs.evaluation(UNTUNED)} if runs.evaluation(UNTUNED).exists() else {}
    evals.update({name: layout.evaluations(cmp_dir) / name for name in cmp["policies"]})
    evals["bc"] = runs.evaluation("bc")
    evals[f"eto best (iteration {eto['best_iteration']})"] = Path(eto.get("best_eval", runs.evaluation("eto_best")))
    if "last_eval" in eto:  # eto.test_last_iteration: the last iteration too, when dev kept another
        evals[f"eto iteration {eto['last_iteration']} (last, not kept)"] = Path(eto["last_eval"])
    rows: dict[str, dict[str, Any]] = {}
    for split in cmp["splits"]:
        files = {n: layout.episodes(d, split) for n, d in evals.items() if layout.episodes(d, split).exists()}
        rows[split] = comparison(files, n_boot, seed)
        for n, r in rows[split].items():
            r["environment_failures"] = env_failures(files[n])
            r["behaviour"] = behaviour(files[n])  # invalid / loop / redundant / premature-stop rates
    best = f"eto best (iteration {eto['best_iteration']})"
    headline = cfg.eval.splits[0]
    verdict = None
    if best in rows.get(headline, {}) and eto["best_iteration"] > 0:
        r = rows[headline][best]

        def beats(x: dict[str, Any]) -> dict[str, bool]:
            return {"beats_bc": x["vs_bc"]["diff_ci95"][0] > 0,
                    "beats_control": "vs_control" in x and x["vs_control"]["diff_ci95"][0] > 0}

        verdict = {"split": headline, **beats(r), "per_game": {g: beats(x) for g, x in r["per_game"].items()}}
    reading = runs.reading(cfg.reading.split)
    seeds = layout.seeds_file(runs.run, ".json")  # compare over several seeds (seeds=[...]), when it ran
    return {"eto": eto, "compared": cmp_file.exists(), "compare_dpo_steps": cmp.get("dpo_steps", {}), "control_of": cmp.get("control_of", "trajectory"),
            "rollout_cost": cmp.get("rollout_cost", {}), "no_pairs": cmp.get("no_pairs", []),
            "splits": rows, "verdict": verdict, "reading": json.loads(reading.read_text()) if reading.exists() else None,
            "seeds": json.loads(seeds.read_text()) if seeds.exists() else None, "faults": fault_accounts(runs.run),
            "costs": stage_seconds(Path(runs.run))}


def reading_section(rd: dict[str, Any] | None) -> list[str]:
    """The precondition (make reading): does each policy's first move / take follow its observation?"""
    if not rd:
        return []
    out = ["", f"## Does the policy read its observation? ({rd['split']})", "",
           "The first mapreader `move` against the gold direction, the first twc `take` against the objects the room "
           "offers, each against the chance line of the policy's own mix (one-sided permutation test; the "
           f"precondition for ETO's gain holds at p < {rd['alpha']}).", "",
           "| policy | test | n | right | chance line | p | holds | its choices |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for tag, res in rd["policies"].items():
        for name, key in (("mapreader first move", "first_move"), ("twc first take in the room", "first_take")):
            if (x := res.get(key)) is not None:
                top = sorted(x["choices"].items(), key=lambda ck: (-ck[1], ck[0]))[:4]  # the JSON has them by name
                choices = ", ".join(f"{c} {k}" for c, k in top)
                out.append(f"| {tag} | {name} | {x['n']} | {x['hits']} | {x['expected']:.1f} | {x['p']:.2g} | "
                           f"{'yes' if x['p'] < rd['alpha'] else 'no'} | {choices} |")
    return out


def behaviour_section(splits: dict[str, dict[str, Any]]) -> list[str]:
    """Per policy, beside success: how it fails (``credit.rates``; the report's JSON has the numbers)."""
    out = ["## How each policy fails (held-out test splits)", "",
           "Invalid: share of steps not accepted; loop: share of episodes where one action repeats 3 times in a "
           "row or an A-B cycle 3 times; redundant: share of steps repeating an action already taken from the "
           "same observation; premature stop: share of episodes ended before the step limit without success "
           "(status `failure` or `model_failure`); unparsed: share of the policy's outputs with no `Action:` line "
           "to read (counted among the invalid steps too).", "",
           "| split | policy | success | invalid | unparsed | loop | redundant | premature stop |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for split, rows in splits.items():
        for n, r in rows.items():
            if (b := r.get("behaviour")) is not None:
                out.append(f"| {split} | {n} | {pct(r['success'])} | {pct(b['invalid_action_rate'])} | "
                           f"{pct(b.get('unparsed_rate', 0.0))} | {pct(b['loop_rate'])} | {pct(b['redundant_action_rate'])} | "
                           f"{pct(b['premature_stop_rate'])} |")
    return out + [""]


def compare_section(rep: dict[str, Any], compare_png: str) -> list[str]:
    """What compare added (make compare-contrast): the control, each arm's DPO steps and rollout cost, the
    chart, and the seeds' table when it ran over several seeds."""
    out: list[str] = []
    steps = rep["compare_dpo_steps"]
    out += ["", f"`control` continues BC with SFT on the {rep['control_of']} arm's chosen side "
            f"for the same number of optimizer steps as its DPO ({steps.get(rep['control_of'], '-')}); every other arm is "
            "one DPO run from BC on its own pairs (docs/step_level.md; DPO steps: "
            + ", ".join(f"{arm} {n}" for arm, n in steps.items()) + ")"
            + (f"; no pairs, so BC itself: {', '.join(rep['no_pairs'])}" if rep.get("no_pairs") else "") + ".", ""]
    if rep.get("rollout_cost"):  # what each arm's pairs cost in episodes
        out += ["| arm | rollouts for its pairs (explored + continuations) | of which value rollouts |", "| --- | --- | --- |"]
        out += [f"| {arm} | {c['total']} | {c['value_rollouts']} |" for arm, c in rep["rollout_cost"].items()]
        out.append("")
    out += [f"![arms]({compare_png})", ""]
    if rep.get("seeds") and "compare" in rep["seeds"]:  # what holds across seeds, beside this one seed's table
        from ..seeds import markdown as seeds_markdown

        out += ["## Across seeds", "", "Each seed is a whole run (BC, explorations, DPO); the interval resamples seeds, "
                "then tasks. A difference holds across seeds when its interval excludes 0.", "",
                seeds_markdown({"compare": rep["seeds"]["compare"]}).replace("## ", "### "), ""]
    return out


def writable_place(cfg, folder: Path, what: str) -> Path:
    """``folder`` (in the run folder) if it can be written, else ``$TMPDIR/eto-train-<what>/<run_name>``,
    said in one line: a finished run that is read-only (a copy, an archive) still gets its report
    and reading results, and nothing in it changes."""
    if writable(folder):
        return folder
    where = Path(tempfile.gettempdir()) / f"eto-train-{what}" / str(cfg.run_name)
    sys.stderr.write(f"eto-train: note: {folder} is not writable; {what} written to {where}\n")
    return where


def env_scope(env) -> str:
    """What of the environment a run plays, for the report's first line: TextWorldExpress's games, ScienceWorld's
    or ALFWorld's tasks (" (all tasks)" when none are named), nothing for an environment without either."""
    for key in ("games", "tasks"):
        if key in type(env).model_fields:
            names = env.get(key)
            if not names:
                return " (all tasks)"
            return " (" + ", ".join(str(g) if isinstance(g, (str, int)) else str(g["name"]) for g in names) + ")"
    return ""


def markdown(cfg, rep: dict[str, Any], plot_name: str, compare_png: str) -> str:
    eto, dev = rep["eto"], cfg.eto.dev_split
    out = [f"# ETO demo report: run `{cfg.run_name}`", "",
           f"Environment `{cfg.env.name}`{env_scope(cfg.env)}, model `{cfg.model.name}`, "
           f"seed {cfg.seed}. Success rates with Wilson 95% intervals; differences are paired on the same seeds "
           f"(bootstrap 95% interval over tasks, exact McNemar p).", "",
           f"## Success against ETO iteration ({dev} split, model selection)", "",
           "| iteration | dev success [95% CI] | n | explore success | pairs |", "| --- | --- | --- | --- | --- |"]
    for h in eto["history"]:
        m = h["dev"]
        explore = pct(h["explore_success"]) if "explore_success" in h else "-"
        out.append(f"| {'BC' if h['iteration'] == 0 else h['iteration']} | {pct(m['success_rate'], m['success_ci95'])} "
                   f"| {m['scored_episodes']} | {explore} | {h.get('pairs', '-')} |")
    out += ["", f"Best iteration on {dev}: {eto['best_iteration']} (0 = BC).", "", f"![success against iteration]({plot_name})",
            "", "## Held-out test splits: every policy on the same seeds", "",
            "| split | game | policy | n | success [95% CI] | vs BC [95% CI] | p | vs control [95% CI] | p | env failures |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def failures_cell(r, game):  # environment failures are counted over the whole split
        return [str(r["environment_failures"]) if game == "all" else "-"]

    out += ["| " + " | ".join(cells) + " |" for cells in table_rows(rep["splits"], failures_cell)]
    if any(UNTUNED in rows for rows in rep["splits"].values()):
        out += ["", f"`{UNTUNED}` is the model BC starts from ({cfg.model.name}), prompted as every policy is "
                f"(prompt `{cfg.prompt.version}`), before any training.", ""]
    if rep.get("compared", True):
        out += compare_section(rep, compare_png)
    out += behaviour_section(rep["splits"])
    v = rep["verdict"]
    if v is None:
        out.append("**Verdict:** no ETO iteration beat BC on the dev split; the best policy is BC.")
    else:
        control = rep.get("compared", True)  # no compare: no SFT control to beat
        out.append(f"**Verdict ({v['split']}):** the best ETO iteration "
                   f"{'beats' if v['beats_bc'] else 'does not beat'} BC"
                   + (f" and {'beats' if v['beats_control'] else 'does not beat'} the SFT control" if control else "")
                   + " with a paired 95% interval above zero.")
        for game, g in v["per_game"].items():
            out.append(f"On {game} alone it {'beats' if g['beats_bc'] else 'does not beat'} BC"
                       + (f" and {'beats' if g['beats_control'] else 'does not beat'} the control." if control else "."))
    out += reading_section(rep.get("reading"))
    out += ["", "## Environment faults", "",
            "Every failed environment call an episode met: recovered (the episode was rebuilt on a fresh instance "
            "by replaying its actions, and went on) or, after `rollout.env_retries` retries of one call, ended as "
            "`environment_failure`, which is never scored and never paired. `injected` is the fault injector's "
            "count from the stage's manifest (`env.faults`; `-` when off or the stage was reused).", "",
            "| stage | episodes | injected | env errors met | episodes recovered | environment failures |",
            "| --- | --- | --- | --- | --- | --- |"]
    for f in rep.get("faults", []):
        out.append(f"| {f['stage']} | {f['episodes']} | {'-' if f['injected'] is None else f['injected']} | "
                   f"{f['errors']} | {f['recovered']} | {f['environment_failures']} |")
    if rep.get("costs"):
        out += ["", "## What each stage cost", "",
                "Seconds and peak memory per stage, from the stages' manifests: the process's peak resident memory "
                "(its child processes', such as a simulator's JVM, after +), on a GPU the device's peak. A stage "
                "reused by content hash counts once in the total.", "",
                stage_seconds_markdown(rep["costs"]).rstrip()]
    out += ["", "## Configuration", "", "```yaml", yaml.safe_dump(cfg.plain(), sort_keys=False).strip(), "```", "",
            "## Versions", "", "```json", json.dumps(versions(), indent=1, sort_keys=True), "```", ""]
    return "\n".join(out)


def run(cfg: Config) -> Path:
    require(cfg, "eto_train.stages.report.run")
    if cfg.eto.dev_split is None:
        raise ValueError("make report: the report plots every iteration on the dev split, and this run has none "
                         "(eto.dev_split: null, the paper's profile: no selection); evaluate iterations with make eval")
    run_dir = Path(cfg.paths.run)
    rep = build(cfg)
    out = writable_place(cfg, run_dir, layout.REPORT)  # the run folder, unless it is read-only
    out.mkdir(parents=True, exist_ok=True)
    iteration_plot(rep["eto"]["history"], out / layout.ITERATION_PLOT, cfg.eto.dev_split)
    # report.json: the run's results, the same for two runs of the same seed; its costs (seconds, peak memory:
    # measurements of this machine) only in report.md
    write_json(out / f"{layout.REPORT}.json", {k: v for k, v in rep.items() if k != "costs"})
    path = out / f"{layout.REPORT}.md"
    png = layout.compare_file(Path(cfg.paths.compare), ".png")  # linked relative to the run folder's report
    compare_png = os.path.relpath(png, out) if out == run_dir else str(png)
    write_atomic(path, markdown(cfg, rep, layout.ITERATION_PLOT, compare_png))
    return path
