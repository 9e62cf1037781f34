"""Which adapter class ``env=<name>`` plays, and its config section's model.

Three sources, looked up in this order (the contract an adapter meets: docs/environments.md):

1. ``env.adapter: "package.module:Class"`` in the env section: that class, whatever ``env.name`` is
   (an adapter of your own without packaging it).
2. The built-in adapters (:data:`BUILTIN`), imported on first use: each pulls in its simulator's
   package, so listing them costs nothing.
3. Installed plug-ins: a distribution that declares an entry point in the group
   :data:`GROUP` (``[project.entry-points."eto_train.envs"] myenv = "mypkg.env:MyEnv"``); ``env=myenv``
   then works with no edit to eto-train. Its ``Config`` (below) gives Hydra the section's defaults
   (:func:`store_plugin_configs`), so no YAML file in configs/env is needed either.

An adapter class may carry ``Config``, a subclass of :class:`eto_train.config.EnvSection` (pydantic):
the schema its section is validated against (:func:`config_model`). Its constructor receives the
section's keys except eto-train's own (:data:`OWN_KEYS`: the wrappers', the workers', model
selection's), so the section and the constructor's keywords are one list.

Builds here are always in this process; :func:`eto_train.envs.make_env` decides whether a rollout's
environment lives in a worker process (envs/workers.py), which builds it with :func:`build`:
this module imports neither, so there is no import cycle to hide.
"""

from __future__ import annotations

import functools
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

from .base import Environment

GROUP = "eto_train.envs"  # the entry point group of environment plug-ins

# env.name -> "module:Class" of the adapters shipped with eto-train
BUILTIN: dict[str, str] = {
    "twx": "eto_train.envs.textworld_express:TextWorldExpressEnv",
    "sciworld": "eto_train.envs.scienceworld:ScienceWorldEnv",
    "alfworld": "eto_train.envs.alfworld:ALFWorldEnv",
    "webshop": "eto_train.envs.webshop:WebShopEnv",
    "openenv": "eto_train.envs.openenv:OpenEnvEnv",
    "agentgym": "eto_train.envs.agentgym:AgentGymEnv",
}

# keys of the env section that eto-train reads itself, not passed to the adapter's constructor
OWN_KEYS = ("name", "adapter", "faults", "dev_holdout", "metric", "workers", "call_timeout_s",
            "max_observation_chars")
# ... and those of them that change no episode (how splits are drawn and scored, how many processes
# step the environments, the guard's bounds): never part of a stage's hash
NOT_HASHED = ("splits", "dev_holdout", "metric", "workers", "faults", "call_timeout_s", "max_observation_chars")

BROKEN: dict[str, str] = {}  # installed plug-ins whose section could not be composed: name -> why (store_plugin_configs)


class UnknownEnvironment(KeyError):
    """``env.name`` names no built-in adapter and no installed plug-in."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def plugins() -> dict[str, str]:
    """Installed plug-ins: entry point name -> ``"module:Class"`` (a built-in's name is not overridden)."""
    return {ep.name: ep.value for ep in entry_points(group=GROUP) if ep.name not in BUILTIN}


def known() -> dict[str, str]:
    """Every environment name ``env=`` accepts: the built-ins, then the installed plug-ins."""
    return {**BUILTIN, **plugins()}


def names() -> list[str]:
    return sorted(known())


def _import(path: str, where: str) -> type:
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{where}={path!r}: an adapter is named 'package.module:Class'")
    try:
        obj = import_module(module)
    except ImportError as exc:
        raise ImportError(f"{where}={path!r}: cannot import {module!r} ({exc})") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"{where}={path!r}: module {module!r} has no {attr!r}") from None
    return obj


def _unknown(name: Any) -> UnknownEnvironment:
    found = plugins()
    installed = ", ".join(f"{n} ({v})" for n, v in sorted(found.items())) or "none"
    return UnknownEnvironment(
        f"env.name: unknown environment {name!r}; built in: {', '.join(sorted(BUILTIN))}; installed plug-ins "
        f"(entry point group {GROUP!r}): {installed}. An adapter of your own: install a package that declares "
        f"it in that group, or name its class with env.adapter='package.module:Class' (docs/environments.md)")


def adapter_path(name: Any, adapter: str | None = None) -> str:
    """``"module:Class"`` of the adapter for ``env.name`` (or ``env.adapter`` when given)."""
    if adapter:
        return str(adapter)
    path = known().get(name) if isinstance(name, str) else None
    if path is None:
        raise _unknown(name)
    return path


@functools.cache
def _load(path: str, where: str) -> type:
    return _import(path, where)


def adapter_class(name: Any, adapter: str | None = None) -> type:
    """The adapter class of ``env.name`` / ``env.adapter`` (imported now)."""
    return _load(adapter_path(name, adapter), "env.adapter" if adapter else f"env.name={name!r}: adapter")


def config_model(name: Any, adapter: str | None = None) -> type | None:
    """The pydantic model of the env section of ``env.name`` (the adapter class's ``Config``);
    None when the adapter declares none (only eto-train's own keys are then checked)."""
    return getattr(adapter_class(name, adapter), "Config", None)


def adapter_kwargs(cfg: dict[str, Any]) -> dict[str, Any]:
    """The env section's keys the adapter's constructor receives."""
    return {k: v for k, v in cfg.items() if k not in OWN_KEYS}


def build(cfg: dict[str, Any]) -> Environment:
    """One environment of the env section ``cfg`` (a plain dict), in this process: the adapter in
    its guard (envs/guard.py: answers checked, calls bounded by ``env.call_timeout_s``), the dev split
    held out of train (``env.dev_holdout``) and fault injection (``env.faults``)."""
    from .guard import GuardedEnv, Limits
    from .holdout import check_dev_config, wrap_holdout

    path = adapter_path(cfg.get("name"), cfg.get("adapter"))
    cls = adapter_class(cfg.get("name"), cfg.get("adapter"))
    check_dev_config(cfg)  # env.dev_holdout / env.splits.dev, before a simulator starts
    limits, kwargs = Limits.of(cfg), adapter_kwargs(cfg)
    guarded = GuardedEnv(lambda: cls(**kwargs), path, str(cfg.get("name")), limits)
    env = wrap_holdout(guarded, cfg)  # env.dev_holdout > 0: see envs/holdout.py
    if cfg.get("faults"):  # env.faults: fault injection (all rates 0 = off), see envs/faults.py
        from .faults import wrap_faults

        env = wrap_faults(env, cfg["faults"])
    return env


def identity(cfg: dict[str, Any], env: Environment) -> dict[str, str]:
    """What produced an episode, beyond the env section: the adapter's ``module:Class`` and its
    ``version`` (of ``env``, an instance of that section). Every stage whose output depends on the
    environment hashes it (manifest.Stage's ``environment``), so a changed adapter is played again."""
    return {"adapter": adapter_path(cfg.get("name"), cfg.get("adapter")), "version": str(env.version)}


class PluginImportError(ImportError):
    """``env=<name>`` names an installed plug-in whose section cannot be composed (its module does
    not import, or its Config has fields without a default)."""


def check_requested(overrides: list[str]) -> None:
    """``env=<name>`` on the command line naming a plug-in that :func:`store_plugin_configs` could
    not store: its import error (or its required fields), instead of Hydra's "Could not find 'env/<name>'"."""
    for o in overrides:
        key, _, value = o.partition("=")
        if key.lstrip("+~") == "env" and value in BROKEN:
            raise PluginImportError(BROKEN[value])


def plugin_defaults(name: str) -> dict[str, Any] | None:
    """The env section a plug-in's ``Config`` gives when every field of its own has a default (``name`` set):
    what ``env=<name>`` composes over configs/env_common.yaml (eto-train's own keys, :data:`OWN_KEYS`) when
    configs/env has no ``<name>.yaml``; None when a field of its own is required."""
    model = config_model(name)
    if model is None:
        return None
    own = {k: f for k, f in model.model_fields.items() if k not in OWN_KEYS}
    if any(f.is_required() for f in own.values()):
        return None  # the user writes the section (a YAML in a --config-dir)
    section = model.model_construct(name=name)  # the defaults, unvalidated: `load` validates what composes
    return {"name": name, **section.model_dump(mode="json", include=set(own))}


def store_plugin_configs(configs_dir: str | None = None) -> list[str]:
    """Put every installed plug-in's default section in Hydra's ConfigStore (group ``env``) unless
    ``configs_dir/env/<name>.yaml`` exists, so ``env=<name>`` composes; returns the names stored.
    A plug-in that fails to import is left out here: ``env=<name>`` then names the import error."""
    from pathlib import Path

    from hydra.core.config_store import ConfigStore

    stored = []
    found = plugins()
    for name in sorted(found):
        if configs_dir is not None and (Path(configs_dir) / "env" / f"{name}.yaml").exists():
            continue
        where = f"env={name}: the installed plug-in {found[name]} (entry point group {GROUP!r})"
        try:
            node = plugin_defaults(name)
        except Exception as exc:  # noqa: BLE001 - named when env=<name> asks for it (check_requested)
            cause = exc.__cause__ if isinstance(exc, ImportError) and exc.__cause__ is not None else exc
            BROKEN[name] = (f"{where} cannot be imported: {type(cause).__name__}: {cause}. Install what it needs "
                            f"(or fix its module), or uninstall the plug-in")
            continue
        if node is None:
            model = config_model(name)
            required = sorted(k for k, f in model.model_fields.items() if f.is_required() and k not in OWN_KEYS)
            BROKEN[name] = (f"{where} has Config fields without a default ({', '.join(required)}): write its section "
                            f"as env/{name}.yaml in a folder given with --config-dir (docs/environments.md)")
            continue
        BROKEN.pop(name, None)
        ConfigStore.instance().store(group="env", name=name, node=node)
        stored.append(name)
    return stored


__all__ = ["BROKEN", "BUILTIN", "GROUP", "NOT_HASHED", "OWN_KEYS", "PluginImportError", "UnknownEnvironment",
           "adapter_class", "adapter_kwargs", "adapter_path", "build", "check_requested", "config_model", "identity",
           "known", "names", "plugin_defaults", "plugins", "store_plugin_configs"]
