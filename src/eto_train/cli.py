"""One entry point for every stage: ``eto-train <stage> [hydra overrides]``.

    eto-train bc run_name=try1 bc.num_train_epochs=1
    eto-train eto -m run_name=sweep eto.dpo.beta=0.1,0.5      # a Hydra multirun
    python -m eto_train.cli eval eval.policy=runs/demo/bc/model   # the same, without the console script
    eto-train --help                                            # the stages, one line each

The stage name is taken off the command line before Hydra parses the rest, so everything after
it is Hydra's (overrides, ``-m``, ``--cfg job``, ``--help``). The configs are the repository's
``configs/`` folder (found from this file: the package is installed editable), or the folder
named by the environment variable ``ETO_TRAIN_CONFIGS``. Hydra's job name is the stage's
(``hydra.job.name=eto_iter`` for ``eto-iter``), so each stage's logs get a folder of their own.

Every stage runs the same way: a Ctrl-C while Hydra starts up or during the job ends with one
line saying what was kept and exit status 130 (:mod:`eto_train.interrupt`); under ``-m`` every job's
config is composed and validated before the first one runs, and the jobs recorded (:mod:`eto_train.sweeps`); each
job first gets its own run folder (:func:`eto_train.layout.isolate_sweep_job`); then the config is
validated and typed once (:func:`eto_train.config.load`), tracking is configured (:func:`eto_train.tracking.configure`, one wandb run per stage) and the stage runs;
``eto`` and ``compare`` with ``seeds`` set run once per seed, each in ``<run>/seed<k>/``, then
aggregate (:mod:`eto_train.seeds`).

Before Hydra's run (plain overrides; not under ``-m``, ``--cfg``, ``--help``) the config is
composed once: a bad override, and a paper-sized model on a machine without a CUDA GPU
(:mod:`eto_train.device_check`), stop there, before Hydra makes its log folder
``<run>/logs/<time>-<stage>``; a run folder that cannot be written gets its log folder in a
temporary folder instead (with a one-line note), so that reading stages run on a read-only run.
A config, input or disk error is printed as one block with exit status 2 (input) or 1 (disk)
(:mod:`eto_train.errors`; the traceback with ``ETO_TRAIN_TRACEBACK=1``), and a job that fails
on one removes the log folder it started with, if that holds only Hydra's own files.
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ENV_CONFIGS = "ETO_TRAIN_CONFIGS"
PROG = "eto-train"


@dataclass(frozen=True)
class StageEntry:
    target: str | Callable  # "module:function", imported when the stage runs, or a function of this module
    help: str  # one line for `eto-train --help`
    resume: bool = True  # a rerun of the same command resumes (else it starts over)
    isolate: bool = True  # under -m, each job gets its own run folder
    seeded: str | None = None  # with `seeds`: once per seed in <run>/seed<k>/, then the aggregate's entry (seeds.py)

    def function(self) -> Callable:
        if callable(self.target):
            return self.target
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)


STAGES: dict[str, StageEntry] = {
    "experts": StageEntry("eto_train.stages.experts:run", "expert (gold-path) trajectories of the training tasks"),
    "model": StageEntry("eto_train.stages.model:run",
                        "build the offline tiny base model (tokenizer + small Llama), no download"),
    "pretrain": StageEntry(lambda cfg: _pretrain(cfg),
                           "pretrain a small causal LM on text-game transcripts (configs/pretrain)"),
    "bc": StageEntry("eto_train.stages.bc:run", "behavior cloning (SFT on expert actions only)"),
    "eval": StageEntry("eto_train.stages.evaluate:run",
                       "evaluate a policy (default: the bc model) on held-out splits (eval.splits)"),
    "eto-iter": StageEntry("eto_train.stages.eto.loop:run_next_iteration",
                           "one ETO iteration (explore -> pairs -> dpo -> eval on dev) from the latest policy"),
    "eto": StageEntry("eto_train.stages.eto.loop:run",
                      "bc if needed, then ETO iterations up to eto.iterations with early stopping; best on test",
                      seeded="eto"),
    "reading": StageEntry("eto_train.stages.reading:run",
                          "does each policy read its observation? first moves / takes vs chance"),
    "compare": StageEntry("eto_train.stages.compare:run",
                          "the DPO arms (compare.variants) and an SFT control from one BC, paired vs BC",
                          seeded="compare"),
    "demo": StageEntry("eto_train.stages.demo:run", "scripts/demo.sh's stages in one process: experts -> model -> "
                       "bc -> eval -> eto -> compare -> reading -> report.md"),
    "report": StageEntry(lambda cfg: _report(cfg), "rebuild a finished demo's report.md (no training, no rollouts)",
                         resume=False),
    "results": StageEntry("eto_train.stages.results:run",
                          "keep a finished seed's (or unit's) results outside the run folder (results.dir), then "
                          "the seeds' table from that folder alone", resume=False, isolate=False),
    "export": StageEntry("eto_train.stages.export:run",
                         "export episodes as training data, fields dropped / redacted (config: export)",
                         resume=False, isolate=False),
}


def configs_dir() -> str:
    """The Hydra config folder: $ETO_TRAIN_CONFIGS, else the repository's configs/."""
    override = os.environ.get(ENV_CONFIGS)
    from .layout import CONFIGS

    path = Path(override) if override else CONFIGS
    return str(path.resolve())


def usage() -> str:
    width = max(map(len, STAGES))
    lines = [f"usage: {PROG} <stage> [hydra overrides] [-m] [--cfg job] [--help]", "", "stages:"]
    lines += [f"  {name:<{width}}  {s.help}" for name, s in STAGES.items()]
    lines += ["", f"e.g. {PROG} bc run_name=try1 bc.num_train_epochs=1;  {PROG} <stage> --help: Hydra's help for the stage",
              f"configs: {configs_dir()} (set {ENV_CONFIGS} to use another folder)"]
    return "\n".join(lines)


# -- stages whose wrapper did a little more than call run(cfg) -----------------------------------
_command = f"{PROG} pretrain"  # the command line, for the pretrained model's card


def _pretrain(cfg) -> None:
    from .stages import pretrain

    pretrain.run(cfg, command=_command)


def _report(cfg) -> None:
    from .stages import report

    print(report.run(cfg))


def with_job_name(args: list[str], job: str) -> list[str]:
    """``args`` with ``hydra.job.name=<job>`` among the overrides: just before the first one (Hydra's
    parser takes the overrides as one run of positional arguments, e.g. ``-m a=1 b=1,2 --cfg job``),
    or last when there is none."""
    first = next((i for i, a in enumerate(args) if "=" in a and not a.startswith("-")), len(args))
    return [*args[:first], f"hydra.job.name={job}", *args[first:]]


def _job(entry: StageEntry, cfg) -> None:
    """One job: its own run folder under -m (on Hydra's DictConfig), the config validated once
    (:func:`eto_train.config.load`: every bad value in one error), tracking, then the stage with
    the typed Config."""
    from . import runtime, tracking
    from .config import load
    from .interrupt import interruptible
    from .layout import isolate_sweep_job, own_run

    global _cfg
    _cfg = cfg
    # Ctrl-C: one line saying what was kept, exit 130; a finished stage outside the run's folder (reached through
    # paths.base) is another run's, not redone in place (manifest.check_owner)
    with interruptible(cfg, resume=entry.resume), own_run(cfg.paths.run):
        if entry.isolate:
            isolate_sweep_job(cfg)  # under -m: one run folder per job
        config = load(cfg)
        runtime.configure(config.runtime)  # its switches (C++ kernels, library hooks), read once per process
        tracking.configure(cfg)  # wandb: one run per stage
        if entry.seeded and config.seeds:  # each seed's run in <run>/seed<k>/, then <run>/seeds.{json,md}
            from .seeds import run_seeds

            run_seeds(entry.seeded, entry.function(), cfg)
        else:
            entry.function()(config)


# -- before Hydra's run: the config composed once, its errors, the run folder, the device ---------
_cfg = None  # the job's config, for the stage a disk error names
_fresh: list[Path] = []  # folders this command would create for Hydra's log (removed on a failed start)


def _overrides_only(args: list[str]) -> bool:
    """Plain overrides (no -m, --cfg, --help, ...): then the config is composed before Hydra's run."""
    return all("=" in a and not a.startswith("-") for a in args)


def _composer(job: str):
    def compose(overrides: list[str]):
        from hydra import compose as hydra_compose, initialize_config_dir

        with initialize_config_dir(config_dir=configs_dir(), version_base="1.3", job_name=job):
            return hydra_compose("config", overrides=list(overrides))
    return compose


def _running_stage() -> str | None:
    """The stage (manifest name) this process left running, for a disk error's message."""
    from .interrupt import _Guard

    found = _Guard(_cfg, True)._running_stage() if _cfg is not None else None
    return found[1].get("stage", found[0].name) if found else None


def _log_dir_overrides(cfg, job: str, rest: list[str]) -> list[str]:
    """Where Hydra's log folder goes: ``<run>/logs/<time>-<stage>`` when the run folder can be
    written, else a temporary folder (a read-only run folder still serves report, reading, export),
    with a one-line note. Records the folders the log would create, for a failed start to remove."""
    from omegaconf import OmegaConf

    from .errors import writable

    if any(a.startswith("hydra.run.dir=") for a in rest):
        return []
    run = Path(str(OmegaConf.select(cfg, "paths.run")))
    from .layout import LOGS

    logs = run / LOGS  # as hydra.run.dir in configs/config.yaml
    _fresh[:] = [p for p in (logs, *logs.absolute().parents) if not p.exists()]  # deepest first
    if writable(logs):
        return [f"hydra.run.dir={hydra_quoted(str(_own_log_dir(logs, job)))}"]
    import tempfile

    where = Path(tempfile.gettempdir()) / "eto-train-logs" / str(cfg.run_name)
    sys.stderr.write(f"{PROG}: note: {run} is not writable; this command's log folder is under {where}\n")
    _fresh.clear()
    return [f"hydra.run.dir={hydra_quoted(str(_own_log_dir(where, job)))}"]


def hydra_quoted(value: str) -> str:
    """``value`` as one quoted string of Hydra's override grammar: any path (a run_name such as
    ``ünï``, a space, a quote) parses as itself; a backslash is doubled where it precedes a quote."""
    import re

    inner = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
    return f"'{inner}'"


def _own_log_dir(logs: Path, job: str) -> Path:
    """This command's own log folder ``<logs>/<time>-<job>``, made here (``-2``, ``-3``, ... when a
    command of the same stage took that second's name: three evals started together each keep
    their resolved config and log; under ``accelerate launch`` each process gets its own, ``-rank<r>``
    for the global rank r > 0, on one machine or several). Hydra
    then writes into it (configs/config.yaml's ``hydra.run.dir`` has the same form)."""
    import time

    from .distributed import rank

    stamp = time.strftime("%Y%m%d-%H%M%S")
    mine = f"{stamp}-{job}" + (f"-rank{rank()}" if rank() else "")  # accelerate launch: rank 0's has the plain name
    logs.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        folder = logs / (mine if n == 1 else f"{mine}-{n}")
        try:
            folder.mkdir()  # atomic: exactly one command gets each name
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f"{logs}: 10,000 log folders named {stamp}-{job}-<n>")  # pragma: no cover


def _hydra_run(entry: StageEntry, name: str, rest: list[str]) -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from . import errors
    from .interrupt import interruptible

    job = name.replace("-", "_")
    extra: list[str] = []
    _fresh.clear()
    if _overrides_only(rest):  # compose once first: bad overrides, the device and the log folder
        cfg = _composer(job)(rest)  # before Hydra makes a folder
        from .device_check import MODEL_STAGES, check_device

        from .layout import check_run_folder

        check_run_folder(cfg)  # run_name inside paths.runs, paths.runs a folder: before any folder is made
        check_device(cfg, name)
        if name in MODEL_STAGES:  # a damaged tokenizer.json or config.json of the policy: named before Hydra's run
            from .model.load import check_json_files

            check_json_files(cfg.eval.policy if name == "eval" else cfg.model.path)
        extra = _log_dir_overrides(cfg, job, rest)
    else:
        from . import sweeps

        if sweeps.checked(rest):  # -m: every job composed, placed and validated before the first one runs
            sweeps.check(name, rest, configs_dir())
    # Hydra reads sys.argv: the stage's own arguments, with the job name (the log folder's name)
    # before the first override, so that a hydra.job.name given on the command line still wins
    sys.argv = [sys.argv[0], *with_job_name([*rest, *extra], job)]

    failed: list[Exception] = []

    def task(cfg) -> None:
        try:
            _job(entry, cfg)
        except Exception as exc:
            if not (errors.is_input_error(exc) or errors.is_disk_error(exc)):
                raise  # a bug: Hydra's report, with its traceback
            # a failed start leaves no log folder of Hydra's in the run; the error is raised after
            # Hydra's run, which would print "Error executing job with overrides [...]" first
            # (hydra/core/utils.py JobReturn.return_value) above the one block errors.reporting prints
            errors.remove_start_folders(Path(HydraConfig.get().runtime.output_dir), _fresh)
            failed.append(exc)

    hydra_main = hydra.main(config_path=configs_dir(), config_name="config", version_base="1.3")(task)
    with interruptible(resume=entry.resume):  # and while Hydra starts up
        hydra_main()
    if failed:
        raise failed[0]


def main(argv: list[str] | None = None) -> None:
    """``eto-train <stage> [hydra overrides]``; ``argv``: the arguments after the program name."""
    global _command
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        sys.exit(0)
    name, rest = args[0], args[1:]
    if name not in STAGES:
        print(f"{PROG}: unknown stage {name!r}; the stages are: {', '.join(STAGES)}\n\n{usage()}", file=sys.stderr)
        sys.exit(2)
    entry = STAGES[name]
    _command = " ".join([PROG, name, *map(shlex.quote, rest)])

    from . import errors
    from .config_files import check_config_files
    from .envs.registry import check_requested, store_plugin_configs

    store_plugin_configs(configs_dir())  # env=<plug-in> composes from its adapter's Config (envs/registry.py)
    # Hydra re-raises what a job raised (hydra/_internal/utils.py run_and_report) and errors.reporting
    # prints it: one block for a config, input or disk error; the traceback with ETO_TRAIN_TRACEBACK=1
    # (or HYDRA_FULL_ERROR=1, which this sets for Hydra while it runs)
    errors.full_traceback = errors.wants_traceback()
    saved = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    compose = _composer(name.replace("-", "_"))
    overrides = [a for a in rest if "=" in a and not a.startswith("-")]
    try:
        with errors.reporting(name, overrides, compose, running=_running_stage):
            check_config_files(configs_dir(), rest)  # a YAML alias bomb: named, before Hydra reads it (hangs)
            check_requested(overrides)  # env=<a plug-in that does not import>: its import error, not Hydra's
            _hydra_run(entry, name, rest)
    finally:
        if saved is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved


if __name__ == "__main__":
    main()
