"""Saving a trained policy as one plain checkpoint, whatever the training mode.

Every later stage (exploration, DPO, evaluation, vLLM) loads an ordinary safetensors folder in
the model's dtype, so adapters are merged and 4-bit bases are never saved:

- full fine-tuning, one process: the model's own ``save_pretrained``;
- LoRA on a 16-bit base, one process: merge in memory, then save;
- FSDP / ZeRO-3 (sharded weights) or QLoRA (a 4-bit base that cannot take a merge losslessly):
  the Trainer gathers and saves (a collective: every process calls it); an adapter is then
  merged by the main process into a fresh 16-bit copy of the base, loaded on the CPU.
"""

from __future__ import annotations

from pathlib import Path

from ..distributed import is_main, world_size
from ..model.load import load_model


def is_quantized(model) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def merge_adapter(base: str, adapter_dir: str | Path, out: str | Path, dtype: str,
                  trust_remote_code: bool = False) -> None:
    """Base weights (16-bit, CPU) + a saved LoRA adapter -> one merged checkpoint at ``out``."""
    from peft import PeftModel

    model = load_model(base, dtype=dtype, trust_remote_code=trust_remote_code)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)


def save_policy(trainer, tokenizer, out: str | Path, base: str, dtype: str,
                trust_remote_code: bool = False) -> None:
    """Write the trained policy to ``out``; ``base`` is the checkpoint training started from."""
    out, model = Path(out), trainer.model
    peft = hasattr(model, "peft_config")
    if world_size() == 1 and not is_quantized(model):
        final = model.merge_and_unload() if peft else model
        final.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        return
    target = out.parent / "adapter" if peft else out
    trainer.save_model(str(target))  # gathers FSDP / ZeRO-3 shards; only the main process writes
    if not is_main():
        return
    (target / "training_args.bin").unlink(missing_ok=True)  # keep the folder a plain checkpoint
    if peft:
        merge_adapter(base, target, out, dtype, trust_remote_code)
    tokenizer.save_pretrained(out)
