"""The training export: episodes or pairs for training, checked, with fields dropped and secrets
redacted (the raw episode store may hold secrets from tool outputs; the export for training
need not).

Nothing here writes over an input: the output is one whole file written atomically.
"""

from __future__ import annotations

import json
import os
import re
from importlib.metadata import version as _version
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import EXPORT_FORMATS
from .eto_format import agenttraj_id, eto_id, pair_to_eto, to_agenttraj, to_eto, to_eval_output, write_eval_outputs
from .pairs import Pair, pair_from_dict
from .records import NOT_POLICY_FAULT, Episode, RecordError, to_messages
from .redact import Redactor
from .store import read_jsonl, write_atomic, write_jsonl

# the authors' layouts | chat messages (TRL) | full records | the authors' evaluation outputs (a
# folder, one file per task: what their construct_preference.py reads; eto_format.write_eval_outputs) |
# AgentGym's AgentTraj (item_id, conversations with loss flags: what its BC trainer reads)


@dataclass
class ExportConfig:
    format: str = "eto"  # eto (ShareGPT conversations) | messages (chat) | episodes (full records)
    drop_fields: list[str] = field(default_factory=list)  # dotted paths, e.g. "policy.path", "steps.latency_s"
    redact_patterns: list[str] = field(default_factory=list)  # the user's regexes; matches become ``replacement``
    replacement: str = "[REDACTED]"
    detect_secrets: bool = True  # detect-secrets' plugins and the project's named patterns (redact.py)
    entropy_limit: float | None = 4.5  # base64 strings above it (bits/char, 20+ chars) are secrets; None: off
    skip_statuses: list[str] = field(default_factory=lambda: list(NOT_POLICY_FAULT))

    def __post_init__(self) -> None:
        if self.format not in EXPORT_FORMATS:
            raise ValueError(f"export.format: {self.format!r} is not one of {list(EXPORT_FORMATS)}")
        for i, f in enumerate(self.drop_fields):
            if not isinstance(f, str) or not f or any(not part for part in f.split(".")):
                raise ValueError(f"export.drop_fields[{i}]: {f!r} is not a dotted field path")
        self._compiled = []
        for i, p in enumerate(self.redact_patterns):
            try:
                self._compiled.append(re.compile(p))
            except (re.error, TypeError) as exc:
                raise ValueError(f"export.redact_patterns[{i}]: invalid regex {p!r}: {exc}") from None
        if not isinstance(self.detect_secrets, bool):
            raise ValueError(f"export.detect_secrets: {self.detect_secrets!r} is not true or false")
        if self.entropy_limit is not None and (isinstance(self.entropy_limit, bool)
                                               or not isinstance(self.entropy_limit, (int, float))
                                               or not 0 < self.entropy_limit <= 8):
            raise ValueError(f"export.entropy_limit: {self.entropy_limit!r} is not null or a number in (0, 8] "
                             f"(bits per character)")


def _episode_record(ep: Episode, fmt: str, id: str) -> dict[str, Any]:
    if fmt == "eto":
        return to_eto(ep, id=id)
    if fmt == "eto_eval":
        return to_eval_output(ep, id=id)
    if fmt == "agenttraj":
        return to_agenttraj(ep, id=id)
    if fmt == "messages":
        return {"id": id, "task_id": ep.task_id, "messages": to_messages(ep),
                "reward": ep.final_score, "success": ep.success}
    return ep.to_dict()


def _pair_record(pair: Pair, fmt: str, id: str) -> dict[str, Any]:
    if fmt in ("eto_eval", "agenttraj"):
        what = "the authors' evaluation outputs" if fmt == "eto_eval" else "AgentGym's trajectories"
        raise ValueError(f"export.format={fmt} holds episodes ({what}), not pairs "
                         f"(pair {pair.pair_id}): export pairs with format eto")
    if fmt == "eto":  # the authors' construct_preference.py layout, read by their train_dpo.py
        return pair_to_eto(pair, id=id)
    if fmt == "messages":  # TRL's conversational preference format
        return {"id": id, "prompt": pair.prompt, "chosen": pair.chosen, "rejected": pair.rejected}
    return pair.to_dict()


def _distinct_ids(keys: list[str]) -> list[str]:
    """Each record's id: its task's id, suffixed ``-<n>`` from the second record of a task on
    (the authors' tools key on the first; no two records share an id)."""
    seen: dict[str, int] = {}
    out = []
    for k in keys:
        n = seen.get(k, 0)
        seen[k] = n + 1
        out.append(k if n == 0 else f"{k}-{n}")
    return out


def _drop(obj: Any, parts: list[str]) -> bool:
    """Remove the dotted path from ``obj`` (through lists); True when something was removed."""
    if isinstance(obj, list):
        return any([_drop(x, parts) for x in obj])  # a list, not a generator: drop from every item
    if not isinstance(obj, dict) or parts[0] not in obj:
        return False
    if len(parts) == 1:
        del obj[parts[0]]
        return True
    return _drop(obj[parts[0]], parts[1:])


def export_training_data(inputs: str | os.PathLike | list, output: str | os.PathLike,
                         cfg: ExportConfig | dict[str, Any] | None = None) -> dict[str, Any]:
    """Write episodes (or pairs) from ``inputs`` to ``output`` for training; returns a report.

    Episodes with a status in ``skip_statuses`` (default: not the policy's fault) are left out.
    Episodes and pairs become the chosen ``format``: ``eto``, the authors' layouts (SFT
    conversations with the instruction/"OK" opening; pairs as ``{id, prompt, chosen,
    rejected}`` of ShareGPT turns); ``messages``, chat messages (TRL's formats); ``episodes``,
    the full records. Ids are distinct (see :func:`_distinct_ids`). Then every
    ``drop_fields`` path is removed, and in every string of every record each ``redact_patterns``
    match and (``detect_secrets``, on by default) each secret found by :class:`redact.Redactor`
    is replaced; the report counts them by pattern (``redactions``) and by kind (``secrets_redacted``).
    A drop path that matches no field of any record is an error (a typo must not leak a field).
    The output is written atomically and may not be one of the inputs; a ``.json`` output is a
    JSON list (the authors' files), anything else JSON Lines.
    """
    cfg = cfg if isinstance(cfg, ExportConfig) else ExportConfig(**(cfg or {}))
    paths = [Path(p) for p in (inputs if isinstance(inputs, (list, tuple)) else [inputs])]
    out = Path(output)
    if any(out.resolve() == p.resolve() for p in paths):
        raise ValueError(f"export.output: {out} is also an input; the export never writes over its source")
    records: list[Episode | Pair] = []
    skipped: dict[str, int] = {}
    read = 0
    for path in paths:
        for lineno, obj in read_jsonl(path):
            read += 1
            try:
                if isinstance(obj, dict) and "pair_id" in obj:
                    records.append(pair_from_dict(obj))
                    continue
                ep = Episode.from_dict(obj)
            except (ValueError, TypeError, KeyError) as exc:
                raise RecordError(f"{path}:{lineno}: not an episode or pair record: {exc}") from None
            if ep.status in cfg.skip_statuses:
                skipped[ep.status] = skipped.get(ep.status, 0) + 1
                continue
            records.append(ep)
    # the id the format's readers key on: AgentTraj's item_id; the authors' (file-safe: their gold file and
    # evaluation-output files match as they are); chat messages and records keep the task's own id
    episode_id = {"agenttraj": agenttraj_id, "eto": eto_id, "eto_eval": eto_id}.get(
        cfg.format, lambda ep: ep.task_id.rsplit("/", 1)[-1] if ep.env == "alfworld" else ep.task_id)
    ids = _distinct_ids([episode_id(r) if isinstance(r, Episode) else r.task_id for r in records])
    rows = [_pair_record(r, cfg.format, i) if isinstance(r, Pair) else _episode_record(r, cfg.format, i)
            for r, i in zip(records, ids)]
    matched = [False] * len(cfg.drop_fields)
    for r in rows:
        for i, f in enumerate(cfg.drop_fields):
            matched[i] |= _drop(r, f.split("."))
    unmatched = [f for f, m in zip(cfg.drop_fields, matched) if not m]
    if rows and unmatched:
        raise ValueError(f"export.drop_fields: {unmatched} match no field of the exported records "
                         f"(format {cfg.format!r}); nothing was written")
    with Redactor(cfg.redact_patterns, cfg.replacement, cfg.detect_secrets, cfg.entropy_limit) as redact:
        rows = [redact(r) for r in rows]
    counts = redact.counts
    if cfg.format == "eto_eval":  # a folder: <output>/<env>/<file-safe id>.json and ids.jsonl (eto_format.py)
        write_eval_outputs(out, rows)
    elif out.suffix == ".json":  # a JSON list, as the authors' files (their trainers json.load them)
        write_atomic(out, json.dumps(rows, ensure_ascii=False, indent=2) + "\n")
    else:
        write_jsonl(out, rows)
    return {"inputs": [str(p) for p in paths], "output": str(out), "records_read": read, "exported": len(rows),
            "skipped": skipped, "dropped_fields": list(cfg.drop_fields),
            "redactions": {p: counts[p] for p in cfg.redact_patterns},
            "secrets_redacted": {k: n for k, n in sorted(counts.items()) if k not in cfg.redact_patterns and n},
            "secret_detection": "off" if not cfg.detect_secrets else
            f"detect-secrets {_version('detect-secrets')} + named patterns (entropy limit {cfg.entropy_limit})"}
