"""The rehearsal (test_rehearsal.py) of the families without an experiment config: Llama-3.x,
Qwen3 (full and LoRA) and Gemma-3 with the paper's training profiles and their model config,
on TextWorldExpress."""

from __future__ import annotations

import pytest

from test_rehearsal import EXTRA, check_run, fixtures, overrides, rehearse  # noqa: F401 (fixture)


@pytest.mark.parametrize("name", list(EXTRA))
def test_family_runs_bc_eto_iter_eval(name, fixtures, tmp_path):
    check_run(rehearse(overrides(name, fixtures, None, tmp_path)))
