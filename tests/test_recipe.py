"""The one training recipe (training/recipe.py): a section's keys are TRL's, passed through as they are."""

from __future__ import annotations

import pytest

from eto_train.config import SET_BY_STAGE, BCSection, ConfigError, DPOSection
from eto_train.training.dpo import FIXED as DPO_FIXED, dpo_arguments
from eto_train.training.sft import FIXED as SFT_FIXED, sft_arguments
from eto_train.trl_names import trainer_fields

BC = {"max_length": 64, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "learning_rate": 1e-3,
      "lr_scheduler_type": "constant", "warmup_steps": 0.0, "weight_decay": 0.0, "num_train_epochs": 1,
      "max_steps": 2, "logging_steps": 1, "save_strategy": "no", "save_steps": 500, "save_total_limit": 1,
      "bf16": False, "activation_checkpointing": False, "use_cpu": True}
DPO = {**BC, "beta": 0.1, "loss_type": ["sigmoid"], "loss_weights": None, "precompute_ref_log_probs": False}
BC = {**BC, "only_success": True}
RUNTIME = {"output_dir", "seed", "data_seed", "report_to"}  # from the stage (training/sft.py, training/dpo.py)


def bc(**extra) -> BCSection:
    return BCSection.model_validate({**BC, **extra})


def dpo(**extra) -> DPOSection:
    return DPOSection.model_validate({**DPO, **extra})


def test_any_trl_argument_in_a_section_reaches_the_trl_config_and_eto_trains_own_keys_do_not(tmp_path):
    args = sft_arguments(bc(max_grad_norm=0.25, optim="sgd", only_success=False), tmp_path, 0)
    assert args.max_grad_norm == 0.25 and args.optim == "sgd" and args.output_dir == str(tmp_path)
    args = dpo_arguments(dpo(max_grad_norm=0.5, label_smoothing=0.1, later={"beta": 0.5}), tmp_path, 7)
    assert args.max_grad_norm == 0.5 and args.label_smoothing == 0.1 and args.beta == 0.1
    assert (args.seed, args.data_seed, args.remove_unused_columns) == (7, 7, False)
    assert sft_arguments(bc(), tmp_path, 0).max_grad_norm == 1.0  # absent: TRL's default


def test_effective_batch_sets_the_accumulation_over_the_processes(tmp_path, monkeypatch):
    from eto_train.distributed import grad_accum

    section = bc(per_device_train_batch_size=4, effective_batch=64)
    assert sft_arguments(section, tmp_path, 0).gradient_accumulation_steps == 16
    assert "effective_batch" not in section.trl_arguments()
    monkeypatch.setenv("WORLD_SIZE", "2")  # (a TRL config would start a process group here)
    assert grad_accum(section) == 8


@pytest.mark.parametrize("kind,section,fixed", [("sft", bc, SFT_FIXED), ("dpo", dpo, DPO_FIXED)])
def test_the_arguments_the_recipe_sets_itself_are_trls_and_no_section_key(kind, section, fixed):
    fields = trainer_fields(kind)
    assert "max_grad_norm" in fields and "beta" in trainer_fields("dpo") and "beta" not in trainer_fields("sft")
    assert SET_BY_STAGE[kind] == {*fixed, *RUNTIME}  # the schema refuses exactly what the recipe sets
    for key in sorted(SET_BY_STAGE[kind]):
        assert key in fields, key
        with pytest.raises((ConfigError, ValueError), match=key):
            section(**{key: None})


def test_the_config_names_a_key_that_is_no_trl_argument_or_one_the_recipe_sets():
    from hydra import compose, initialize_config_dir
    from test_pipeline import ROOT

    from eto_train.config import load

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("config", ["+bc.max_grad_norm=0.5", "+bc.no_such_arg=1", "+bc.output_dir=x",
                                 "+eto.dpo.label_smoothing=0.1"])
    with pytest.raises(ConfigError) as e:
        load(cfg)
    msg = str(e.value)
    assert "bc.no_such_arg=1: not a SFTConfig argument" in msg and "bc.output_dir='x': set by eto-train" in msg
    assert "bc.max_grad_norm" not in msg and "eto.dpo.label_smoothing" not in msg  # real arguments pass


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
    args = dpo_arguments(DPOSection.model_validate(DPO_ARGS), tmp_path, 0)
    trainer = make_dpo_trainer(load_model(str(tiny_model_dir)), ref32, tok, ds, args)
    assert trainer.ref_model is None and "ref_chosen_logps" in trainer.train_dataset.column_names


def test_threads_auto_is_measured_and_leaves_torch_as_it_was(monkeypatch):
    """runtime.*_threads: an integer as it is; auto: one thread on a one-core machine without measuring, else
    one or every core, whichever the matmul timing picks; torch's own setting is untouched by the measurement."""
    import torch

    from eto_train import runtime

    assert runtime.pick_threads(3) == 3
    before = torch.get_num_threads()
    assert runtime.pick_threads("auto") in (1, runtime.cores())
    assert torch.get_num_threads() == before
    monkeypatch.setattr(runtime, "cores", lambda: 1)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (_ for _ in ()).throw(AssertionError("measured")))
    assert runtime.pick_threads("auto") == 1
