"""Loading a policy (the tiny model's folder, any local checkpoint or a Hugging Face id)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ..records import PolicyRef


class CheckpointError(FileNotFoundError):
    """A checkpoint that is missing or unreadable; the message names the path."""


def weights_sha256(path: str | Path) -> str:
    """Content hash of a checkpoint's weight files (safetensors only)."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors weights found")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def policy_ref(path_or_id: str, name: str | None = None) -> PolicyRef:
    check_checkpoint(path_or_id)
    p = Path(path_or_id)
    if p.is_dir():
        sha = weights_sha256(p)
        return PolicyRef(id=f"{name or p.name}@{sha[:12]}", path=str(p), weights_sha256=sha)
    return PolicyRef(id=f"{path_or_id}@hub", path=str(path_or_id), weights_sha256="")


def is_local(path_or_id: str) -> bool:
    """A local folder, as opposed to a hub id such as ``org/name`` or ``gpt2``."""
    s = str(path_or_id)
    return Path(s).exists() or s.startswith(("/", ".", "~")) or s.count("/") >= 2


def check_checkpoint(path_or_id: str) -> None:
    """A clear error for a local checkpoint that is missing or not a model folder."""
    if not is_local(path_or_id):
        return
    p = Path(path_or_id).expanduser()
    if not p.is_dir():
        raise CheckpointError(f"{p}: checkpoint folder not found (run the stage that writes it first)")
    if not (p / "config.json").exists():
        raise CheckpointError(f"{p}: not a model folder (no config.json)")
    if not list(p.glob("*.safetensors")):
        raise CheckpointError(f"{p}: no *.safetensors weights (only safetensors are loaded)")


def load_tokenizer(path_or_id: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    check_checkpoint(path_or_id)
    tok = AutoTokenizer.from_pretrained(path_or_id, trust_remote_code=trust_remote_code)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(path_or_id: str, dtype: str = "float32", trust_remote_code: bool = False,
               device: str = "cpu", **kwargs: Any):
    import torch
    from transformers import AutoModelForCausalLM

    check_checkpoint(path_or_id)
    model = AutoModelForCausalLM.from_pretrained(
        path_or_id, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code,
        use_safetensors=True, **kwargs)
    return model.to(device)
