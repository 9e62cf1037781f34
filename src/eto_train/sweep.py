"""Hydra multiruns: each sweep job gets its own run folder; experts, the tiny model and BC stay
shared unless the sweep varies something BC depends on.
"""

from __future__ import annotations

import sys

# Overrides that change what BC is trained on or how; a sweep job with one of them gets its own BC.
_BC_KEYS = ("bc.", "env.", "env=", "model.", "model=", "bc=", "prompt.", "prompt=", "experts.", "seed=", "paths.")


def _swept_overrides(hc) -> list[str]:
    """This job's overrides of the keys the sweep varies (``-m key=a,b``), e.g. ``eto.dpo.beta=0.5``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(
        [a for a in sys.argv[1:] if "=" in a and not a.startswith(("-", "hydra."))])
    swept = {o.key_or_group for o in parsed if o.is_sweep_override()}
    return sorted(o for o in hc.overrides.task if o.split("=", 1)[0].lstrip("+~") in swept)


def isolate_sweep_job(cfg) -> None:
    """Under a Hydra multirun, give each job its own run folder.

    The job's folder is ``<runs>/<run_name>/<its swept overrides>`` (Hydra's ``override_dirname``
    lists the fixed overrides too and soon exceeds a file name's length). Experts, the tiny
    model and BC stay shared in ``<runs>/<run_name>`` (trained once, skipped by the next jobs)
    unless the sweep varies something BC depends on. A plain run is left untouched.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import open_dict

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    hc = HydraConfig.get()
    mine = _swept_overrides(hc)
    name = ",".join(mine).replace("/", "_")
    if not name or len(name) > 200:
        name = f"job{hc.job.num}"
    shared = cfg.paths.run
    with open_dict(cfg):
        cfg.paths.run = f"{shared}/{name}"
        explicit_base = any(o.startswith("paths.base=") for o in hc.overrides.task)
        if not explicit_base and not any(o.lstrip("+~").startswith(_BC_KEYS) for o in mine):
            cfg.paths.base = shared
