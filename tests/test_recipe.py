"""The one training recipe (training/recipe.py): TRL arguments passed through, checked before use."""

from __future__ import annotations

import pytest

from eto_train.training.dpo import dpo_config
from eto_train.training.sft import sft_config
from eto_train.validate import SET_BY_SECTION, trainer_fields

BC = {"max_length": 64, "batch_size": 2, "grad_accum": 1, "lr": 1e-3, "scheduler": "constant", "warmup_ratio": 0.0,
      "weight_decay": 0.0, "epochs": 1, "max_steps": 2, "logging_steps": 1, "save_strategy": "no",
      "save_steps": None, "save_total_limit": 1, "bf16": False, "gradient_checkpointing": False, "use_cpu": True}
DPO = {**BC, "beta": 0.1, "loss_type": ["sigmoid"], "loss_weights": None, "precompute_ref_log_probs": False}


def test_a_trainer_section_reaches_the_trl_config_under_trls_names(tmp_path):
    args = sft_config(str(tmp_path), {**BC, "trainer": {"max_grad_norm": 0.25, "optim": "sgd"}}, 0, "none")
    assert args.max_grad_norm == 0.25 and args.optim == "sgd"
    args = dpo_config(str(tmp_path), {**DPO, "trainer": {"max_grad_norm": 0.5, "label_smoothing": 0.1}}, 0, "none")
    assert args.max_grad_norm == 0.5 and args.label_smoothing == 0.1
    assert sft_config(str(tmp_path), BC, 0, "none").max_grad_norm == 1.0  # absent: TRL's default


@pytest.mark.parametrize("kind,make,base", [("sft", sft_config, BC), ("dpo", dpo_config, DPO)])
def test_the_keys_a_section_sets_itself_are_exactly_the_ones_validation_refuses_in_trainer(kind, make, base, tmp_path):
    fields = trainer_fields(kind)
    assert "max_grad_norm" in fields and "beta" in trainer_fields("dpo") and "beta" not in trainer_fields("sft")
    for key in sorted(SET_BY_SECTION[kind]):  # each one is set by the section: passing it again is a clash
        assert key in fields, key
        with pytest.raises(TypeError, match="multiple values"):
            make(str(tmp_path), {**base, "trainer": {key: None}}, 0, "none")


def test_validation_names_a_bad_trainer_key_and_a_bad_attention(tmp_path):
    from hydra import compose, initialize_config_dir
    from test_pipeline import ROOT

    from eto_train.validate import check_config

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("config", ["+bc.trainer={max_grad_norm:0.5,learning_rate:1.0,no_such_arg:1}",
                                 "+eto.dpo.trainer={label_smoothing:0.1}", "+model.attn_implementation=fast"])
    with pytest.raises(ValueError) as e:
        check_config(cfg)
    msg = str(e.value)
    assert "bc.trainer.learning_rate=1.0: bc sets this argument from its own keys" in msg
    assert "bc.trainer.no_such_arg=1: not a SFTConfig argument" in msg
    assert "bc.trainer.max_grad_norm" not in msg and "eto.dpo.trainer" not in msg  # real arguments pass
    assert "model.attn_implementation" in msg and "sdpa" in msg


# -- the DPO reference under FSDP (training/dpo.py fsdp_reference) ---------------------------------
def test_trls_own_reference_loader_spreads_it_over_every_gpu(monkeypatch, tiny_model_dir):
    """What TRL 1.16 does with ref_model=None under FSDP: no device_map in its kwargs (it sets None
    only for MULTI_GPU and DEEPSPEED, dpo_trainer.py:920-921), so its loader picks "auto" on a GPU."""
    import types

    import transformers
    from trl.trainer import utils as trl_utils

    seen = {}

    def capture(model_id, **kwargs):
        seen.update(kwargs)
        return types.SimpleNamespace()

    on_gpu = types.SimpleNamespace(device=types.SimpleNamespace(type="cuda"))
    monkeypatch.setattr(trl_utils, "PartialState", lambda: on_gpu)
    monkeypatch.setattr(transformers.LlamaForCausalLM, "from_pretrained", staticmethod(capture))
    trl_utils.create_model_from_path(str(tiny_model_dir), dtype="bfloat16")  # the kwargs TRL passes under FSDP
    assert seen["device_map"] == "auto"


def test_under_fsdp_full_fine_tuning_dpo_gets_a_frozen_cpu_reference_used_once(monkeypatch, tmp_path, tiny_model_dir,
                                                                               expert_episodes):
    import torch
    from datasets import Dataset
    from test_dpo import DPO as DPO_ARGS, _two_turn_pair

    from eto_train.model.load import load_model, load_tokenizer
    from eto_train.training.dpo import fsdp_reference, make_dpo_trainer

    cfg = {"dtype": "bfloat16", "lora": None}
    assert fsdp_reference(str(tiny_model_dir), cfg) is None  # one process: TRL's own choice (the policy itself)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert fsdp_reference(str(tiny_model_dir), {**cfg, "lora": {"r": 4}}) is None  # LoRA: the adapter-disabled model
    ref = fsdp_reference(str(tiny_model_dir), cfg)
    params = list(ref.parameters())
    assert {p.device.type for p in params} == {"cpu"} and {p.dtype for p in params} == {torch.bfloat16}
    assert not ref.training and not any(p.requires_grad for p in params)
    assert not hasattr(ref, "hf_device_map")  # no dispatch hooks
    monkeypatch.setenv("WORLD_SIZE", "1")  # the trainer itself runs in this one process

    # with precomputed log-probs the given reference is used once, then dropped
    tok = load_tokenizer(str(tiny_model_dir))
    pairs = [_two_turn_pair(e) for e in expert_episodes[:2]]
    ds = Dataset.from_list([{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs])
    ref32 = load_model(str(tiny_model_dir)).eval().requires_grad_(False)
    args = dpo_config(str(tmp_path), DPO_ARGS, 0, "none")
    trainer = make_dpo_trainer(load_model(str(tiny_model_dir)), ref32, tok, ds, args)
    assert trainer.ref_model is None and "ref_chosen_logps" in trainer.train_dataset.column_names
