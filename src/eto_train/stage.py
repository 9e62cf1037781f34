"""What every stage script shares: thread setup, config plumbing, run folders and manifests.

A stage writes into its own folder with ``manifest.json``: the config sections it used (and
their hash), its inputs' content hashes, library versions, thread counts, metrics and status.
A finished stage whose config and inputs are unchanged is skipped (and says so).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .store import write_json

PACKAGES = ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "tokenizers",
            "textworld-express", "scienceworld", "hydra-core", "eto-train")


def to_plain(cfg) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, (dict, list)) else cfg


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


def setup_runtime(threads: int) -> None:
    """Set torch's thread count deliberately (busy JVMs make 2 threads 5-8x slower than 1)."""
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")  # TRL's reference pass uses a bare tqdm
    torch.set_num_threads(int(threads))
    # One rich display per stage: silence the libraries' own tqdm bars.
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def setup_wandb(wandb_cfg: dict[str, Any], run_dir: Path) -> str:
    """wandb offline by default; returns the Trainer's ``report_to`` value."""
    if not wandb_cfg.get("enabled", True):
        return "none"
    os.environ["WANDB_MODE"] = str(wandb_cfg.get("mode", "offline"))
    os.environ.setdefault("WANDB_PROJECT", str(wandb_cfg.get("project", "eto-train")))
    os.environ.setdefault("WANDB_DIR", str(run_dir))
    os.environ.setdefault("WANDB_SILENT", "true")
    return "wandb"


def file_sha256(path: str | os.PathLike) -> str:
    p = Path(path)
    h = hashlib.sha256()
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    for f in files:
        h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for p in PACKAGES:
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = "not installed"
    return out


def config_hash(section: Any) -> str:
    return hashlib.sha256(json.dumps(section, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Stage:
    """A stage's folder and manifest. Use ``if stage.done(): return`` then ``stage.finish(...)``."""

    def __init__(self, name: str, out_dir: str | os.PathLike, config: dict[str, Any],
                 inputs: dict[str, str | os.PathLike] | None = None):
        self.name, self.dir, self.config = name, Path(out_dir), config
        self.inputs = {k: str(v) for k, v in (inputs or {}).items()}
        self.manifest_path = self.dir / "manifest.json"
        self.started = time.time()

    def _input_hashes(self) -> dict[str, str]:
        out = {}
        for k, v in self.inputs.items():
            if not Path(v).exists():
                raise FileNotFoundError(f"stage {self.name}: input {k!r} not found at {v} "
                                        f"(run the stage that writes it first)")
            out[k] = file_sha256(v)
        return out

    def done(self) -> bool:
        """True when a finished manifest matches this config and these inputs."""
        self.input_hashes = self._input_hashes()
        if not self.manifest_path.exists():
            return False
        try:
            old = json.loads(self.manifest_path.read_text())
        except json.JSONDecodeError:
            return False
        same = (old.get("status") == "done" and old.get("config_hash") == config_hash(self.config)
                and old.get("input_hashes") == self.input_hashes)
        if same:
            print(f"[{self.name}] up to date in {self.dir} (same config and inputs): nothing to do")
        return same

    def begin(self) -> bool:
        """Mark the stage running. True when partial work in the folder may be resumed
        (an interrupted run with the same config and inputs); False means start clean."""
        if not hasattr(self, "input_hashes"):
            self.input_hashes = self._input_hashes()
        resumable = False
        if self.manifest_path.exists():
            try:
                old = json.loads(self.manifest_path.read_text())
                resumable = (old.get("config_hash") == config_hash(self.config)
                             and old.get("input_hashes") == self.input_hashes)
            except json.JSONDecodeError:
                pass
        write_json(self.manifest_path, {
            "stage": self.name, "status": "running", "config": self.config,
            "config_hash": config_hash(self.config), "inputs": self.inputs,
            "input_hashes": self.input_hashes, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        return resumable

    def finish(self, metrics: dict[str, Any] | None = None, **extra: Any) -> None:
        write_json(self.manifest_path, {
            "stage": self.name, "status": "done", "config": self.config,
            "config_hash": config_hash(self.config), "inputs": self.inputs,
            "input_hashes": getattr(self, "input_hashes", None) or self._input_hashes(),
            "versions": versions(), "threads": _threads(), "seconds": round(time.time() - self.started, 2),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "metrics": metrics or {}, **extra})


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def copy_outputs(src: Path, dst: Path, names: list[str]) -> None:
    """Copy a finished stage's outputs (files or folders) and then its manifest, each by a
    temporary name and a rename: a half-copied stage is never seen as done. Used to share a
    stage between sweep jobs that run it with the very same config and inputs."""
    import shutil

    dst.mkdir(parents=True, exist_ok=True)
    for name in [*names, "manifest.json"]:
        tmp, final = dst / f".{name}.tmp", dst / name
        if tmp.exists():
            shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
        if (src / name).is_dir():
            shutil.copytree(src / name, tmp)
            if final.exists():
                shutil.rmtree(final)
        else:
            shutil.copyfile(src / name, tmp)
        os.replace(tmp, final)
