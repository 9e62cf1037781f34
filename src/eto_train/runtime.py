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


def setup_runtime(threads: int | str) -> int:
    """Set torch's thread count deliberately (busy JVMs make 2 threads 5-8x slower than 1):
    ``threads`` an integer, or ``auto`` (:func:`pick_threads`); returns the count set. The runtime
    section's switches are not passed here: :func:`configure` read them once, at the entry point."""
    import torch

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


# -- the CPU speed layer's switches: read once per process (configure), asked where they act ------------------
_library_hooks: str | bool = "cpu"  # runtime.library_hooks until configure(): the config's default


def configure(section) -> None:
    """The runtime section's switches (typed: :class:`eto_train.config.Runtime`), read once per process where the
    config is typed (``cli``; each process of ``accelerate launch`` runs the same entry point): ``cpu_kernels``
    into :mod:`eto_train.native` (the project's C++ kernels, where they are the faster), ``library_hooks`` for
    :func:`library_hooks`. Nothing passes them on; a stage run without the entry point (a test, a script) runs the
    config's defaults unless it calls this. Neither enters a stage's config hash (the runtime section is in none)."""
    from . import native

    native.enable(section.cpu_kernels)
    global _library_hooks
    _library_hooks = section.library_hooks


def library_hooks() -> bool:
    """Whether training puts this project's hooks into TRL and transformers (``runtime.library_hooks``):
    training/lm_head.py (TRL's fused LM head over the labelled positions only) and training/right_padding.py
    (right-padded rows packed, shared prefixes once; bf16 attention through :mod:`eto_train.native`).

    ``cpu`` (the default): where training runs on the CPU, i.e. where torch sees no accelerator (CUDA, XPU, MPS):
    there they were measured faster (docs/lab/bench.md). Not on a GPU: there TRL's fused head projects only the
    labelled positions already, and the packing was never timed against the libraries' own path (it ran in
    scripts/gpu_smoke.sh on an H200, 2026-12-04: correct, not timed), so a GPU trains with the libraries as they
    are. ``true``: on any device (the same results to rounding); ``false``: never, the CPU included."""
    setting = _library_hooks
    if setting != "cpu":
        return bool(setting)
    import torch

    return not torch.accelerator.is_available()


def versions() -> dict[str, str]:
    """The packages' versions, which attention kernels this process runs (``cpu_kernels``: the project's C++
    ones or torch's, per CPU; :func:`eto_train.native.choices`) and whether training's hooks into TRL and
    transformers are in (``library_hooks``, :func:`library_hooks`)."""
    from . import native

    hooks = f"{'on' if library_hooks() else 'off'} (runtime.library_hooks={str(_library_hooks).lower()})"
    out = {"python": sys.version.split()[0], "platform": platform.platform(), "cpu_kernels": native.choices(),
           "library_hooks": hooks}
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
