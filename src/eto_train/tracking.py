"""wandb, one run per stage: grouped by the run name, ``job_type`` = the stage, offline by default.

Every :class:`eto_train.manifest.Stage` that has work to do opens its own wandb run when it begins
(:func:`start`) and closes it when it finishes (:func:`finish`, with the stage's metrics in the
run's summary) or fails (exit code 1). A trainer inside the stage (TRL / transformers'
``WandbCallback``) finds that run active and logs its curves into it instead of starting one of
its own. The entry point calls :func:`configure` once with the resolved Hydra config; without it
(library use, unit tests) nothing is tracked.
"""

from __future__ import annotations

import os
from typing import Any

_settings: dict[str, Any] | None = None  # set by configure(); None: not tracking
_run = None                              # the active stage's wandb run


def configure(cfg) -> None:
    """Track the stages of this process with ``cfg.wandb`` (``enabled``, ``mode``, ``project``),
    grouped by ``cfg.run_name``, files under ``cfg.paths.run``; the resolved config goes along."""
    global _settings
    from omegaconf import OmegaConf

    w = cfg.get("wandb") or {}
    if not w.get("enabled", True):
        _settings = None
        return
    _settings = {"mode": str(w.get("mode", "offline")), "project": str(w.get("project", "eto-train")),
                 "group": str(cfg.run_name), "dir": str(cfg.paths.run),
                 "config": OmegaConf.to_container(cfg, resolve=True)}
    os.environ["WANDB_MODE"] = _settings["mode"]
    os.environ["WANDB_PROJECT"] = _settings["project"]
    os.environ["WANDB_SILENT"] = "true"


def report_to() -> str:
    """The Trainer's ``report_to``: "wandb" (into the stage's run) when tracking, else "none"."""
    return "wandb" if _settings is not None else "none"


def start(stage: str, stage_config: dict[str, Any], folder: str | os.PathLike | None = None) -> None:
    """Open the wandb run of ``stage`` (``job_type``: its first part, e.g. ``dpo`` of ``dpo/iter1``);
    main process only. The run is named by the stage's ``folder`` within the run folder (e.g.
    ``toy/compare/step/dpo``), which tells apart stages of one name (a DPO per contrast variant)."""
    global _run
    if _settings is None:
        return
    import wandb

    name = stage
    if folder is not None:
        rel = os.path.relpath(os.path.abspath(folder), os.path.abspath(_settings["dir"]))
        name = stage if rel.startswith("..") else rel.replace(os.sep, "/")

    finish(exit_code=1)  # a run still open: its stage never finished (no-op when none is)
    os.makedirs(_settings["dir"], exist_ok=True)
    _run = wandb.init(mode=_settings["mode"], project=_settings["project"], group=_settings["group"],
                      job_type=stage.split("/")[0], name=f"{_settings['group']}/{name}", dir=_settings["dir"],
                      # the Hydra config under its own key: the trainer adds its TrainingArguments at the top
                      config={"stage": stage, "stage_config": stage_config, "hydra": _settings["config"]},
                      reinit="finish_previous")


def finish(metrics: dict[str, Any] | None = None, exit_code: int = 0) -> None:
    """Put the stage's numeric metrics (nested keys joined by ``/``) in its run's summary and close it."""
    global _run
    if _run is None:
        return
    run, _run = _run, None
    if metrics:
        run.summary.update(flat_numbers(metrics))
    run.finish(exit_code=exit_code)


def record(stage: str, stage_config: dict[str, Any], metrics: dict[str, Any],
           folder: str | os.PathLike | None = None) -> None:
    """A stage without a :class:`~eto_train.manifest.Stage` of its own (pairs, the ETO summary):
    one run with its metrics, opened and closed at once."""
    start(stage, stage_config, folder)
    finish(metrics)


def flat_numbers(d: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers (and booleans) of a nested dict, keys joined by ``/``."""
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_numbers(v, key + "/"))
        elif isinstance(v, (bool, int, float)) and v is not None:
            out[key] = float(v)
    return out
