"""What the stages need to know when `accelerate launch` starts one process per GPU.

Training (bc, dpo) runs data-parallel in every process (the Trainer does the sharding).
Rollouts (evaluation, exploration) are data-parallel too (rollouts/play.py): the main process
publishes a plan, every process plays its share into its own shard file, and the main one
merges the shards and finishes the stage while the others wait for its manifest
(``rollout.data_parallel: false``: the main process plays every episode). Processes meet by
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


def fsdp_enabled() -> bool:
    """This process was started by ``accelerate launch`` with an FSDP config (the variable the
    launcher sets from ``distributed_type: FSDP``; the Trainer does not exist yet when it is read)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and world_size() > 1


def fsdp_on_cpu() -> bool:
    """Make an FSDP config shard on a CPU too (FSDP2 over gloo), for rehearsing the GPU path here.

    accelerate 1.15 keeps the FSDP plugin only for accelerator back-ends: AcceleratorState turns FSDP
    on when the distributed type is MULTI_GPU, MULTI_NPU, ... (accelerate/state.py:986-1015), a list
    without MULTI_CPU, so on a CPU ``--config_file configs/accelerate/fsdp.yaml`` silently trains plain
    DDP. Under ``accelerate launch`` with FSDP and no CUDA, this sets the type and the plugin after the
    state is built as that branch would (a later ``AcceleratorState()`` copies PartialState's type back,
    state.py:913, so both are set). Called by ``runtime.setup_runtime``; a no-op elsewhere. Returns
    whether it applied."""
    import torch

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true" or torch.cuda.is_available():
        return False
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    init = AcceleratorState.__init__
    if getattr(init, "_eto_fsdp_on_cpu", False):
        return True

    def patched(self, *args, fsdp_plugin=None, **kwargs):
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = self.distributed_type  # as state.py:1037

    patched._eto_fsdp_on_cpu = True
    AcceleratorState.__init__ = patched
    return True


def loads_weights(model_cfg: dict) -> bool:
    """False where a training process gets the policy's weights by broadcast instead of reading them.

    With ``fsdp_cpu_ram_efficient_loading: true`` accelerate shards the model on the meta device
    and broadcasts the main process's weights into every shard (accelerate/utils/fsdp_utils.py:
    830-844 and 887-895, ``fsdp2_load_full_state_dict`` :574-664: the other ranks only need shapes
    and dtypes). transformers 5.24 still reads every weight on every rank under that setting (its
    ``is_fsdp_enabled`` paths, modeling_utils.py:4862 and 4898, only skip missing-key init), so the
    other ranks build the model empty instead (:func:`empty_model`). Full fine-tuning only:
    a 4-bit base is not loaded that way by accelerate either (fsdp_utils.py:830), and LoRA keeps the
    ordinary path."""
    if not fsdp_enabled() or model_cfg.get("quantization") or model_cfg.get("lora"):
        return True
    if os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING", "false").lower() != "true":
        return True
    return is_main()  # accelerate broadcasts from the main process (global rank 0) only


def empty_model(path: str, dtype: str = "float32", trust_remote_code: bool = False, quantization=None, **kwargs):
    """The model at ``path`` with its parameters uninitialised (no weight is read) and its
    buffers real (rotary frequencies are not in the checkpoint, and accelerate re-registers the
    non-persistent ones after sharding, fsdp_utils.py:836-841 and 897-900); for :func:`loads_weights`."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype),
                                                 trust_remote_code=trust_remote_code, **kwargs)
    # Uninitialised CPU storage, not meta: accelerate maps the optimizer's parameters to their shards by
    # data_ptr (accelerator.py:1713-1766; every meta tensor's is 0) and expects "torch.empty" on the other
    # ranks (fsdp_utils.py:833). Untouched pages of a large empty tensor take no host memory.
    buffers = {n: b for n, b in model.named_buffers()}
    model.to_empty(device="cpu")
    for name, b in buffers.items():
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner).register_buffer(leaf, b, persistent=leaf not in
                                                   model.get_submodule(owner)._non_persistent_buffers_set)
    model.tie_weights()  # meta -> cpu makes new parameters, one per module: a tied head is tied again
    return model


def grad_accum(train: dict) -> int:
    """Gradient accumulation that reaches ``effective_batch`` over all processes.

    ``effective_batch`` (optional, the paper's batch: 64 for SFT, 32 for DPO) wins over a
    fixed ``gradient_accumulation_steps``, so one config serves 1 GPU (4 x 16) and 8 GPUs (4 x 2 x 8).
    """
    eb = train.get("effective_batch")
    if not eb:
        return int(train["gradient_accumulation_steps"])
    per_step = int(train["per_device_train_batch_size"]) * world_size()
    if eb % per_step:
        raise ValueError(f"effective_batch={eb} is not a multiple of per_device_train_batch_size="
                         f"{train['per_device_train_batch_size']} x {world_size()} processes")
    return max(1, math.ceil(eb / per_step))


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
    """Drop a finished trainer's or engine's GPU memory before the next model loads, and its
    ZeRO-3 switch: a DeepSpeed Trainer registers its config globally (transformers/integrations/
    deepspeed.py:270-275, alive as long as the trainer), and while it is set every ``from_pretrained``
    builds the model inside ``deepspeed.zero.Init`` (modeling_utils.py:3820-3831), a collective: the
    rollout that follows a training stage loads its policy on the main process first and hung
    there (seen with ZeRO-3 on two CPU processes: eto-iter's dev evaluation after DPO)."""
    import gc

    try:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
    except ImportError:
        pass
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass
