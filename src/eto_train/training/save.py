"""Saving a trained policy as one plain checkpoint, whatever the training mode.

Every later stage (exploration, DPO, evaluation, vLLM) loads an ordinary safetensors folder in
the model's dtype, so adapters are merged and 4-bit bases are never saved:

- full fine-tuning, one process: the model's own ``save_pretrained``;
- LoRA on a 16-bit base, one process: merge in memory, then save;
- FSDP2 (sharded DTensor weights): every process gathers one weight at a time, the main process
  writes them in the model's dtype (:func:`save_fsdp2`; the Trainer's own checkpoints stay sharded);
- ZeRO-3 (sharded weights) or QLoRA (a 4-bit base that cannot take a merge losslessly): the
  Trainer gathers and saves (a collective: every process calls it);
- with LoRA an adapter is then merged by the main process into a fresh 16-bit copy of the base,
  loaded on the CPU.

A saved policy is whole only when it loads and every weight is finite: :func:`save_policy`
checks what it wrote (:func:`check_policy`) before the stage may mark itself done, training
stops at the first non-finite loss or weight (:func:`finite_guard`), and rollouts refuse a
checkpoint with non-finite weights before playing anything.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .. import killpoints, layout
from ..distributed import is_main, world_size
from ..model.load import CheckpointError, check_checkpoint, load_model


class NonFiniteError(ValueError):
    """NaN or Inf in a loss, a gradient norm or a weight; the message names the stage and step or file."""


def check_finite_weights(path: str | Path) -> None:
    """Raise :class:`NonFiniteError` naming the file and tensor when a weight of the safetensors
    checkpoint at ``path`` is NaN or Inf. Reads one tensor at a time (memory-mapped)."""
    import torch
    from safetensors import safe_open

    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                t = fh.get_tensor(key)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    bad = int((~torch.isfinite(t)).sum())
                    raise NonFiniteError(f"{f}: weight {key!r} has {bad} non-finite value(s) (NaN/Inf) of {t.numel()}: "
                                         f"this checkpoint is refused (re-run the stage that wrote it, e.g. with a "
                                         f"lower learning rate)")


def check_policy(path: str | Path, trust_remote_code: bool = False) -> None:
    """A saved policy folder is whole: its config loads, its weights load and are finite."""
    from transformers import AutoConfig

    check_checkpoint(str(path))
    try:
        AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - any failure to read it is the same verdict
        raise CheckpointError(f"{path}/config.json: the model config does not load ({exc})") from None
    check_finite_weights(path)


def local_shard(p):
    """The part of parameter ``p`` this process holds: the local tensor of an FSDP2 DTensor
    (``DTensor.to_local()``), DeepSpeed ZeRO-3's partition (``p.ds_tensor``; the parameter itself is
    then empty, ``numel() == 0``), else ``p`` itself. Checking it needs no collective: every rank
    checks its own shard and :func:`_any_rank` shares the verdict."""
    from torch.distributed.tensor import DTensor

    if isinstance(p, DTensor):
        return p.to_local()
    ds = getattr(p, "ds_tensor", None)  # deepspeed/runtime/zero/partition_parameters.py: the rank's partition
    return ds if ds is not None else p


def _first_nonfinite(model) -> str | None:
    """The name of the first parameter whose local shard (:func:`local_shard`) holds a NaN/Inf."""
    import torch

    params = [(n, t) for n, p in model.named_parameters()
              if (t := local_shard(p).detach()).is_floating_point() and t.numel()]
    if not params:
        return None
    # one device sync for all parameters; on plain tensors (a DTensor's nonzero has no sharding rule)
    flags = torch.stack([torch.isfinite(t).all() for _, t in params]).cpu()
    bad = (~flags).nonzero()
    return params[int(bad[0])][0] if len(bad) else None


def _any_rank(flag: bool) -> bool:
    """True when ``flag`` is set on any process (training is data-parallel: all stop together)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    import torch

    from ..distributed import local_device

    t = torch.tensor([1.0 if flag else 0.0], device=local_device() if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t)
    return bool(t.item() > 0)


def finite_guard(stage: str):
    """A TrainerCallback that stops training with :class:`NonFiniteError` at the first NaN/Inf
    logged loss or gradient norm, or weight after an optimizer step (before that step's
    checkpoint is saved); the message names the stage and the step."""
    from transformers import TrainerCallback

    class FiniteGuard(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self._check(model, state, f"before training (step {state.global_step}: the starting checkpoint is not finite)")

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self._check(model, state, f"after optimizer step {state.global_step}")

        def on_log(self, args, state, control, logs=None, **kwargs):
            for key in ("loss", "grad_norm"):
                v = (logs or {}).get(key)
                if isinstance(v, (int, float)) and not math.isfinite(v):
                    raise NonFiniteError(f"[{stage}] {key} is {v} at step {state.global_step}: training stopped, the "
                                         f"stage is not marked done (lower the learning rate or check the data)")

        def _check(self, model, state, when: str):
            name = _first_nonfinite(model) if model is not None else None
            if _any_rank(name is not None):
                raise NonFiniteError(f"[{stage}] non-finite weights (NaN/Inf) {when}"
                                     + (f", e.g. {name!r}" if name else " on another process")
                                     + ": training stopped before saving them, the stage is not marked done (lower "
                                       "the learning rate or check the data)")

    return FiniteGuard()


def is_quantized(model) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def merge_adapter(base: str, adapter_dir: str | Path, out: str | Path, dtype: str,
                  trust_remote_code: bool = False) -> None:
    """Base weights (16-bit, CPU) + a saved LoRA adapter -> one merged checkpoint at ``out``."""
    from peft import PeftModel

    model = load_model(base, dtype=dtype, trust_remote_code=trust_remote_code)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)


def is_fsdp2(model) -> bool:
    """The model is sharded by FSDP2 (``fully_shard``): its parameters are DTensors."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def save_fsdp2(model, out: Path, dtype: str) -> None:
    """Gather an FSDP2 model into one plain HF checkpoint at ``out`` in ``dtype`` (every process
    calls it: each weight is all-gathered in turn, the main process keeps it on the CPU in ``dtype``
    and writes).

    Not ``trainer.save_model``: with ``fsdp_state_dict_type: SHARDED_STATE_DICT`` (the Trainer's
    checkpoints, no optimizer gather at each save) it writes nothing for FSDP (transformers/trainer.py:
    4105-4108 handles FULL_STATE_DICT only), and with FULL_STATE_DICT accelerate's ``get_state_dict``
    (accelerate/accelerator.py:4095-4099) gathers every weight in the training dtype: fp32, as
    accelerate upcasts trainable weights before sharding (accelerate/utils/fsdp_utils.py:815-820),
    twice the checkpoint's size on the main process. Gathering one weight at a time and casting it
    keeps the main process's host memory at the saved checkpoint's size."""
    import torch
    from torch.distributed.tensor import DTensor

    want, gathered, state = getattr(torch, dtype) if dtype != "auto" else None, {}, {}
    # the parameters themselves (keep_vars): a tied embedding and head are one object, gathered once;
    # the same order on every process, so the collectives match
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) not in gathered:
            full = t.full_tensor() if isinstance(t, DTensor) else t
            if is_main():
                full = full.detach().to("cpu", dtype=want if want is not None and full.is_floating_point() else None)
            gathered[id(t)] = full if is_main() else None
        state[name] = gathered[id(t)]
    if is_main():
        _write(model, out, dtype, state)


def _write(model, out: Path, dtype: str, state: dict) -> None:
    """``model.save_pretrained`` of ``state`` (already in ``dtype``), its config saying ``dtype``:
    save_pretrained records the dtype training held the weights in (fp32 masters)."""
    model.save_pretrained(out, state_dict=state, safe_serialization=True)
    if dtype != "auto" and not hasattr(model, "peft_config"):
        model.config.dtype = dtype
        model.config.save_pretrained(out)


def _cast_state(model, dtype: str) -> dict:
    """The model's state dict with floating tensors in ``dtype`` (the policy's ``model.dtype``: training
    held fp32 master weights, model/load.py:train_dtype); a tied embedding and head stay one tensor."""
    import torch

    want = getattr(torch, dtype) if dtype != "auto" else None
    cast: dict[int, Any] = {}
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) not in cast:
            cast[id(t)] = t.detach().to(dtype=want) if want is not None and t.is_floating_point() else t.detach()
        out[name] = cast[id(t)]
    return out


def save_policy(trainer, tokenizer, out: str | Path, base: str, dtype: str,
                trust_remote_code: bool = False, stage: str | None = None) -> None:
    """Write the trained policy to ``out``; ``base`` is the checkpoint training started from.

    The main process then checks what it wrote (:func:`check_policy`): an error naming
    ``stage`` when it does not load or a weight is not finite, so the stage is never done on it."""
    out, model = Path(out), trainer.model
    peft = hasattr(model, "peft_config")
    if world_size() == 1 and not is_quantized(model) and not is_fsdp2(model):  # FSDP2 even on one process: DTensors
        final = model.merge_and_unload() if peft else model
        _write(final, out, dtype, _cast_state(final, dtype))  # in model.dtype, not the fp32 masters
        killpoints.hit(f"{stage}/save")  # tests only: weights written, no tokenizer yet
        tokenizer.save_pretrained(out)
        killpoints.hit(f"{stage}/save")  # tests only: all written, not yet verified
        _verify(out, stage, trust_remote_code)
        return
    target = out.parent / layout.ADAPTER if peft else out
    if is_fsdp2(model):
        save_fsdp2(model, target, dtype)
    else:
        trainer.save_model(str(target))  # gathers ZeRO-3 shards (zero3_save_16bit_model); the main process writes
    if not is_main():
        return
    (target / "training_args.bin").unlink(missing_ok=True)  # keep the folder a plain checkpoint
    if peft:
        merge_adapter(base, target, out, dtype, trust_remote_code)
    killpoints.hit(f"{stage}/save")  # tests only: weights written, no tokenizer yet
    tokenizer.save_pretrained(out)
    killpoints.hit(f"{stage}/save")  # tests only: all written, not yet verified
    _verify(out, stage, trust_remote_code)


def _verify(out: Path, stage: str | None, trust_remote_code: bool) -> None:
    try:
        check_policy(out, trust_remote_code)
    except (CheckpointError, NonFiniteError) as exc:
        raise type(exc)(f"[{stage or 'training'}] the saved policy is not whole, the stage is not marked done: "
                        f"{exc}") from None
