"""One entry point for every stage: ``eto-train <stage> [hydra overrides]``.

    eto-train bc run_name=try1 bc.epochs=1
    eto-train eto -m run_name=sweep eto.dpo.beta=0.1,0.5      # a Hydra multirun
    python -m eto_train.cli eval eval.policy=runs/demo/bc/model   # the same, without the console script
    eto-train --help                                            # the stages, one line each

The stage name is taken off the command line before Hydra parses the rest, so everything after
it is Hydra's (overrides, ``-m``, ``--cfg job``, ``--help``). The configs are the repository's
``configs/`` folder (found from this file: the package is installed editable), or the folder
named by the environment variable ``ETO_TRAIN_CONFIGS``. Hydra's job name is the stage's
(``hydra.job.name=eto_iter`` for ``eto-iter``), so each stage's logs get a folder of their own.

Every stage runs the same way: a Ctrl-C while Hydra starts up or during the job ends with one
line saying what was kept and exit status 130 (:mod:`eto_train.interrupt`); under ``-m`` each
job first gets its own run folder (:func:`eto_train.layout.isolate_sweep_job`); then tracking is
configured (:func:`eto_train.tracking.configure`, one wandb run per stage) and the stage runs.
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
    "eto-iter": StageEntry("eto_train.stages.eto:run_next_iteration",
                           "one ETO iteration (explore -> pairs -> dpo -> eval on dev) from the latest policy"),
    "eto": StageEntry("eto_train.stages.eto:run",
                      "bc if needed, then ETO iterations up to eto.iterations with early stopping; best on test"),
    "reading": StageEntry("eto_train.stages.reading:run",
                          "does each policy read its observation? first moves / takes vs chance"),
    "compare": StageEntry("eto_train.stages.compare:run",
                          "trajectory / step / mixture DPO and an SFT control from one BC, paired vs BC"),
    "demo": StageEntry("eto_train.stages.demo:run", "the whole story: eto -> compare -> reading -> report.md"),
    "report": StageEntry(lambda cfg: _report(cfg), "rebuild a finished demo's report.md (no training, no rollouts)",
                         resume=False),
    "export": StageEntry("eto_train.stages.export:run",
                         "export episodes as training data, fields dropped / redacted (config: export)",
                         resume=False, isolate=False),
}


def configs_dir() -> str:
    """The Hydra config folder: $ETO_TRAIN_CONFIGS, else the repository's configs/."""
    override = os.environ.get(ENV_CONFIGS)
    path = Path(override) if override else Path(__file__).resolve().parents[2] / "configs"
    return str(path.resolve())


def usage() -> str:
    width = max(map(len, STAGES))
    lines = [f"usage: {PROG} <stage> [hydra overrides] [-m] [--cfg job] [--help]", "", "stages:"]
    lines += [f"  {name:<{width}}  {s.help}" for name, s in STAGES.items()]
    lines += ["", f"e.g. {PROG} bc run_name=try1 bc.epochs=1;  {PROG} <stage> --help: Hydra's help for the stage",
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
    from . import tracking
    from .interrupt import interruptible
    from .layout import isolate_sweep_job

    with interruptible(cfg, resume=entry.resume):  # Ctrl-C: one line saying what was kept, exit 130
        if entry.isolate:
            isolate_sweep_job(cfg)  # under -m: one run folder per job
        tracking.configure(cfg)  # wandb: one run per stage
        entry.function()(cfg)


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

    import hydra

    from .interrupt import interruptible

    # Hydra reads sys.argv: the stage's own arguments, with the job name (the log folder's name)
    # before the first override, so that a hydra.job.name given on the command line still wins
    sys.argv = [sys.argv[0], *with_job_name(rest, name.replace("-", "_"))]

    def task(cfg) -> None:
        _job(entry, cfg)

    hydra_main = hydra.main(config_path=configs_dir(), config_name="config", version_base="1.3")(task)
    with interruptible(resume=entry.resume):  # and while Hydra starts up
        hydra_main()


if __name__ == "__main__":
    main()
