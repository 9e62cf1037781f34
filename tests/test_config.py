"""The typed config (issue 27): config.load validates the composed config once.

Every enum and range it checks, one bad override at a time, raises one ConfigError that names the
key, the value and what is allowed; the default config, every experiment and every config group
option pass; a stage entry (`make eval` on a finished evaluation) given a bad value fails without
touching the stage's folder; and the typed sections behave as the stages use them (rollout
overrides merged, TRL's arguments, plain dicts for the stage hashes).
"""

from __future__ import annotations

import copy
import functools
import pickle
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from eto_train.config import Config, ConfigError, RolloutSection, errors_of, load, require
from eto_train.trl_names import dpo_loss_types, package_file, scheduler_types

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))
GROUPS = ("env", "model", "bc", "eval", "eto", "prompt", "hardware")


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(str(CONFIGS), version_base="1.3", job_name="config"):
        return hydra_compose("config", overrides=overrides)


@functools.lru_cache(maxsize=None)
def _base(base: tuple[str, ...]):
    return compose(list(base))


def with_overrides(base: tuple[str, ...], overrides: list[str]):
    """``compose(base + overrides)`` at a fraction of the cost (a compose takes ~0.2 s; the table
    below has ~170 rows): the base is composed once, and each override is parsed by Hydra's own
    override parser and applied as its compose applies a command-line override (struct mode on:
    an unknown key fails; ``+`` adds one)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    cfg = copy.deepcopy(_base(base))
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_add():
            with open_dict(cfg):
                OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
        else:
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
    return cfg


BASES = {"twx": (), "sciworld": ("env=sciworld",), "alfworld": ("env=alfworld",), "webshop": ("env=webshop",),
         "lora": ("model=llama2_7b_chat_lora",), "qlora": ("hardware=qlora_24gb",), "bc_paper": ("bc=paper",),
         "eto_paper": ("eto=paper",)}
NUM_GT0, INT_GE1, INT_GE0, UNIT = "a number > 0", "an integer >= 1", "an integer >= 0", "a number in [0, 1]"
BOOL = "true or false"

# (base, overrides, what the error must say: "<key>=<value>: <what is allowed>")
CASES = [
    # -- top level -----------------------------------------------------------------------------
    ("twx", ["run_name=''"], "run_name='': empty; a run's name is a folder name inside paths.runs"),
    ("twx", ["seed=-1"], "seed=-1: an integer in [0, 4294967295]"),
    ("twx", ["seed=1.5"], "seed=1.5: an integer in [0, 4294967295]"),
    ("twx", ["trust_remote_code=1"], f"trust_remote_code=1: {BOOL}"),
    ("twx", ["runtime.train_threads=0"], "runtime.train_threads=0: an integer >= 1, or 'auto' (measured"),
    ("twx", ["runtime.rollout_threads=many"], "runtime.rollout_threads='many': an integer >= 1, or 'auto' (measured"),
    ("twx", ["wandb.enabled=yes"], f"wandb.enabled='yes': {BOOL}"),
    ("twx", ["wandb.mode=onlin"], "wandb.mode='onlin': one of 'online', 'offline', 'disabled'"),
    ("twx", ["experts.source=/nonexistent/webshop_sft.json"],
     "experts.source='/nonexistent/webshop_sft.json': 'gold' (play each training task's gold path) or an "
     "existing file"),
    # -- env: common ---------------------------------------------------------------------------
    ("twx", ["env.name=nope"], "env.name='nope': one of 'agentgym', 'alfworld', 'openenv', 'sciworld', 'twx', "
                               "'webshop'"),
    ("twx", ["env.dev_holdout=-1"], f"env.dev_holdout=-1: {INT_GE0}"),
    ("twx", ["env.dev_holdout=0.5"], f"env.dev_holdout=0.5: {INT_GE0}"),
    ("twx", ["env.metric=reward"], "env.metric='reward': the dev figure that selects ETO iterations: one of "
                                   "'success_rate', 'mean_score'"),
    ("twx", ["env.faults.crash.rate=1.5"], f"env.faults.crash.rate=1.5: {UNIT}"),
    ("twx", ["env.faults.timeout.rate=-0.1"], f"env.faults.timeout.rate=-0.1: {UNIT}"),
    ("twx", ["env.faults.malformed.seed=x"], "env.faults.malformed.seed='x': an integer"),
    ("twx", ["+env.faults.crashes={rate:0.1}"], "env.faults.crashes={rate: 0.1}: not a fault kind: one of "
                                                "'timeout', 'crash', 'malformed'"),
    ("twx", ["env.call_timeout_s=0"], "env.call_timeout_s=0: a number > 0 (seconds one adapter call may take; "
                                      "more is EnvironmentTimeout)"),
    ("sciworld", ["env.call_timeout_s=null"], "env.call_timeout_s=null: a number > 0"),
    ("twx", ["env.max_observation_chars=0"], "env.max_observation_chars=0: an integer >= 1 (the longest observation "
                                             "an adapter may answer; longer stops the stage)"),
    ("webshop", ["env.max_observation_chars=1.5"], "env.max_observation_chars=1.5: an integer >= 1"),
    ("twx", ["experts.on_lost=fail"], "experts.on_lost='fail': what a gold path that does not win in the environment "
                                      "is: one of 'warn', 'error'"),
    # -- env: TextWorldExpress -------------------------------------------------------------------
    ("twx", ["env.step_limit=0"], f"env.step_limit=0: {INT_GE1}"),
    ("twx", ["env.step_limit=null"], f"env.step_limit=null: {INT_GE1}"),
    ("twx", ["env.games.0.name=nosuch"], "env.games.0.name='nosuch': a TextWorldExpress game: one of 'coin', "
                                         "'mapreader'"),
    ("twx", ["env.games=[]"], "env.games=[]: a non-empty list of {name: <game>, params: <str>}"),
    ("twx", ["env.splits.seen.count=0"], f"env.splits.seen.count=0: {INT_GE1}"),
    ("twx", ["env.splits.train.start=-1"], f"env.splits.train.start=-1: {INT_GE0}"),
    ("twx", ["env.splits.unseen.fold=val"], "env.splits.unseen.fold='val': one of 'train', 'dev', 'test'"),
    # -- env: ScienceWorld -----------------------------------------------------------------------
    ("sciworld", ["env.step_limit=0"], f"env.step_limit=0: {INT_GE1}, or null (the paper's per-task limits"),
    ("sciworld", ["env.default_step_limit=0"], f"env.default_step_limit=0: {INT_GE1}"),
    ("sciworld", ["env.dev_holdout=-2"], f"env.dev_holdout=-2: {INT_GE0}"),
    ("sciworld", ["env.metric=score"], "env.metric='score': the dev figure"),
    ("sciworld", ["env.simplifications=easyy"], "env.simplifications='easyy': comma-separated, each one of 'easy'"),
    ("sciworld", ["env.tasks=[]"], "env.tasks=[]: a non-empty list of ETO task names or task numbers, or null"),
    ("sciworld", ["env.limit_per_task=0"], f"env.limit_per_task=0: {INT_GE1}, or null (every variation)"),
    ("sciworld", ["env.heap_mb=0"], f"env.heap_mb=0: {INT_GE1}"),
    ("sciworld", ["env.games_per_jvm=0"], f"env.games_per_jvm=0: {INT_GE1}"),
    ("sciworld", ["env.timeout_s=0"], f"env.timeout_s=0: {NUM_GT0}"),
    ("sciworld", ["env.valid_actions=2"], f"env.valid_actions=2: {BOOL}"),
    ("sciworld", ["env.jvm_options=[1]"], "env.jvm_options=[1]: a list, each entry a non-empty string"),
    ("sciworld", ["env.splits.seen=3"], "env.splits.seen=3: a file of [task, variation] pairs"),
    # -- env: ALFWorld ---------------------------------------------------------------------------
    ("alfworld", ["env.step_limit=0"], f"env.step_limit=0: {INT_GE1}"),
    ("alfworld", ["env.splits.seen.fold=valid"], "env.splits.seen.fold='valid': one of 'train', 'valid_seen', "
                                                 "'valid_unseen'"),
    ("alfworld", ["env.task_types=[7]"], "env.task_types=[7]: a non-empty list of ALFWorld task types, each one of "
                                         "1, 2, 3, 4, 5, 6"),
    ("alfworld", ["env.expert=gold"], "env.expert='gold': one of 'planner', 'walkthrough'"),
    ("alfworld", ["env.limit_per_type=0"], f"env.limit_per_type=0: {INT_GE1}, or null (every game)"),
    # -- env: WebShop ----------------------------------------------------------------------------
    ("webshop", ["env.step_limit=-3"], f"env.step_limit=-3: {INT_GE1}"),
    ("webshop", ["env.limit=0"], f"env.limit=0: {INT_GE1}, or null (every goal)"),
    ("webshop", ["env.observation_mode=htm"], "env.observation_mode='htm': one of 'html', 'text', 'text_rich', "
                                              "'url'"),
    ("webshop", ["env.text_env=web_agent_site.envs"], "env.text_env='web_agent_site.envs': 'module:Class'"),
    ("webshop", ["env.human_goals=maybe"], f"env.human_goals='maybe': {BOOL}"),
    ("webshop", ["env.share_server=1"], f"env.share_server=1: {BOOL}"),
    ("webshop", ["env.splits.train=5"], "env.splits.train=5: a file of goal indices in env.data_dir, or "
                                        "{not_in: [files], count:"),
    ("webshop", ["+env.splits.dev={not_in:[train_indices.json],count:0}"], f"env.splits.dev.count=0: {INT_GE1}"),
    # -- model -----------------------------------------------------------------------------------
    ("twx", ["model.name=''"], "model.name='': a non-empty string"),
    ("twx", ["model.path=''"], "model.path='': a non-empty string"),
    ("twx", ["model.build=yes"], f"model.build='yes': {BOOL}"),
    ("twx", ["model.dtype=float64"], "model.dtype='float64': one of 'float32', 'float16', 'bfloat16'"),
    ("twx", ["model.max_context=0"], f"model.max_context=0: {INT_GE1}"),
    ("twx", ["model.max_context=2048"], "model.max_context=2048: at most model.arch.max_position_embeddings=1024"),
    ("twx", ["model.tokenizer.vocab_size=0"], f"model.tokenizer.vocab_size=0: {INT_GE1}"),
    ("twx", ["model.tokenizer.min_frequency=0"], f"model.tokenizer.min_frequency=0: {INT_GE1}"),
    ("twx", ["model.arch.hidden_size=0"], f"model.arch.hidden_size=0: {INT_GE1}"),
    ("twx", ["model.arch.num_layers=0"], f"model.arch.num_layers=0: {INT_GE1}"),
    ("twx", ["model.arch.num_heads=0"], f"model.arch.num_heads=0: {INT_GE1}"),
    ("twx", ["model.arch.num_heads=3"], "model.arch.hidden_size=128: a multiple of model.arch.num_heads=3"),
    ("twx", ["model.arch.intermediate_size=-1"], f"model.arch.intermediate_size=-1: {INT_GE1}"),
    ("twx", ["model.arch.max_position_embeddings=0"], f"model.arch.max_position_embeddings=0: {INT_GE1}"),
    ("twx", ["model.tokenizer=null"], "model.tokenizer=null: {vocab_size: <int>, min_frequency: <int>}"),
    ("lora", ["model.lora.r=0"], f"model.lora.r=0: {INT_GE1}"),
    ("lora", ["model.lora.lora_alpha=0"], f"model.lora.lora_alpha=0: {NUM_GT0}"),
    ("lora", ["model.lora.lora_dropout=1.0"], "model.lora.lora_dropout=1.0: a number in [0, 1)"),
    ("lora", ["model.lora.target_modules=[]"], "model.lora.target_modules=[]: a non-empty list of module names"),
    ("qlora", ["model.quantization.load_in_4bit=1"], f"model.quantization.load_in_4bit=1: {BOOL}"),
    ("qlora", ["model.quantization.bnb_4bit_quant_type=nf5"],
     "model.quantization.bnb_4bit_quant_type='nf5': one of 'nf4', 'fp4'"),
    ("qlora", ["model.quantization.bnb_4bit_use_double_quant=x"],
     f"model.quantization.bnb_4bit_use_double_quant='x': {BOOL}"),
    # -- bc --------------------------------------------------------------------------------------
    ("twx", ["bc.learning_rate=0"], f"bc.learning_rate=0: {NUM_GT0}"),
    ("twx", ["bc.learning_rate=-0.001"], f"bc.learning_rate=-0.001: {NUM_GT0}"),
    ("twx", ["bc.num_train_epochs=0"], f"bc.num_train_epochs=0: {NUM_GT0}"),
    ("twx", ["bc.max_steps=0"], f"bc.max_steps=0: {INT_GE1}, or -1 (no cap: the epochs decide)"),
    ("twx", ["bc.per_device_train_batch_size=0"], f"bc.per_device_train_batch_size=0: {INT_GE1}"),
    ("twx", ["bc.per_device_train_batch_size=2.5"], f"bc.per_device_train_batch_size=2.5: {INT_GE1}"),
    ("twx", ["bc.gradient_accumulation_steps=0"], f"bc.gradient_accumulation_steps=0: {INT_GE1}"),
    ("twx", ["bc.lr_scheduler_type=cosin"], "bc.lr_scheduler_type='cosin': a transformers SchedulerType (transformers "),
    ("twx", ["bc.warmup_steps=1.5"], f"bc.warmup_steps=1.5: {UNIT}"),
    ("twx", ["bc.warmup_steps=-0.1"], f"bc.warmup_steps=-0.1: {UNIT}"),
    ("twx", ["bc.weight_decay=-1"], "bc.weight_decay=-1: a number >= 0"),
    ("twx", ["bc.max_length=0"], f"bc.max_length=0: {INT_GE1}"),
    ("twx", ["bc.logging_steps=0"], f"bc.logging_steps=0: {NUM_GT0}"),
    ("twx", ["bc.save_strategy=step"], "bc.save_strategy='step': one of 'no', 'steps', 'epoch', 'best'"),
    ("twx", ["bc.save_steps=0"], f"bc.save_steps=0: {NUM_GT0}"),
    ("twx", ["bc.save_total_limit=0"], f"bc.save_total_limit=0: {INT_GE1}, or null"),
    ("twx", ["bc.bf16=1"], f"bc.bf16=1: {BOOL}"),
    ("twx", ["bc.activation_checkpointing=x"], f"bc.activation_checkpointing='x': {BOOL}"),
    ("twx", ["bc.use_cpu=x"], f"bc.use_cpu='x': {BOOL}"),
    ("twx", ["bc.only_success=x"], f"bc.only_success='x': {BOOL}"),
    ("twx", ["+bc.effective_batch=0"], f"bc.effective_batch=0: {INT_GE1}, or null (bc.gradient_accumulation_steps decides)"),
    ("bc_paper", ["bc.effective_batch=63"], "bc.effective_batch=63: a multiple of bc.per_device_train_batch_size=4"),
    # -- eto: the loop and exploration -------------------------------------------------------------
    ("twx", ["eto.iterations=0"], f"eto.iterations=0: {INT_GE1}"),
    ("twx", ["eto.early_stopping=x"], f"eto.early_stopping='x': {BOOL}"),
    ("twx", ["eto.min_improvement=-0.1"], "eto.min_improvement=-0.1: a number >= 0"),
    ("twx", ["eto.dev_split=''"], "eto.dev_split='': a non-empty string, or null (no dev evaluation)"),
    ("twx", ["eto.explore.split=''"], "eto.explore.split='': a non-empty string"),
    ("twx", ["eto.explore.tasks_per_game=0"], f"eto.explore.tasks_per_game=0: {INT_GE1}, or null"),
    ("twx", ["eto.explore.samples=0"], f"eto.explore.samples=0: {INT_GE1}"),
    ("twx", ["eto.explore.rollout.generation.do_sample=x"], f"eto.explore.rollout.generation.do_sample='x': {BOOL}"),
    ("twx", ["eto.explore.rollout.generation.do_sample=true", "eto.explore.rollout.generation.temperature=0"],
     f"eto.explore.rollout.generation.temperature=0: {NUM_GT0} when eto.explore.rollout.generation.do_sample is true"),
    ("twx", ["eto.explore.rollout.generation.temperature=-1"], "eto.explore.rollout.generation.temperature=-1: a number >= 0"),
    ("twx", ["eto.explore.rollout.generation.top_p=0"], "eto.explore.rollout.generation.top_p=0: a number in (0, 1]"),
    ("twx", ["eto.explore.rollout.generation.top_p=1.5"], "eto.explore.rollout.generation.top_p=1.5: a number in (0, 1]"),
    ("twx", ["eto.explore.rollout.batch_size=0"], f"eto.explore.rollout.batch_size=0: {INT_GE1}"),
    # -- eto: pairs ------------------------------------------------------------------------------
    ("twx", ["eto.pairs.contrast=trajetory"], "eto.pairs.contrast='trajetory': one of 'trajectory', 'step', "
                                              "'mixture'"),
    ("twx", ["eto.pairs.chosen=me"], "eto.pairs.chosen='me': one of 'expert', 'self', 'both'"),
    ("twx", ["eto.pairs.extra_turns=-1"], f"eto.pairs.extra_turns=-1: {INT_GE0}, or null (the rejected side is "
                                          "not cut)"),
    ("twx", ["eto.pairs.rejected_cut=first"], "eto.pairs.rejected_cut='first': one of 'expert_length', "
                                              "'first_divergence'"),
    ("twx", ["eto.pairs.step_positions=any"], "eto.pairs.step_positions='any': one of 'all', 'sample', "
                                              "'first_divergence'"),
    ("twx", ["eto.pairs.step_samples=0"], f"eto.pairs.step_samples=0: {INT_GE1}"),
    ("twx", ["eto.pairs.mixture_step_fraction=1.5"], f"eto.pairs.mixture_step_fraction=1.5: {UNIT}"),
    # -- eto: dpo --------------------------------------------------------------------------------
    ("twx", ["eto.dpo.beta=-1"], f"eto.dpo.beta=-1: {NUM_GT0}"),
    ("twx", ["eto.dpo.beta=0"], f"eto.dpo.beta=0: {NUM_GT0}"),
    ("twx", ["eto.dpo.learning_rate=0"], f"eto.dpo.learning_rate=0: {NUM_GT0}"),
    ("twx", ["eto.dpo.later.beta=0"], f"eto.dpo.later.beta=0: {NUM_GT0}"),
    ("twx", ["eto.dpo.later.learning_rate=-5e-6"], f"eto.dpo.later.learning_rate=-5e-06: {NUM_GT0}"),
    ("twx", ["+eto.dpo.later.bta=1"], "eto.dpo.later.bta=1: not a key of eto.dpo"),
    ("twx", ["eto.dpo.loss_type=[sigmod]"], "eto.dpo.loss_type=['sigmod']: 'sigmod' is not a TRL DPO loss type; "
                                            "each entry one of 'sigmoid', 'hinge', 'ipo'"),
    ("twx", ["eto.dpo.loss_type=sigmoid"], "eto.dpo.loss_type='sigmoid': a non-empty list of TRL DPO loss types"),
    ("twx", ["eto.dpo.loss_type=[]", "eto.dpo.loss_weights=null"], "eto.dpo.loss_type=[]: a non-empty list"),
    ("twx", ["eto.dpo.loss_weights=[1.0]"], "eto.dpo.loss_weights=[1.0]: as many loss_weights as loss_type has "
                                            "entries (2: ['sigmoid', 'sft'] against 1 weights), or loss_weights null"),
    ("twx", ["+eto.dpo.later.loss_type=[sigmoid]"], "eto.dpo.later.loss_type=['sigmoid']: as many loss_weights as "
                                                    "loss_type has entries (1: ['sigmoid'] against 2 weights)"),
    ("twx", ["eto.dpo.loss_weights=[-1,1]"], "eto.dpo.loss_weights=[-1, 1]: a list of numbers >= 0"),
    ("twx", ["eto.dpo.num_train_epochs=0"], f"eto.dpo.num_train_epochs=0: {NUM_GT0}"),
    ("twx", ["eto.dpo.max_steps=-2"], f"eto.dpo.max_steps=-2: {INT_GE1}, or -1"),
    ("twx", ["eto.dpo.per_device_train_batch_size=0"], f"eto.dpo.per_device_train_batch_size=0: {INT_GE1}"),
    ("twx", ["eto.dpo.gradient_accumulation_steps=0"], f"eto.dpo.gradient_accumulation_steps=0: {INT_GE1}"),
    ("twx", ["eto.dpo.lr_scheduler_type=constant_warmup"], "eto.dpo.lr_scheduler_type='constant_warmup': a transformers "
                                                   "SchedulerType"),
    ("twx", ["eto.dpo.warmup_steps=2"], f"eto.dpo.warmup_steps=2: {UNIT}"),
    ("twx", ["eto.dpo.max_length=0"], f"eto.dpo.max_length=0: {INT_GE1}"),
    ("twx", ["eto.dpo.logging_steps=0"], f"eto.dpo.logging_steps=0: {NUM_GT0}"),
    ("twx", ["eto.dpo.save_strategy=sometimes"], "eto.dpo.save_strategy='sometimes': one of 'no', 'steps'"),
    ("twx", ["eto.dpo.save_steps=-1"], f"eto.dpo.save_steps=-1: {NUM_GT0}"),
    ("twx", ["eto.dpo.save_total_limit=0"], f"eto.dpo.save_total_limit=0: {INT_GE1}"),
    ("twx", ["eto.dpo.precompute_ref_log_probs=x"], f"eto.dpo.precompute_ref_log_probs='x': {BOOL}"),
    ("twx", ["eto.dpo.bf16=x"], f"eto.dpo.bf16='x': {BOOL}"),
    ("eto_paper", ["eto.dpo.effective_batch=30"], "eto.dpo.effective_batch=30: a multiple of eto.dpo.per_device_train_batch_size=4"),
    ("eto_paper", ["eto.dpo.later.beta=-0.5"], f"eto.dpo.later.beta=-0.5: {NUM_GT0}"),
    # -- eval ------------------------------------------------------------------------------------
    ("twx", ["eval.policy=''"], "eval.policy='': a checkpoint folder or hub id"),
    ("twx", ["eval.tag=''"], "eval.tag='': a non-empty name"),
    ("twx", ["eval.splits=[]"], "eval.splits=[]: a non-empty list of split names"),
    ("twx", ["eval.splits=seen"], "eval.splits='seen': a non-empty list of split names"),
    ("twx", ["rollout.batch_size=0"], f"rollout.batch_size=0: {INT_GE1}"),
    ("twx", ["rollout.backend=vlm"], "rollout.backend='vlm': the rollout engine: one of 'auto', 'hf', 'vllm'"),
    ("twx", ["rollout.vllm.gpu_memory_utilization=1.5"], "rollout.vllm.gpu_memory_utilization=1.5: a number in (0, 1]"),
    ("twx", ["rollout.vllm.max_num_seqs=0"], f"rollout.vllm.max_num_seqs=0: {INT_GE1}"),
    ("twx", ["rollout.vllm.enforce_eager=x"], f"rollout.vllm.enforce_eager='x': {BOOL}"),
    ("twx", ["rollout.overlap_env=x"], f"rollout.overlap_env='x': {BOOL}"),
    ("twx", ["rollout.data_parallel=x"], f"rollout.data_parallel='x': {BOOL}"),
    ("twx", ["rollout.env_retries=-1"], f"rollout.env_retries=-1: {INT_GE0}"),
    ("twx", ["rollout.generation.max_new_tokens=0"], f"rollout.generation.max_new_tokens=0: {INT_GE1}"),
    ("twx", ["rollout.generation.max_new_tokens=1024"], "rollout.generation.max_new_tokens=1024: an integer in "
                                                     "[1, model.max_context=1024)"),
    ("twx", ["rollout.generation.do_sample=true", "rollout.generation.temperature=0"],
     f"rollout.generation.temperature=0: {NUM_GT0} when rollout.generation.do_sample is true"),
    ("twx", ["rollout.generation.top_p=0"], "rollout.generation.top_p=0: a number in (0, 1]"),
    # -- prompt ----------------------------------------------------------------------------------
    ("twx", ["prompt.opening=user"], "prompt.opening='user': one of 'system', 'instruction_ok'"),
    ("twx", ["prompt.thought=x"], f"prompt.thought='x': {BOOL}"),
    ("twx", ["prompt.version=''"], "prompt.version='': a non-empty string"),
    ("twx", ["prompt.task_template='{goal}'"], "prompt.task_template='{goal}': a template whose only slots are "
                                               "{task}, {observation}"),
    ("twx", ["prompt.observation_template='{obs}'"], "prompt.observation_template='{obs}': a template whose only "
                                                     "slots are {task}, {observation}"),
    ("twx", ["prompt.system='Use {tools}'"], "prompt.system='Use {tools}': a template whose only slots are "
                                             "{actions}"),
    ("twx", ["prompt.example=[{role:assistant,content:hi}]"],
     "prompt.example.0.role='assistant': 'user' (the example alternates user and assistant turns"),
    ("twx", ["prompt.example=[{role:user,content:hi}]"], "prompt.example=[{role: 'user', content: 'hi'}]: ends on an "
                                                         "assistant turn"),
    ("twx", ["+prompt.style=x"], "prompt.style='x': not a prompt setting"),
    # -- compare ---------------------------------------------------------------------------------
    ("twx", ["compare.variants=[trajectory,steps]"], "compare.variants=['trajectory', 'steps']: a non-empty list, each "
                                                     "entry one of 'trajectory', 'step', 'mixture'"),
    ("twx", ["compare.variants=[]"], "compare.variants=[]: a non-empty list"),
    ("twx", ["compare.variants=[step,step]", "compare.control_of=step"],
     "compare.variants=['step', 'step']: each contrast once"),
    ("twx", ["compare.variants=[step]"], "compare.control_of='trajectory' is not one of compare.variants=['step']: "
                                         "with compare.control=true it names the variant"),
    ("twx", ["compare.control=x"], f"compare.control='x': {BOOL}"),
    ("twx", ["compare.splits=[]"], "compare.splits=[]: a non-empty list of split names"),
    ("twx", ["compare.bootstrap=0"], f"compare.bootstrap=0: {INT_GE1}"),
    # -- export ----------------------------------------------------------------------------------
    ("twx", ["export.format=csv"], "export.format='csv': one of 'eto', 'messages', 'episodes'"),
    ("twx", ["export.inputs=[]"], "export.inputs=[]: a non-empty list of episode or pairs files"),
    ("twx", ["export.output=''"], "export.output='': a non-empty string"),
    ("twx", ["export.drop_fields=[a..b]"], "export.drop_fields.0='a..b': a dotted field path"),
    ("twx", ["export.redact_patterns=['(unclosed']"], "export.redact_patterns.0='(unclosed': a valid regular "
                                                      "expression"),
    ("twx", ["export.skip_statuses=[won]"], "export.skip_statuses=['won']: a list, each entry one of 'success'"),
    # -- reading -------------------------------------------------------------------------------
    ("twx", ["reading.alpha=2"], "reading.alpha=2: a number in (0, 1)"),
    ("twx", ["reading.permutations=0"], f"reading.permutations=0: {INT_GE1}"),
]


@pytest.mark.parametrize("base,overrides,message", CASES, ids=[" ".join(c[1]) for c in CASES])
def test_a_bad_value_is_one_error_naming_key_value_and_what_is_allowed(base, overrides, message):
    cfg = with_overrides(BASES[base], overrides)
    with pytest.raises(ConfigError) as err:
        load(cfg)
    text = str(err.value)
    assert message in text, text
    assert text.startswith("1 bad config value (nothing was run or written):\n  "), text  # nothing else flagged


def test_every_bad_key_is_listed_at_once_on_the_real_compose():
    """The issue's examples through Hydra's compose, as a user types them: one error, every key."""
    bad = {"eto.dpo.beta=-1": "eto.dpo.beta=-1: a number > 0", "bc.learning_rate=0": "bc.learning_rate=0: a number > 0",
           "env.step_limit=0": "env.step_limit=0: an integer >= 1",
           "rollout.batch_size=0": "rollout.batch_size=0: an integer >= 1",
           "eto.pairs.contrast=trajetory": "eto.pairs.contrast='trajetory': one of 'trajectory', 'step', 'mixture'",
           "eto.pairs.chosen=me": "eto.pairs.chosen='me': one of 'expert', 'self', 'both'",
           "eto.dpo.loss_type=[sigmod]": "eto.dpo.loss_type=['sigmod']: 'sigmod' is not a TRL DPO loss type",
           "rollout.backend=vlm": "rollout.backend='vlm': the rollout engine: one of 'auto', 'hf', 'vllm'"}
    errors = errors_of(compose(list(bad)))
    assert len(errors) == len(bad), errors
    for want in bad.values():
        assert any(e.startswith(want) for e in errors), (want, errors)


def _group_options() -> list[list[str]]:
    """Every option of every config group, in as few composes as the largest group has options:
    compose i takes option i (cycling) of each group."""
    options = {g: sorted(p.stem for p in (CONFIGS / g).glob("*.yaml")) for g in GROUPS}
    most = max(len(opts) for opts in options.values())
    return [[f"{g}={opts[i % len(opts)]}" for g, opts in options.items()] for i in range(most)]


# the paper/* group is used by the experiments (- /paper: <env>), so each of its options is among them
SHIPPED = [[]] + [[f"experiment={e}"] for e in EXPERIMENTS] + _group_options()


@pytest.mark.parametrize("overrides", SHIPPED, ids=lambda o: " ".join(o) or "default")
def test_the_shipped_configs_pass(overrides, tmp_path):
    if any(o.startswith("experiment=webshop") for o in overrides):
        sft = tmp_path / "webshop_sft.json"  # WebShop has no gold paths: experts come from the authors' file
        sft.write_text("[]")
        overrides = overrides + [f"experts.source={sft}"]
    assert isinstance(load(compose(overrides)), Config)


def test_every_group_option_is_composed():
    seen = {o for overrides in SHIPPED for o in overrides}
    for g in GROUPS:
        assert {f"{g}={p.stem}" for p in (CONFIGS / g).glob("*.yaml")} <= seen
    assert {f"experiment={e}" for e in EXPERIMENTS} <= seen
    used = " ".join((CONFIGS / "experiment" / f"{e}.yaml").read_text() for e in EXPERIMENTS)
    assert all(f"/paper: {p.stem}" in used for p in (CONFIGS / "paper").glob("*.yaml"))


def test_a_required_value_left_unset_is_named():
    errors = errors_of(compose(["experiment=webshop_llama2_7b", "experts.source=???"]))
    assert errors == ["experts.source=???: required, not set ('gold' or the path of the authors' <env>_sft.json)"]


def test_the_allowed_values_come_from_the_installed_libraries_and_the_modules_that_use_them():
    from eto_train import config
    from eto_train.envs.faults import KINDS

    assert config.FAULT_KINDS == KINDS
    # TRL documents DPOConfig's loss types; its trainer implements exactly those (read without importing trl)
    trainer = package_file("trl", "trainer", "dpo_trainer.py").read_text()
    implemented = set(re.findall(r'loss_type == "([a-z_]+)"', trainer))
    assert set(dpo_loss_types()) == implemented and {"sigmoid", "sft"} <= implemented
    assert {"linear", "cosine", "constant_with_warmup"} <= set(scheduler_types())


@pytest.mark.parametrize("override", ["eto.pairs.contrastt=step", "env.splits.train.cnt=3", "rollout.vllm.foo=1",
                                      "env.faults.timeout.rat=0.1", "model.arch.hidden=8"])
def test_struct_mode_rejects_an_unknown_key_at_any_depth(override):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="Could not override"):
        compose([override])


# -- at the entry point: fail in seconds, touch nothing ------------------------------------------------
EVAL = ["run_name=val", "env.step_limit=2", "env.splits.seen.count=1", "eval.splits=[seen]", "rollout.batch_size=2",
        "rollout.generation.max_new_tokens=4", "eval.tag=bc", "wandb.enabled=false", "runtime.rollout_threads=1"]


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def finished_eval(tiny_model_dir, tmp_path_factory):
    from eto_train.stages import evaluate

    runs = tmp_path_factory.mktemp("runs")
    over = [f"paths.runs={runs}", f"eval.policy={tiny_model_dir}", *EVAL]
    evaluate.run(load(compose(over)))
    out = runs / "val" / "eval" / "bc" / "seen"
    assert (out / "metrics.json").exists() and (out / "manifest.json").exists()
    return {"overrides": over, "run": runs / "val"}


@pytest.mark.parametrize("bad,message", [
    ("rollout.backend=vlm", "rollout.backend='vlm': the rollout engine: one of 'auto', 'hf', 'vllm'"),
    ("rollout.batch_size=0", "rollout.batch_size=0: an integer >= 1"),
    ("env.step_limit=0", "env.step_limit=0: an integer >= 1"),
    ("eto.dpo.beta=-1", "eto.dpo.beta=-1: a number > 0"),
])
def test_a_bad_value_stops_make_eval_and_leaves_the_finished_stage_as_it_was(finished_eval, bad, message):
    from eto_train.stages import evaluate

    before = _snapshot(finished_eval["run"])
    cfg = compose([*finished_eval["overrides"], bad])
    with pytest.raises(ConfigError, match=re.escape(message)):
        evaluate.run(load(cfg))  # typed once, at the entry point (the CLI's, here the test's)
    assert _snapshot(finished_eval["run"]) == before  # every file byte for byte, nothing added or removed


# -- the typed sections, as the stages use them ---------------------------------------------------
def test_a_typed_section_gives_back_the_yaml_dict_so_stage_hashes_keep_their_value():
    from omegaconf import OmegaConf

    from eto_train.runtime import config_hash, to_plain

    for overrides in ([], ["experiment=sciworld_llama2_7b_qlora_24gb"], ["env=alfworld", "bc=paper", "eto=paper"]):
        cfg = compose(overrides)
        c = load(cfg)
        for section in ("env", "model", "bc", "rollout", "eval", "eto", "prompt", "compare", "export", "pretrain"):
            assert to_plain(getattr(c, section)) == OmegaConf.to_container(cfg[section], resolve=True), section
        assert config_hash(to_plain(c.eto.dpo)) == config_hash(OmegaConf.to_container(cfg.eto.dpo, resolve=True))
    assert "quantization" not in to_plain(load(compose([])).model)  # unset optional keys stay out


# The stage entries, each called as a test or a lab/ script would: (module, function, the arguments after cfg).
ENTRIES = [("experts", "run", ()), ("model", "run", ()), ("bc", "run", ()), ("evaluate", "run", ()),
           ("evaluate", "evaluate_policy", ("policy", "bc", ["seen"], "out")), ("reading", "run", ()),
           ("report", "run", ()), ("pretrain", "run", ()), ("eto", "run", ()), ("eto", "run_next_iteration", ()),
           ("eto", "run_iteration", (1, "policy"))]


@pytest.mark.parametrize("module,function,args", ENTRIES, ids=[f"{m}.{f}" for m, f, _ in ENTRIES])
def test_a_stage_entry_given_a_dictconfig_stops_at_once_naming_itself_and_config_load(module, function, args, tmp_path):
    import importlib

    from omegaconf import OmegaConf

    entry = getattr(importlib.import_module(f"eto_train.stages.{module}"), function)
    hand_made = OmegaConf.create({"paths": {"runs": str(tmp_path / "runs"), "run": str(tmp_path / "runs" / "r")},
                                  "run_name": "r", "model": {"build": True}, "eval": {"splits": ["seen"]}})
    where = f"eto_train.stages.{module}.{function}"
    with pytest.raises(TypeError, match=rf"^{re.escape(where)} takes the typed eto_train.config.Config, not a "
                                        rf"DictConfig: call eto_train.config.load\(cfg\) first"):
        entry(hand_made, *args)
    assert list(tmp_path.iterdir()) == []  # nothing made


def test_require_gives_back_a_config_and_refuses_a_dict():
    c = load(compose([]))
    assert require(c, "here") is c
    with pytest.raises(TypeError, match=r"^here takes the typed eto_train.config.Config, not a dict: call "
                                        r"eto_train.config.load\(cfg\) first"):
        require({"paths": {}}, "here")


def test_load_is_a_no_op_on_a_config_and_a_config_survives_pickle_and_with_values():
    c = load(compose([]))
    assert load(c) is c and load(compose([])) == c
    assert pickle.loads(pickle.dumps(c)) == c
    step = c.with_values({"eto.pairs.contrast": "step", "rollout.batch_size": 4})
    assert (step.eto.pairs.contrast, step.rollout.batch_size, c.eto.pairs.contrast) == ("step", 4, "trajectory")
    with pytest.raises(ConfigError, match="eto.pairs.contrast='steps': one of 'trajectory'"):
        c.with_values({"eto.pairs.contrast": "steps"})


def test_rollout_overrides_merge_over_the_rollout_section():
    c = load(compose(["rollout.batch_size=16", "+eval.rollout.generation.max_new_tokens=8",
                      "eto.explore.rollout.batch_size=4"]))
    ev, ex = c.rollout.merged(c.eval.rollout), c.rollout.merged(c.eto.explore.rollout)
    assert isinstance(ev, RolloutSection) and (ev.batch_size, ev.generation.max_new_tokens) == (16, 8)
    assert ev.generation.do_sample is False and ev.vllm.max_num_seqs == 256  # one level down: the rest kept
    assert (ex.batch_size, ex.generation.max_new_tokens) == (4, 20)
    assert c.rollout.merged(None) is c.rollout
    with pytest.raises(ConfigError, match=r"eval\.rollout\.generation\.max_new_tokens=2048: an integer in \[1, "
                                          r"model\.max_context=1024\)"):
        load(compose(["+eval.rollout.generation.max_new_tokens=2048"]))


def test_bc_and_dpo_take_trls_names_and_any_other_argument_of_trls_config():
    c = load(compose(["+bc.max_grad_norm=0.5", "+eto.dpo.optim=adamw_torch"]))
    args = c.bc.trl_arguments()
    assert args["max_grad_norm"] == 0.5 and args["learning_rate"] == 3e-3 and "only_success" not in args
    assert "later" not in c.eto.dpo.trl_arguments() and c.eto.dpo.trl_arguments()["optim"] == "adamw_torch"
    errors = errors_of(compose(["+bc.max_grad_nrm=0.5", "+bc.output_dir=x", "+eto.dpo.lr=1e-5"]))
    assert any(e.startswith("bc.max_grad_nrm=0.5: not a SFTConfig argument (trl ") for e in errors)
    assert "bc.output_dir='x': set by eto-train itself, not a bc key" in errors
    assert any(e.startswith("eto.dpo.lr=1e-05: not a DPOConfig argument") for e in errors)


def test_dpo_later_keys_apply_from_iteration_2():
    d = load(compose([])).eto.dpo
    assert d.at(1) is d and (d.at(2).beta, d.at(2).learning_rate, d.at(2).loss_type) == (0.5, 5e-6, d.loss_type)


@pytest.mark.parametrize("overrides,message", [
    (["eval.splits=[dev,seen]"], "eto.dev_split='dev' is one of eval.splits=['dev', 'seen']: model selection"),
    (["eto.dev_split=seen"], "eto.dev_split='seen': a split held out of training (env.dev_holdout), not a test"),
    (["eto.dev_split=test_unseen"], "eto.dev_split='test_unseen': a split held out of training"),
    (["eto.dev_split=train"], "eto.dev_split='train': a split held out of training, not the split ETO explores"),
    (["eto.dev_split=null"], "eto.dev_split is null but eto.early_stopping is true"),
    (["env.metric=reward"], "env.metric='reward': the dev figure that selects ETO iterations"),
])
def test_model_selection_settings_are_checked_without_the_environment(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(compose(overrides))


def test_an_eval_of_the_dev_split_alone_is_a_selection_play_not_a_test():
    """eval.splits=[dev] plays what early stopping reads (BC's dev figure before iteration 1: the ScienceWorld bc
    piece once failed here after BC's 57 minutes); dev beside a test split stays an error (above)."""
    c = load(compose(["eval.splits=[dev]"]))
    assert c.eval.splits == ["dev"] and c.eto.dev_split == "dev" and c.eto.early_stopping
    with pytest.raises(ConfigError, match=re.escape("eval.splits=[dev] alone plays the dev split by itself")):
        load(compose(["eval.splits=[seen,dev]"]))


def test_a_compare_arm_meets_the_same_selection_and_contrast_rules_as_eto():
    """config.eto_problems decides them for the run's eto and for each arm: an arm's own override is named at its
    key; a value it inherits from eto is named once, at eto's."""
    errors = errors_of(compose(["+compare.arms.mine={dev_split: seen}",
                                "+compare.arms.greedy={explore: {samples: 1}, pairs: {contrast: anchor}}"]))
    text = "\n".join(errors)
    assert "compare.arms.mine.dev_split='seen': a split held out of training (env.dev_holdout)" in text, text
    assert "compare.arms.greedy.explore.samples=1: an integer >= 2 with eto.pairs.contrast=anchor" in text, text
    inherited = errors_of(compose(["eto.dev_split=train"]))
    assert [e for e in inherited if "dev_split" in e] == [
        "eto.dev_split='train': a split held out of training, not the split ETO explores (eto.explore.split)"]


def test_bad_pretrain_values_are_named_at_once():
    errors = errors_of(compose(["pretrain.data.heldout.fold=train", "pretrain.data.heldout.start=800",
                                "pretrain.train.seq_len=2048", "pretrain.data.kinds={gold:0,random:0,detour:0}",
                                "pretrain.arch.num_heads=7", "pretrain.data.settings=[{game:chess}]"]))
    text = "\n".join(errors)
    for want in ("pretrain.data.kinds={gold: 0, random: 0, detour: 0}: counts >= 0",
                 "pretrain.arch.hidden_size=128: a multiple of pretrain.arch.num_heads=7",
                 "pretrain.data.settings.0.game='chess': a TextWorldExpress game: one of"):
        assert want in text, (want, text)
    errors = errors_of(compose(["pretrain.data.heldout.fold=train", "pretrain.data.heldout.start=800",
                                "pretrain.train.seq_len=2048"]))  # cross-key rules, once the keys are valid
    assert any(e.startswith("pretrain.train.seq_len=2048: at most pretrain.arch.max_position_embeddings=1024")
               for e in errors), errors
    errors = errors_of(compose(["pretrain.data.heldout.fold=train", "pretrain.data.heldout.start=800"]))
    assert errors == ["pretrain.data.heldout: positions 800..849 of the train fold are used by an env split"
                      + errors[0].split("env split", 1)[1]], errors


def test_a_dict_of_the_new_shape_is_validated_and_an_unknown_section_named():
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(compose([]), resolve=True)
    assert load(data).rollout.batch_size == 32
    data["bench"] = {"episodes": 3}  # the benchmark script's own section: not the stages'
    load(data)
    data["evals"] = {}
    with pytest.raises(ConfigError, match=r"evals=\{\}: not a section of the config"):
        load(data)


def test_a_stage_finished_before_the_typed_config_under_another_config_is_an_error_not_a_rerun(tmp_path):
    import json

    from eto_train.manifest import Stage

    folder = tmp_path / "bc"
    first = Stage("bc", folder, {"train": {"lr": 1e-3, "epochs": 1}})
    assert not first.done()
    first.begin()
    (folder / "model.txt").write_text("the finished policy")
    first.finish({"loss": 1.0})
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["config_schema"] == 2
    del manifest["config_schema"]  # as a manifest written before issue 27
    (folder / "manifest.json").write_text(json.dumps(manifest))
    before = _snapshot(folder)
    with pytest.raises(ConfigError, match=re.escape(f"{folder}: stage 'bc' finished before the typed config (config "
                                                    "schema 1) and its config differs from this run's ("
                                                    "train.learning_rate, train.lr)")) as err:
        Stage("bc", folder, {"train": {"learning_rate": 1e-3, "epochs": 1}}).done()
    assert f"use a new run_name or remove {folder}" in str(err.value)
    assert _snapshot(folder) == before and not (folder / ".lock").exists()
    assert Stage("bc", folder, {"train": {"lr": 1e-3, "epochs": 1}}).done()  # the same config: up to date
