"""Environment registry: ``env=<name>`` in Hydra selects an adapter by ``env.name``."""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable

from .base import Environment, EnvironmentFailure, EnvironmentTimeout, StepResult, Task

_REGISTRY: dict[str, Callable[..., Environment]] = {}


def register(name: str):
    def deco(factory):
        _REGISTRY[name] = factory
        return factory
    return deco


# the adapters, imported on first use (each pulls in its simulator's package): env.name -> module, class
_ADAPTERS = {"twx": ("textworld_express", "TextWorldExpressEnv"), "sciworld": ("scienceworld", "ScienceWorldEnv"),
             "alfworld": ("alfworld", "ALFWorldEnv"), "webshop": ("webshop", "WebShopEnv")}


def _lazy(module: str, cls: str) -> Callable[..., Environment]:
    def factory(**cfg: Any) -> Environment:
        return getattr(import_module(f".{module}", __name__), cls)(**cfg)
    return factory


for _name, (_module, _cls) in _ADAPTERS.items():
    register(_name)(_lazy(_module, _cls))


def make_env(cfg: dict[str, Any]) -> Environment:
    """Build one environment instance from an ``env`` config section (a plain dict)."""
    name = cfg.get("name")
    if name not in _REGISTRY:
        raise KeyError(f"env.name: unknown environment {name!r}; registered: {sorted(_REGISTRY)}")
    from .holdout import check_dev_config, wrap_holdout
    from .workers import hosted_env, worker_count
    check_dev_config(cfg)  # env.dev_holdout / env.splits.dev, before a simulator starts
    if worker_count(cfg) > 0:  # env.workers: inside a rollout, the environment lives in a worker process
        hosted = hosted_env(cfg)  # (envs/workers.py); elsewhere (task lists, gold paths) it is built here
        if hosted is not None:
            return hosted
    # keys of the wrappers, of the workers and of model selection (env.metric, read by stages/eto.py),
    # not the adapter's
    env = _REGISTRY[name](**{k: v for k, v in cfg.items() if k not in ("faults", "dev_holdout", "metric", "workers")})
    env = wrap_holdout(env, cfg)  # env.dev_holdout > 0: a dev split held out of train, see envs/holdout.py
    if cfg.get("faults"):  # env.faults: fault injection (all rates 0 = off), see envs/faults.py
        from .faults import wrap_faults
        env = wrap_faults(env, cfg["faults"])
    return env


def check_playable(cfg: dict[str, Any]) -> None:
    """Fail now, not after hours of BC, when the environment cannot be played (a package that
    is imported on first use, as WebShop's)."""
    env = make_env(cfg)
    try:
        getattr(env, "check_playable", lambda: None)()
    finally:
        env.close()


__all__ = ["Environment", "EnvironmentFailure", "EnvironmentTimeout", "StepResult", "Task",
           "check_playable", "make_env", "register"]
