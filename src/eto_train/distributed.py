"""What the stages need to know when `accelerate launch` starts one process per GPU.

Training (bc, dpo) runs data-parallel in every process (the Trainer does the sharding).
Rollouts do not shard: the main process plays every episode and the other processes wait
for its stage manifest, then read the same episode file. They wait by polling the file
rather than in a collective, because an exploration can outlast NCCL's timeout.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path


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


def wait_for_manifest(manifest: str | os.PathLike, config_hash: str, poll_s: float = 5.0,
                      timeout_s: float | None = None) -> None:
    """Block until the main process marks the stage at ``manifest`` done with this config
    (a finished manifest of an older config does not count; inputs are checked afterwards
    by the caller's ``Stage.done()``, once: hashing a 7B checkpoint on every poll is slow)."""
    path, t0, told = Path(manifest), time.time(), False
    while True:
        try:
            m = json.loads(path.read_text())
            if m.get("status") == "done" and m.get("config_hash") == config_hash:
                return
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        if not told:
            print(f"[rank {rank()}] waiting for the main process to finish {path.parent}", flush=True)
            told = True
        if timeout_s is not None and time.time() - t0 > timeout_s:
            raise TimeoutError(f"{path}: not done after {timeout_s:.0f} s")
        time.sleep(poll_s)


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
