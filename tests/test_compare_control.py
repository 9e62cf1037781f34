"""The SFT control of `make compare-contrast` trains by the bc stage's recipe (training/sft.py).

On the conftest's tiny model, standing in for the BC policy: one DPO variant (LoRA, 3 optimizer
steps of 2 x 2 pairs) and its control. The control with ``model.lora`` set trains LoRA adapters
and saves one merged plain checkpoint; its optimizer steps and examples equal the DPO's; and a
control SIGKILLed mid-way (``ETO_TRAIN_KILL_AT``, as in tests/test_resume.py) resumes from its
last checkpoint to the very weights of an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LORA = "model.lora={r:4,lora_alpha:8,lora_dropout:0.0,target_modules:[q_proj,v_proj]}"
# DPO: 3 steps of 2 pairs x 2 accumulated (effective batch 4), a checkpoint after every step;
# bc.per_device_train_batch_size=3: the control's per-device batch is 2 (the largest divisor of 4 up to 3), x 2
SMALL = ["wandb.enabled=false", "runtime.train_threads=1", "runtime.rollout_threads=1",
         "eto.dpo.max_steps=3", "eto.dpo.per_device_train_batch_size=2", "eto.dpo.gradient_accumulation_steps=2", "eto.dpo.save_steps=1",
         "eto.dpo.logging_steps=1", "eto.dpo.learning_rate=1e-3", "eto.dpo.loss_type=[sigmoid]", "eto.dpo.loss_weights=null",
         "bc.per_device_train_batch_size=3", LORA]

# The control in a process of its own (to be SIGKILLed): argv[1] = [overrides, policy, variant dir, out]
CONTROL_SCRIPT = """
import json, sys
from pathlib import Path
from hydra import compose, initialize_config_dir
from eto_train.config import load
from eto_train.pairs import Pair
from eto_train.stages import compare
from eto_train.stages.eto import dpo

overrides, policy, variant_dir, out = json.loads(sys.argv[1])
with initialize_config_dir(sys.argv[2], version_base="1.3", job_name="control"):
    cfg = load(compose("config", overrides=overrides))
lines = (Path(variant_dir) / "pairs" / "pairs.jsonl").read_text().splitlines()
vpairs = [Pair(**json.loads(x)) for x in lines]
trained = dpo.run(cfg, 1, policy, vpairs, Path(variant_dir))  # up to date: the variant's DPO as it ran
compare.sft_control(cfg, policy, vpairs, trained, Path(variant_dir), Path(out))
"""


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from eto_train.config import load

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="control"):
        return load(compose("config", overrides=overrides))  # the typed config, as the CLI gives a stage


def _pairs(expert_episodes, policy_id: str):
    """Per expert (first 2 steps), a clone by ``policy_id`` whose 2nd action is wrong and scores lower."""
    from eto_train.pairs import trajectory_pair
    from eto_train.records import Episode

    out = []
    for expert in [e for e in expert_episodes if e.num_steps >= 2][:6]:
        exp = Episode.from_dict(expert.to_dict())
        exp.steps = exp.steps[:2]
        exp.finish("success")
        agent = Episode.from_dict(exp.to_dict())
        agent.episode_id, agent.policy.id = f"agent-{exp.episode_id}", policy_id
        agent.steps[1].raw_output, agent.steps[1].action = "Action: inventory", "inventory"
        agent.steps[1].observation, agent.steps[1].reward = "You are carrying nothing.", 0.0
        agent.finish("failure")
        out.append(trajectory_pair(exp, agent))
    return out


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _sha(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_dir, expert_episodes):
    """The trajectory variant's pairs and DPO from the tiny 'BC' policy, and an uninterrupted control."""
    from eto_train.model.load import policy_ref
    from eto_train.stages import compare
    from eto_train.stages.eto import dpo
    from eto_train.store import write_jsonl

    runs = tmp_path_factory.mktemp("runs")
    overrides = SMALL + [f"paths.runs={runs}", "run_name=ctl", f"model.path={tiny_model_dir}"]
    cfg = _compose(overrides)
    policy = str(tiny_model_dir)
    vpairs = _pairs(expert_episodes, policy_ref(policy).id)
    assert len(vpairs) == 6
    variant = runs / "ctl" / "compare" / "trajectory"
    write_jsonl(variant / "pairs" / "pairs.jsonl", (p.to_dict() for p in vpairs))
    trained = dpo.run(cfg, 1, policy, vpairs, variant)
    control = compare.sft_control(cfg, policy, vpairs, trained, variant, runs / "ctl" / "compare" / "control")
    return {"cfg": cfg, "overrides": overrides, "policy": policy, "variant": variant, "control": Path(control),
            "pairs": vpairs, "trained": trained}


def test_control_with_lora_trains_adapters_and_saves_a_merged_model(setup):
    import torch

    out = setup["control"].parent
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "done" and m["stage"] == "compare/control" and m["metrics"]["lora"] is True
    base = _weights(Path(setup["policy"]))
    assert 0 < m["metrics"]["trainable_parameters"] < sum(t.numel() for t in base.values()) / 10
    # the checkpoints hold the adapters only; the policy is one plain checkpoint, adapters merged
    ckpt = out / "checkpoints" / "checkpoint-3"
    assert (ckpt / "adapter_model.safetensors").exists() and not (ckpt / "model.safetensors").exists()
    assert not (out / "adapter").exists() and not (setup["control"] / "adapter_config.json").exists()
    merged = _weights(setup["control"])
    assert set(merged) == set(base)  # no lora_A / lora_B / base_layer names: a plain checkpoint
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed), changed
    assert (setup["control"] / "tokenizer_config.json").exists()


def test_control_takes_as_many_optimizer_steps_and_examples_as_its_dpo(setup):
    from eto_train.distributed import grad_accum

    d = json.loads((setup["variant"] / "dpo" / "manifest.json").read_text())
    dpo = d["config"]["dpo"]
    dpo_steps, dpo_batch = d["metrics"]["optimizer_steps"], dpo["per_device_train_batch_size"] * grad_accum(dpo)
    assert (dpo_steps, dpo_batch) == (3, 4)
    c = json.loads((setup["control"].parent / "manifest.json").read_text())["metrics"]
    assert c["optimizer_steps"] == c["dpo_optimizer_steps"] == dpo_steps
    assert c["effective_batch"] == c["dpo_effective_batch"] == dpo_batch
    assert c["examples"] == c["dpo_examples"] == dpo_steps * dpo_batch == 12
    assert (c["per_device_batch"], c["grad_accum"]) == (2, 2) and c["conversations"] == 6
    assert c["control_of"] == "trajectory" and "resumed_from" not in c
    # the trainer ran that many steps (trainer_state of the last checkpoint)
    state = json.loads((setup["control"].parent / "checkpoints" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and state["train_batch_size"] == 2


def test_control_training_matches_the_dpo_batch_under_bc_memory_settings():
    from eto_train.stages.compare import control_training

    batch, accum = "per_device_train_batch_size", "gradient_accumulation_steps"
    bc = {batch: 1, "weight_decay": 0.0, "bf16": True, "activation_checkpointing": True, "use_cpu": False}
    d = {batch: 1, accum: 1, "effective_batch": 32, "learning_rate": 1e-5, "lr_scheduler_type": "cosine",
         "warmup_steps": 0.03, "max_length": 4096, "num_train_epochs": 1, "logging_steps": 5,
         "save_strategy": "steps", "save_steps": 200, "save_total_limit": 1}
    t = control_training(bc, d, 177)  # lora_24gb: SFT 1 sequence a step on the device, DPO 1 pair
    assert (t[batch], t[accum], t["effective_batch"], t["max_steps"]) == (1, 32, 32, 177)
    assert t["learning_rate"] == 1e-5 and t["activation_checkpointing"] and t["bf16"]
    t = control_training({**bc, batch: 2}, d, 10)  # qlora_24gb: bc.per_device_train_batch_size=2
    assert (t[batch], t[accum]) == (2, 16)
    t = control_training({**bc, batch: 8}, {**d, batch: 8, "effective_batch": None}, 18)  # CPU default
    assert (t[batch], t[accum], t["effective_batch"]) == (8, 1, 8)


def _control_process(setup, out: Path, log: Path, kill_at: str | None = None) -> tuple[int, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ETO_TRAIN_KILL_AT", None)
    if kill_at:
        env["ETO_TRAIN_KILL_AT"] = kill_at
    args = json.dumps([setup["overrides"], setup["policy"], str(setup["variant"]), str(out)])
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-c", CONTROL_SCRIPT, args, str(ROOT / "configs")], cwd=ROOT,
                                env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=300)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return rc, log.read_text(errors="replace")


def test_a_killed_control_resumes_from_its_checkpoint_to_the_uninterrupted_weights(setup, tmp_path):
    out = tmp_path / "control"
    rc, log = _control_process(setup, out, tmp_path / "kill.log", kill_at="compare/control:2")
    assert rc == -signal.SIGKILL, log[-4000:]
    assert "ETO_TRAIN_KILL_AT=compare/control:2: SIGKILL" in log
    assert json.loads((out / "manifest.json").read_text())["status"] == "running"
    assert sorted(p.name for p in (out / "checkpoints").glob("checkpoint-*")) == ["checkpoint-1"]
    assert not (out / "model").exists()

    rc, log = _control_process(setup, out, tmp_path / "rerun.log")
    assert rc == 0, log[-4000:]
    msg = f"[compare/control] resuming from the last checkpoint {out}/checkpoints/checkpoint-1"
    assert "".join(msg.split()) in "".join(log.split())  # rich may wrap long lines
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "done" and m["metrics"]["resumed_from"] == "checkpoint-1"
    assert m["metrics"]["optimizer_steps"] == 3 and m["metrics"]["examples"] == 12
    assert _sha(out / "model") == _sha(setup["control"])  # the same weights as without the kill

    rc, log = _control_process(setup, out, tmp_path / "again.log")  # finished: nothing to do
    assert rc == 0 and "[compare/control] up to date" in log, log[-4000:]


def test_qlora_control_on_a_cpu_stops_before_writing(setup, tmp_path, monkeypatch):
    import sys

    import torch

    from eto_train.stages import compare

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # with it, QLoRA runs on a CPU (tests/test_master_weights.py)
    cfg = _compose(setup["overrides"] + ["+model.quantization={load_in_4bit:true}"])
    with pytest.raises(RuntimeError, match=r"model.quantization .* needs a CUDA GPU"):
        compare.sft_control(cfg, setup["policy"], setup["pairs"], setup["trained"], setup["variant"], tmp_path / "control")
    assert not (tmp_path / "control").exists()
