"""memory: a stage's peak resident memory (its process's and its children's) and its manifest's record."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from eto_train import memory
from eto_train.manifest import Stage

MB = 1e6


def _rss_gb() -> float:
    return memory._self_rss() / memory.GB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's high-water mark is Linux's")
def test_a_spike_freed_between_two_samples_still_counts():
    wid = memory.open_window()
    base = _rss_gb()
    block = bytearray(300 * int(MB))  # zero-filled, so every page is touched: resident at once
    del block  # freed long before the sampler's next tick
    out = memory.close_window(wid)
    assert out["peak_rss_gb"] >= base + 0.29  # the kernel's peak, not a sample: the spike is in it
    assert out["peak_children_rss_gb"] >= 0.0


def test_children_are_sampled_and_windows_overlap():
    outer = memory.open_window()
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(200_000_000); time.sleep(3)"])
    try:
        inner = memory.open_window()
        deadline = time.time() + 10
        while memory._children_rss() < 150 * MB and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(2 * memory.TICK_S)
        got_inner = memory.close_window(inner)
    finally:
        child.wait()
    got_outer = memory.close_window(outer)
    assert got_inner["peak_children_rss_gb"] >= 0.15
    assert got_outer["peak_children_rss_gb"] >= got_inner["peak_children_rss_gb"]  # the outer saw it too
    assert got_outer["peak_rss_gb"] >= got_inner["peak_rss_gb"] > 0
    assert "peak_device_gb" not in got_outer  # no GPU here: nothing claimed for one
    assert memory.close_window(outer) == {}  # a closed window answers nothing


def test_every_finished_stage_records_its_peak_memory(tmp_path):
    stage = Stage("demo", tmp_path / "s", {"k": 1}, outputs=["out.txt"])
    assert not stage.done()
    stage.begin()
    block = bytearray(120 * int(MB))
    (stage.work / "out.txt").write_text("x")
    del block
    stage.finish({"ok": 1})
    m = __import__("json").loads((tmp_path / "s" / "manifest.json").read_text())
    assert set(m["memory"]) == {"peak_rss_gb", "peak_children_rss_gb"}
    if sys.platform.startswith("linux"):
        assert m["memory"]["peak_rss_gb"] >= 0.12
    # up to date: nothing done, no window left open
    again = Stage("demo", tmp_path / "s", {"k": 1}, outputs=["out.txt"])
    assert again.done() and again._memory is None


def test_training_floor_by_hand():
    from types import SimpleNamespace

    cfg = SimpleNamespace(hidden_size=4, intermediate_size=8, num_hidden_layers=2, vocab_size=10)
    f = memory.training_floor(cfg, parameters=1_000_000_000, tokens=1_000, labelled=100, base_gb=0.5)
    # weights 4 GB, gradients 4, AdamW 8; layer inputs 2 x 1000 x 4 x 4 B, one layer 1000 x (24 + 32) x 4 B,
    # logits 2 x 100 x 10 x 4 B
    assert f["weights"] == 4.0 and f["gradients"] == 4.0 and f["optimizer"] == 8.0 and f["reference"] == 0
    assert f["activations"] == round((2 * 1000 * 4 * 4 + 1000 * 56 * 4) / 1e9, 3)
    assert f["logits"] == round(8000 / 1e9, 3)
    assert f["total"] == round((0.5e9 + 16e9 + 32_000 + 224_000 + 8000) / 1e9, 3)
    lora = memory.training_floor(cfg, parameters=1_000_000_000, tokens=1_000, labelled=100, trainable=10_000_000,
                                 reference=True, checkpointed=False)
    assert lora["gradients"] == 0.04 and lora["optimizer"] == 0.08 and lora["reference"] == 4.0
    assert lora["activations"] == round(2 * 1000 * 56 * 4 / 1e9, 3)  # every layer's intermediates kept


def test_a_sample_that_fails_does_not_stop_the_sampler(monkeypatch):
    calls = []

    def broken():
        calls.append(1)
        raise AttributeError("partially initialized module 'torch' has no attribute 'cuda'")

    wid = memory.open_window()
    monkeypatch.setattr(memory, "_children_rss", broken)
    time.sleep(3 * memory.TICK_S)
    monkeypatch.undo()
    time.sleep(2 * memory.TICK_S)
    assert calls and memory._SAMPLER.thread.is_alive()  # it met the error and went on
    assert memory.close_window(wid)["peak_rss_gb"] > 0
