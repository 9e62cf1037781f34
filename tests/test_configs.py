"""The paper's configs and the GPU path's knobs, checked on the CPU.

Every ``configs/experiment/*.yaml`` must compose and resolve as ``eto-train <stage> experiment=X``
composes it; the hardware profiles, the 4-bit knob, the merged-checkpoint saving, the
accelerate files and the Makefile's launcher are checked for what they produce.
"""

from __future__ import annotations

import json

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))
PAPER_EXPERIMENTS = [n for n in EXPERIMENTS if n.split("_")[0] in ("alfworld", "sciworld")]
NEEDED_ENVS = ("sciworld", "alfworld")


@pytest.fixture(scope="module")
def searchpath(tmp_path_factory) -> list[str]:
    """Env configs the experiments select but this checkout does not have yet (the adapters
    are built alongside) come from stand-ins naming only the env; a real file always wins,
    because Hydra searches configs/ first."""
    missing = [e for e in NEEDED_ENVS if not (CONFIGS / "env" / f"{e}.yaml").exists()]
    if not missing:
        return []
    extra = tmp_path_factory.mktemp("standin")
    (extra / "env").mkdir()
    for e in missing:
        (extra / "env" / f"{e}.yaml").write_text(f"name: {e}\nsplits: {{}}\n")
    warnings.warn(f"configs/env/{{{','.join(missing)}}}.yaml not in this checkout yet: composed with stand-ins")
    return [f"hydra.searchpath=[file://{extra}]"]


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(CONFIGS), version_base="1.3", job_name="test_configs"):
        return hydra_compose("config", overrides=overrides)


def test_experiment_is_optional_and_the_cpu_default_unchanged():
    cfg = compose([])
    assert "experiment" not in cfg and "hardware" not in cfg
    assert cfg.model.name == "tiny" and cfg.env.name == "twx" and cfg.bc.learning_rate == 3.0e-3
    assert "effective_batch" not in cfg.bc and "quantization" not in cfg.model  # tiny runs' hashes kept


def test_the_fault_experiment_turns_on_ten_percent_faults_and_nothing_else():
    base = OmegaConf.to_container(compose([]), resolve=True)
    cfg = OmegaConf.to_container(compose(["experiment=faults10"]), resolve=True)
    rates = [cfg["env"]["faults"][k]["rate"] for k in ("timeout", "crash", "malformed")]
    p_any = 1 - (1 - rates[0]) * (1 - rates[1]) * (1 - rates[2])
    assert abs(p_any - 0.10) < 0.005 and cfg["rollout"]["env_retries"] == 3
    for d in (base, cfg):
        d["env"].pop("faults"), d["rollout"].pop("env_retries")
    assert cfg == base


@pytest.mark.parametrize("name", PAPER_EXPERIMENTS)
def test_every_experiment_composes_and_resolves(name, searchpath, monkeypatch):
    from eto_train.distributed import grad_accum

    monkeypatch.setenv("WORLD_SIZE", "1")
    cfg = compose([f"experiment={name}", *searchpath])
    plain = OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    env = name.split("_")[0]
    assert plain["env"]["name"] == env and plain["run_name"].startswith(f"{env}-")
    assert plain["paths"]["bc"] == f"runs/{plain['run_name']}/bc"
    assert plain["model"]["build"] is False and plain["model"]["dtype"] == "bfloat16"
    bc, dpo = plain["bc"], plain["eto"]["dpo"]
    # the paper's schedule and effective batches, whatever the hardware
    assert (bc["num_train_epochs"], bc["lr_scheduler_type"], bc["warmup_steps"], bc["max_length"]) == (3, "cosine", 0.03, 4096)
    batch = "per_device_train_batch_size"
    assert bc[batch] * grad_accum(bc) == 64
    assert dpo[batch] * grad_accum(dpo) == 32
    assert dpo["num_train_epochs"] == 3 and plain["eto"]["iterations"] == 3
    explore = plain["eto"]["explore"]["rollout"]
    assert explore["generation"]["do_sample"] is False and plain["rollout"]["generation"]["do_sample"] is False
    assert bc["bf16"] and dpo["bf16"] and not bc["use_cpu"] and not dpo["use_cpu"]
    later = dpo["later"]  # iterations >= 2 (stages/eto/dpo.py)
    assert (dpo["beta"], later["beta"]) == (0.1, 0.5)
    if "24gb" in name:  # adapters on one GPU: LoRA everywhere, 4-bit base for QLoRA
        assert plain["model"]["lora"]["r"] == 16 and bc[batch] <= 2 and dpo[batch] == 1
        assert (plain["model"].get("quantization") or {}).get("load_in_4bit", False) == ("qlora" in name)
        assert plain["rollout"]["batch_size"] == explore["batch_size"] == 4  # the profile beats rollout/gpu
    else:  # the paper: full fine-tuning, its learning rates
        assert plain["model"]["lora"] is None and plain["model"]["quantization"] is None
        assert (bc["learning_rate"], dpo["learning_rate"], later["learning_rate"]) == (2.0e-5, 1.0e-6, 5.0e-7)


def test_command_line_wins_over_the_experiment(searchpath):
    cfg = compose(["experiment=sciworld_llama2_7b_qlora_24gb", "model=qwen2_5_7b_instruct", "bc.learning_rate=5e-5",
                   *searchpath])
    assert cfg.model.path == "Qwen/Qwen2.5-7B-Instruct" and cfg.model.quantization.load_in_4bit
    assert cfg.run_name == "sciworld-qwen2.5-7b-instruct-qlora" and cfg.bc.learning_rate == 5e-5


def test_cfg_job_from_the_command_line(searchpath):
    """What a user types: the stage prints the resolved job config."""
    proc = subprocess.run([sys.executable, "-m", "eto_train.cli", "bc", "experiment=alfworld_llama2_7b", *searchpath,
                           "--cfg", "job", "--resolve"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    job = OmegaConf.create(proc.stdout)
    assert job.run_name == "alfworld-llama2-7b-chat" and job.model.path == "meta-llama/Llama-2-7b-chat-hf"
    assert job.bc.effective_batch == 64 and job.eto.dpo.lr_scheduler_type == "constant_with_warmup"


def test_grad_accum_reaches_the_effective_batch_on_any_gpu_count(monkeypatch):
    from eto_train.distributed import grad_accum

    bc = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 16, "effective_batch": 64}
    for gpus, accum in ((1, 16), (2, 8), (4, 4), (8, 2), (16, 1)):
        monkeypatch.setenv("WORLD_SIZE", str(gpus))
        assert grad_accum(bc) == accum
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="not a multiple"):
        grad_accum(bc)
    assert grad_accum({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 5}) == 5  # as configured


def test_4bit_knob_maps_to_bitsandbytes_keywords(searchpath):
    import torch

    from eto_train.model.load import bnb_kwargs

    cfg = compose(["experiment=sciworld_llama2_7b_qlora_24gb", *searchpath])
    kw = bnb_kwargs(OmegaConf.to_container(cfg.model.quantization), cfg.model.dtype)
    assert kw == {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                  "bnb_4bit_compute_dtype": torch.bfloat16}
    assert bnb_kwargs({"load_in_4bit": True, "bnb_4bit_compute_dtype": "float16"}, "bfloat16")[
        "bnb_4bit_compute_dtype"] is torch.float16


def test_4bit_on_a_cpu_says_what_it_needs(tmp_path, monkeypatch):
    import sys

    import torch

    from eto_train.model.load import load_model

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # with it, QLoRA runs on a CPU (tests/test_master_weights.py)
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text("{}")
    save_file({"w": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        load_model(str(tmp_path), dtype="bfloat16", quantization={"load_in_4bit": True})


def _tiny_lora(tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2))
    base.save_pretrained(tmp_path / "base", safe_serialization=True)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    return model


def test_adapter_merged_into_a_fresh_base_equals_the_trained_model(tmp_path, monkeypatch):
    """The distributed / QLoRA save path: Trainer.save_model writes the adapter, the main
    process merges it into a 16-bit copy of the base; the result computes what training had."""
    import torch
    from transformers import AutoModelForCausalLM

    from eto_train.training.save import save_policy

    model = _tiny_lora(tmp_path)
    ids = torch.tensor([[1, 5, 9, 33]])
    with torch.no_grad():
        want = model(input_ids=ids).logits

    class Tok:
        def save_pretrained(self, out):
            (Path(out) / "tok.txt").write_text("tokenizer")

    class FakeTrainer:  # what Trainer.save_model does for a PEFT model: the adapter only
        def __init__(self, m):
            self.model, self.saved = m, []

        def save_model(self, out):
            self.saved.append(out)
            self.model.save_pretrained(out)
            (Path(out) / "training_args.bin").write_bytes(b"x")

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    trainer = FakeTrainer(model)
    save_policy(trainer, Tok(), tmp_path / "dpo" / "model", str(tmp_path / "base"), "float32")
    assert trainer.saved == [str(tmp_path / "dpo" / "adapter")]
    out = tmp_path / "dpo" / "model"
    assert (out / "model.safetensors").exists() and not (out / "adapter_config.json").exists()
    assert (out / "tok.txt").exists()
    merged = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, want, rtol=1e-4, atol=1e-5)

    monkeypatch.setenv("RANK", "1")  # another process: joins the gather, writes nothing
    trainer2 = FakeTrainer(model)
    save_policy(trainer2, Tok(), tmp_path / "r1" / "model", str(tmp_path / "base"), "float32")
    assert trainer2.saved and not (tmp_path / "r1" / "model").exists()


def test_mistral_template_keeps_masks_on_the_actions():
    """Mistral's template override: the system text stays in the first user turn, so each
    assistant turn's tokens are exactly its content and end-of-turn token."""
    from eto_train.model.tiny import train_tokenizer
    from eto_train.training.masks import assistant_token_mask

    template = OmegaConf.load(CONFIGS / "model" / "mistral_7b_instruct.yaml").chat_template
    msgs = [{"role": "system", "content": "You act. Actions: go, look."},
            {"role": "user", "content": "Task: find the key\nObservation: a hall"},
            {"role": "assistant", "content": "Action: look"},
            {"role": "user", "content": "You see a door."},
            {"role": "assistant", "content": "Action: go"}]
    tok = train_tokenizer([m["content"] for m in msgs] * 3 + ["[INST] [/INST]"], vocab_size=300, min_frequency=1)
    tok.chat_template = template
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert text == ("<|im_start|>[INST] You act. Actions: go, look.\n\nTask: find the key\nObservation: a hall[/INST]"
                    " Action: look<|im_end|>[INST] You see a door.[/INST] Action: go<|im_end|>")
    ids, mask = assistant_token_mask(tok, msgs)
    spans = tok.decode([i for i, m in zip(ids, mask) if m])
    assert spans == " Action: look<|im_end|> Action: go<|im_end|>"


def test_accelerate_configs_load_as_accelerate_reads_them():
    from accelerate.commands.config.config_args import load_config_from_file

    fsdp = load_config_from_file(str(CONFIGS / "accelerate" / "fsdp.yaml"))
    assert fsdp.distributed_type == "FSDP" and fsdp.mixed_precision == "bf16"
    assert fsdp.fsdp_config["fsdp_version"] == 2 and fsdp.fsdp_config["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    assert fsdp.fsdp_config["fsdp_cpu_ram_efficient_loading"] is True  # rank 0 reads, the others get a broadcast
    ds = load_config_from_file(str(CONFIGS / "accelerate" / "deepspeed_zero3.yaml"))
    assert ds.distributed_type == "DEEPSPEED" and ds.deepspeed_config["zero_stage"] == 3
    assert ds.deepspeed_config["zero3_save_16bit_model"] is True


@pytest.mark.parametrize("target", ["bc", "eto-iter", "eto"])
def test_makefile_launches_through_accelerate_above_one_gpu(target):
    def recipe(*args):
        proc = subprocess.run(["make", "-n", target, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return [line for line in proc.stdout.splitlines() if f"eto_train.cli {target} " in line][-1]

    one = recipe('ARGS=experiment=x')
    assert one.split()[:4] == [".venv/bin/python", "-m", "eto_train.cli", target] and "accelerate" not in one
    four = recipe("N_GPUS=4", "ACCEL=deepspeed_zero3", 'ARGS=experiment=x')
    assert "accelerate" in four and "launch" in four and "--num_processes 4" in four
    assert "--config_file configs/accelerate/deepspeed_zero3.yaml" in four and four.endswith(
        f"-m eto_train.cli {target} experiment=x")
    assert "configs/accelerate/fsdp.yaml" in recipe("N_GPUS=2")


def test_the_contrast_study_is_its_rule_and_the_demo_setting():
    """experiment=contrast_study is the rule of docs/lab/experiments.md: the demo's setting from the
    shipped base, five seeds, every arm, both 400-episode test splits."""
    from eto_train.config import load

    cfg = load(compose(["experiment=contrast_study"]))
    assert cfg.seeds == [0, 1, 2, 3, 4] and cfg.run_name == "contrast_study"
    assert cfg.compare.variants == ["trajectory", "step", "step_value", "anchor", "mixture", "on_policy"]
    assert cfg.compare.control and cfg.compare.control_of == "trajectory" and cfg.compare.bootstrap == 2000
    assert cfg.compare.splits == ["test_seen", "test_unseen"]
    for split in cfg.compare.splits:  # 200 seeds per game x 2 games = 400 episodes
        assert cfg.env.splits[split].count == 200 and len(cfg.env.games) == 2
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    for setting in ("model=twx_base", "env.splits.train.count=100", "bc.learning_rate=1e-3"):
        assert setting in demo  # the demo's setting ...
    assert cfg.model.name == compose(["model=twx_base"]).model.name  # ... is the study's
    assert cfg.env.splits["train"].count == 100 and cfg.bc.learning_rate == 1e-3
    arms = cfg.compare.arms
    assert arms["anchor"]["explore"]["samples"] == arms["on_policy"]["explore"]["samples"] == 4
    assert cfg.eto.pairs.value_rollouts == 4 and cfg.eto.pairs.value_margin == 0.1
    assert cfg.eto.dpo.beta == 0.1 and cfg.eto.dpo.learning_rate == 1e-5


def test_the_base_study_again_is_the_first_one_with_three_dpo_epochs():
    """experiment=contrast_study_e3 (issue 36's rule for the 1.7M base) differs from
    experiment=contrast_study in its run folder and DPO's epochs only."""
    from eto_train.config import load
    from eto_train.runtime import to_plain

    first, again = (to_plain(load(compose([f"experiment={name}"]))) for name in ("contrast_study", "contrast_study_e3"))
    assert again["run_name"] == "contrast_study_e3" and again["eto"]["dpo"]["num_train_epochs"] == 3
    assert first["eto"]["dpo"]["num_train_epochs"] == 1
    again["eto"]["dpo"]["num_train_epochs"] = 1
    # every path follows run_name
    assert json.loads(json.dumps(again).replace("contrast_study_e3", "contrast_study")) == first


REAL_STUDY_DPO = (0.1, 5e-6, 3, 4)  # beta, lr, epochs, pairs per step: the dev diagnosis's choice


def test_the_real_model_study_is_its_rule():
    """experiment=real_study is the rule of docs/lab/experiments.md ("ETO on a real chat model across seeds: the rule"):
    SmolLM2-135M-Instruct with the paper-shaped prompt, bf16 fixed up front, three seeds, the issue's arms, both
    200-episode test splits, DPO's strength from the dev diagnosis."""
    from eto_train.config import load

    cfg = load(compose(["experiment=real_study"]))
    assert cfg.seeds == [0, 1, 2] and cfg.run_name == "real_study"
    assert cfg.model.name == "smollm2-135m-instruct" and cfg.prompt.version == compose(["prompt=twx_eto"]).prompt.version
    assert cfg.model.dtype == "bfloat16" and cfg.bc.bf16 and cfg.eto.dpo.bf16
    assert cfg.runtime.train_threads == cfg.runtime.rollout_threads == 1
    assert [g.name for g in cfg.env.games] == ["mapreader", "twc"] and cfg.env.step_limit == 10
    assert cfg.rollout.generation.max_new_tokens == 16
    assert cfg.env.splits["train"].count == cfg.eto.explore.tasks_per_game == 40 and cfg.env.splits["dev"].count == 50
    for split in ("test_seen", "test_unseen"):  # 100 seeds per game x 2 games = 200 episodes
        assert cfg.env.splits[split].count == 100
    assert list(cfg.compare.splits) == list(cfg.eval.splits) == ["test_seen", "test_unseen"]
    assert (cfg.bc.num_train_epochs, cfg.bc.per_device_train_batch_size, cfg.bc.learning_rate) == (2, 4, 1e-4)
    assert cfg.compare.variants == ["trajectory", "step", "step_value", "anchor", "mixture"]
    assert cfg.compare.control and cfg.compare.control_of == "trajectory" and cfg.compare.bootstrap == 2000
    assert cfg.eto.iterations == 2 and cfg.eto.early_stopping and cfg.eto.dev_split == "dev"
    d = cfg.eto.dpo
    assert (d.beta, d.learning_rate, d.num_train_epochs, d.per_device_train_batch_size) == REAL_STUDY_DPO
    assert list(d.loss_type) == ["sigmoid", "sft"] and d.precompute_ref_log_probs
    assert (d.later.beta, d.later.learning_rate) == (0.5, d.learning_rate / 2)
    arms = cfg.compare.arms
    assert arms["anchor"]["explore"]["samples"] == 4 and cfg.eto.pairs.value_rollouts == 4
    assert cfg.eto.pairs.value_margin == 0.1 and cfg.eto.pairs.mixture_step_fraction == 0.5


def test_the_real_model_study_in_units_is_its_rule():
    """experiment=real_study2 is the rule of docs/lab/experiments.md ("ETO on a real chat model, played in units: the
    rule (2026-12-06)"): real_study's setting, arms and DPO strength (rule 76994e1), fp32 everywhere, two threads,
    seeds 0-2, the results kept in docs/results/real_study2; the units are lab/real_study.sh's."""
    from eto_train.config import load

    old, cfg = load(compose(["experiment=real_study"])), load(compose(["experiment=real_study2"]))
    assert cfg.seeds == [0, 1, 2] and cfg.run_name == "real_study2" and cfg.results.dir == "docs/results/real_study2"
    assert cfg.model.dtype == "float32" and not cfg.bc.bf16 and not cfg.eto.dpo.bf16
    assert cfg.runtime.train_threads == cfg.runtime.rollout_threads == 2
    same = ("env", "prompt", "rollout", "eval", "compare")  # (the paths follow run_name)
    assert json.loads(json.dumps({k: getattr(cfg, k).plain() for k in same}).replace("real_study2", "real_study")) \
        == {k: getattr(old, k).plain() for k in same}
    assert cfg.model.plain() == {**old.model.plain(), "dtype": "float32"}
    assert cfg.bc.plain() == {**old.bc.plain(), "bf16": False, "activation_checkpointing": True}
    assert cfg.eto.plain() == {**old.eto.plain(), "dpo": {**old.eto.dpo.plain(), "bf16": False,
                                                          "activation_checkpointing": True}}
    units = (ROOT / "lab" / "real_study.sh").read_text()
    for unit, arms in (("trajectory", "[trajectory] compare.control=true"), ("step", "[step,mixture] compare.control=false"),
                       ("value", "[step_value] compare.control=false"), ("anchor", "[anchor] compare.control=false")):
        assert f"{unit}) arms=\"compare.variants={arms}" in units
    assert 'eto)   eto-train eto $A' in units and "eval.tag=untuned" in units
    assert sorted(["trajectory", "step", "mixture", "step_value", "anchor"]) == sorted(cfg.compare.variants)


SHIPPED = ([[]] + [[f"env={p.stem}"] for p in sorted((ROOT / "configs/env").glob("*.yaml"))]
           + [[f"prompt={p.stem}"] for p in sorted((ROOT / "configs/prompt").glob("*.yaml"))]
           + [[f"experiment={p.stem}", *(["experts.source=<a file>"]
                                          if p.stem.startswith("webshop") else [])]
              for p in sorted((ROOT / "configs/experiment").glob("*.yaml"))]
           + [["rollout=gpu"], ["eto=paper"], ["model=smollm2_135m"], ["hardware=qlora_24gb"]])


def written_twice(obj, path: tuple[str, ...] = ()) -> list[tuple[str, object, object]]:
    """(key, schema default, YAML value) of every key ``obj`` (a loaded config) sets that also carries a default in
    config.py's schema, with the same value or another. An override section's unset means "the other section's",
    and an optional key's null default is its absence (the library's default): neither is a value."""
    from pydantic import BaseModel

    from eto_train.config import _Overrides

    fields, found = type(obj).model_fields, []
    for k in sorted(obj.model_fields_set & fields.keys()):
        v, f = getattr(obj, k), fields[k]
        if isinstance(v, BaseModel):
            found += written_twice(v, (*path, k))
        elif not f.is_required() and not isinstance(obj, _Overrides):
            d = f.get_default(call_default_factory=True)
            if d is not None:
                found.append((".".join((*path, k)), d, v))
    return found


@pytest.mark.parametrize("overrides", SHIPPED, ids=lambda o: " ".join(o) or "default")
def test_no_value_is_written_in_two_homes(overrides, tmp_path):
    """Issue 38, item 1: every value lives in the YAML (configs/), the schema holds types, bounds and words only.
    For each shipped profile, no key the composed YAML sets also carries a schema default (the adapters' Config
    models included). Override sections (eto.dpo.later, eval.rollout, eto.explore.rollout) are optional keys
    whose unset means "the other section's": no value of their own."""
    from eto_train.config import load

    (tmp_path / "sft.json").write_text("[]")  # WebShop's experts come from a file (its name is all load checks)
    assert written_twice(load(compose([o.replace("<a file>", str(tmp_path / "sft.json")) for o in overrides]))) == []
