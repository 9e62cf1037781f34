"""A study's results outside its run folder: what its reading needs, kept where a lost machine cannot take it.

A run folder holds weights and every intermediate file; it lives on one machine, and a preemptible GPU or a
replaced box takes it along. ``eto-train results results.dir=<folder>`` copies, from each finished seed (or
*unit*: a part of a seed played in a run of its own, on one machine) of a run, what the seeds' aggregate
reads, into ``<folder>/seed<k>/<unit>/``, small enough to commit:

- every evaluation's episodes (each policy on every split it played: ``**/eval/**/episodes.jsonl``),
  compressed (``episodes.jsonl.gz``, which :func:`eto_train.store.read_jsonl` reads), and its ``metrics.json``;
- ``compare/compare.json`` (each arm's pairs, DPO steps, rollouts spent, its rows against BC and the control),
  ``eto/result.json`` (the kept iteration) and each iteration's ``summary.json``, every ``pairs/stats.json``;
- every stage's ``manifest.json`` (its config, seconds and peak memory);
- ``unit.json``: the seed, the unit, the machine (CPU model and the instruction sets the engine cares about),
  torch's version, the commit of the code that played it, when it was collected.

Paths the JSON files record inside the run folder are rewritten relative to it. Then :func:`aggregate`
computes ``seeds.json`` / ``seeds.md`` from the results folder alone (no run folder: a fresh clone
reproduces the table). A unit already collected is never replaced: collecting a run whose files differ
from a unit of the same name is an error (a unit played again is collected under a new name, after the
old one is removed by hand, which git shows).

Written here because it is this project's layout that decides what a reading needs; no library keeps it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from . import layout
from .errors import ConfigError
from .manifest import NEXT, OLD
from .seeds import Source, aggregate_sources, markdown
from .store import write_atomic, write_json

SKIPPED = ("cache", "diag", NEXT, OLD, layout.LOGS, layout.SHARDS, "wandb")  # not results of the run
KEPT_JSON = (layout.METRICS, layout.MANIFEST, layout.STATS, layout.SUMMARY, layout.RESULT,
             f"{layout.COMPARE}.json")
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")  # what the engine's speed and dtypes depend on


def machine() -> dict[str, Any]:
    """The CPU this process runs on (model name, the instruction sets the engine cares about), torch's version."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    import torch

    return {"cpu": model, "cpu_flags": [f for f in CPU_FLAGS if f in flags], "cores": os.cpu_count(),
            "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def code_commit() -> str | None:
    """The commit of the code that runs (its checkout's HEAD), with ``+changes`` when the checkout has any."""
    src = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no", "--", "."],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+changes" if dirty else "")


def _wanted(rel: Path) -> str | None:
    """How a file of a run is kept: "gz" (an evaluation's episodes), "json" (a record), None (left out)."""
    parts = rel.parts
    if any(p in SKIPPED or p.startswith(layout.SEED_RUN.format(seed="")) for p in parts[:-1]):
        return None
    if rel.name == layout.EPISODES:
        return "gz" if layout.EVAL in parts[:-1] else None  # explorations stay in the run (pairs say what they gave)
    return "json" if rel.name in KEPT_JSON else None


def _relative(value: Any, prefixes: list[str]) -> Any:
    """``value`` with every string that names a path inside the run (one of ``prefixes``) made relative to it."""
    if isinstance(value, dict):
        return {k: _relative(v, prefixes) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative(v, prefixes) for v in value]
    if isinstance(value, str):
        for p in prefixes:
            if value == p:
                return "."
            if value.startswith(p + "/"):
                return value[len(p) + 1:]
    return value


def files_of(run: Path) -> dict[str, bytes]:
    """What :func:`collect` keeps of ``run``: relative path (as kept) -> content, records with their paths made
    relative, episodes compressed (mtime 0: the same episodes give the same bytes)."""
    run = Path(run)
    prefixes = sorted({str(run), str(run.resolve()), os.path.abspath(run)}, key=len, reverse=True)
    out: dict[str, bytes] = {}
    for path in sorted(run.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(run)
        how = _wanted(rel)
        if how == "gz":
            out[rel.as_posix() + layout.GZ] = gzip.compress(path.read_bytes(), compresslevel=9, mtime=0)
        elif how == "json":
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise ConfigError(f"{path}: not JSON ({exc}); the run's stage that wrote it has to finish first")
            out[rel.as_posix()] = (json.dumps(_relative(data, prefixes), indent=1, sort_keys=True) + "\n").encode()
    return out


def digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def collect(run: Path, dest: Path, seed: int, unit: str, paths: dict[str, str], partial: bool = False) -> str:
    """Copy ``run``'s results into ``dest`` (``<results.dir>/seed<k>/<unit>``): "collected", or "kept" when
    ``dest`` already holds the same results. ``paths``: the run's layout (bc_eval, eto, compare) relative to
    ``run``, recorded in unit.json for :func:`sources`. ``partial`` (results.partial): a run whose eto or compare
    has not finished is collected too when it holds an evaluation (a piece of a study played in pieces, each
    collected under its own unit name)."""
    files = files_of(run)
    finished = any(n.endswith(f"{layout.COMPARE}.json") or n.endswith(f"eto/{layout.RESULT}") for n in files)
    if not finished and not (partial and any(n.endswith(layout.EPISODES + layout.GZ) for n in files)):
        raise ConfigError(f"{run}: no finished compare.json or eto/result.json{' nor an evaluation' if partial else ''}:"
                          f" nothing to collect yet (results.dir={dest.parent.parent}); finish the run's eto or "
                          f"compare first")
    record = dest / layout.UNIT
    if record.exists():
        old = json.loads(record.read_text(encoding="utf-8"))
        if old.get("digest") == digest(files):
            return "kept"
        raise ConfigError(
            f"{dest}: seed {seed}'s unit {unit!r} is already in the results, collected {old.get('collected_at')} from "
            f"{old.get('run')} on {old.get('machine', {}).get('cpu')}, and {run} holds other results. A finished unit "
            f"is never replaced: give this one another results.unit, or remove {dest} first (git shows it)")
    if dest.exists():
        shutil.rmtree(dest)  # a collection cut before its unit.json: never finished, redone whole
    for name, data in files.items():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    write_json(record, {"seed": seed, "unit": unit, "run": str(run), "layout": paths, "machine": machine(),
                        "commit": code_commit(), "collected_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        "files": len(files), "digest": digest(files)})  # written last: the unit is whole
    return "collected"


def sources(folder: Path) -> list[Source]:
    """Every unit a results folder holds (``seed<k>/<unit>/unit.json``), as the seeds' aggregate reads it."""
    folder = Path(folder)
    found = []
    for record in sorted(folder.glob(f"{layout.SEED_RUN.format(seed='*')}/*/{layout.UNIT}")):
        unit_dir = record.parent
        info = json.loads(record.read_text(encoding="utf-8"))
        paths = info.get("layout") or {}

        runs = layout.RunLayout(run=unit_dir, base=unit_dir, experts=unit_dir / "experts",
                                bc=unit_dir / paths.get("bc", "bc"),
                                bc_eval=unit_dir / paths.get("bc_eval", f"{layout.EVAL}/bc"),
                                eto=unit_dir / paths.get("eto", "eto"), compare=unit_dir / paths.get("compare", "compare"),
                                cache_root=unit_dir / "cache")
        untuned = runs.evaluation(layout.UNTUNED)

        def resolve(p: str, base: Path = unit_dir) -> Path:
            return Path(p) if Path(p).is_absolute() else base / p

        found.append(Source(int(info["seed"]), runs, resolve=resolve, untuned=untuned if untuned.is_dir() else None,
                            name=f"{unit_dir.parent.name}/{unit_dir.name}", required=False))
    return found


def aggregate(folder: Path, n_boot: int, seed: int) -> dict[str, Any]:
    """The seeds' aggregate (seeds.py) of every unit in a results folder, for each stage some unit has:
    ``{"eto": ..., "compare": ...}``; nothing but the folder is read."""
    srcs = sources(folder)
    if not srcs:
        raise ConfigError(f"{folder}: no collected unit (seed<k>/<unit>/unit.json): run eto-train results with "
                          f"results.dir={folder} after a seed or unit finishes")
    out = {}
    for stage, file in (("eto", lambda s: s.layout.eto_result),
                        ("compare", lambda s: layout.compare_file(s.layout.compare, ".json"))):
        if any(file(s).exists() for s in srcs):
            out[stage] = aggregate_sources(stage, srcs, n_boot, seed,
                                           runs={s.name: str(s.layout.run.relative_to(folder)) for s in srcs})
    return out


def write(folder: Path, every: dict[str, Any]) -> tuple[Path, Path]:
    """``<folder>/seeds.json`` and ``seeds.md`` (the table the docs quote)."""
    js, md = layout.seeds_file(folder, ".json"), layout.seeds_file(folder, ".md")
    write_json(js, every)
    write_atomic(md, markdown(every))
    return js, md


def policy_evaluations(src: Source) -> dict[str, Path]:
    """A unit's policies in play order, each with its evaluations folder: the untuned model, BC, ETO's kept policy
    (``eto`` in eto/result.json: BC's own evaluation when dev kept BC) and each ETO iteration that played the
    test splits without being kept (``eto iter<k>``, eto.test_last_iteration). Only those the unit holds."""
    runs = src.layout
    out: dict[str, Path] = {}
    if src.untuned is not None and src.untuned.is_dir():
        out[layout.UNTUNED] = src.untuned
    if runs.bc_eval.is_dir():
        out["bc"] = runs.bc_eval
    if runs.eto_result.exists():
        res = json.loads(runs.eto_result.read_text(encoding="utf-8"))
        out["eto"] = src.resolve(res["best_eval"])
        for it in sorted(runs.eto.glob("iter*/" + layout.EVAL), key=lambda p: int(p.parent.name[4:] or 0)):
            if it.resolve() != out["eto"].resolve():
                out[f"eto {it.parent.name}"] = it
    return out


def scores(folder: Path, splits: list[str], n_boot: int, seed: int,
           demonstrated: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The paper's ScienceWorld metric over a results folder: for each unit, each split of ``splits`` its policies
    (:func:`policy_evaluations`) played, :func:`eto_train.evaluation.score_comparison` (average final score 0-100,
    success, the paired differences, per task type, behaviour rates). ``{unit: {split: ...}}``; units without
    an evaluation of those splits are left out. ``demonstrated``: split -> its task ids that are also
    demonstrations (:func:`eto_train.evaluation.demonstrated_tasks`); a split with any gets the same comparison
    without them too, under ``without_demonstrations`` (:func:`eto_train.evaluation.without_demonstrations`)."""
    from .evaluation import score_comparison, without_demonstrations

    out: dict[str, Any] = {}
    for src in sources(folder):
        evals = policy_evaluations(src)
        by_split = {}
        for split in splits:
            files = {n: layout.episodes(p, split) for n, p in evals.items() if layout.episodes(p, split).exists()}
            if files:
                by_split[split] = score_comparison(files, n_boot, seed)
                if (demonstrated or {}).get(split):
                    by_split[split]["without_demonstrations"] = without_demonstrations(files, demonstrated[split],
                                                                                       n_boot, seed)
        if by_split:
            out[src.name] = by_split
    return out


def write_scores(folder: Path, table: dict[str, Any], n_boot: int) -> tuple[Path, Path]:
    """``<folder>/scores.json`` and ``scores.md``: :func:`scores`' tables, one section per unit."""
    from .evaluation import score_markdown

    js, md = Path(folder) / "scores.json", Path(folder) / "scores.md"
    write_json(js, table)
    note = (f"Average final score: each episode's best score (0-100) at its end, the mean over the split's tasks; "
            f"intervals: percentile bootstrap over tasks ({n_boot} resamples), paired on the tasks both policies "
            f"played; success: Wilson interval; differences are row minus column policy, later minus earlier.")
    write_atomic(md, "\n".join(f"## {unit}\n\n{score_markdown(by_split)}" for unit, by_split in table.items())
                 + note + "\n")
    return js, md
