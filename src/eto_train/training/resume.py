"""Which Trainer checkpoint an interrupted training stage resumes from.

The Trainer writes a checkpoint's ``trainer_state.json`` last (after the weights, optimizer,
scheduler and RNG states), so a ``checkpoint-N`` folder without it was cut by a kill in the
middle of a save: resuming from it would fail or load half-written state. Checkpoints of a run
with another config or other inputs must not be resumed either.
"""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

from ..distributed import is_main
from ..layout import TRAINER_STATE


def resume_checkpoint(folder: str | Path, resumable: bool) -> str | None:
    """The last complete checkpoint in ``folder``, or None to train from the start.

    ``resumable`` is :meth:`Stage.begin`'s answer; when False (another config or other inputs)
    the old checkpoints are removed. Incomplete checkpoints are removed with a warning.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    if not resumable:
        if is_main():
            shutil.rmtree(folder, ignore_errors=True)
        return None
    steps = sorted(((int(m.group(1)), p) for p in folder.iterdir()
                    if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name))), reverse=True)
    for _, p in steps:
        if (p / TRAINER_STATE).is_file():
            return str(p)
        warnings.warn(f"{p}: incomplete checkpoint (no trainer_state.json; a save was interrupted): removed")
        if is_main():
            shutil.rmtree(p, ignore_errors=True)
    return None
