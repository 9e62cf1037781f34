"""A Hydra multirun (``eto-train <stage> -m key=a,b ...``) checked whole before its first job, and its record.

Hydra runs a sweep's jobs one after another and composes each when its turn comes, so a bad value in job 1 was
found after job 0 had trained. :func:`check` (cli.py, before Hydra's run) lists the jobs as Hydra's basic sweeper
will (:func:`expand`), composes each, gives it the folders its run will have (:func:`eto_train.layout.job_paths`)
and validates it (:func:`eto_train.config.load`, the run folder's and the device's checks): every bad job is named
with its index, its swept values and each bad key, in one :class:`~eto_train.errors.ConfigError` (exit 2), and
no job runs. So are jobs that would share a stage's folder while their settings for that stage differ (a
``paths.base`` given with a swept ``bc`` key: each job would train its BC over the last one's).

Then the sweep's jobs are recorded in ``<sweep>/sweep.json`` (:data:`eto_train.layout.SWEEP_RECORD`), before the
first runs: ``make sweep-table`` has a row for every job, and names the ones that never ran or did not finish
(:func:`jobs_of`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import layout

MULTIRUN = ("-m", "--multirun")
# Hydra's options that run no job (--cfg, --help, ...) or compose from another config (then Hydra's own checks only)
NO_CHECK = ("--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc",
            "--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp", "--experimental-rerun")
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
# the stage folders of paths.base a sweep's jobs may share, and which keys are settings of each: the sections
# experts and the tiny model read; for BC and its evaluations any section but those they may share
# (layout.SHARES_BC, SHARES_BC_EVAL). The paths that place a folder are no setting of its stage.
READS = {"experts": ("env", "experts", "prompt"), "tiny_model": ("env", "experts", "prompt", "model", "seed")}
SHARED_FOLDERS = ("experts", "tiny_model", "bc", "bc_eval")
PLACES = ("paths.runs", "paths.run", "paths.base")


def _setting_of(folder: str, override: str) -> bool:
    """Whether ``override`` (``key=value``) sets something the stage in ``paths.<folder>`` computes from."""
    key = override.lstrip("+~").split("=", 1)[0]
    section = key.split(".", 1)[0]
    if key in PLACES or key == f"paths.{folder}":
        return False
    if folder in READS:
        return section in READS[folder]
    return section not in (layout.SHARES_BC if folder == "bc" else layout.SHARES_BC_EVAL)


@dataclass
class Job:
    index: int
    overrides: list[str]  # every override of the job, as Hydra passes them
    swept: list[str]      # its values of the swept keys (sorted): its name
    folder: str           # its run folder's name inside the sweep's run folder
    sweep: str = ""       # the sweep's run folder (paths.run before the job's own)
    paths: dict[str, str] = field(default_factory=dict)  # its resolved paths (run, base, experts, bc, ...)
    problems: list[str] = field(default_factory=list)    # why it cannot run, one line each

    @property
    def name(self) -> str:
        return f"job {self.index} ({','.join(self.swept) or 'no swept key'})"


def checked(args: list[str]) -> bool:
    """A command line whose jobs :func:`check` lists and checks: ``-m`` with Hydra's own options left out."""
    return any(a in MULTIRUN for a in args) and not any(a.split("=", 1)[0] in NO_CHECK for a in args)


def _overrides(args: list[str]) -> list[str]:
    return [a for a in args if "=" in a and not a.startswith("-")]


def expand(overrides: list[str], loader=None, params: dict[str, str] | None = None) -> list[list[str]]:
    """Each job's overrides, in Hydra's order (the basic sweeper's: the first swept key varies slowest);
    ``params``: ``hydra.sweeper.params`` (they come first, as the sweeper reads them)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create(config_loader=loader).parse_overrides(
        [*(f"{k}={v}" for k, v in (params or {}).items()), *overrides])
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def plan(stage: str, args: list[str], config_dir: str | Path = layout.CONFIGS) -> list[Job]:
    """The jobs of ``eto-train <stage> <args>`` (``-m``), each composed from ``config_dir``, placed and validated:
    a job's ``problems`` say why it cannot run. An empty list when the sweep is not Hydra's basic sweeper's."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    overrides = _overrides(args)
    swept = layout.swept_keys(overrides)
    jobs: list[Job] = []
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.3", job_name=stage.replace("-", "_")):
        loader = GlobalHydra.instance().config_loader()
        fixed = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in swept]
        try:
            hydra_node = compose("config", overrides=fixed, return_hydra_config=True).hydra
            if OmegaConf.select(hydra_node, "sweeper._target_") != BASIC_SWEEPER:
                return []  # another sweeper (optuna, ...) decides its jobs as it goes: Hydra's checks only
            params = OmegaConf.to_container(hydra_node.sweeper.params or {})
        except Exception:  # noqa: BLE001 - a fixed override that does not compose: named at each job below
            params = {}
        try:
            listed = expand(overrides, loader, params)
        except Exception as exc:  # noqa: BLE001 - a sweep Hydra cannot expand: Hydra's own error, at its run
            from .errors import is_input_error

            if not is_input_error(exc):
                raise
            return []
        explicit = lambda job: any(o.lstrip("+~").startswith("paths.base=") for o in job)  # noqa: E731
        for i, job_overrides in enumerate(listed):
            mine = layout.job_swept(job_overrides, swept)
            job = Job(i, list(job_overrides), mine, layout.job_folder(mine, i))
            jobs.append(job)
            try:
                cfg = compose("config", overrides=list(job_overrides))
            except Exception as exc:  # noqa: BLE001 - Hydra's error for this job's overrides, as the CLI prints it
                job.problems.append(_compose_error(exc, list(job_overrides)))
                continue
            _place(cfg, job, stage, explicit(job_overrides))
    return jobs


def _compose_error(exc: Exception, overrides: list[str]) -> str:
    from hydra import compose

    from .errors import message

    found = message(exc, overrides, lambda o: compose("config", overrides=list(o)))
    if found is None:
        raise exc
    return found[0]


def _place(cfg, job: Job, stage: str, explicit_base: bool) -> None:
    """The job's folders (as :func:`eto_train.layout.isolate_sweep_job` will give them) and its checks."""
    from omegaconf import OmegaConf, open_dict

    from .config import load
    from .device_check import check_device
    from .errors import ConfigError, message

    try:
        job.sweep = str(cfg.paths.run)
        with open_dict(cfg):
            layout.job_paths(cfg, job.swept, job.index, explicit_base)
        job.paths = {k: str(OmegaConf.select(cfg, f"paths.{k}"))
                     for k in ("run", "base", "experts", "tiny_model", "bc", "bc_eval")}
    except Exception:  # noqa: BLE001 - a path that does not resolve: load names it
        pass
    for check in (layout.check_run_folder, load, lambda c: check_device(c, stage)):
        try:
            check(cfg)
        except ConfigError as exc:
            job.problems += exc.lines
        except Exception as exc:  # noqa: BLE001 - an input error of ours (DeviceError): its message
            found = message(exc)
            if found is None:
                raise
            job.problems.append(found[0])
        if job.problems:
            return


def _sharing(jobs: list[Job]) -> list[str]:
    """Jobs that would share a stage's folder (``paths.bc`` ...) while the keys of that stage they vary differ."""
    conflicts: dict[tuple[int, ...], tuple[list[str], set[str]]] = {}
    for key in SHARED_FOLDERS:
        groups: dict[str, list[Job]] = {}
        for job in jobs:
            if key in job.paths:
                groups.setdefault(job.paths[key], []).append(job)
        for path, group in groups.items():
            def settings(job: Job) -> frozenset[str]:
                return frozenset(o for o in job.swept if _setting_of(key, o))  # noqa: B023 - used right here
            if len({settings(j) for j in group}) > 1:
                differ = set().union(*(settings(j) for j in group)) - set.intersection(*(set(settings(j)) for j in group))
                where, keys = conflicts.setdefault(tuple(j.index for j in group), ([], set()))
                where.append(f"paths.{key}={path}")
                keys.update(o.lstrip("+~").split("=", 1)[0] for o in differ)
    by_index = {j.index: j for j in jobs}
    return [f"{', '.join(by_index[i].name for i in group)} would share {', '.join(where)} with other values of "
            f"{', '.join(sorted(keys))} (each job would redo that stage over the last one's result): leave "
            f"paths.base out (a job that varies them gets its own folders), or sweep them in separate commands"
            for group, (where, keys) in conflicts.items()]


def check(stage: str, args: list[str], config_dir: str | Path = layout.CONFIGS) -> list[Job]:
    """Every job of the sweep valid and placed apart, else one :class:`~eto_train.errors.ConfigError` naming each
    bad job and key (nothing run or written); then the jobs are recorded (:func:`record`). Returns the jobs."""
    from .errors import ConfigError

    jobs = plan(stage, args, config_dir)
    bad = [j for j in jobs if j.problems]
    if bad:
        lines = [f"{j.name}: {line}" for j in bad for line in j.problems]
        raise ConfigError(f"{len(bad)} of {len(jobs)} sweep jobs cannot run (no job was run or written):\n  "
                          + "\n  ".join(lines))
    shared = _sharing(jobs)
    if shared:
        raise ConfigError(f"sweep of {len(jobs)} jobs: stage folders shared by jobs of other settings (no job was "
                          "run or written):\n  " + "\n  ".join(shared))
    record(stage, args, jobs)
    return jobs


def record(stage: str, args: list[str], jobs: list[Job]) -> None:
    """Add this sweep's jobs to ``<sweep>/sweep.json`` of each sweep folder (several with a swept run_name)."""
    import json

    from .store import write_json

    folders: dict[str, list[Job]] = {}
    for job in jobs:
        if job.sweep:
            folders.setdefault(job.sweep, []).append(job)
    for folder, mine in folders.items():
        path = Path(folder) / layout.SWEEP_RECORD
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
            sweeps = old["sweeps"] if isinstance(old, dict) and isinstance(old.get("sweeps"), list) else []
        except (OSError, ValueError):
            sweeps = []
        sweeps.append({"stage": stage, "command": [stage, *args], "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "jobs": [{"index": j.index, "overrides": j.overrides, "swept": j.swept, "folder": j.folder}
                                for j in mine]})
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"sweeps": sweeps})


# -- the table's rows ----------------------------------------------------------------------------------------

@dataclass
class Row:
    folder: str
    name: str                        # "job <i> (<swept values>)", or the folder's name for a job not recorded
    status: str                      # done, missing: never ran, failed or stopped: ...
    result: dict[str, Any] | None = None


def _status(job: Path) -> str:
    if (job / "eto" / layout.RESULT).exists():
        return "done"
    if not job.is_dir():
        return "missing: never ran"
    import json

    for m in sorted(job.rglob(layout.MANIFEST)):
        if layout.LOGS in m.relative_to(job).parts:
            continue
        try:
            data = json.loads(m.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return f"failed or stopped: {m} cannot be read"
        if isinstance(data, dict) and data.get("status") == "running":
            return f"failed or stopped: {data.get('stage', m.parent.name)} did not finish"
    return "failed or stopped: no eto/result.json"


def jobs_of(sweep: str | Path) -> list[Row]:
    """A row for every job of the sweep in ``sweep``: those recorded in its ``sweep.json`` (the latest sweep's
    entry for a folder wins), then any other job folder with an ``eto/result.json`` (a sweep from before the record)."""
    import json

    sweep = Path(sweep)
    rows: dict[str, Row] = {}
    try:
        recorded = json.loads((sweep / layout.SWEEP_RECORD).read_text(encoding="utf-8")).get("sweeps", [])
    except (OSError, ValueError, AttributeError):
        recorded = []
    for entry in recorded:
        for j in entry.get("jobs", []):
            name = f"job {j['index']} ({','.join(j['swept']) or 'no swept key'})"
            rows.pop(j["folder"], None)
            rows[j["folder"]] = Row(j["folder"], name, _status(sweep / j["folder"]))
    for result in sorted(sweep.glob(f"*/eto/{layout.RESULT}")):
        folder = result.parent.parent.name
        rows.setdefault(folder, Row(folder, folder, "done"))
    for row in rows.values():
        if row.status == "done":
            row.result = json.loads((sweep / row.folder / "eto" / layout.RESULT).read_text(encoding="utf-8"))
    return list(rows.values())
