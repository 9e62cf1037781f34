"""Environment registry: ``env=<name>`` in Hydra selects an adapter by ``env.name``."""

from __future__ import annotations

from typing import Any, Callable

from .base import Environment, EnvironmentFailure, EnvironmentTimeout, StepResult, Task

_REGISTRY: dict[str, Callable[..., Environment]] = {}


def register(name: str):
    def deco(factory):
        _REGISTRY[name] = factory
        return factory
    return deco


@register("twx")
def _twx(**cfg: Any) -> Environment:
    from .textworld_express import TextWorldExpressEnv
    return TextWorldExpressEnv(**cfg)


def make_env(cfg: dict[str, Any]) -> Environment:
    """Build one environment instance from an ``env`` config section (a plain dict)."""
    name = cfg.get("name")
    if name not in _REGISTRY:
        raise KeyError(f"env.name: unknown environment {name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[name](**cfg)


__all__ = ["Environment", "EnvironmentFailure", "EnvironmentTimeout", "StepResult", "Task",
           "make_env", "register"]
