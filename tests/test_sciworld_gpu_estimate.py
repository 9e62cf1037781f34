"""The paper's full ScienceWorld run on GPUs, estimated (lab/sciworld_gpu_estimate.py): its arithmetic against a hand
computation, and the token conversions from the authors' example against the tokenizers themselves."""

from __future__ import annotations

import sys

import pytest

from eto_train import layout

sys.path.insert(0, str(layout.REPO_ROOT / "lab"))
import sciworld_gpu_estimate as est  # noqa: E402


def test_the_stages_seconds_by_hand(monkeypatch):
    """Unit rates: 6 s a trained token, 8 a DPO token, 2 a prefilled token, 1 a decoded one. One task type (gold 2
    steps, limit 4, a 100-token demonstration, a 50-token head, 10 a exchange, 5 an answer), one training and one
    seen variation:
    BC 3 x 100 x 6 = 1,800; a play 2 x (50 + 2 x 10) + 2 x 5 = 150 at gold length, 2 x (50 + 40) + 20 = 200 at the
    limit; exploration 3 plays; DPO 3 x 3 x (2 x 100 + 5 x 10) x 8 = 18,000; tests (1 + 3) plays. A play stops at
    the step limit even where the gold path is longer."""
    for key, value in dict(N_PARAMS=1, GEMM_FLOPS=1, MFU_SFT=1, MFU_DPO=1, HBM=2, DECODE_ROWS=1,
                           DECODE_EFFICIENCY=1, CORES=2).items():
        monkeypatch.setattr(est, key, value)
    types = {"t": est.TaskType(steps=2, limit=4, demo=100, head=50, exchange=10, answer=5)}
    got = est.estimate(types, {"train": ["t"], "seen": ["t"], "unseen": []}, env_step=3)
    assert got == {"BC (3 epochs)": (1800, 1800), "exploration (x3)": (450, 600), "DPO (x3, 3 epochs)": (18000, 18000),
                   "seen + unseen plays (BC and 3 iterations)": (600, 800), "GPU total": (20850, 21200),
                   # 7 plays (3 explorations, 4 test plays) of 2 or 4 steps, 3 s a step, 2 at a time
                   "environment steps (CPU wall clock, not GPU)": (21, 42)}
    types = {"t": est.TaskType(steps=9, limit=4, demo=100, head=50, exchange=10, answer=5)}  # gold past the limit
    assert est.estimate(types, {"train": ["t"], "seen": [], "unseen": []})["exploration (x3)"] == (600, 600)


def test_task_types_convert_smollm2_action_only_means_to_llama2_with_thoughts():
    """Two gold paths of one type: means steps 3, BC tokens 150, head 60, exchange 15; ratio 1.5, thought 7, answer
    3 -> demonstration 1.5 x 150 + 7 x 3 = 246, head 90, exchange 1.5 x 15 + 7 = 29.5, answer 10."""
    rows = [dict(task="t", steps=2, bc_tokens=100, prefix_tokens=50, per_exchange=10),
            dict(task="t", steps=4, bc_tokens=200, prefix_tokens=70, per_exchange=20)]
    got = est.task_types(rows, {"t": 15}, thought=7, answer=3, ratio=1.5)
    assert got == {"t": est.TaskType(steps=3, limit=15, demo=246, head=90, exchange=29.5, answer=10)}


def test_the_examples_thoughts_are_counted_in_llama2_tokens():
    """The authors' example answers 'Thought: ...\\nAction: ...': a thought is tens of Llama-2 tokens, an action
    alone a few, and Llama-2 spends more tokens than SmolLM2 on the same text (a 32k against a 49k vocabulary)."""
    thought, answer, ratio = est.example_tokens()
    assert 10 < thought < 60 and 2 < answer < 15 and 1.0 < ratio < 1.5
