"""scripts/gpu_smoke.py wiring, on the CPU (--cpu-dry-run: tiny model, seconds); the GPU run
itself needs a CUDA device, bitsandbytes and vllm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def test_mfu_is_six_n_tokens_over_the_peak():
    import gpu_smoke

    assert gpu_smoke.peak_flops("NVIDIA H200", None) == 989e12
    assert gpu_smoke.peak_flops("Some Future GPU", None) is None
    assert gpu_smoke.peak_flops("Some Future GPU", 500) == 500e12
    assert abs(gpu_smoke.mfu(1_000_000_000, 10_000, 989e12) - 6e13 / 989e12) < 1e-12
    assert gpu_smoke.mfu(10, 10, None) is None


def test_cpu_dry_run_trains_plays_and_reports(tmp_path):
    proc = subprocess.run([sys.executable, "scripts/gpu_smoke.py", "--cpu-dry-run", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "gpu_smoke.json").read_text())["sections"]
    for name in ("sft_full", "sft_lora", "dpo"):
        assert res[name]["tokens"] > 0 and res[name]["tokens_per_s"] > 0, res[name]
    assert res["dpo"]["pairs"] == 4  # every rollout of the random model lost to its expert
    hf = res["rollouts_hf"]
    assert hf["episodes"] == 4 and hf["generated_tokens"] > 0 and hf["gen_tokens_per_s"] > 0
    assert "bitsandbytes" in res["sft_qlora"]["skipped"] and "vllm" in res["rollouts_vllm"]["skipped"]
    assert "tokens/s" in proc.stdout
