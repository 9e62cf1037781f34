"""bf16 training that trains: one optimizer step at lr 1e-6 changes the trainable weights under
every one-GPU profile, through the recipe (training/recipe.py), on the CPU with bf16 autocast.

Full fine-tuning as the paper's profile sets it (``model.dtype: bfloat16``, ``bf16: true``) used to
load and train bf16 weights, where a step at lr 1e-6 rounds to nothing for almost every weight;
the recipe now loads fp32 master weights (model/load.py ``train_dtype``) and computes in bf16
autocast. LoRA (hardware/lora_24gb.yaml) keeps the base in bf16 and the adapters in fp32; QLoRA
(hardware/qlora_24gb.yaml) keeps a 4-bit NF4 base (bitsandbytes' CPU backend) and fp32 adapters
(TRL casts them to bf16, the recipe casts them back: ``fp32_trainable``).

The weights are compared in memory after the last optimizer step, before the save (which writes
``model.dtype``)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "models" / "twx-base-1.7m"
LR = 1e-6

# bc/paper.yaml's keys at test size: the paper's bf16 and checkpointing, a constant lr (no warmup:
# the first step of a warmup schedule has lr 0)
TRAIN = {"max_length": 128, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "learning_rate": LR,
         "lr_scheduler_type": "constant", "warmup_steps": 0.0, "weight_decay": 0.0, "num_train_epochs": 1, "max_steps": 1, "logging_steps": 1,
         "save_strategy": "no", "save_steps": 500, "save_total_limit": 1, "bf16": True,
         "activation_checkpointing": True, "use_cpu": True, "only_success": True}
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05,  # hardware/lora_24gb.yaml
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
QLORA = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}  # qlora_24gb.yaml
PROFILES = {
    "full": {"name": "twx", "dtype": "bfloat16", "lora": None, "quantization": None},
    "lora": {"name": "twx-lora", "dtype": "bfloat16", "lora": LORA, "quantization": None},
    "qlora": {"name": "twx-qlora", "dtype": "bfloat16", "lora": LORA, "quantization": QLORA},
}


def conversations(n: int = 4) -> list[list[dict[str, str]]]:
    return [[{"role": "system", "content": "You are in a house. Find the coin."},
             {"role": "user", "content": f"You are in the kitchen {i}. Exits: north, east."},
             {"role": "assistant", "content": "Thought: the coin may be north.\nAction: move north"},
             {"role": "user", "content": "You are in the hallway. You see a coin."},
             {"role": "assistant", "content": "Action: take coin"}] for i in range(n)]


class Recorder:
    """A TrainerCallback (through the recipe's test hook, killpoints.trainer_callback) that keeps
    the trainable weights as the optimizer starts with them and after each step, and the dtypes
    the trainable layers compute in."""

    def __init__(self):
        from transformers import TrainerCallback

        rec = self

        class _Cb(TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, **kw):
                rec.before = rec.snapshot(model)
                rec.dtypes = {n: p.dtype for n, p in model.named_parameters() if p.requires_grad}
                rec.modules = {type(m).__name__ for m in model.modules()}
                for name, mod in model.named_modules():  # the output dtype of each trainable Linear
                    if type(mod).__name__ == "Linear" and mod.weight.requires_grad:
                        mod.register_forward_hook(rec.hook(name))

            def on_step_end(self, args, state, control, model=None, **kw):
                rec.after = rec.snapshot(model)

        self.callback, self.out_dtypes = _Cb(), {}

    def hook(self, name: str):
        def record(module, inputs, output):
            self.out_dtypes.setdefault(name, output.dtype)
        return record

    @staticmethod
    def snapshot(model):
        return {n: p.detach().float().clone() for n, p in model.named_parameters() if p.requires_grad}

    def changed(self, select=lambda name: True) -> float:
        """Share of the selected trainable weights the optimizer steps changed."""
        names = [n for n in self.before if select(n)]
        assert names
        moved = sum(int((self.after[n] != self.before[n]).sum()) for n in names)
        return moved / sum(self.before[n].numel() for n in names)


def one_step(profile: str, tmp_path, monkeypatch, steps: int = 1) -> Recorder:
    from eto_train import killpoints
    from eto_train.config import BCSection
    from eto_train.training import recipe
    from eto_train.training.sft import sft_arguments

    rec = Recorder()
    monkeypatch.setattr(killpoints, "trainer_callback", lambda point: rec.callback)
    args = sft_arguments(BCSection.model_validate({**TRAIN, "max_steps": steps}), tmp_path / "bc" / "checkpoints", seed=0)
    job = recipe.SFTJob("bc", str(BASE), conversations(), args, PROFILES[profile])
    trained = recipe.train(job, tmp_path / "bc")
    assert trained.optimizer_steps == steps
    return rec


def test_full_fine_tuning_in_bf16_keeps_fp32_masters_and_one_step_at_1e6_moves_them(tmp_path, monkeypatch):
    import torch

    rec = one_step("full", tmp_path, monkeypatch)
    # AdamW's first step moves each weight with a gradient by ~lr; bf16 weights: about 1% of them moved
    assert rec.changed() > 0.9
    assert set(rec.dtypes.values()) == {torch.float32}  # master weights
    assert rec.out_dtypes and set(rec.out_dtypes.values()) == {torch.bfloat16}  # bf16 autocast computes


@pytest.mark.parametrize("profile", ["full", "lora"])
def test_the_saved_policy_keeps_model_dtype(profile, tmp_path, monkeypatch):
    """Training holds fp32 masters; the checkpoint every later stage loads is in model.dtype."""
    import torch
    from safetensors import safe_open

    one_step(profile, tmp_path, monkeypatch)
    with safe_open(str(tmp_path / "bc" / "model" / "model.safetensors"), framework="pt") as fh:
        assert {fh.get_tensor(k).dtype for k in fh.keys()} == {torch.bfloat16}


@pytest.mark.parametrize("profile", ["lora", "qlora"])
def test_lora_and_qlora_adapters_are_fp32_and_two_steps_at_1e6_move_both_factors(profile, tmp_path, monkeypatch):
    """LoRA's B starts at zero, so step 1 moves B only (A's gradient is B^T ...= 0); step 2 moves A,
    whose values (~0.1 here, ~0.016 at 7B) lie on a bf16 grid far coarser than 1e-6."""
    import torch

    rec = one_step(profile, tmp_path, monkeypatch, steps=2)
    assert set(rec.dtypes) and all(".lora_" in n for n in rec.dtypes)  # adapters only
    assert rec.changed(lambda n: ".lora_A." in n) > 0.9
    assert rec.changed(lambda n: ".lora_B." in n) > 0.9
    assert set(rec.dtypes.values()) == {torch.float32}
    assert set(rec.out_dtypes.values()) == {torch.bfloat16}  # the adapters compute in bf16 autocast
    assert ("Linear4bit" in rec.modules) == (profile == "qlora")  # QLoRA's base really is 4-bit (bitsandbytes)
