"""Training data in and out, checked: ETO-format imports, pairs files, the training export.

Every reader names the file, the line (or list item) and the field of a bad record, and
nothing here writes over an input: outputs are whole files written atomically.

- :func:`read_eto_file`: ETO's released trajectories (a JSON list, or JSON Lines).
- :func:`read_eto_pairs`: pairs in the authors' layout (``construct_preference.py``).
- :func:`import_experts`: the authors' SFT file as expert episodes of this environment's tasks.
- :func:`read_pairs` / :func:`pair_from_dict`: a pairs file as ``stages.pairs`` writes it.
- :func:`check_pairs_policy`: the pairs were explored by the DPO reference policy.
- :func:`export_training_data`: episodes or pairs for training, with fields dropped and
  secrets redacted (the raw episode store may hold secrets from tool outputs; the export
  for training need not).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator

from .pairs import Pair
from .eto_format import bind_task, eto_id, from_eto, match_task, pair_from_eto, pair_to_eto, task_index, to_eto
from .records import NOT_POLICY_FAULT, Episode, RecordError, to_messages
from .store import read_jsonl, write_atomic, write_jsonl

ROLES = ("system", "user", "assistant")
PAIR_KINDS = ("trajectory", "step", "self")


# -- ETO-format import ------------------------------------------------------------------------
def _json_items(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, object) for a JSON Lines file (``path:line``) or a JSON list (``path:line [item i]``)."""
    if path.suffix == ".jsonl":
        for lineno, obj in read_jsonl(path):
            yield f"{path}:{lineno}", obj
        return
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise RecordError(f"{path}:{line}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(items, list):
        raise RecordError(f"{path}: expected a JSON list of trajectories, got {type(items).__name__}")
    # line of each item's start, for messages a user can jump to
    starts = _item_lines(text, len(items))
    for i, obj in enumerate(items):
        yield f"{path}:{starts[i]} [item {i}]", obj


def _item_lines(text: str, n: int) -> list[int]:
    """The line where each top-level item of a JSON list starts (1 when it cannot tell)."""
    dec, out, pos = json.JSONDecoder(), [], text.index("[") + 1
    ws = re.compile(r"[\s,]*")
    try:
        for _ in range(n):
            pos = ws.match(text, pos).end()
            out.append(text.count("\n", 0, pos) + 1)
            _, pos = dec.raw_decode(text, pos)
    except (ValueError, AttributeError):
        return out + [1] * (n - len(out))
    return out


def read_eto_file(path: str | os.PathLike, env: str = "eto-import", split: str = "train") -> list[Episode]:
    """Episodes from ETO's trajectory format; an unusable trajectory names file, line and field."""
    out = []
    for where, obj in _json_items(Path(path)):
        try:
            out.append(from_eto(obj, env=env, split=split))
        except (ValueError, TypeError, KeyError) as exc:
            raise RecordError(f"{where}: not an ETO trajectory: {exc}") from None
    return out


def import_experts(path: str | os.PathLike, tasks: list, env_version: str) -> tuple[list[Episode], dict[str, Any]]:
    """Expert episodes from the authors' SFT file, each bound to the training task it belongs to.

    Every entry is checked first (a malformed one names file, line and item); entries whose id
    matches no task of ``tasks`` are reported, not imported; a second entry for a task is
    reported and skipped. Raises when no entry matches any task.
    """
    index = task_index(tasks)
    episodes, unmatched, duplicates, seen = [], [], [], set()
    total = 0
    for where, obj in _json_items(Path(path)):
        total += 1
        try:
            ep = from_eto(obj)
        except (ValueError, TypeError, KeyError) as exc:
            raise RecordError(f"{where}: not an ETO trajectory: {exc}") from None
        task = match_task(obj, index)
        if task is None:
            unmatched.append(str(obj.get("game_file", obj.get("id"))))
            continue
        if task.task_id in seen:
            duplicates.append(task.task_id)
            continue
        seen.add(task.task_id)
        episodes.append(bind_task(ep, task, env_version))
    if not episodes:
        raise RecordError(f"{path}: none of its {total} trajectories matches a task of the training split "
                          f"({len(tasks)} tasks, ids like {tasks[0].task_id if tasks else '-'}; the file's "
                          f"ids: {unmatched[:3]}): is it the file of another environment?")
    report = {"source": str(path), "entries": total, "imported": len(episodes),
              "unmatched": len(unmatched), "unmatched_ids": unmatched[:20],
              "duplicates": len(duplicates), "duplicate_ids": duplicates[:20],
              "tasks_without_expert": len(tasks) - len(episodes)}
    return episodes, report


def read_eto_pairs(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Pairs in the authors' layout as ``{id, prompt, chosen, rejected}`` chat messages."""
    out = []
    for where, obj in _json_items(Path(path)):
        try:
            out.append(pair_from_eto(obj))
        except (ValueError, TypeError, KeyError) as exc:
            raise RecordError(f"{where}: not an ETO preference pair: {exc}") from None
    return out


# -- pairs files ------------------------------------------------------------------------------
def _check_messages(msgs: Any, name: str, ends_with: str | None, need_assistant: bool) -> None:
    if not isinstance(msgs, list) or not msgs:
        raise ValueError(f"{name}: expected a non-empty list of messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise ValueError(f"{name}[{i}]: expected a message object, got {type(m).__name__}")
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise ValueError(f"{name}[{i}]: unknown key(s) {extra}")
        if m.get("role") not in ROLES:
            raise ValueError(f"{name}[{i}].role: unknown role {m.get('role')!r} (one of {list(ROLES)})")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"{name}[{i}].content: expected a string")
    if need_assistant and not any(m["role"] == "assistant" for m in msgs):
        raise ValueError(f"{name}: no assistant turn (nothing to train on)")
    if ends_with and msgs[-1]["role"] != ends_with:
        raise ValueError(f"{name}[{len(msgs) - 1}].role: must end on a {ends_with} turn, got {msgs[-1]['role']!r}")


def pair_from_dict(d: Any) -> Pair:
    """A checked :class:`Pair`; ``ValueError`` names the bad field."""
    if not isinstance(d, dict):
        raise ValueError(f"a pair must be a JSON object, got {type(d).__name__}")
    names = [f.name for f in fields(Pair)]
    unknown, missing = sorted(set(d) - set(names)), sorted(set(names) - set(d))
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}")
    if missing:
        raise ValueError(f"missing field(s) {missing}")
    if d["kind"] not in PAIR_KINDS:
        raise ValueError(f"kind: {d['kind']!r} is not one of {list(PAIR_KINDS)}")
    for k in ("pair_id", "task_id", "chosen_policy", "rejected_policy"):
        if not isinstance(d[k], str) or not d[k]:
            raise ValueError(f"{k}: expected a non-empty string, got {d[k]!r}")
    for k in ("chosen_score", "rejected_score"):
        if not isinstance(d[k], (int, float)) or isinstance(d[k], bool):
            raise ValueError(f"{k}: expected a number, got {d[k]!r}")
    _check_messages(d["prompt"], "prompt", ends_with="user", need_assistant=False)
    _check_messages(d["chosen"], "chosen", ends_with="assistant", need_assistant=True)
    _check_messages(d["rejected"], "rejected", ends_with="assistant", need_assistant=True)
    for side in ("chosen", "rejected"):
        for i, m in enumerate(d[side]):
            if m["role"] == "assistant" and not m["content"].strip():
                raise ValueError(f"{side}[{i}].content: empty assistant turn (an empty action)")
    return Pair(**d)


def read_pairs(path: str | os.PathLike) -> list[Pair]:
    out = []
    for lineno, obj in read_jsonl(path):
        try:
            out.append(pair_from_dict(obj))
        except (ValueError, TypeError) as exc:
            raise RecordError(f"{path}:{lineno}: not a pair record: {exc}") from None
    return out


class PairsPolicyError(ValueError):
    """Pairs explored by another policy than the DPO reference."""


def _weights_tag(policy_id: str) -> str:
    """The part of ``<name>@<weights sha256[:12]>`` that names the weights (names differ by stage)."""
    return policy_id.rsplit("@", 1)[1] if "@" in policy_id else policy_id


def check_pairs_policy(pairs: Iterable[Pair], reference_id: str, source: str = "pairs") -> None:
    """Every non-expert side of every pair was produced by the reference policy.

    DPO's implicit reward is log pi/pi_ref; rejected turns sampled from another policy are
    off-policy for the reference the trainer uses. ``reference_id`` is
    ``model.load.policy_ref(reference_path).id``. Policy ids are compared by their weights hash
    (the name before ``@`` differs between stages); hub ids (``...@hub``) must match whole.
    Line numbers count the pairs in order, as ``pairs.jsonl`` stores them.
    """
    ref_tag = _weights_tag(reference_id)
    for line, p in enumerate(pairs, start=1):
        for side in ("chosen_policy", "rejected_policy"):
            pid = getattr(p, side)
            if pid == "expert":
                continue
            same = pid == reference_id if ref_tag == "hub" else _weights_tag(pid) == ref_tag
            if not same:
                raise PairsPolicyError(
                    f"{source}:{line}: pair {p.pair_id}: {side} is {pid!r}, but the DPO reference is "
                    f"{reference_id!r}: these pairs were explored by another policy (rebuild them from the "
                    f"reference: rerun explore and pairs for this iteration)")


# -- export for training --------------------------------------------------------------------
EXPORT_FORMATS = ("eto", "messages", "episodes")  # the authors' layouts | chat messages (TRL) | full records


@dataclass
class ExportConfig:
    format: str = "eto"  # eto (ShareGPT conversations) | messages (chat) | episodes (full records)
    drop_fields: list[str] = field(default_factory=list)  # dotted paths, e.g. "policy.path", "steps.latency_s"
    redact_patterns: list[str] = field(default_factory=list)  # regexes; matches become ``replacement``
    replacement: str = "[REDACTED]"
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


def _episode_record(ep: Episode, fmt: str, id: str) -> dict[str, Any]:
    if fmt == "eto":
        return to_eto(ep, id=id)
    if fmt == "messages":
        return {"id": id, "task_id": ep.task_id, "messages": to_messages(ep),
                "reward": ep.final_score, "success": ep.success}
    return ep.to_dict()


def _pair_record(pair: Pair, fmt: str, id: str) -> dict[str, Any]:
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


def _redact(obj: Any, patterns: list[re.Pattern], replacement: str, counts: list[int]) -> Any:
    if isinstance(obj, str):
        for i, p in enumerate(patterns):
            obj, n = p.subn(replacement, obj)
            counts[i] += n
        return obj
    if isinstance(obj, list):
        return [_redact(x, patterns, replacement, counts) for x in obj]
    if isinstance(obj, dict):
        return {k: _redact(v, patterns, replacement, counts) for k, v in obj.items()}
    return obj


def export_training_data(inputs: str | os.PathLike | list, output: str | os.PathLike,
                         cfg: ExportConfig | dict[str, Any] | None = None) -> dict[str, Any]:
    """Write episodes (or pairs) from ``inputs`` to ``output`` for training; returns a report.

    Episodes with a status in ``skip_statuses`` (default: not the policy's fault) are left out.
    Episodes and pairs become the chosen ``format``: ``eto``, the authors' layouts (SFT
    conversations with the instruction/"OK" opening; pairs as ``{id, prompt, chosen,
    rejected}`` of ShareGPT turns); ``messages``, chat messages (TRL's formats); ``episodes``,
    the full records. Ids are distinct (see :func:`_distinct_ids`). Then every
    ``drop_fields`` path is removed and every ``redact_patterns`` match in any text is replaced.
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
    ids = _distinct_ids([eto_id(r) if isinstance(r, Episode) else r.task_id for r in records])
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
    counts = [0] * len(cfg._compiled)
    rows = [_redact(r, cfg._compiled, cfg.replacement, counts) for r in rows]
    if out.suffix == ".json":  # a JSON list, as the authors' files (their trainers json.load them)
        write_atomic(out, json.dumps(rows, ensure_ascii=False, indent=2) + "\n")
    else:
        write_jsonl(out, rows)
    return {"inputs": [str(p) for p in paths], "output": str(out), "records_read": read, "exported": len(rows),
            "skipped": skipped, "dropped_fields": list(cfg.drop_fields),
            "redactions": dict(zip(cfg.redact_patterns, counts))}
