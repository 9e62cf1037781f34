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


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def pick_threads(setting: int | str, gain: float = 1.25) -> int:
    """torch's thread count for ``setting`` (``runtime.train_threads`` / ``rollout_threads``): an
    integer as it is; ``auto``: measured now, on this machine as it is loaded. A matmul of a
    real model's shape (128 x 576 x 1536, fp32) is timed at one thread and at every core; all cores
    when they are at least ``gain`` times faster, else one. Both cores of the 2-core box when nothing
    else runs on them (1.6-1.9x); one when a simulator's JVM, another run or a test keeps a core busy
    (then 2 threads wait on each other: 5-8x slower than 1 was seen). About 0.1 s."""
    if setting != "auto":
        return int(setting)
    n = cores()
    if n == 1:
        return 1
    import time

    import torch

    a, b = torch.randn(128, 576), torch.randn(1536, 576)
    before = torch.get_num_threads()

    def median_ms(threads: int) -> float:
        torch.set_num_threads(threads)
        torch.nn.functional.linear(a, b)  # warm the pool
        times = []
        for _ in range(5):
            t = time.perf_counter()
            torch.nn.functional.linear(a, b)
            times.append(time.perf_counter() - t)
        return sorted(times)[2]

    try:
        one, all_ = median_ms(1), median_ms(n)
    finally:
        torch.set_num_threads(before)
    return n if one >= gain * all_ else 1


def setup_runtime(threads: int | str, cpu_kernels: bool = True) -> int:
    """Set torch's thread count deliberately (busy JVMs make 2 threads 5-8x slower than 1):
    ``threads`` an integer, or ``auto`` (:func:`pick_threads`); returns the count set. ``cpu_kernels``
    (``runtime.cpu_kernels``): whether the project's C++ kernels are built and used (:mod:`eto_train.native`)."""
    import torch

    from . import native

    native.enable(cpu_kernels)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")  # TRL's reference pass uses a bare tqdm
    n = pick_threads(threads)
    torch.set_num_threads(n)
    from .distributed import fsdp_on_cpu

    fsdp_on_cpu()  # an FSDP config on a CPU (the rehearsal) shards for real instead of falling back to DDP
    # One rich display per stage: silence the libraries' own tqdm bars.
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    return n


def versions() -> dict[str, str]:
    """The packages' versions, and which attention kernels this process runs (``cpu_kernels``: the project's C++
    ones or torch's, per CPU; :func:`eto_train.native.choices`)."""
    from . import native

    out = {"python": sys.version.split()[0], "platform": platform.platform(), "cpu_kernels": native.choices()}
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
