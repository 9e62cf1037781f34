"""A paper-sized model on a machine without a CUDA GPU: refused before anything is loaded.

``eto-train bc experiment=sciworld_llama2_7b`` on a laptop would otherwise load 13 GB of weights
(or, offline, stop on a checkpoint the machine does not have) before finding out that full
fine-tuning of 7B parameters in bf16 cannot run there. :func:`check_device` runs in the CLI right
after the config is composed (well under a second plus torch's import) and raises
:class:`DeviceError` naming the model, its size, how it would train, and what to run instead.

The size comes from the checkpoint's ``config.json`` (a local folder, or the Hugging Face cache,
never the network), else from the ``<n>b`` in the hub id (``Llama-2-7b-chat-hf``: 7B). A model
of unknown size, or under :data:`CPU_LIMIT` parameters, passes. ``ETO_TRAIN_ALLOW_CPU=1`` skips
the check (a patient user with a large CPU machine).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

ALLOW_ENV = "ETO_TRAIN_ALLOW_CPU"
CPU_LIMIT = 3e9  # parameters; gemma-3-1b (1B) still rehearses on a CPU, 7B/8B models do not
MODEL_STAGES = ("bc", "eval", "eto-iter", "eto", "compare", "demo")  # stages that train or play a policy
_BILLIONS = re.compile(r"(?<![0-9.])(\d+(?:\.\d+)?)[bB](?![a-zA-Z])")


class DeviceError(RuntimeError):
    """A model this machine cannot train or play in any useful time (no CUDA GPU)."""


def _config_json(path: str) -> dict | None:
    p = Path(path).expanduser() / "config.json"
    if p.is_file():
        found = p
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(path, "config.json")
        except Exception:  # not a valid repo id, no cache
            cached = None
        if not isinstance(cached, str):
            return None
        found = Path(cached)
    try:
        return json.loads(found.read_text())
    except (OSError, ValueError):
        return None


def parameters(path: str) -> float | None:
    """About how many parameters the model at ``path`` has (config.json, else the hub id's "7b")."""
    conf = _config_json(path)
    if conf is not None:
        c = conf.get("text_config") or conf
        try:
            h, n, v = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
            i = c.get("intermediate_size") or 4 * h
        except (KeyError, TypeError):
            return None
        tied = c.get("tie_word_embeddings", conf.get("tie_word_embeddings", False))
        return n * (4 * h * h + 3 * h * i) + (1 if tied else 2) * v * h  # attention + MLP + embeddings
    m = _BILLIONS.search(Path(str(path)).name)
    return float(m.group(1)) * 1e9 if m else None


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def check_device(cfg, stage: str) -> None:
    """Raise :class:`DeviceError` when ``stage`` would train or play a model of more than
    :data:`CPU_LIMIT` parameters on a machine without a CUDA GPU."""
    if stage not in MODEL_STAGES or os.environ.get(ALLOW_ENV, "") not in ("", "0"):
        return
    model = cfg.model
    path = str(cfg.eval.policy if stage == "eval" else model.path)
    if stage != "eval" and model.get("build"):
        return
    n = parameters(path)
    if n is None or n < CPU_LIMIT or cuda_available():
        return
    how = "LoRA" if model.get("lora") else "full fine-tuning"
    if model.get("quantization"):
        how = "QLoRA (bitsandbytes 4-bit)"
    what = "evaluation" if stage == "eval" else how
    text = (f"model {model.name} ({path}, about {n / 1e9:.1f}B parameters, {model.dtype}, {what}) needs a CUDA GPU; "
            f"this machine has none (torch.cuda.is_available() is False), so nothing was loaded or written. "
            f"For a CPU rehearsal of this experiment on a small model of the same family: make rehearse "
            f"(tests/test_rehearsal.py); for the whole pipeline on a CPU: make demo; set {ALLOW_ENV}=1 to run it "
            f"on the CPU anyway")
    try:
        from .model.load import check_checkpoint

        check_checkpoint(path)
    except Exception as exc:  # both problems in one message: this machine has neither the GPU nor the weights
        text += f". Also: {exc}"
    raise DeviceError(text)
