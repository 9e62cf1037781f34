"""The names TRL and transformers accept, read from the installed packages' source (no import).

Importing trl or transformers takes seconds; parsing their source takes milliseconds, so the
config schema (:mod:`eto_train.config`) checks ``bc`` / ``eto.dpo`` against the very versions
that will train, before anything is loaded: DPO loss types, scheduler and save-strategy names,
and the fields of ``SFTConfig`` / ``DPOConfig`` (with ``TrainingArguments``).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from importlib.metadata import PackageNotFoundError, version as pkg_version
from pathlib import Path

# Fallbacks, used only when the installed package's source cannot be read (trl 1.16, transformers 5.24).
_LOSS_TYPES_FALLBACK = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
                        "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm")
_SCHEDULERS_FALLBACK = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                        "inverse_sqrt", "reduce_lr_on_plateau", "cosine_with_min_lr", "cosine_warmup_with_min_lr",
                        "warmup_stable_decay", "greedy")
_SAVE_STRATEGIES_FALLBACK = ("no", "steps", "epoch", "best")


def package_file(package: str, *parts: str) -> Path | None:
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
    return _enum_values(package_file("transformers", "trainer_utils.py"), "SchedulerType") or _SCHEDULERS_FALLBACK


@functools.lru_cache(maxsize=None)
def save_strategies() -> tuple[str, ...]:
    """transformers' ``SaveStrategy`` values (``save_strategy``), from the installed transformers."""
    return _enum_values(package_file("transformers", "trainer_utils.py"), "SaveStrategy") or _SAVE_STRATEGIES_FALLBACK


def _fields(path: Path | None, name: str) -> set[str]:
    node = _class_node(path, name)
    return {s.target.id for s in (node.body if node else []) if isinstance(s, ast.AnnAssign)
            and isinstance(s.target, ast.Name)}


@functools.lru_cache(maxsize=None)
def trainer_fields(kind: str) -> frozenset[str]:
    """The arguments of TRL's ``SFTConfig`` / ``DPOConfig`` (``kind``: sft | dpo, with transformers'
    ``TrainingArguments``), from the installed sources; empty when they cannot be read (then not checked)."""
    own = _fields(package_file("trl", "trainer", f"{kind}_config.py"), f"{kind.upper()}Config")
    base = _fields(package_file("transformers", "training_args.py"), "TrainingArguments")
    return frozenset(own | base) if own and base else frozenset()


@functools.lru_cache(maxsize=None)
def dpo_loss_types() -> tuple[str, ...]:
    """The loss types TRL's ``DPOConfig.loss_type`` allows, from the installed trl: the values of
    a ``Literal`` annotation when the field has one, else the ones its documentation (the
    field's ``help``) lists; trl 1.16 exposes no constant."""
    node = _class_node(package_file("trl", "trainer", "dpo_config.py"), "DPOConfig")
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
def version(package: str) -> str:
    try:
        return pkg_version(package)
    except PackageNotFoundError:
        return "?"
