"""A rehearsal of every ready-made experiment (configs/experiment/) on the CPU: each runs
bc -> eto-iter -> eval, the stages `make bc`, `make eto-iter` and `make eval` run, on a small
random-init model of its family with the real tokenizer and chat template
(tests/fixture_models.py), with size overrides and the CPU's device settings only. Families without an experiment config
(Llama-3.x, Qwen3, Gemma-3) run the paper's ScienceWorld profile with their model config; Qwen3
also with LoRA. QLoRA needs CUDA (bitsandbytes): its experiments are checked up to that point,
which must fail with a clear error before any stage writes anything.

`make rehearse` runs the rehearsal alone. It is split by environment into three modules
(this one: ScienceWorld and QLoRA; test_rehearsal_alfworld.py; test_rehearsal_families.py for the
families without an experiment config) so that `make test`'s two workers share it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fixture_models import FAMILIES, build_fixture_model  # tests/fixture_models.py


ROOT = Path(__file__).resolve().parents[1]
# every experiment on a chat model (faults10 is the tiny CPU model's)
EXPERIMENTS = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml")
                     if "override /model" in p.read_text())
FAMILY_OF = {OmegaConf.load(ROOT / "configs" / "model" / f"{f.model_config}.yaml").name: f.name
             for f in FAMILIES.values()}  # model.name -> fixture family


def family_param(name: str):
    """An experiment as a test case: the paper's model (Llama-2) runs in `make test` (and ALFWorld's LoRA profile);
    the same protocol on another family (Mistral, Qwen2.5: their templates are checked token by token in
    tests/test_chat_families.py) is marked `rehearse` and runs in `make rehearse` (make test: -m 'not rehearse')."""
    # ScienceWorld's LoRA profile too: ALFWorld's (alfworld_llama2_7b_lora_24gb) rehearses the LoRA path in make test
    light = "llama2" in name and not (name.startswith("sciworld") and "lora" in name)
    return pytest.param(name, marks=[] if light else [pytest.mark.rehearse])

# Size overrides only: a few steps, a few tasks, short answers; the profiles stay the paper's.
SIZE = [
    "wandb.enabled=false", "runtime.train_threads=1", "runtime.rollout_threads=1",
    "env.step_limit=3",
    "bc.max_steps=1", "bc.per_device_train_batch_size=1", "bc.effective_batch=2", "bc.max_length=512",
    "eto.explore.rollout.batch_size=2", "eto.dpo.max_steps=1", "eto.dpo.per_device_train_batch_size=1", "eto.dpo.effective_batch=1",
    "eto.dpo.max_length=512", "rollout.batch_size=2", "rollout.generation.max_new_tokens=8", "eval.splits=[unseen]",
    "model.max_context=1024",
]
# The CPU's device settings: the GPU profiles train in bf16 on CUDA (TRL refuses bf16 without it).
CPU = ["bc.bf16=false", "bc.use_cpu=true", "eto.dpo.bf16=false", "eto.dpo.use_cpu=true", "model.dtype=float32"]
SCIWORLD = ["env.tasks=[11]", "env.limit_per_task=1"]
ALFWORLD = ["env.splits.unseen.ids=null", "env.limit_per_type=1"]
TWX = ["env.splits.train.count=1", "env.splits.dev.count=1", "env.splits.seen.count=1",
       "env.splits.unseen.count=1", "eto.explore.tasks_per_game=1"]
# Families without an experiment config: the paper's training profiles with their model config,
# on the CPU default's TextWorldExpress games (short observations: Gemma's 262k-token vocabulary
# makes every sequence position cost, and the template, not the environment, is under test here).
PAPER = ["env=twx", "bc=paper", "eto=paper", "rollout=gpu"]
EXTRA = {
    "llama3": PAPER + ["model=llama3_8b_instruct"],
    "qwen3": PAPER + ["model=qwen3_8b"],
    "qwen3-lora": PAPER + ["model=qwen3_8b", "hardware=lora_24gb"],
    "gemma3": PAPER + ["model=gemma3_1b_it"],
}


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="rehearsal"):
        return compose("config", overrides=overrides)


def _config(overrides: list[str]):
    """:func:`_compose` typed once (config.load): what a stage takes."""
    from eto_train.config import load

    return load(_compose(overrides))


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixture_models")
    return {f: build_fixture_model(f, root / f) for f in FAMILIES}


def overrides(name: str, fixtures, alfworld_data: Path | None, runs: Path) -> list[str]:
    base = [f"experiment={name}"] if name in EXPERIMENTS else list(EXTRA[name])
    cfg = _compose(base)
    env = {"sciworld": SCIWORLD, "twx": TWX}.get(cfg.env.name) or ALFWORLD + [f"env.data_dir={alfworld_data}"]
    return base + SIZE + CPU + env + [f"model.path={fixtures[FAMILY_OF[cfg.model.name]]}", f"paths.runs={runs}"]


def rehearse(overrides: list[str]) -> dict:
    from eto_train.stages import bc, eto, evaluate, experts, model

    cfg = _config(overrides)
    experts.run(cfg)                       # make bc: experts -> model (a no-op here) -> bc
    model.run(cfg)
    bc.run(cfg)
    k, policy = eto.latest_policy(cfg)    # make eto-iter
    summary = eto.run_iteration(cfg, k + 1, policy)
    cfg = _config(overrides + [f"eval.policy={summary['policy']}", "eval.tag=iter1"])
    evaluate.run(cfg)                      # make eval
    return {"cfg": cfg, "summary": summary}


def check_run(out: dict) -> None:
    cfg, summary = out["cfg"], out["summary"]
    run = Path(cfg.paths.run)
    bc = json.loads((run / "bc" / "manifest.json").read_text())
    assert bc["status"] == "done" and bc["metrics"]["optimizer_steps"] == 1
    assert summary["pairs"] >= 1  # a random policy loses to the expert: there is something to learn from
    dpo = json.loads((run / "eto" / "iter1" / "dpo" / "manifest.json").read_text())
    assert dpo["status"] == "done" and dpo["metrics"]["optimizer_steps"] == 1
    for split in cfg.eval.splits:
        m = json.loads((run / "eval" / "iter1" / split / "metrics.json").read_text())
        assert m["overall"]["episodes"] >= 1 and m["policy"].startswith("iter1@")
    if cfg.model.lora:  # LoRA: the saved policy is a plain merged checkpoint
        assert not (run / "bc" / "adapter").exists() and (run / "bc" / "model" / "model.safetensors").exists()


@pytest.mark.parametrize("name", [family_param(e) for e in EXPERIMENTS if e.startswith("sciworld") and "qlora" not in e])
def test_sciworld_experiment_runs_bc_eto_iter_eval_on_its_family(name, fixtures, tmp_path):
    check_run(rehearse(overrides(name, fixtures, None, tmp_path)))


@pytest.mark.parametrize("name", [e for e in EXPERIMENTS if "qlora" in e])
def test_qlora_experiment_stops_with_a_clear_error_before_writing(name, fixtures, tmp_path, monkeypatch):
    import sys

    from eto_train.stages import bc, experts

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # with it, QLoRA runs on a CPU (tests/test_master_weights.py)

    cfg = _config(overrides(name, fixtures, tmp_path / "no-alfworld-data-needed", tmp_path))
    if cfg.env.name == "sciworld":
        experts.run(cfg)  # the stage before bc, so that bc fails on the quantization alone
    with pytest.raises(RuntimeError, match=r"model.quantization .* needs a CUDA GPU"):
        bc.run(cfg)
    assert not Path(cfg.paths.bc).exists()


def released_entries(cfg, thought: str = "next I should") -> list[dict]:
    """Entries in the authors' released SFT schema for this config's training tasks, written here
    (never their data): the gold paths played through the environment, each action with a
    written thought, after the instruction turn and "OK"."""
    from eto_train.envs import make_env
    from eto_train.experts import expert_episode
    from eto_train.prompting import PromptConfig
    from eto_train.runtime import to_plain

    env, prompt = make_env(to_plain(cfg.env)), PromptConfig(**to_plain(cfg.prompt))
    entries = []
    try:
        for task in env.tasks("train"):
            ep = expert_episode(env, task, prompt)
            conv = [{"from": "human", "value": ep.system}, {"from": "gpt", "value": "OK"},
                    {"from": "human", "value": ep.first_user}]
            for s in ep.steps:
                conv += [{"from": "gpt", "value": f"Thought: {thought} {s.action}.\nAction: {s.action}"},
                         {"from": "human", "value": s.observation}]
            entries.append({"id": task.task_id, "conversations": conv[:-1]})
    finally:
        env.close()
    return entries


def released_sft_file(cfg, path: Path) -> Path:
    """:func:`released_entries` plus one entry of no task, as a JSON list (the authors' files)."""
    entries = released_entries(cfg)
    entries.append({"id": "99_0", "conversations": entries[0]["conversations"]})
    path.write_text(json.dumps(entries, indent=4))
    return path


def test_paper_run_on_experts_imported_from_the_released_layout(fixtures, tmp_path):
    from eto_train.store import read_episodes

    base = overrides("sciworld_llama2_7b", fixtures, None, tmp_path)
    source = released_sft_file(_compose(base), tmp_path / "sciworld_sft.json")
    out = rehearse(base + [f"experts.source={source}"])
    check_run(out)
    cfg = out["cfg"]
    (ep,) = read_episodes(cfg.paths.experts)
    assert ep.opening == "instruction_ok" and ep.system.startswith("You are a helpful assistant to do some scientific")
    assert ep.steps[0].raw_output.startswith("Thought: next I should") and ep.env_version.startswith("imported")
    manifest = json.loads((Path(cfg.paths.experts).parent / "manifest.json").read_text())
    assert manifest["metrics"]["imported"] == 1 and manifest["metrics"]["unmatched_ids"] == ["99_0"]
    # the pairs train on the imported expert: its thoughts are the chosen side
    pair = json.loads((Path(cfg.paths.eto) / "iter1" / "pairs" / "pairs.jsonl").read_text().splitlines()[0])
    assert pair["chosen"][0]["content"] == ep.steps[0].raw_output
    assert [m["content"] for m in pair["prompt"]] == [ep.system, "OK", ep.first_user]
