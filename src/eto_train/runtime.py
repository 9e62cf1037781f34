"""What every stage sets up and records: torch threads and quiet libraries, plain configs, the
config hash and the versions of every package that can shape a result (see :mod:`eto_train.manifest`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

# Every package that can shape a result (training, generation, the environments, the numbers);
# one that is absent is recorded as "not installed".
PACKAGES = ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "tokenizers", "safetensors",
            "numpy", "vllm", "bitsandbytes", "deepspeed", "wandb", "textworld-express", "scienceworld",
            "alfworld", "textworld", "hydra-core", "eto-train")


def to_plain(cfg) -> Any:
    """A config section as plain JSON types: a typed section (config.py) as the YAML gave it
    (``exclude_unset``: defaults the YAML does not name stay out, so stage hashes keep their
    value), a DictConfig resolved, a dict or list as it is."""
    from pydantic import BaseModel

    if isinstance(cfg, BaseModel):
        return cfg.model_dump(mode="json", exclude_unset=True)
    if isinstance(cfg, (dict, list)):
        return cfg
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def setup_runtime(threads: int) -> None:
    """Set torch's thread count deliberately (busy JVMs make 2 threads 5-8x slower than 1)."""
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")  # TRL's reference pass uses a bare tqdm
    torch.set_num_threads(int(threads))
    from .distributed import fsdp_on_cpu

    fsdp_on_cpu()  # an FSDP config on a CPU (the rehearsal) shards for real instead of falling back to DDP
    # One rich display per stage: silence the libraries' own tqdm bars.
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for p in PACKAGES:
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = "not installed"
    return out


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def config_hash(section: Any) -> str:
    return hashlib.sha256(json.dumps(section, sort_keys=True, default=str).encode()).hexdigest()[:16]
