"""Stage `demo` (make demo): the whole story at CPU scale, eto -> compare -> reading -> report.md.

Each stage skips what is already done, so an interrupted demo resumes where it stopped.

    eto-train demo [hydra overrides]
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..layout import RunLayout
from . import compare, eto, reading, report


def run(cfg) -> Path:
    result = eto.run(cfg)  # experts, base model, bc, then iterations with early stopping on dev
    compare.run(cfg)  # trajectory / step / mixture and the SFT control from the same BC
    reading.run(cfg, {"bc": str(RunLayout.of(cfg).bc_policy),  # does each read its observation? (the precondition)
                      **({"eto_best": result["best_policy"]} if result.get("best_iteration") else {})})
    path = report.run(cfg)
    Console(markup=False).print(f"[demo] report: {path}")
    return path
