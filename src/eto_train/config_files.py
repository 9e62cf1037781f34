"""The YAML files a run composes, checked before Hydra reads them: a YAML "alias bomb" (anchors
whose aliases nest into billions of values: ``a: &a [x, x]``, ``b: &b [*a, *a]``, ...) is a named
error naming the file, never a hang.

PyYAML builds such a file in linear time (an alias is a shared reference), but OmegaConf copies
every alias out into nodes of its own, so Hydra's composition would run for hours and fill the
memory. :func:`check_config_files` counts the values each file expands to (each node once, its
expansion remembered) and refuses a file over :data:`MAX_EXPANDED_VALUES`. The folders checked:
the configs folder (``configs/`` or ``$ETO_TRAIN_CONFIGS``), ``--config-dir`` / ``-cd`` and the
file folders of a ``hydra.searchpath=[...]`` override.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .errors import ConfigError

MAX_EXPANDED_VALUES = 100_000  # a run's whole composed config is a few thousand values


class AliasBomb(ConfigError):
    """A config file whose YAML aliases expand to more values than any config needs (or without end)."""


def _expanded(node, memo: dict[int, int], busy: set[int]) -> int:
    """How many values ``node`` becomes once every alias in it is copied out (capped just past the
    limit; an alias inside its own anchor counts as without end)."""
    import yaml

    key = id(node)
    if key in memo:
        return memo[key]
    if key in busy:  # an anchor that contains its own alias: a copy without end
        return MAX_EXPANDED_VALUES + 1
    busy.add(key)
    total = 1
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    else:
        children = []
    for child in children:
        total = min(total + _expanded(child, memo, busy), MAX_EXPANDED_VALUES + 1)
    busy.discard(key)
    memo[key] = total
    return total


def expanded_values(text: str) -> int:
    """The number of values the YAML ``text`` expands to (every document; aliases copied out)."""
    import yaml

    memo: dict[int, int] = {}
    return sum(_expanded(doc, memo, set()) for doc in yaml.compose_all(text, Loader=yaml.SafeLoader)
               if doc is not None)


def check_file(path: Path) -> None:
    """:class:`AliasBomb` for a YAML file whose aliases expand past :data:`MAX_EXPANDED_VALUES`.
    A file with no anchor (``&``) is not parsed; one that is not valid YAML is left to Hydra's error."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return  # Hydra names what it cannot read
    if "&" not in text or "*" not in text:
        return
    import yaml

    try:
        n = expanded_values(text)
    except (yaml.YAMLError, RecursionError):
        return
    if n > MAX_EXPANDED_VALUES:
        raise AliasBomb(
            f"{path}: its YAML aliases (*name, each a copy of an &name anchor) nest into more than "
            f"{MAX_EXPANDED_VALUES:,} values (a YAML alias bomb): composing it would not end. Nothing was run or "
            f"written; write the values out, or remove the aliases that copy other aliases")


def searched_folders(configs_dir: str, args: list[str]) -> list[Path]:
    """The folders Hydra reads configs from for this command: ``configs_dir``, ``--config-dir`` /
    ``-cd`` (``X`` or ``=X``) and the file folders of ``hydra.searchpath=[...]``."""
    folders = [Path(configs_dir)]
    for i, a in enumerate(args):
        for flag in ("--config-dir", "-cd"):
            if a == flag and i + 1 < len(args):
                folders.append(Path(args[i + 1]))
            elif a.startswith(flag + "="):
                folders.append(Path(a.partition("=")[2]))
        if a.lstrip("+").startswith("hydra.searchpath="):
            for entry in a.partition("=")[2].strip("[]").split(","):
                entry = entry.strip().strip("'\"")
                if entry and not entry.startswith("pkg://"):
                    folders.append(Path(entry.removeprefix("file://")))
    return folders


def check_config_files(configs_dir: str, args: list[str] | None = None) -> None:
    """Every ``*.yaml`` / ``*.yml`` file under the folders this command composes from, checked by
    :func:`check_file` before Hydra reads any of them."""
    seen: set[Path] = set()
    for folder in searched_folders(configs_dir, list(args or [])):
        if not folder.is_dir():
            continue
        for path in sorted([*folder.rglob("*.yaml"), *folder.rglob("*.yml")]):
            real = path.resolve()
            if real not in seen:
                seen.add(real)
                check_file(path)


if __name__ == "__main__":  # pragma: no cover - python -m eto_train.config_files <folder>
    check_config_files(sys.argv[1] if len(sys.argv) > 1 else ".")
