"""Environments: ``env=<name>`` selects an adapter (envs/registry.py: the built-ins, installed
plug-ins, or ``env.adapter: module:Class``) and :func:`make_env` builds it, in this process or, inside
a rollout with ``env.workers`` > 0, in a worker process (envs/workers.py)."""

from __future__ import annotations

from typing import Any

from . import registry
from .base import Environment, EnvironmentFailure, EnvironmentTimeout, StepResult, Task
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


def check_playable(cfg: dict[str, Any]) -> None:
    """Fail now, not after hours of BC, when the environment cannot be played (a package that
    is imported on first use, as WebShop's; a server that is not up)."""
    env = make_env(cfg)
    try:
        getattr(env, "check_playable", lambda: None)()
    finally:
        env.close()


__all__ = ["Environment", "EnvironmentFailure", "EnvironmentTimeout", "StepResult", "Task",
           "check_playable", "make_env", "registry"]
