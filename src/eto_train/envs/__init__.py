"""Environments: ``env=<name>`` selects an adapter (envs/registry.py: the built-ins, installed
plug-ins, or ``env.adapter: module:Class``) and :func:`make_env` builds it, in this process or, inside
a rollout with ``env.workers`` > 0, in a worker process (envs/workers.py)."""

from __future__ import annotations

from typing import Any

from . import registry
from .base import AdapterContractError, AdapterError, Environment, EnvironmentFailure, EnvironmentTimeout, StepResult, Task
from .workers import hosted_env, worker_count


def make_env(cfg: dict[str, Any]) -> Environment:
    """Build one environment instance from an ``env`` config section (a plain dict)."""
    registry.adapter_path(cfg.get("name"), cfg.get("adapter"))  # an unknown name: before anything starts
    from .holdout import check_dev_config

    check_dev_config(cfg)  # env.dev_holdout / env.splits.dev, env.workers: checked before a simulator starts
    worker_count(cfg)
    hosted = hosted_env(cfg)  # a rollout's environment in a worker process (env.workers); elsewhere
    if hosted is not None:  # (task lists, gold paths) it is built here
        return hosted
    return registry.build(cfg)


class MissingSplit(ValueError):
    """A split a setting names (eval.splits, compare.splits, eto.explore.split, ...) that the
    environment does not have."""


def check_splits(cfg: dict[str, Any], named: dict[str, str | list[str]]) -> None:
    """Every split ``named`` by a setting (``{"eval.splits": [...], "eto.explore.split": "train"}``)
    exists in the environment of the env section ``cfg``: checked before anything runs, one error
    naming the setting, the split and the splits there are."""
    env = make_env(cfg)
    try:
        for key, value in named.items():
            for split in [value] if isinstance(value, str) else list(value):
                try:
                    env.tasks(split)
                except KeyError:
                    have = sorted({*(cfg.get("splits") or {}), *(["dev"] if (cfg.get("dev_holdout") or 0) > 0 else [])})
                    if isinstance(value, str):
                        shown, fix = value, ""
                    else:
                        shown = "[" + ", ".join(value) + "]"
                        kept = [s for s in value if s in have] or [s for s in have if s not in ("train", "dev")]
                        fix = f"; e.g. {key}=[{', '.join(kept)}]" if kept else ""
                    raise MissingSplit(
                        f"{key}={shown}: the environment {cfg.get('name')!r} has no split {split!r} (its splits: "
                        f"{', '.join(have) or 'none'}){fix}. Nothing was run") from None
    finally:
        env.close()


def check_playable(cfg: dict[str, Any]) -> None:
    """Fail now, not after hours of BC, when the environment cannot be played (a package that
    is imported on first use, as WebShop's; a server that is not up)."""
    env = make_env(cfg)
    try:
        getattr(env, "check_playable", lambda: None)()
    finally:
        env.close()


__all__ = ["AdapterContractError", "AdapterError", "Environment", "EnvironmentFailure", "EnvironmentTimeout",
           "MissingSplit", "StepResult", "Task", "check_playable", "check_splits", "make_env", "registry"]
