"""Which Trainer checkpoint an interrupted training stage resumes from.

The Trainer writes a checkpoint's ``trainer_state.json`` last (after the weights, optimizer,
scheduler and RNG states), so a ``checkpoint-N`` folder without it was cut by a kill in the
middle of a save: resuming from it would fail or load half-written state. Checkpoints of a run
with another config or other inputs must not be resumed either.

A checkpoint with ``trainer_state.json`` can still be damaged afterwards (a file cut short, a
disk error, a state file that ``torch.load(weights_only=True)`` refuses): every rerun would then
stop in the Trainer's own load with a raw traceback. Its state files are read first as the Trainer
reads them (:func:`checkpoint_problem`); a damaged checkpoint is named, set aside (never
deleted) beside the checkpoints folder, and the stage resumes from the newest checkpoint before it
that reads, or from the start, said in one block.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import warnings
from pathlib import Path

from ..distributed import is_main
from ..layout import TRAINER_STATE

SET_ASIDE = "checkpoints.set-aside"  # damaged checkpoints, beside the stage's checkpoints folder


def _steps(folder: Path) -> list[tuple[int, Path]]:
    """The ``checkpoint-<n>`` folders, newest step first."""
    return sorted(((int(m.group(1)), p) for p in folder.iterdir()
                   if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name))), reverse=True)


def checkpoint_problem(ckpt: str | Path) -> str | None:
    """Why the Trainer could not resume from ``ckpt`` (its files read as ``Trainer._load_*`` read
    them: ``trainer_state.json`` as JSON, every ``*.pt`` / ``*.pth`` state with
    ``torch.load(weights_only=True)`` under transformers' numpy allow-list, the safetensors weights'
    headers), or None. Tensor data is memory-mapped, not read: a 7B optimizer state costs a header read."""
    import torch

    ckpt = Path(ckpt)
    try:
        json.loads((ckpt / TRAINER_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{TRAINER_STATE}: {exc}"
    try:
        from transformers.trainer_pt_utils import safe_globals
    except ImportError:  # pragma: no cover - transformers is a dependency
        from contextlib import nullcontext as safe_globals
    for f in sorted(ckpt.iterdir()):
        if f.is_file() and f.suffix in (".pt", ".pth"):
            try:
                with safe_globals(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        torch.load(f, map_location="cpu", weights_only=True, mmap=True)
                    except RuntimeError as exc:  # an old (non-zip) torch file cannot be memory-mapped
                        if "mmap" not in str(exc):
                            raise
                        torch.load(f, map_location="cpu", weights_only=True)
            except Exception as exc:  # noqa: BLE001 - any failure is the Trainer's failure to come
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                return f"{f.name}: {first}"
        elif f.is_file() and f.suffix == ".safetensors":
            try:
                from safetensors import safe_open

                with safe_open(str(f), framework="pt") as sf:
                    sf.keys()
            except Exception as exc:  # noqa: BLE001
                return f"{f.name}: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
    return None


def _aside(folder: Path) -> Path:
    """Where a damaged checkpoint of ``folder`` goes: ``<stage>/checkpoints.set-aside/`` (the stage
    folder itself, also when the run works in ``<stage>/.next``, whose leftovers are discarded)."""
    parent = folder.parent
    if parent.name == ".next":
        parent = parent.parent
    return parent / SET_ASIDE


def set_aside(ckpt: Path) -> Path:
    """Move ``ckpt`` into the stage's set-aside folder (a new name when one of that step is there)."""
    dest_dir = _aside(ckpt.parent)
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / ckpt.name
    if dest.exists():
        dest = dest_dir / f"{ckpt.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    os.rename(ckpt, dest)
    return dest


def resume_checkpoint(folder: str | Path, resumable: bool, name: str = "training") -> str | None:
    """The last complete checkpoint in ``folder`` that the Trainer can load, or None to train from the start.

    ``resumable`` is :meth:`Stage.begin`'s answer; when False (another config or other inputs)
    the old checkpoints are removed. Incomplete checkpoints (no trainer_state.json: a save cut by a
    kill) are removed with a warning. A complete one whose files do not load (:func:`checkpoint_problem`)
    is set aside, never deleted, and the next older one is tried; one block on stderr (``name``: the
    stage) says which, why, where it went and what this run resumes from.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    if not resumable:
        if is_main():
            shutil.rmtree(folder, ignore_errors=True)
        return None
    damaged: list[tuple[Path, str, Path | None]] = []
    found = None
    for _, p in _steps(folder):
        if not (p / TRAINER_STATE).is_file():
            if not p.exists():  # the main process set it aside meanwhile (another rank's look)
                continue
            warnings.warn(f"{p}: incomplete checkpoint (no trainer_state.json; a save was interrupted): removed")
            if is_main():
                shutil.rmtree(p, ignore_errors=True)
            continue
        try:
            why = checkpoint_problem(p)
        except FileNotFoundError:  # set aside by the main process while this rank looked
            continue
        if why is None:
            found = str(p)
            break
        damaged.append((p, why, set_aside(p) if is_main() else None))
    if damaged and is_main():
        _say(name, folder, damaged, found)
    return found


def _say(name: str, folder: Path, damaged: list[tuple[Path, str, Path | None]], found: str | None) -> None:
    what = "; ".join(f"{p.name}: {why}, set aside (not deleted) as {dest}" for p, why, dest in damaged)
    then = (f"resuming from {Path(found).name}, the newest checkpoint that loads" if found else
            "training starts from the beginning: no earlier checkpoint loads")
    dest_dir = damaged[0][2].parent if damaged[0][2] is not None else _aside(folder)
    sys.stdout.flush()
    sys.stderr.write(f"[{name}] {len(damaged)} checkpoint(s) in {folder} cannot be resumed: {what}. So {then}. "
                     f"The damaged files stay in {dest_dir}: remove them when you no longer need them, or mend one "
                     f"and move it back into {folder} to resume from it\n")
    sys.stderr.flush()
