"""A failed validation of the composed config as one line per bad key: ``key=value: what is allowed``,
in the words of the field's :class:`~eto_train.config_fields.Rule` (or its section's own check), the key
dotted as on the command line (``eto.dpo.beta=-1: a number > 0``). config.load raises them together as one
:class:`~eto_train.errors.ConfigError`."""

from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel, ValidationError

from .config_fields import Rule, render


def lookup(data: Any, path: list) -> Any:
    for part in path:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return MISSING
    return data


MISSING = object()


def _data_path(data: Any, loc: tuple, missing: bool = False) -> list:
    """The parts of a pydantic error location that are keys of the data (not union tags); a
    ``missing`` error's last part is the key the data lacks."""
    path = []
    for i, part in enumerate(loc):
        if isinstance(data, dict) and part in data:
            data = data[part]
            path.append(part)
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
            path.append(part)
        elif missing and i == len(loc) - 1:
            path.append(part)
    return path


def _unwrap(t: Any) -> tuple[Any, list]:
    """(the type under Annotated / Optional, the Annotated metadata met on the way)."""
    metas: list = []
    while True:
        if typing.get_origin(t) is Annotated:
            metas.extend(t.__metadata__)
            t = t.__origin__
            continue
        if typing.get_origin(t) in (Union, types.UnionType):
            args = [a for a in typing.get_args(t) if a is not type(None)]
            if len(args) == 1:
                t = args[0]
                continue
        return t, metas


def _step(t: Any, part: Any) -> tuple[Any, list] | None:
    """The type (and metadata) one key below ``t``."""
    t, _ = _unwrap(t)
    if isinstance(t, type) and issubclass(t, BaseModel):
        f = t.model_fields.get(part) if isinstance(part, str) else None
        if f is None:
            return None
        inner, metas = _unwrap(f.annotation)
        return f.annotation, list(f.metadata) + metas
    origin = typing.get_origin(t)
    if origin in (list, tuple) and isinstance(part, int):
        return _unwrap(typing.get_args(t)[0])[0], _unwrap(typing.get_args(t)[0])[1]
    if origin is dict:
        arg = typing.get_args(t)[1]
        return arg, _unwrap(arg)[1]
    if origin in (Union, types.UnionType):
        for member in typing.get_args(t):
            found = _step(member, part)
            if found is not None:
                return found
    return None


def _rule_of(metas: list) -> str | None:
    return next((m.text for m in reversed(metas) if isinstance(m, Rule)), None)


def _section_of(root: type, path: list) -> tuple[type | None, int]:
    """The model class holding the last key of ``path``, and the depth of that model."""
    t, model, depth = root, root, 0
    for i, part in enumerate(path[:-1], 1):
        found = _step(t, part)
        if found is None:
            break
        t = found[0]
        inner = _unwrap(t)[0]
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            model, depth = inner, i
    return model, depth


def _rule_path(root: type, path: list) -> tuple[int, str | None]:
    """The depth and text of the deepest :class:`Rule` along ``path``."""
    t, best = root, (len(path), None)
    for i, part in enumerate(path, 1):
        found = _step(t, part)
        if found is None:
            break
        t, metas = found
        text = _rule_of(metas)
        if text is not None:
            best = (i, text)
    return best


def _dotted_key(path: list) -> str:
    return ".".join(str(p) for p in path)


def error_lines(exc: ValidationError, root: type, data: dict) -> list[tuple[str, str]]:
    """(key, line) for each error of the validation."""
    out: list[tuple[str, str]] = []

    def add(path: list, text: str, section: list) -> None:
        key = _dotted_key(path)
        value = lookup(data, path)
        text = text.replace("{section}", _dotted_key(section))
        if text.startswith("!"):  # a line of its own words after the key
            out.append((key, key + text[1:]))
        elif text.startswith("="):  # after key=value
            out.append((key, f"{key}={render(value)}{text[1:]}"))
        elif value == "???":
            out.append((key, f"{key}=???: required, not set ({text})"))
        else:
            out.append((key, f"{key}={'<missing>' if value is MISSING else render(value)}: {text}"))

    for e in exc.errors():
        path = _data_path(data, e["loc"], missing=e["type"] == "missing")
        ctx = e.get("ctx") or {}
        if e["type"] == "config" and "lines" in ctx:
            for rel, text in ctx["lines"]:
                add(path + [int(p) if p.isdigit() else p for p in rel.split(".") if rel], text, path)
            continue
        if e["type"] == "extra_forbidden":
            model, depth = _section_of(root, path)
            names = ", ".join(sorted(model.model_fields)) if model else ""
            add(path, (model.unknown if model and model.unknown else
                       f"not a key of {_dotted_key(path[:-1]) or 'the config'}: one of {names}"), path[:depth])
            continue
        depth, rule = _rule_path(root, path)
        model, mdepth = _section_of(root, path[:depth])
        text = ctx["allowed"] if "allowed" in ctx and lookup(data, path) != "???" else rule or e["msg"]
        add(path if "allowed" in ctx else path[:depth], text, path[:mdepth])
    return out


def one_per_key(lines: list[tuple[str, str]], raw: dict) -> list[str]:
    """One line per key; none for a key that is ``${other}`` when ``other`` has one (the default
    compare.splits is ${eval.splits}: one bad value, one line)."""
    seen: dict[str, str] = {}
    for key, line in lines:
        seen.setdefault(key, line)
    out = []
    for key, line in seen.items():
        m = re.fullmatch(r"\$\{([\w.]+)\}", str(lookup(raw, key.split("."))))
        if m and m.group(1) in seen:
            continue
        out.append(line)
    return out
