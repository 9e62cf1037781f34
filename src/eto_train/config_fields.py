"""The typed config's building blocks: field types that carry the words of their error line
(``Int(ge=1)``, ``Choice(...)``, ``Rule("...")``), the way a value is shown in one (``render``), and
:class:`Section`, the base of every config section. config.py builds the schema from them; config_errors.py
turns a failed validation into one line per bad key with their words."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError


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


def one_of(choices) -> str:
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


# -- field types: each carries the text its error line shows -----------------------------------
class Rule:
    """What a field allows, as its error line says it (``{section}``: the section's dotted key)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Rule({self.text!r})"


def _or_null(text: str, null: str | None) -> str:
    return text + (f", or null ({null})" if null else "")


def _typed(inner: Any, text: str, null: str | None) -> Any:
    return Annotated[Optional[inner] if null else inner, Rule(text)]


def Int(*, gt=None, ge=None, lt=None, le=None, null: str | None = None, when: str = "") -> Any:
    """An integer in a range (``null``: what null means, when it is allowed; ``when``: appended)."""
    return _typed(Annotated[int, Field(gt=gt, ge=ge, lt=lt, le=le)],
                  _or_null(_range_text(gt, ge, lt, le, True), null) + when, null)


def Num(*, gt=None, ge=None, lt=None, le=None, null: str | None = None, when: str = "") -> Any:
    """A finite number in a range; an integer stays one (1 and 1.0 hash differently in a manifest)."""
    return _typed(Union[Annotated[int, Field(gt=gt, ge=ge, lt=lt, le=le)],
                        Annotated[float, Field(gt=gt, ge=ge, lt=lt, le=le)]],
                  _or_null(_range_text(gt, ge, lt, le, False), null) + when, null)


def Choice(choices, *, null: str | None = None, what: str = "") -> Any:
    """One of ``choices`` (a ``Literal``)."""
    return _typed(Literal[tuple(choices)], _or_null((what + ": " if what else "") + one_of(choices), null), null)


def Text(*, null: str | None = None, what: str = "a non-empty string", pattern: str | None = None) -> Any:
    return _typed(Annotated[str, Field(min_length=1, pattern=pattern)], _or_null(what, null), null)


def Texts(*, choices=None, what: str = "", null: str | None = None, nonempty: bool = True) -> Any:
    """A list of strings (each one of ``choices`` when given)."""
    each = one_of(choices) if choices else "a non-empty string"
    item = Literal[tuple(choices)] if choices else Annotated[str, Field(min_length=1)]
    text = what or f"a {'non-empty ' if nonempty else ''}list, each entry {each}"
    return _typed(Annotated[list[item], Field(min_length=1 if nonempty else 0)], _or_null(text, null), null)


Flag = Annotated[bool, Rule("true or false")]


def Part(model: type, text: str, null: str | None = None) -> Any:
    """A sub-section (``null``: may be null)."""
    return _typed(model, _or_null(text, null), null)


def problem(*lines: tuple[str, str]) -> PydanticCustomError:
    """The error of a cross-key rule: ``(key, allowed)`` per bad key, ``key`` relative to the
    section; ``allowed`` starting with ``=`` is a whole line after the key (its own wording)."""
    return PydanticCustomError("config", "{lines}", {"lines": list(lines)})


def allowed(text: str) -> PydanticCustomError:
    """A field validator's error: what the field allows, in words that depend on the value."""
    return PydanticCustomError("config", "{allowed}", {"allowed": text})


# -- sections -----------------------------------------------------------------------------------
class Section(BaseModel):
    """A config section: strict types, unknown keys refused, attribute access (``cfg.bc.learning_rate``).

    ``get`` / ``[]`` / ``in`` read it as the DictConfig did (``in``: the key was given, by the YAML
    or an override, or is an allowed extra key)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, validate_default=False)
    unknown: ClassVar[str] = ""  # what an unknown key's error line says ("" : the section's keys)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default) if key in type(self).model_fields or key in (self.model_extra or {}) \
            else default

    def __getitem__(self, key: str) -> Any:
        if key in type(self).model_fields or key in (self.model_extra or {}):
            return getattr(self, key)
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return key in self.model_fields_set or key in (self.model_extra or {})

    def plain(self) -> dict[str, Any]:
        """The section as plain JSON types, as the YAML gave it (what a stage hash is made of)."""
        return self.model_dump(mode="json", exclude_unset=True)
