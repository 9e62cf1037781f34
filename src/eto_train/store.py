"""The episode store: JSON Lines files, append-only, each line one whole record.

Appends write a complete line with one ``write`` on an ``O_APPEND`` descriptor and fsync it, so
a kill leaves at most one partial last line, which :func:`read_jsonl` reports (or, for resume,
skips with a warning) instead of silently dropping or mangling earlier records.
Whole-file outputs go through :func:`write_atomic` (temporary file, then rename).
"""

from __future__ import annotations

import json
import os
import secrets
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator

from .records import Episode, RecordError


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` whole: a temporary file beside ``path``, fsynced, then renamed over it.

    The temporary file is created with mode 0666 and the process's umask, like any file the
    process opens (``tempfile.mkstemp`` would make it 0600, and the rename would keep that:
    teammates could not read the manifests)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def umask_modes(folder: str | os.PathLike) -> int:
    """Give the files under ``folder`` that a library wrote as 0600 the process's normal mode
    (0666 less the umask); returns how many changed. safetensors (and ``tempfile``) create their
    files 0600, so without this a teammate or a job under another user could not load a checkpoint
    the stage wrote. Files with any other mode were set on purpose and are left alone."""
    mask = os.umask(0)
    os.umask(mask)
    mode, changed = 0o666 & ~mask, 0
    if mode == 0o600:
        return 0
    for f in Path(folder).rglob("*"):
        if f.is_file() and not f.is_symlink() and (f.stat().st_mode & 0o777) == 0o600:
            f.chmod(mode)
            changed += 1
    return changed


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict[str, Any]]) -> None:
    """A whole JSON Lines file, written atomically (temporary file, then rename)."""
    write_atomic(path, "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))


def append_jsonl(path: str | os.PathLike, rows: Iterable[dict[str, Any]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)  # less the umask
    try:
        for row in rows:
            line = (json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")
            os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_partial_tail(path: str | os.PathLike) -> int:
    """Cut a partial last line (a write interrupted by a kill); returns the bytes dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return 0
    keep = data.rfind(b"\n") + 1
    warnings.warn(f"{path}: dropped a partial last line ({len(data) - keep} bytes) left by an interrupted write")
    with open(path, "r+b") as f:
        f.truncate(keep)
    return len(data) - keep


def read_jsonl(path: str | os.PathLike, allow_partial_tail: bool = False) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object). Errors name the file and line.

    ``allow_partial_tail`` tolerates a last line without its newline (a write cut by a kill):
    it is skipped with a warning, never parsed as a record.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail_partial = bool(lines) and lines[-1] != b""
    for i, raw in enumerate(lines, start=1):
        if raw.strip() == b"":
            continue
        if i == len(lines) and tail_partial and allow_partial_tail:
            warnings.warn(f"{path}:{i}: partial last line (interrupted write) skipped")
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError(f"{path}:{i}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            hint = " (truncated line?)" if i == len(lines) and tail_partial else ""
            raise RecordError(f"{path}:{i}: malformed JSON: {exc.msg} at column {exc.colno}{hint}") from None
        yield i, obj


def read_episodes(path: str | os.PathLike, allow_partial_tail: bool = False) -> list[Episode]:
    out = []
    for lineno, obj in read_jsonl(path, allow_partial_tail=allow_partial_tail):
        try:
            out.append(Episode.from_dict(obj))
        except (ValueError, TypeError, KeyError) as exc:
            raise RecordError(f"{path}:{lineno}: not an episode record: {exc}") from None
    return out


def append_episodes(path: str | os.PathLike, episodes: Iterable[Episode]) -> None:
    append_jsonl(path, (ep.to_dict() for ep in episodes))
