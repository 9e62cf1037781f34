"""What the stages need to know when `accelerate launch` starts one process per GPU.

Training (bc, dpo) runs data-parallel in every process (the Trainer does the sharding).
Rollouts (evaluation, exploration) are data-parallel too (rollouts/play.py): the main process
publishes a plan, every process plays its share into its own shard file, and the main one
merges the shards and finishes the stage while the others wait for its manifest
(``eval.data_parallel: false``: the main process plays every episode). Processes meet by
polling files rather than in a collective, because an exploration can outlast NCCL's timeout.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

_IMPORTED = time.time()


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    return rank() == 0


def local_device() -> str:
    """This process's accelerator (cuda:LOCAL_RANK) when there is one, else cpu."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return "cpu"


def grad_accum(train: dict) -> int:
    """Gradient accumulation that reaches ``effective_batch`` over all processes.

    ``effective_batch`` (optional, the paper's batch: 64 for SFT, 32 for DPO) wins over a
    fixed ``grad_accum``, so one config serves 1 GPU (4 x 16) and 8 GPUs (4 x 2 x 8).
    """
    eb = train.get("effective_batch")
    if not eb:
        return int(train["grad_accum"])
    per_step = int(train["batch_size"]) * world_size()
    if eb % per_step:
        raise ValueError(f"effective_batch={eb} is not a multiple of batch_size={train['batch_size']} "
                         f"x {world_size()} processes")
    return max(1, math.ceil(eb / per_step))


def with_grad_accum(train: dict) -> dict:
    return {**train, "grad_accum": grad_accum(train)}


def process_started() -> float:
    """When this process started (wall-clock seconds), read from /proc; elsewhere, when this
    module was imported."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED


def poll(ready: Callable[[], Any], poll_s: float = 5.0, timeout_s: float | None = None) -> Any:
    """Call ``ready()`` until it returns something other than None and return that; the pause
    between calls grows from 50 ms to ``poll_s`` (short waits stay short, long ones cost little).
    TimeoutError after ``timeout_s``."""
    t0, pause = time.time(), 0.05
    while (got := ready()) is None:
        if timeout_s is not None and time.time() - t0 > timeout_s:
            raise TimeoutError(f"not ready after {timeout_s:.0f} s")
        time.sleep(min(pause, poll_s))
        pause *= 1.5
    return got


def wait_for_manifest(manifest: str | os.PathLike, config_hash: str, poll_s: float = 5.0,
                      timeout_s: float | None = None, abort: Callable[[], str | None] | None = None) -> None:
    """Block until the main process marks the stage at ``manifest`` done with this config
    (a finished manifest of an older config does not count; inputs are checked afterwards
    by the caller's ``Stage.done()``, once: hashing a 7B checkpoint on every poll is slow).
    ``abort`` (optional) returns an error message once waiting is pointless (the main process failed)."""
    path = Path(manifest)

    def ready():
        try:
            m = json.loads(path.read_text())
            if m.get("status") == "done" and m.get("config_hash") == config_hash:
                return True
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        if abort is not None and (why := abort()):
            raise RuntimeError(f"[rank {rank()}] {path.parent}: the main process {why}")
        return None

    if ready() is None:
        print(f"[rank {rank()}] waiting for the main process to finish {path.parent}", flush=True)
        try:
            poll(ready, poll_s, timeout_s)
        except TimeoutError:
            raise TimeoutError(f"{path}: not done after {timeout_s:.0f} s") from None


def free_accelerator_memory() -> None:
    """Drop a finished trainer's or engine's GPU memory before the next model loads."""
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass
