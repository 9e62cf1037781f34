"""Greedy episodes in fp32 are the same whatever the batch size and engine (docs/gpu.md, determinism):
the KV engine at batch 1 and 4 and HF ``generate`` on whole conversations, on the shipped base and
on real-family fixtures (Llama-2 without GQA, Qwen2.5 with it). In bf16 they are not (measured with
lab/determinism.py; not asserted). tests/test_rollout.py and tests/test_kvbatch.py check the same
on the tiny model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))


@pytest.mark.parametrize("model", ["twx-base", "llama2", "qwen2_5"])
def test_fp32_greedy_episodes_are_identical_across_batch_sizes_and_engines(model, twx_cfg, tmp_path):
    from determinism import agreement, play

    from eto_train.envs import make_env
    from eto_train.model.load import load_model, load_tokenizer

    path = ROOT / "models" / "twx-base-1.7m"
    if model != "twx-base":
        from fixture_models import build_fixture_model

        path = build_fixture_model(model, tmp_path / model)
    tok, policy = load_tokenizer(str(path)), load_model(str(path), dtype="float32")
    env_cfg = {**twx_cfg, "step_limit": 6, "splits": {"seen": {**twx_cfg["splits"]["seen"], "count": 2}}}
    lister = make_env(env_cfg)
    work = [(t, 0) for t in lister.tasks("seen")]
    lister.close()
    runs = {f"{engine}@{b}": play(policy, tok, env_cfg, work, b, engine, max_new_tokens=12, max_context=1024)
            for engine, b in [("kv", 1), ("kv", 4), ("generate", 4)]}
    ref = runs.pop("kv@1")
    assert len(ref) == len(work) and sum(map(len, ref.values())) > len(work)  # several turns per episode
    for name, other in runs.items():
        assert other == ref, (name, agreement(ref, other))
