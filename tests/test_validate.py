"""Config values are checked up front (issue "Nothing written is lost"): validate.check_config.

Every enum and range it checks, one bad override at a time, raises one ValueError that names the
key, the value and what is allowed; the default config, every experiment and every config group
option pass; and a stage entry (`make eval` on a finished evaluation) given a bad value fails in
seconds without touching the stage's folder.
"""

from __future__ import annotations

import copy
import functools
import re
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from eto_train.validate import check_config, config_errors, dpo_loss_types, scheduler_types

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))
GROUPS = ("env", "model", "bc", "eval", "eto", "prompt", "hardware")


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(str(CONFIGS), version_base="1.3", job_name="validate"):
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
    ("twx", ["run_name=''"], "run_name='': a non-empty string"),
    ("twx", ["seed=-1"], "seed=-1: an integer in [0, 4294967295]"),
    ("twx", ["seed=1.5"], "seed=1.5: an integer in [0, 4294967295]"),
    ("twx", ["trust_remote_code=1"], f"trust_remote_code=1: {BOOL}"),
    ("twx", ["runtime.train_threads=0"], f"runtime.train_threads=0: {INT_GE1}"),
    ("twx", ["runtime.rollout_threads=0"], f"runtime.rollout_threads=0: {INT_GE1}"),
    ("twx", ["wandb.enabled=yes"], f"wandb.enabled='yes': {BOOL}"),
    ("twx", ["wandb.mode=onlin"], "wandb.mode='onlin': one of 'online', 'offline', 'disabled'"),
    ("twx", ["experts.source=/nonexistent/webshop_sft.json"],
     "experts.source='/nonexistent/webshop_sft.json': 'gold' (play each training task's gold path) or an "
     "existing file"),
    # -- env: common ---------------------------------------------------------------------------
    ("twx", ["env.name=nope"], "env.name='nope': one of 'alfworld', 'sciworld', 'twx', 'webshop'"),
    ("twx", ["env.dev_holdout=-1"], f"env.dev_holdout=-1: {INT_GE0}"),
    ("twx", ["env.dev_holdout=0.5"], f"env.dev_holdout=0.5: {INT_GE0}"),
    ("twx", ["env.metric=reward"], "env.metric='reward': the dev figure that selects ETO iterations: one of "
                                   "'success_rate', 'mean_score'"),
    ("twx", ["env.faults.crash.rate=1.5"], f"env.faults.crash.rate=1.5: {UNIT}"),
    ("twx", ["env.faults.timeout.rate=-0.1"], f"env.faults.timeout.rate=-0.1: {UNIT}"),
    ("twx", ["env.faults.malformed.seed=x"], "env.faults.malformed.seed='x': an integer"),
    ("twx", ["+env.faults.crashes={rate:0.1}"], "env.faults.crashes={rate: 0.1}: not a fault kind: one of "
                                                "'timeout', 'crash', 'malformed'"),
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
    ("twx", ["bc.lr=0"], f"bc.lr=0: {NUM_GT0}"),
    ("twx", ["bc.lr=-0.001"], f"bc.lr=-0.001: {NUM_GT0}"),
    ("twx", ["bc.epochs=0"], f"bc.epochs=0: {NUM_GT0}"),
    ("twx", ["bc.max_steps=0"], f"bc.max_steps=0: {INT_GE1}, or null (no cap: the epochs decide)"),
    ("twx", ["bc.batch_size=0"], f"bc.batch_size=0: {INT_GE1}"),
    ("twx", ["bc.batch_size=2.5"], f"bc.batch_size=2.5: {INT_GE1}"),
    ("twx", ["bc.grad_accum=0"], f"bc.grad_accum=0: {INT_GE1}"),
    ("twx", ["bc.scheduler=cosin"], "bc.scheduler='cosin': a transformers SchedulerType (transformers "),
    ("twx", ["bc.warmup_ratio=1.5"], f"bc.warmup_ratio=1.5: {UNIT}"),
    ("twx", ["bc.warmup_ratio=-0.1"], f"bc.warmup_ratio=-0.1: {UNIT}"),
    ("twx", ["bc.weight_decay=-1"], "bc.weight_decay=-1: a number >= 0"),
    ("twx", ["bc.max_length=0"], f"bc.max_length=0: {INT_GE1}"),
    ("twx", ["bc.logging_steps=0"], f"bc.logging_steps=0: {NUM_GT0}"),
    ("twx", ["bc.save_strategy=step"], "bc.save_strategy='step': one of 'no', 'steps', 'epoch', 'best'"),
    ("twx", ["bc.save_steps=0"], f"bc.save_steps=0: {NUM_GT0}"),
    ("twx", ["bc.save_total_limit=0"], f"bc.save_total_limit=0: {INT_GE1}, or null"),
    ("twx", ["bc.bf16=1"], f"bc.bf16=1: {BOOL}"),
    ("twx", ["bc.gradient_checkpointing=x"], f"bc.gradient_checkpointing='x': {BOOL}"),
    ("twx", ["bc.use_cpu=x"], f"bc.use_cpu='x': {BOOL}"),
    ("twx", ["bc.only_success=x"], f"bc.only_success='x': {BOOL}"),
    ("twx", ["+bc.effective_batch=0"], f"bc.effective_batch=0: {INT_GE1}, or null (bc.grad_accum decides)"),
    ("bc_paper", ["bc.effective_batch=63"], "bc.effective_batch=63: a multiple of bc.batch_size=4"),
    # -- eto: the loop and exploration -------------------------------------------------------------
    ("twx", ["eto.iterations=0"], f"eto.iterations=0: {INT_GE1}"),
    ("twx", ["eto.early_stopping=x"], f"eto.early_stopping='x': {BOOL}"),
    ("twx", ["eto.min_improvement=-0.1"], "eto.min_improvement=-0.1: a number >= 0"),
    ("twx", ["eto.dev_split=''"], "eto.dev_split='': a non-empty string, or null (no dev evaluation)"),
    ("twx", ["eto.explore.split=''"], "eto.explore.split='': a non-empty string"),
    ("twx", ["eto.explore.tasks_per_game=0"], f"eto.explore.tasks_per_game=0: {INT_GE1}, or null"),
    ("twx", ["eto.explore.samples=0"], f"eto.explore.samples=0: {INT_GE1}"),
    ("twx", ["eto.explore.do_sample=x"], f"eto.explore.do_sample='x': {BOOL}"),
    ("twx", ["eto.explore.do_sample=true", "eto.explore.temperature=0"],
     f"eto.explore.temperature=0: {NUM_GT0} when eto.explore.do_sample is true"),
    ("twx", ["eto.explore.temperature=-1"], "eto.explore.temperature=-1: a number >= 0"),
    ("twx", ["eto.explore.top_p=0"], "eto.explore.top_p=0: a number in (0, 1]"),
    ("twx", ["eto.explore.top_p=1.5"], "eto.explore.top_p=1.5: a number in (0, 1]"),
    ("twx", ["eto.explore.batch_size=0"], f"eto.explore.batch_size=0: {INT_GE1}"),
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
    ("twx", ["eto.dpo.lr=0"], f"eto.dpo.lr=0: {NUM_GT0}"),
    ("twx", ["eto.dpo.later.beta=0"], f"eto.dpo.later.beta=0: {NUM_GT0}"),
    ("twx", ["eto.dpo.later.lr=-5e-6"], f"eto.dpo.later.lr=-5e-06: {NUM_GT0}"),
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
    ("twx", ["eto.dpo.epochs=0"], f"eto.dpo.epochs=0: {NUM_GT0}"),
    ("twx", ["eto.dpo.max_steps=-1"], f"eto.dpo.max_steps=-1: {INT_GE1}, or null"),
    ("twx", ["eto.dpo.batch_size=0"], f"eto.dpo.batch_size=0: {INT_GE1}"),
    ("twx", ["eto.dpo.grad_accum=0"], f"eto.dpo.grad_accum=0: {INT_GE1}"),
    ("twx", ["eto.dpo.scheduler=constant_warmup"], "eto.dpo.scheduler='constant_warmup': a transformers "
                                                   "SchedulerType"),
    ("twx", ["eto.dpo.warmup_ratio=2"], f"eto.dpo.warmup_ratio=2: {UNIT}"),
    ("twx", ["eto.dpo.max_length=0"], f"eto.dpo.max_length=0: {INT_GE1}"),
    ("twx", ["eto.dpo.logging_steps=0"], f"eto.dpo.logging_steps=0: {NUM_GT0}"),
    ("twx", ["eto.dpo.save_strategy=sometimes"], "eto.dpo.save_strategy='sometimes': one of 'no', 'steps'"),
    ("twx", ["eto.dpo.save_steps=-1"], f"eto.dpo.save_steps=-1: {NUM_GT0}"),
    ("twx", ["eto.dpo.save_total_limit=0"], f"eto.dpo.save_total_limit=0: {INT_GE1}"),
    ("twx", ["eto.dpo.precompute_ref_log_probs=x"], f"eto.dpo.precompute_ref_log_probs='x': {BOOL}"),
    ("twx", ["eto.dpo.bf16=x"], f"eto.dpo.bf16='x': {BOOL}"),
    ("eto_paper", ["eto.dpo.effective_batch=30"], "eto.dpo.effective_batch=30: a multiple of eto.dpo.batch_size=4"),
    ("eto_paper", ["eto.dpo.later.beta=-0.5"], f"eto.dpo.later.beta=-0.5: {NUM_GT0}"),
    # -- eval ------------------------------------------------------------------------------------
    ("twx", ["eval.policy=''"], "eval.policy='': a checkpoint folder or hub id"),
    ("twx", ["eval.tag=''"], "eval.tag='': a non-empty name"),
    ("twx", ["eval.splits=[]"], "eval.splits=[]: a non-empty list of split names"),
    ("twx", ["eval.splits=seen"], "eval.splits='seen': a non-empty list of split names"),
    ("twx", ["eval.batch_size=0"], f"eval.batch_size=0: {INT_GE1}"),
    ("twx", ["eval.backend=vlm"], "eval.backend='vlm': the rollout engine: one of 'hf', 'vllm'"),
    ("twx", ["eval.vllm.gpu_memory_utilization=1.5"], "eval.vllm.gpu_memory_utilization=1.5: a number in (0, 1]"),
    ("twx", ["eval.vllm.max_num_seqs=0"], f"eval.vllm.max_num_seqs=0: {INT_GE1}"),
    ("twx", ["eval.vllm.enforce_eager=x"], f"eval.vllm.enforce_eager='x': {BOOL}"),
    ("twx", ["eval.overlap_env=x"], f"eval.overlap_env='x': {BOOL}"),
    ("twx", ["eval.data_parallel=x"], f"eval.data_parallel='x': {BOOL}"),
    ("twx", ["eval.env_retries=-1"], f"eval.env_retries=-1: {INT_GE0}"),
    ("twx", ["eval.generation.max_new_tokens=0"], f"eval.generation.max_new_tokens=0: {INT_GE1}"),
    ("twx", ["eval.generation.max_new_tokens=1024"], "eval.generation.max_new_tokens=1024: an integer in "
                                                     "[1, model.max_context=1024)"),
    ("twx", ["eval.generation.do_sample=true", "eval.generation.temperature=0"],
     f"eval.generation.temperature=0: {NUM_GT0} when eval.generation.do_sample is true"),
    ("twx", ["eval.generation.top_p=0"], "eval.generation.top_p=0: a number in (0, 1]"),
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
    # -- bench -----------------------------------------------------------------------------------
    ("twx", ["bench.episodes=0"], f"bench.episodes=0: {INT_GE1}"),
    ("twx", ["bench.repeats=0"], f"bench.repeats=0: {INT_GE1}"),
    ("twx", ["bench.threads=[0]"], "bench.threads=[0]: a non-empty list of torch thread counts >= 1"),
    ("twx", ["bench.bc_trajectories=0"], f"bench.bc_trajectories=0: {INT_GE1}"),
    ("twx", ["bench.bc_steps=0"], f"bench.bc_steps=0: {INT_GE1}"),
    ("twx", ["bench.only=gpu"], "bench.only='gpu': one of 'rollout', 'sciworld', 'envsteps', 'data_parallel', "
                                "'vllm', or null (every section)"),
    ("twx", ["bench.data_parallel.processes=1"], "bench.data_parallel.processes=1: an integer >= 2"),
    ("twx", ["bench.vllm.python=''"], "bench.vllm.python='': a non-empty string"),
    ("twx", ["bench.envsteps.batch.twx=0"], f"bench.envsteps.batch.twx=0: {INT_GE1}"),
    ("twx", ["bench.envsteps.envs=[chess]"], "bench.envsteps.envs"),
    ("twx", ["reading.alpha=2"], "reading.alpha=2: a number in (0, 1)"),
    ("twx", ["reading.permutations=0"], f"reading.permutations=0: {INT_GE1}"),
    ("twx", ["bench.sciworld.variations=-1"], f"bench.sciworld.variations=-1: {INT_GE0}"),
    ("twx", ["bench.sciworld.repeats=0"], f"bench.sciworld.repeats=0: {INT_GE1}"),
]


@pytest.mark.parametrize("base,overrides,message", CASES, ids=[" ".join(c[1]) for c in CASES])
def test_a_bad_value_is_one_error_naming_key_value_and_what_is_allowed(base, overrides, message):
    cfg = with_overrides(BASES[base], overrides)
    with pytest.raises(ValueError) as err:
        check_config(cfg)
    text = str(err.value)
    assert message in text, text
    assert text.startswith("1 bad config value (nothing was run or written):\n  "), text  # nothing else flagged


def test_every_bad_key_is_listed_at_once_on_the_real_compose():
    """The issue's examples through Hydra's compose, as a user types them: one error, every key."""
    bad = {"eto.dpo.beta=-1": "eto.dpo.beta=-1: a number > 0", "bc.lr=0": "bc.lr=0: a number > 0",
           "env.step_limit=0": "env.step_limit=0: an integer >= 1",
           "eval.batch_size=0": "eval.batch_size=0: an integer >= 1",
           "eto.pairs.contrast=trajetory": "eto.pairs.contrast='trajetory': one of 'trajectory', 'step', 'mixture'",
           "eto.pairs.chosen=me": "eto.pairs.chosen='me': one of 'expert', 'self', 'both'",
           "eto.dpo.loss_type=[sigmod]": "eto.dpo.loss_type=['sigmod']: 'sigmod' is not a TRL DPO loss type",
           "eval.backend=vlm": "eval.backend='vlm': the rollout engine: one of 'hf', 'vllm'"}
    errors = config_errors(compose(list(bad)))
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
    cfg = compose(overrides)
    t0 = time.perf_counter()
    check_config(cfg)
    assert time.perf_counter() - t0 < 1.0


def test_every_group_option_is_composed():
    seen = {o for overrides in SHIPPED for o in overrides}
    for g in GROUPS:
        assert {f"{g}={p.stem}" for p in (CONFIGS / g).glob("*.yaml")} <= seen
    assert {f"experiment={e}" for e in EXPERIMENTS} <= seen
    used = " ".join((CONFIGS / "experiment" / f"{e}.yaml").read_text() for e in EXPERIMENTS)
    assert all(f"/paper: {p.stem}" in used for p in (CONFIGS / "paper").glob("*.yaml"))


def test_a_required_value_left_unset_is_named():
    errors = config_errors(compose(["experiment=webshop_llama2_7b", "experts.source=???"]))
    assert errors == ["experts.source=???: required, not set ('gold' or the path of the authors' <env>_sft.json)"]


def test_the_allowed_values_come_from_the_installed_libraries_and_the_stages():
    import ast

    from eto_train import validate

    # env.metric's values are stages/eto.py's METRICS (read from its source: importing the stage imports TRL)
    tree = ast.parse((ROOT / "src" / "eto_train" / "stages" / "eto.py").read_text())
    metrics = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                   and any(getattr(t, "id", None) == "METRICS" for t in n.targets))
    assert validate.METRICS == metrics
    # TRL documents DPOConfig's loss types; its trainer implements exactly those (read without importing trl)
    trainer = validate._package_file("trl", "trainer", "dpo_trainer.py").read_text()
    implemented = set(re.findall(r'loss_type == "([a-z_]+)"', trainer))
    assert set(dpo_loss_types()) == implemented and {"sigmoid", "sft"} <= implemented
    assert {"linear", "cosine", "constant_with_warmup"} <= set(scheduler_types())


@pytest.mark.parametrize("override", ["eto.pairs.contrastt=step", "env.splits.train.cnt=3", "eval.vllm.foo=1",
                                      "env.faults.timeout.rat=0.1", "model.arch.hidden=8"])
def test_struct_mode_rejects_an_unknown_key_at_any_depth(override):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="Could not override"):
        compose([override])


# -- at a stage entry: fail in seconds, touch nothing -------------------------------------------------
EVAL = ["run_name=val", "env.step_limit=2", "env.splits.seen.count=1", "eval.splits=[seen]", "eval.batch_size=2",
        "eval.generation.max_new_tokens=4", "eval.tag=bc", "wandb.enabled=false", "runtime.rollout_threads=1"]


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def finished_eval(tiny_model_dir, tmp_path_factory):
    from eto_train.stages import evaluate

    runs = tmp_path_factory.mktemp("runs")
    over = [f"paths.runs={runs}", f"eval.policy={tiny_model_dir}", *EVAL]
    evaluate.run(compose(over))
    out = runs / "val" / "eval" / "bc" / "seen"
    assert (out / "metrics.json").exists() and (out / "manifest.json").exists()
    return {"overrides": over, "run": runs / "val"}


@pytest.mark.parametrize("bad,message", [
    ("eval.backend=vlm", "eval.backend='vlm': the rollout engine: one of 'hf', 'vllm'"),
    ("eval.batch_size=0", "eval.batch_size=0: an integer >= 1"),
    ("env.step_limit=0", "env.step_limit=0: an integer >= 1"),
    ("eto.dpo.beta=-1", "eto.dpo.beta=-1: a number > 0"),
])
def test_a_bad_value_stops_make_eval_in_seconds_and_leaves_the_finished_stage_as_it_was(finished_eval, bad, message):
    from eto_train.stages import evaluate

    before = _snapshot(finished_eval["run"])
    cfg = compose([*finished_eval["overrides"], bad])
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=re.escape(message)):
        evaluate.run(cfg)
    assert time.perf_counter() - t0 < 10
    assert _snapshot(finished_eval["run"]) == before  # every file byte for byte, nothing added or removed
