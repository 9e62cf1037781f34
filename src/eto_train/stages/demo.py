"""Stage `demo` (``eto-train demo [overrides]``): the stages of ``scripts/demo.sh`` in one process.

``scripts/demo.sh`` (``make demo``) is the demo to read: one ``eto-train <stage>`` line per stage
with the arithmetic of its sizes and the demo's settings (``DEMO_ARGS``). This stage runs the same
stages, in the same order (:data:`STAGES`; tests/test_cli.py keeps the two lists equal), on the
plain config and your overrides only, in one Python process: the tests' toy demos then start
Python, torch and TRL once instead of eight times (a toy demo took about 60 s as eight processes,
20 s as one). Each stage skips what is already done, so an interrupted demo resumes where it stopped.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from .. import layout
from ..config import Config
from . import bc, compare, eto, evaluate, experts, model, reading, report

# the `eto-train <stage>` lines of scripts/demo.sh, in order
STAGES = ("experts", "model", "bc", "eval", "eto", "compare", "reading", "report")


def run(cfg: Config) -> Path:
    experts.run(cfg)   # 1. the gold path of each training task
    model.run(cfg)     # 2. the base model (built for model=tiny, used as it is for a shipped one)
    bc.run(cfg)        # 3. behavior cloning on the expert conversations
    evaluate.run(cfg)  # 4. BC on eval.splits
    eto.run(cfg)       # 5. the ETO loop: explore -> pairs -> dpo -> dev, the kept policy on eval.splits
    compare.run(cfg)   # 6. the contrast arms (compare.variants) and the SFT control from the same BC, one seed
    # 7. does each policy read its observation? BC's, and the loop's kept policy (scripts/demo.sh's
    #    ++reading.policies.eto_best=${paths.eto}/result.json)
    policies = {**cfg.reading.policies, "eto_best": str(Path(cfg.paths.eto) / layout.RESULT)}
    reading.run(cfg.with_values({"reading.policies": policies}))
    path = report.run(cfg)  # 8. report.md from the run folder
    Console(markup=False).print(f"[demo] report: {path}")
    return path
