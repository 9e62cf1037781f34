"""Every config value checked before a stage touches anything: :func:`check_config`.

Each stage entry (``run(cfg)`` of stages/experts, model, bc, evaluate, eto, compare, report, and
``eto.run_iteration``) calls :func:`check_config` first, so a bad value fails in well under a
second, before a model, an environment or a stage folder is opened, and every bad key is named
at once: one ``ValueError`` with a line ``<dotted.key>=<value>: <what is allowed>`` per key.

What is checked: the enums and ranges of every section of configs/ (env per environment name,
model, bc, eto, eval, prompt, compare, export, runtime, experts, seed, wandb, bench,
reading) and the
cross-key rules that have one right answer (loss_weights as long as loss_type, control_of among
the variants, effective_batch a multiple of batch_size, ...). What is not: anything that needs
an environment, a model or the disk beyond ``experts.source`` (a split's tasks, data folders,
checkpoints): the stages keep those checks (e.g. stages/eto.check_selection for the dev split).

Unknown keys: Hydra's struct mode rejects a command-line override of a key that does not exist,
at any depth (``eto.pairs.contrastt=x``, ``env.splits.train.cnt=3``, ``eval.vllm.foo=1``), unless
it is added on purpose with ``+``. Keys that a config *file* adds (an experiment or hardware
profile) are merged without that check; this module does not reject unknown keys either, except
in ``prompt`` (a dataclass) and ``eto.dpo.later`` (whose keys override ``eto.dpo``'s).

The allowed values come from where the project or its libraries define them: TRL's DPO loss
types and transformers' scheduler / save-strategy names are read from the installed packages'
source (importing them takes seconds; parsing takes milliseconds), the rest from the modules
that use them (envs, prompting, export, records).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import math
import re
from importlib.metadata import PackageNotFoundError, version as pkg_version
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .envs.alfworld import FOLDS as ALFWORLD_FOLDS, TASK_TYPES as ALFWORLD_TASK_TYPES
from .envs.faults import KINDS as FAULT_KINDS
from .envs.scienceworld import SIMPLIFICATIONS as SCIWORLD_SIMPLIFICATIONS
from .envs.textworld_express import ACTION_FORMS as TWX_GAMES, FOLDS as TWX_FOLDS
from .export import EXPORT_FORMATS
from .pairs import EXPERT_REWARDS
from .prompting import OPENINGS, PromptConfig
from .records import STATUSES

CONTRASTS = ("trajectory", "step", "mixture")  # eto.pairs.contrast, compare.variants
CHOSEN = ("expert", "self", "both")
REJECTED_CUTS = ("expert_length", "first_divergence")
STEP_POSITIONS = ("all", "sample", "first_divergence")
METRICS = ("success_rate", "mean_score")  # env.metric (stages/eto.py METRICS; a test keeps them equal)
BACKENDS = ("hf", "vllm")
DTYPES = ("float32", "float16", "bfloat16")  # torch dtypes a checkpoint is loaded in (model/load.py)
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")  # WANDB_MODE values wandb accepts
WEBSHOP_OBSERVATION_MODES = ("html", "text", "text_rich", "url")  # WebAgentTextEnv's observation modes
BNB_4BIT_QUANT_TYPES = ("nf4", "fp4")
# env configs (configs/env/<name>.yaml) a bench section may name
ENV_NAMES = tuple(sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "configs" / "env").glob("*.yaml")))
SEED_MAX = 2**32 - 1  # numpy's seed range (transformers.set_seed seeds numpy too)

# Fallbacks, used only when the installed package's source cannot be read (trl 1.16, transformers 5.24).
_LOSS_TYPES_FALLBACK = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
                        "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm")
_SCHEDULERS_FALLBACK = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                        "inverse_sqrt", "reduce_lr_on_plateau", "cosine_with_min_lr", "cosine_warmup_with_min_lr",
                        "warmup_stable_decay", "greedy")
_SAVE_STRATEGIES_FALLBACK = ("no", "steps", "epoch", "best")

_ABSENT = object()  # a key the config does not have (optional keys are skipped)
_UNRESOLVED = object()  # a value whose interpolation failed (reported once, where it failed)


# -- allowed values read from the installed libraries ---------------------------------------------
def _package_file(package: str, *parts: str) -> Path | None:
    """A source file of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0], *parts)
    return path if path.is_file() else None


def _class_node(path: Path | None, name: str) -> ast.ClassDef | None:
    if path is None:
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)


def _enum_values(path: Path | None, name: str) -> tuple[str, ...]:
    """The string values of ``class <name>(ExplicitEnum)`` members in ``path``."""
    node = _class_node(path, name)
    if node is None:
        return ()
    return tuple(s.value.value for s in node.body if isinstance(s, ast.Assign)
                 and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str))


@functools.lru_cache(maxsize=None)
def scheduler_types() -> tuple[str, ...]:
    """transformers' ``SchedulerType`` values (``lr_scheduler_type``), from the installed transformers."""
    return _enum_values(_package_file("transformers", "trainer_utils.py"), "SchedulerType") or _SCHEDULERS_FALLBACK


@functools.lru_cache(maxsize=None)
def save_strategies() -> tuple[str, ...]:
    """transformers' ``SaveStrategy`` values (``save_strategy``), from the installed transformers."""
    return _enum_values(_package_file("transformers", "trainer_utils.py"), "SaveStrategy") or _SAVE_STRATEGIES_FALLBACK


# The TRL arguments a bc / eto.dpo section already sets under its own names (training/sft.py:
# sft_config, training/dpo.py: dpo_config); its free-form ``trainer`` mapping passes any other one.
SET_BY_SECTION = {
    "sft": frozenset({"output_dir", "assistant_only_loss", "max_length", "per_device_train_batch_size",
                      "gradient_accumulation_steps", "learning_rate", "lr_scheduler_type", "warmup_steps",
                      "weight_decay", "num_train_epochs", "max_steps", "logging_steps", "logging_nan_inf_filter",
                      "save_strategy", "save_steps", "save_total_limit", "bf16", "activation_checkpointing",
                      "seed", "data_seed", "report_to", "disable_tqdm", "dataloader_num_workers", "use_cpu"}),
    "dpo": frozenset({"output_dir", "beta", "loss_type", "loss_weights", "learning_rate", "num_train_epochs",
                      "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
                      "lr_scheduler_type", "warmup_steps", "max_length", "precompute_ref_log_probs",
                      "logging_steps", "logging_nan_inf_filter", "save_strategy", "save_steps",
                      "save_total_limit", "bf16", "use_cpu", "activation_checkpointing", "seed", "data_seed",
                      "report_to", "disable_tqdm", "dataloader_num_workers", "remove_unused_columns"}),
}


def _fields(path: Path | None, name: str) -> set[str]:
    node = _class_node(path, name)
    return {s.target.id for s in (node.body if node else []) if isinstance(s, ast.AnnAssign)
            and isinstance(s.target, ast.Name)}


@functools.lru_cache(maxsize=None)
def trainer_fields(kind: str) -> frozenset[str]:
    """The arguments of TRL's ``SFTConfig`` / ``DPOConfig`` (with transformers' ``TrainingArguments``),
    read from the installed packages' sources; empty when they cannot be read (then not checked)."""
    own = _fields(_package_file("trl", "trainer", f"{kind}_config.py"), f"{kind.upper()}Config")
    base = _fields(_package_file("transformers", "training_args.py"), "TrainingArguments")
    return frozenset(own | base) if own and base else frozenset()


@functools.lru_cache(maxsize=None)
def dpo_loss_types() -> tuple[str, ...]:
    """The loss types TRL's ``DPOConfig.loss_type`` allows, from the installed trl: the values of
    a ``Literal`` annotation when the field has one, else the ones its documentation (the
    field's ``help``) lists; trl 1.16 exposes no constant."""
    node = _class_node(_package_file("trl", "trainer", "dpo_config.py"), "DPOConfig")
    field = next((s for s in (node.body if node else []) if isinstance(s, ast.AnnAssign)
                  and isinstance(s.target, ast.Name) and s.target.id == "loss_type"), None)
    if field is None:
        return _LOSS_TYPES_FALLBACK
    literal = [n for n in ast.walk(field.annotation) if isinstance(n, ast.Subscript)
               and getattr(n.value, "id", getattr(n.value, "attr", None)) == "Literal"]
    if literal:
        found = tuple(dict.fromkeys(c.value for lit in literal for c in ast.walk(lit.slice)
                                    if isinstance(c, ast.Constant) and isinstance(c.value, str)))
        if found:
            return found
    text = ""
    if isinstance(field.value, ast.Call):  # field(default_factory=..., metadata={"help": "..."})
        for kw in field.value.keywords:
            if kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
                text += " ".join(str(v.value) for k, v in zip(kw.value.keys, kw.value.values)
                                 if isinstance(k, ast.Constant) and k.value == "help" and isinstance(v, ast.Constant))
    found = tuple(dict.fromkeys(re.findall(r"`'([A-Za-z0-9_]+)'`", text)))
    return found or _LOSS_TYPES_FALLBACK


@functools.lru_cache(maxsize=None)
def _version(package: str) -> str:
    try:
        return pkg_version(package)
    except PackageNotFoundError:
        return "?"


# -- rendering --------------------------------------------------------------------------------------
def render(value: Any) -> str:
    """A value as a message shows it: strings quoted, null/true/false as Hydra writes them."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value) if len(value) <= 120 else repr(value[:100]) + f"... ({len(value)} characters)"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(render(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {render(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _one_of(choices) -> str:
    return "one of " + ", ".join(render(c) for c in choices)


def _num(x) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() and abs(x) < 1e15 else str(x)


def _range_text(gt=None, ge=None, lt=None, le=None, integer=False) -> str:
    kind = "an integer" if integer else "a number"
    lo = None if gt is None and ge is None else ("(" if gt is not None else "[", gt if gt is not None else ge)
    hi = None if lt is None and le is None else (")" if lt is not None else "]", lt if lt is not None else le)
    if lo and hi:
        return f"{kind} in {lo[0]}{_num(lo[1])}, {_num(hi[1])}{hi[0]}"
    if lo:
        return f"{kind} {'>' if lo[0] == '(' else '>='} {_num(lo[1])}"
    if hi:
        return f"{kind} {'<' if hi[0] == ')' else '<='} {_num(hi[1])}"
    return kind


def _is_number(v: Any, integer: bool = False) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return isinstance(v, int) if integer else math.isfinite(v)


# -- the checker ------------------------------------------------------------------------------------
def _has_interpolation(v: Any) -> bool:
    if isinstance(v, str):
        return "${" in v
    if isinstance(v, list):
        return any(_has_interpolation(x) for x in v)
    if isinstance(v, dict):
        return any(_has_interpolation(x) for x in v.values())
    return False


class _Checker:
    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.errors: list[str] = []
        self.flagged: set[str] = set()  # keys with an error
        # the raw tree (resolving the whole config costs ~50 ms of interpolation parsing; only the
        # interpolated values a check reads are resolved, in get())
        self.root = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
        self.resolved: dict[str, Any] = {}
        self.losses: dict[str, tuple[Any, Any]] = {}  # validated (loss_type, loss_weights) of eto.dpo

    def raw(self, key: str) -> Any:
        node = self.root
        for part in key.split("."):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                return _ABSENT
        return node

    def get(self, key: str) -> Any:
        node = self.raw(key)
        if node is _ABSENT or not _has_interpolation(node):
            return node
        if key not in self.resolved:
            try:
                v = OmegaConf.select(self.cfg, key, throw_on_missing=False)
                v = OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
            except Exception as exc:  # noqa: BLE001 - an interpolation that does not resolve is a bad value
                self.report(key, f"{key}={render(node)}: does not resolve ({str(exc).splitlines()[0]})")
                v = _UNRESOLVED
            self.resolved[key] = v
        return self.resolved[key]

    def has(self, key: str) -> bool:
        return self.get(key) not in (_ABSENT, _UNRESOLVED)

    def report(self, key: str, line: str) -> None:
        """One error line for ``key``; none when ``key`` is ``${other}`` and ``other`` has one (the
        default compare.splits is ${eval.splits}: one bad value, one line)."""
        m = re.fullmatch(r"\$\{([\w.]+)\}", str(self.raw(key)))
        if m and m.group(1) in self.flagged:
            return
        self.flagged.add(key)
        self.errors.append(line)

    def bad(self, key: str, value: Any, allowed: str) -> None:
        shown = "<missing>" if value is _ABSENT else render(value)
        self.report(key, f"{key}={shown}: {allowed}")

    def value(self, key: str, allowed: str, required: bool = False) -> Any:
        """The value at ``key``, or _ABSENT when there is nothing to check (absent, unresolved, or
        ``???`` / absent when required: reported here)."""
        v = self.get(key)
        if v is _UNRESOLVED:
            return _ABSENT
        if v == "???":
            self.report(key, f"{key}=???: required, not set ({allowed})")
            return _ABSENT
        if v is _ABSENT and required:
            self.bad(key, _ABSENT, allowed)
        return v

    # primitives: each returns the value when it passed, else _ABSENT (absent, null where allowed, or bad)
    def number(self, key: str, *, gt=None, ge=None, lt=None, le=None, integer: bool = False,
               null: str | None = None, when: str = "", required: bool = False) -> Any:
        allowed = _range_text(gt, ge, lt, le, integer) + (f", or null ({null})" if null else "") + when
        v = self.value(key, allowed, required)
        if v is _ABSENT or (v is None and null):
            return _ABSENT
        if not _is_number(v, integer) or (gt is not None and not v > gt) or (ge is not None and not v >= ge) \
                or (lt is not None and not v < lt) or (le is not None and not v <= le):
            self.bad(key, v, allowed)
            return _ABSENT
        return v

    def enum(self, key: str, choices, *, null: str | None = None, what: str = "",
             required: bool = False) -> Any:
        allowed = (what + ": " if what else "") + _one_of(choices) + (f", or null ({null})" if null else "")
        v = self.value(key, allowed, required)
        if v is _ABSENT or (v is None and null):
            return _ABSENT
        if not isinstance(v, str) or v not in choices:
            self.bad(key, v, allowed)
            return _ABSENT
        return v

    def boolean(self, key: str) -> Any:
        v = self.value(key, "true or false")
        if v is not _ABSENT and not isinstance(v, bool):
            self.bad(key, v, "true or false")
            return _ABSENT
        return v

    def string(self, key: str, *, null: str | None = None, what: str = "a non-empty string",
               required: bool = False) -> Any:
        allowed = what + (f", or null ({null})" if null else "")
        v = self.value(key, allowed, required)
        if v is _ABSENT or (v is None and null):
            return _ABSENT
        if not isinstance(v, str) or not v:
            self.bad(key, v, allowed)
            return _ABSENT
        return v

    def str_list(self, key: str, *, choices=None, what: str = "", null: str | None = None,
                 nonempty: bool = True) -> Any:
        each = _one_of(choices) if choices else "a non-empty string"
        allowed = (what or f"a {'non-empty ' if nonempty else ''}list, each entry {each}") + \
            (f", or null ({null})" if null else "")
        v = self.value(key, allowed)
        if v is _ABSENT or (v is None and null):
            return _ABSENT
        if not isinstance(v, list) or (nonempty and not v) or \
                not all(isinstance(x, str) and x and (not choices or x in choices) for x in v):
            self.bad(key, v, allowed)
            return _ABSENT
        return v

    def mapping(self, key: str, what: str, *, null: str | None = None) -> Any:
        allowed = what + (f", or null ({null})" if null else "")
        v = self.value(key, allowed)
        if v is _ABSENT or (v is None and null):
            return _ABSENT
        if not isinstance(v, dict):
            self.bad(key, v, allowed)
            return _ABSENT
        return v

    # -- sections -------------------------------------------------------------------------------
    def run(self) -> None:
        for section in (self.top, self.env, self.model, self.training_bc, self.eto, self.evaluation, self.prompt,
                        self.compare, self.export, self.bench, self.reading):
            section()

    def top(self) -> None:
        self.string("run_name")
        self.number("seed", ge=0, le=SEED_MAX, integer=True)
        self.boolean("trust_remote_code")
        self.number("runtime.train_threads", ge=1, integer=True)
        self.number("runtime.rollout_threads", ge=1, integer=True)
        self.boolean("wandb.enabled")
        self.enum("wandb.mode", WANDB_MODES)
        src = self.value("experts.source", "'gold' or the path of the authors' <env>_sft.json")
        if src is not _ABSENT and not (src == "gold" or (isinstance(src, str) and src and Path(src).is_file())):
            self.bad("experts.source", src, "'gold' (play each training task's gold path) or an existing file "
                                            "(the authors' <env>_sft.json); no such file")

    # env -----------------------------------------------------------------------------------------
    def env(self) -> None:
        if self.raw("env") is _ABSENT:
            return
        from .envs import _REGISTRY

        name = self.enum("env.name", sorted(_REGISTRY), required=True)
        self.number("env.dev_holdout", ge=0, integer=True,
                    when=" (training tasks held out as a dev split; 0: none)")
        self.enum("env.metric", METRICS, what="the dev figure that selects ETO iterations")
        self.number("env.workers", ge=0, integer=True, null="0",
                    when=" (processes that host a rollout's environments; 0: the rollout's own)")
        faults = self.mapping("env.faults", "{timeout|crash|malformed: {rate: <0..1>, seed: <int>}}",
                              null="no fault injection")
        if faults is not _ABSENT:
            for kind, spec in faults.items():
                k = f"env.faults.{kind}"
                if kind not in FAULT_KINDS:
                    self.bad(k, spec, f"not a fault kind: {_one_of(FAULT_KINDS)}")
                elif spec is not None and not isinstance(spec, dict):
                    self.bad(k, spec, "{rate: <0..1>, seed: <int>}")
                elif spec:
                    for extra in sorted(set(spec) - {"rate", "seed"}):
                        self.bad(f"{k}.{extra}", spec[extra], "not a fault setting: 'rate' or 'seed'")
                    self.number(f"{k}.rate", ge=0, le=1, when=" (probability per environment call)")
                    self.number(f"{k}.seed", integer=True)
        splits = self.mapping("env.splits", "a mapping of split name -> split")
        if isinstance(splits, dict) and not splits:
            self.bad("env.splits", splits, "at least one split")
        check = {"twx": self.env_twx, "sciworld": self.env_sciworld, "alfworld": self.env_alfworld,
                 "webshop": self.env_webshop}.get(name if isinstance(name, str) else "")
        if check:
            check(splits if isinstance(splits, dict) else {})

    def _step_limit(self, null: str | None = None) -> None:
        self.number("env.step_limit", ge=1, integer=True, null=null, when=" (max steps per episode)")

    def _fold_splits(self, splits: dict, folds, rest: str):
        """The config keys of the splits given as ``{fold: <fold>, <rest>}`` mappings, fold checked,
        one at a time (the caller checks the rest of each before the next); other splits are errors."""
        for split, spec in splits.items():
            k = f"env.splits.{split}"
            if not isinstance(spec, dict):
                self.bad(k, spec, f"{{fold: {'|'.join(folds)}, {rest}}}")
                continue
            self.enum(f"{k}.fold", folds, required=True)
            yield k

    def env_twx(self, splits: dict) -> None:
        self._step_limit()
        games = self.value("env.games", "")
        allowed = f"a non-empty list of {{name: <game>, params: <str>}}, game {_one_of(TWX_GAMES)}"
        if games is not _ABSENT:
            if not isinstance(games, list) or not games or not all(isinstance(g, dict) for g in games):
                self.bad("env.games", games, allowed)
            else:
                for i, g in enumerate(games):
                    self.enum(f"env.games.{i}.name", tuple(TWX_GAMES), what="a TextWorldExpress game", required=True)
                    if not isinstance(g.get("params", "") or "", str):
                        self.bad(f"env.games.{i}.params", g["params"], "a string of game parameters, e.g. "
                                                                        "'numLocations=3'")
        for k in self._fold_splits(splits, TWX_FOLDS, "start: <int >= 0>, count: <int >= 1>"):
            self.number(f"{k}.start", ge=0, integer=True, required=True)
            self.number(f"{k}.count", ge=1, integer=True, required=True)

    def env_sciworld(self, splits: dict) -> None:
        self._step_limit(null="the paper's per-task limits, max_steps.json")
        self.number("env.default_step_limit", ge=1, integer=True)
        for split, spec in splits.items():
            if not isinstance(spec, str) or not spec:
                self.bad(f"env.splits.{split}", spec, "a file of [task, variation] pairs in env.data_dir")
        self.string("env.data_dir")
        simp = self.value("env.simplifications", "")
        if simp not in (_ABSENT, None, ""):
            bad = [s for s in str(simp).split(",") if s and s not in SCIWORLD_SIMPLIFICATIONS] \
                if isinstance(simp, str) else [simp]
            if bad:
                self.bad("env.simplifications", simp, f"comma-separated, each {_one_of(SCIWORLD_SIMPLIFICATIONS)}")
        tasks = self.value("env.tasks", "")
        if tasks not in (_ABSENT, None) and (not isinstance(tasks, list) or not tasks or not all(
                isinstance(t, (str, int)) and not isinstance(t, bool) for t in tasks)):
            self.bad("env.tasks", tasks, "a non-empty list of ETO task names or task numbers, or null (all tasks)")
        self.number("env.limit_per_task", ge=1, integer=True, null="every variation")
        self.number("env.heap_mb", ge=1, integer=True)
        self.number("env.games_per_jvm", ge=1, integer=True)
        self.str_list("env.jvm_options", nonempty=False, null="none")
        self.number("env.timeout_s", gt=0)
        self.boolean("env.valid_actions")

    def env_alfworld(self, splits: dict) -> None:
        self._step_limit()
        for k in self._fold_splits(splits, ALFWORLD_FOLDS, "ids: <file> (optional)"):
            self.string(f"{k}.ids", null="every solvable game of the fold")
        types = self.value("env.task_types", "")
        allowed = f"a non-empty list of ALFWorld task types, each {_one_of(sorted(ALFWORLD_TASK_TYPES))}, or null (all)"
        if types not in (_ABSENT, None) and (not isinstance(types, list) or not types
                                              or not all(t in ALFWORLD_TASK_TYPES for t in types)):
            self.bad("env.task_types", types, allowed)
        self.enum("env.expert", ("planner", "walkthrough"))
        self.number("env.limit_per_type", ge=1, integer=True, null="every game")
        self.string("env.data_dir", null="$ALFWORLD_DATA/json_2.1.1")
        self.string("env.ids_dir")

    def env_webshop(self, splits: dict) -> None:
        self._step_limit()
        self.number("env.limit", ge=1, integer=True, null="every goal")
        self.enum("env.observation_mode", WEBSHOP_OBSERVATION_MODES)
        self.boolean("env.human_goals")
        self.boolean("env.share_server")
        self.mapping("env.env_kwargs", "a mapping of WebAgentTextEnv keywords", null="none")
        self.string("env.data_dir")
        text_env = self.string("env.text_env", what="'module:Class', e.g. web_agent_site.envs:WebAgentTextEnv")
        if isinstance(text_env, str) and not re.fullmatch(r"[\w.]+:[\w.]+", text_env):
            self.bad("env.text_env", text_env, "'module:Class', e.g. web_agent_site.envs:WebAgentTextEnv")
        shape = "a file of goal indices in env.data_dir, or {not_in: [files], count: <int >= 1>, start: <int >= 0>}"
        for split, spec in splits.items():
            k = f"env.splits.{split}"
            if isinstance(spec, str) and spec:
                continue
            if not isinstance(spec, dict) or not set(spec) <= {"not_in", "count", "start"}:
                self.bad(k, spec, shape)
                continue
            self.number(f"{k}.count", ge=1, integer=True, required=True)
            self.number(f"{k}.start", ge=0, integer=True)
            self.str_list(f"{k}.not_in", nonempty=False)

    # model ---------------------------------------------------------------------------------------
    def model(self) -> None:
        if self.raw("model") is _ABSENT:
            return
        self.string("model.name")
        self.string("model.path")
        build = self.boolean("model.build")
        self.enum("model.dtype", DTYPES)
        max_context = self.number("model.max_context", ge=1, integer=True)
        self.string("model.chat_template", null="the tokenizer's own")
        self.enum("model.attn_implementation", ATTN_IMPLEMENTATIONS, null="transformers' default")
        tok = self.mapping("model.tokenizer", "{vocab_size: <int>, min_frequency: <int>}",
                           null="a pretrained model's own" if build is not True else None)
        if tok is not _ABSENT:
            self.number("model.tokenizer.vocab_size", ge=1, integer=True)
            self.number("model.tokenizer.min_frequency", ge=1, integer=True)
        arch = self.mapping("model.arch", "{hidden_size, num_layers, num_heads, intermediate_size, "
                                          "max_position_embeddings}",
                            null="a pretrained model's own" if build is not True else None)
        if arch is not _ABSENT:
            sizes = {k: self.number(f"model.arch.{k}", ge=1, integer=True)
                     for k in ("hidden_size", "num_layers", "num_heads", "intermediate_size",
                               "max_position_embeddings")}
            h, n = sizes["hidden_size"], sizes["num_heads"]
            if isinstance(h, int) and isinstance(n, int) and h % n:
                self.bad("model.arch.hidden_size", h, f"a multiple of model.arch.num_heads={n}")
            pos = sizes["max_position_embeddings"]
            if isinstance(pos, int) and isinstance(max_context, int) and max_context > pos:
                self.bad("model.max_context", max_context, f"at most model.arch.max_position_embeddings={pos} "
                                                           "(the tiny model has no positions beyond it)")
        lora = self.mapping("model.lora", "PEFT LoraConfig keywords {r, lora_alpha, lora_dropout, target_modules}",
                            null="full fine-tuning")
        if lora is not _ABSENT:
            self.number("model.lora.r", ge=1, integer=True, required=True)
            self.number("model.lora.lora_alpha", gt=0)
            self.number("model.lora.lora_dropout", ge=0, lt=1)
            modules = self.value("model.lora.target_modules", "")
            if modules is not _ABSENT and modules is not None and not (
                    (isinstance(modules, str) and modules)
                    or (isinstance(modules, list) and modules and all(isinstance(m, str) and m for m in modules))):
                self.bad("model.lora.target_modules", modules, "a non-empty list of module names (or one string), "
                                                               "or null (PEFT's default for the architecture)")
        q = self.mapping("model.quantization", "BitsAndBytesConfig keywords, e.g. {load_in_4bit: true}",
                         null="no quantization")
        if q is not _ABSENT:
            for b in ("load_in_4bit", "load_in_8bit", "bnb_4bit_use_double_quant"):
                self.boolean(f"model.quantization.{b}")
            self.enum("model.quantization.bnb_4bit_quant_type", BNB_4BIT_QUANT_TYPES)
            self.enum("model.quantization.bnb_4bit_compute_dtype", DTYPES, null="model.dtype")

    # bc and dpo ----------------------------------------------------------------------------------
    def training(self, p: str) -> None:
        """The Trainer settings bc and eto.dpo share (training/sft.py, training/dpo.py)."""
        self.number(f"{p}.lr", gt=0)
        self.number(f"{p}.epochs", gt=0)
        self.number(f"{p}.max_steps", ge=1, integer=True, null="no cap: the epochs decide")
        batch = self.number(f"{p}.batch_size", ge=1, integer=True, when=" (per device)")
        self.number(f"{p}.grad_accum", ge=1, integer=True)
        eb = self.number(f"{p}.effective_batch", ge=1, integer=True, null=f"{p}.grad_accum decides")
        if isinstance(eb, int) and isinstance(batch, int) and eb % batch:
            self.bad(f"{p}.effective_batch", eb, f"a multiple of {p}.batch_size={batch} "
                                                  "(accumulation = effective_batch / (batch_size x GPUs))")
        self.enum(f"{p}.scheduler", scheduler_types(),
                  what=f"a transformers SchedulerType (transformers {_version('transformers')})")
        self.number(f"{p}.warmup_ratio", ge=0, le=1, when=" (share of the optimizer steps)")
        self.number(f"{p}.weight_decay", ge=0)
        self.number(f"{p}.max_length", ge=1, integer=True, when=" (tokens per sequence)")
        self.number(f"{p}.logging_steps", gt=0)
        self.enum(f"{p}.save_strategy", save_strategies())
        self.number(f"{p}.save_steps", gt=0, null="500")
        self.number(f"{p}.save_total_limit", ge=1, integer=True, null="keep every checkpoint")
        for b in ("bf16", "gradient_checkpointing", "use_cpu"):
            self.boolean(f"{p}.{b}")
        kind = "sft" if p == "bc" else "dpo"
        cls = f"{kind.upper()}Config"
        extra = self.mapping(f"{p}.trainer", f"a mapping of other {cls} arguments under TRL's names, e.g. "
                             "{max_grad_norm: 0.5, optim: adamw_torch_fused}", null="none")
        if extra is not _ABSENT:
            fields = trainer_fields(kind)
            for k in sorted(extra):
                if k in SET_BY_SECTION[kind]:
                    self.bad(f"{p}.trainer.{k}", extra[k], f"{p} sets this argument from its own keys: use that key")
                elif fields and k not in fields:
                    self.bad(f"{p}.trainer.{k}", extra[k], f"not a {cls} argument (trl {_version('trl')})")

    def training_bc(self) -> None:
        if self.raw("bc") is _ABSENT:
            return
        self.training("bc")
        self.boolean("bc.only_success")

    def dpo(self, p: str) -> None:
        self.training(p)
        self.number(f"{p}.beta", gt=0)
        self.boolean(f"{p}.precompute_ref_log_probs")
        kinds = dpo_loss_types()
        allowed = f"a non-empty list of TRL DPO loss types (trl {_version('trl')}): {_one_of(kinds)}"
        loss = self.value(f"{p}.loss_type", allowed)
        if loss is not _ABSENT:
            if not isinstance(loss, list) or not loss:
                self.bad(f"{p}.loss_type", loss, allowed + (f"; write [{loss}]" if isinstance(loss, str) else ""))
                loss = _UNRESOLVED
            elif any(x not in kinds for x in loss):
                bad = next(x for x in loss if x not in kinds)
                self.bad(f"{p}.loss_type", loss, f"{render(bad)} is not a TRL DPO loss type; each entry "
                                                  f"{_one_of(kinds)} (trl {_version('trl')})")
                loss = _UNRESOLVED
        weights = self.value(f"{p}.loss_weights", "")
        if weights not in (_ABSENT, None) and (not isinstance(weights, list) or not all(
                _is_number(w) and w >= 0 for w in weights)):
            self.bad(f"{p}.loss_weights", weights,
                     "a list of numbers >= 0, one per loss_type entry, or null (1.0 each)")
            weights = _UNRESOLVED
        self.losses[p] = (loss, weights)
        # the pair that trains: iterations >= 2 take eto.dpo.later's keys over eto.dpo's
        if p == "eto.dpo.later":
            if loss is _ABSENT and weights is _ABSENT:
                return  # later changes neither: eto.dpo's pair, checked there
            first_loss, first_weights = self.losses.get("eto.dpo", (_ABSENT, _ABSENT))
            loss = first_loss if loss is _ABSENT else loss
            weights = first_weights if weights is _ABSENT else weights
        if isinstance(loss, list) and isinstance(weights, list) and len(weights) != len(loss):
            key = f"{p}.loss_weights" if self.raw(f"{p}.loss_weights") is not _ABSENT else f"{p}.loss_type"
            self.bad(key, self.get(key), f"as many loss_weights as loss_type has entries ({len(loss)}: "
                                         f"{render(loss)} against {len(weights)} weights), or loss_weights null")

    def eto(self) -> None:
        if self.raw("eto") is _ABSENT:
            return
        self.number("eto.iterations", ge=1, integer=True)
        self.boolean("eto.early_stopping")
        self.number("eto.min_improvement", ge=0)
        self.string("eto.dev_split", null="no dev evaluation")
        self.string("eto.explore.split")
        self.number("eto.explore.tasks_per_game", ge=1, integer=True, null="every training task")
        self.number("eto.explore.samples", ge=1, integer=True, when=" (episodes per task)")
        self._sampling("eto.explore")
        self.number("eto.explore.batch_size", ge=1, integer=True)
        self.enum("eto.pairs.contrast", CONTRASTS)
        self.enum("eto.pairs.chosen", CHOSEN)
        self.number("eto.pairs.extra_turns", ge=0, integer=True, null="the rejected side is not cut")
        self.enum("eto.pairs.rejected_cut", REJECTED_CUTS)
        self.enum("eto.pairs.expert_reward", EXPERT_REWARDS)
        self.enum("eto.pairs.step_positions", STEP_POSITIONS)
        self.number("eto.pairs.step_samples", ge=1, integer=True)
        self.number("eto.pairs.mixture_step_fraction", ge=0, le=1)
        if self.raw("eto.dpo") is _ABSENT:
            return
        self.dpo("eto.dpo")
        later = self.mapping("eto.dpo.later", "a mapping of eto.dpo keys for iterations >= 2, e.g. {beta: 0.5, "
                                              "lr: 5e-6}", null="iteration 1's settings throughout")
        if later is not _ABSENT:
            dpo_keys = set(self.raw("eto.dpo")) - {"later"}
            for k in sorted(set(later) - dpo_keys):
                self.bad(f"eto.dpo.later.{k}", later[k], "not a key of eto.dpo (later overrides eto.dpo's keys "
                                                         "from iteration 2 on)")
            self.dpo("eto.dpo.later")

    def _sampling(self, p: str) -> None:
        sample = self.boolean(f"{p}.do_sample")
        if sample is True:
            self.number(f"{p}.temperature", gt=0, when=f" when {p}.do_sample is true")
        elif self.has(f"{p}.temperature"):
            self.number(f"{p}.temperature", ge=0)
        self.number(f"{p}.top_p", gt=0, le=1)

    # eval ----------------------------------------------------------------------------------------
    def evaluation(self) -> None:
        if self.raw("eval") is _ABSENT:
            return
        self.string("eval.policy", what="a checkpoint folder or hub id")
        self.string("eval.tag", what="a non-empty name (results go to eval/<tag>/)")
        self.str_list("eval.splits", what="a non-empty list of split names, e.g. [seen, unseen]")
        self.number("eval.batch_size", ge=1, integer=True, when=" (episodes in parallel)")
        self.enum("eval.backend", BACKENDS, what="the rollout engine")
        vllm = self.mapping("eval.vllm", "vllm.LLM keywords", null="vLLM's defaults")
        if vllm is not _ABSENT:
            self.number("eval.vllm.gpu_memory_utilization", gt=0, le=1)
            self.number("eval.vllm.max_num_seqs", ge=1, integer=True)
            self.boolean("eval.vllm.enforce_eager")
        self.boolean("eval.overlap_env")
        self.boolean("eval.data_parallel")
        self.number("eval.env_retries", ge=0, integer=True)
        new = self.number("eval.generation.max_new_tokens", ge=1, integer=True)
        ctx = self.get("model.max_context")
        if isinstance(new, int) and _is_number(ctx, integer=True) and ctx >= 1 and new >= ctx:
            self.bad("eval.generation.max_new_tokens", new, f"an integer in [1, model.max_context={ctx}) "
                                                            "(the prompt gets the rest of the context)")
        self._sampling("eval.generation")

    # prompt --------------------------------------------------------------------------------------
    def prompt(self) -> None:
        p = self.mapping("prompt", "a prompt profile (configs/prompt)")
        if p is _ABSENT:
            return
        known = {f.name for f in dataclasses.fields(PromptConfig)}
        for k in sorted(set(p) - known):
            self.bad(f"prompt.{k}", p[k], f"not a prompt setting: {_one_of(sorted(known))}")
        opening = self.enum("prompt.opening", OPENINGS)
        self.boolean("prompt.thought")
        self.string("prompt.version")
        before = len(self.errors)
        slots = {"system": ("actions",), "task_template": ("task", "observation"),
                 "observation_template": ("task", "observation"), "invalid_format": None}
        for k, names in slots.items():
            v = self.get(f"prompt.{k}")
            if v in (_ABSENT, _UNRESOLVED):
                continue
            if not isinstance(v, str):
                self.bad(f"prompt.{k}", v, "a string")
            elif names:
                try:
                    v.format(**{n: "" for n in names})
                except (KeyError, IndexError, ValueError) as exc:
                    self.bad(f"prompt.{k}", v, f"a template whose only slots are {', '.join('{%s}' % n for n in names)}"
                                               f" (other braces doubled: {{{{ }}}}); {type(exc).__name__}: {exc}")
        example = self.get("prompt.example")
        if example not in (_ABSENT, _UNRESOLVED, None):
            if not isinstance(example, list):
                self.bad("prompt.example", example, "a list of {role, content} turns, or []")
            else:
                for i, m in enumerate(example):
                    want = "user" if i % 2 == 0 else "assistant"
                    if not isinstance(m, dict) or set(m) != {"role", "content"} or not isinstance(m["content"], str):
                        self.bad(f"prompt.example.{i}", m, "{role: user|assistant, content: <string>}")
                    elif m["role"] != want:
                        self.bad(f"prompt.example.{i}.role", m["role"], f"{want!r} (the example alternates user "
                                                                        "and assistant turns, starting with the task)")
                if example and isinstance(example[-1], dict) and example[-1].get("role") != "assistant":
                    self.bad("prompt.example", example, "ends on an assistant turn (the next turn is the task)")
        if len(self.errors) > before:
            return
        kw = {k: v for k, v in p.items() if k in known and v is not _UNRESOLVED}
        if opening is _ABSENT:
            kw.pop("opening", None)  # reported above; PromptConfig would stop on it first
        try:  # a last guard: whatever else prompting.PromptConfig checks
            PromptConfig(**kw)
        except (ValueError, TypeError) as exc:
            msg = str(exc)
            self.errors.append(msg if msg.startswith("prompt") else f"prompt: {msg}")

    # compare, export, bench ----------------------------------------------------------------------
    def compare(self) -> None:
        if self.raw("compare") is _ABSENT:
            return
        variants = self.str_list("compare.variants", choices=CONTRASTS)
        if isinstance(variants, list) and len(set(variants)) < len(variants):
            self.bad("compare.variants", variants, f"each contrast once ({_one_of(CONTRASTS)})")
        control = self.boolean("compare.control")
        of = self.value("compare.control_of", "")
        if control is True and of is not _ABSENT and isinstance(variants, list) and of not in variants:
            self.report("compare.control_of", f"compare.control_of={render(of)} is not one of compare.variants="
                                              f"{render(variants)}: with compare.control=true it names the variant "
                                              "whose chosen side and optimizer steps the SFT control matches")
        self.str_list("compare.splits", what="a non-empty list of split names")
        self.number("compare.bootstrap", ge=1, integer=True, when=" (paired bootstrap resamples)")

    def export(self) -> None:
        if self.raw("export") is _ABSENT:
            return
        self.enum("export.format", EXPORT_FORMATS)
        self.str_list("export.inputs", what="a non-empty list of episode or pairs files")
        self.string("export.output")
        fields_ = self.str_list("export.drop_fields", nonempty=False, what="a list of dotted field paths")
        if isinstance(fields_, list):
            for i, f in enumerate(fields_):
                if any(not part for part in f.split(".")):
                    self.bad(f"export.drop_fields.{i}", f, "a dotted field path, e.g. policy.path")
        patterns = self.str_list("export.redact_patterns", nonempty=False, what="a list of regular expressions")
        if isinstance(patterns, list):
            for i, pat in enumerate(patterns):
                try:
                    re.compile(pat)
                except re.error as exc:
                    self.bad(f"export.redact_patterns.{i}", pat, f"a valid regular expression ({exc})")
        v = self.get("export.replacement")
        if v not in (_ABSENT, _UNRESOLVED) and not isinstance(v, str):
            self.bad("export.replacement", v, "a string")
        self.boolean("export.detect_secrets")
        self.number("export.entropy_limit", gt=0, le=8, null="no entropy detector", when=" (bits per character)")
        self.str_list("export.skip_statuses", choices=STATUSES, nonempty=False)

    def bench(self) -> None:
        if self.raw("bench") is _ABSENT:
            return
        self.string("bench.policy")
        self.string("bench.split")
        self.number("bench.episodes", ge=1, integer=True)
        self.number("bench.repeats", ge=1, integer=True)
        threads = self.value("bench.threads", "")
        if threads is not _ABSENT and (not isinstance(threads, list) or not threads
                                       or not all(_is_number(t, integer=True) and t >= 1 for t in threads)):
            self.bad("bench.threads", threads, "a non-empty list of torch thread counts >= 1")
        self.number("bench.bc_trajectories", ge=1, integer=True)
        self.number("bench.bc_steps", ge=1, integer=True)
        self.enum("bench.only", ("rollout", "sciworld", "envsteps", "data_parallel", "vllm"), null="every section")
        self.string("bench.sciworld.split")
        self.number("bench.sciworld.variations", ge=0, integer=True, when=" (0 skips the section)")
        self.number("bench.sciworld.repeats", ge=1, integer=True)
        if self.raw("bench.envsteps") is not _ABSENT:
            self.boolean("bench.envsteps.enabled")
            self.str_list("bench.envsteps.envs", choices=ENV_NAMES)
            for key in ("gpu_batch", "rounds", "tasks", "repeats"):
                self.number(f"bench.envsteps.{key}", ge=1, integer=True)
            batch = self.mapping("bench.envsteps.batch", "environments per env name, each an integer >= 1")
            for name in (batch if batch is not _ABSENT else {}):
                self.number(f"bench.envsteps.batch.{name}", ge=1, integer=True)
            self.string("bench.envsteps.split")
            threads = self.value("bench.envsteps.step_threads", "")
            if threads is not _ABSENT and (not isinstance(threads, list) or not threads
                                           or not all(_is_number(t, integer=True) and t >= 1 for t in threads)):
                self.bad("bench.envsteps.step_threads", threads, "a non-empty list of thread counts >= 1")
            self.number("bench.envsteps.assumed_gpu.tokens_per_s", gt=0)
            self.number("bench.envsteps.assumed_gpu.tokens_per_step", gt=0)
        if self.raw("bench.data_parallel") is not _ABSENT:
            self.boolean("bench.data_parallel.enabled")
            self.number("bench.data_parallel.processes", ge=2, integer=True)
            self.string("bench.data_parallel.split")
            self.number("bench.data_parallel.repeats", ge=1, integer=True)
            self.str_list("bench.data_parallel.overrides", nonempty=False)
            self.number("bench.data_parallel.timeout_s", gt=0)
        if self.raw("bench.vllm") is not _ABSENT:
            self.boolean("bench.vllm.enabled")
            self.string("bench.vllm.python")

    def reading(self) -> None:
        if self.raw("reading") is _ABSENT:
            return
        self.string("reading.split")
        pol = self.mapping("reading.policies", "tags mapped to checkpoint folders or hub ids")
        if pol is not _ABSENT and not pol:
            self.bad("reading.policies", pol, "at least one tag mapped to a checkpoint folder or hub id")
        self.number("reading.permutations", ge=1, integer=True)
        self.number("reading.alpha", gt=0, lt=1)


def config_errors(cfg: Any) -> list[str]:
    """Every bad value of ``cfg`` (a composed Hydra config, or a plain dict), one line each."""
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    checker = _Checker(cfg)
    checker.run()
    return checker.errors


def check_config(cfg: Any) -> None:
    """Raise one ``ValueError`` naming every bad value of ``cfg`` (``<key>=<value>: <what is
    allowed>`` per line); nothing when the config is valid. Reads no model, environment or run
    folder (only whether ``experts.source`` exists): a stage calls it before it touches anything."""
    errors = config_errors(cfg)
    if errors:
        n = len(errors)
        raise ValueError(f"{n} bad config value{'s' if n > 1 else ''} (nothing was run or written):\n  "
                         + "\n  ".join(errors))
