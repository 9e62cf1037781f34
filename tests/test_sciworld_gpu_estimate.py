"""The paper's full ScienceWorld run on GPUs, estimated (lab/sciworld_gpu_estimate.py): its arithmetic against a hand
computation, and the token conversions from the authors' example against the tokenizers themselves."""

from __future__ import annotations

import sys

import pytest

from eto_train import layout

sys.path.insert(0, str(layout.REPO_ROOT / "lab"))
import sciworld_gpu_estimate as est  # noqa: E402


UNITS = dict(N_PARAMS=1, WEIGHT_BYTES=2, KV_BYTES=1, MAX_CONTEXT=1000, GEMM_FLOPS=2, MFU_LOW_SIDE=(0.5, 0.25),
             HBM=4, DECODE_EFFICIENCY=0.5, GPU_MEMORY=10**9, KV_SHARE=1, DECODE_ROWS=2, CORES=2)


def test_the_stages_seconds_by_hand(monkeypatch):
    """Hand units: 6 / (0.5 x 2) = 6 s a trained token, 8 / (0.25 x 2) = 16 a DPO token, 2 / (0.5 x 2) = 2 a
    prefilled one; memory reads at 4 x 0.5 = 2 bytes/s. One task type (gold 2 steps, limit 4, a 100-token
    demonstration, a 50-token head, 10 an exchange, 5 an answer), one training and one seen variation, low side:
    a play prefills 50 + 2 x 10 = 70 tokens (140 s) and decodes 2 answers of 5 tokens at contexts 50 and 60 (sum
    110): (5 x 2 x 2 bytes of weights / 2 rows + 5 x 110 x 1 byte of KV) / 2 = 280 s: 420 s a play.
    BC 3 x 100 x 6 = 1,800; exploration 3 x 420; DPO 3 x 3 x (100 + 100 + 5 x 10) x 16 = 36,000; tests BC and
    the last iteration, 2 x 420; environment (3 + 2) plays x 2 steps x 3 s / 2 cores = 15."""
    for key, value in UNITS.items():
        monkeypatch.setattr(est, key, value)
    t = est.TaskType(steps=2, limit=4, demo=100, head=50, exchange=10, answer=5)
    got = est.estimate({"t": t}, {"train": ["t"], "seen": ["t"], "unseen": []}, "low", env_step=3)
    assert got == {"BC (3 epochs)": 1800, "exploration (x3)": 1260, "DPO (x3, 3 epochs)": 36000,
                   "seen + unseen plays (BC, last iteration)": 840, "GPU total": 39900,
                   "environment steps (CPU wall clock, not GPU)": 15}


def test_a_play_stops_where_its_context_fills_and_decodes_fewer_rows_where_the_cache_is_full(monkeypatch):
    """Context 100: answers fit while 50 + k x 10 + 5 <= 100, k = 0..4: 5 steps of a limit of 8. A KV cache of
    107 - 2 bytes of weights holds one 70-token episode: 1 row, each answer reads all the weights itself: (5 x 2 x 2
    / 1 + 550) / 2 = 285 s of decode. A demonstration past the context trains on its first 1,000 tokens."""
    for key, value in UNITS.items():
        monkeypatch.setattr(est, key, value)
    t = est.TaskType(steps=2, limit=8, demo=5000, head=50, exchange=10, answer=5)
    assert est.play_seconds(t, 2, 0.5) == (420, 2)
    monkeypatch.setattr(est, "GPU_MEMORY", 107)
    assert est.play_seconds(t, 2, 0.5) == (425, 2)
    monkeypatch.setattr(est, "MAX_CONTEXT", 100)
    assert est.play_seconds(t, 8, 0.5)[1] == 5
    monkeypatch.setattr(est, "MAX_CONTEXT", 1000)
    assert est.estimate({"t": t}, {"train": ["t"], "seen": [], "unseen": []}, "low")["BC (3 epochs)"] == 3 * 1000 * 6


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


def test_the_paper_settings_come_from_the_configs(monkeypatch):
    """Epochs, iterations, the cut and the context are read from experiment=sciworld_llama2_7b (one home)."""
    for key in ("EPOCHS_BC", "EPOCHS_DPO", "ITERATIONS", "EXTRA_TURNS", "MAX_CONTEXT"):
        monkeypatch.setattr(est, key, None)
    est.paper_settings()
    assert (est.EPOCHS_BC, est.EPOCHS_DPO, est.ITERATIONS, est.EXTRA_TURNS, est.MAX_CONTEXT) == (3, 3, 3, 5, 4096)
