"""The episode store: JSON Lines files, append-only, each line one whole record.

Appends write a complete line with one ``write`` on an ``O_APPEND`` descriptor and fsync it, so
a kill leaves at most one partial last line, which :func:`read_jsonl` reports (or, for resume,
skips with a warning) instead of silently dropping or mangling earlier records.
Whole-file outputs go through :func:`write_atomic` (temporary file, then rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import time
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator

from .layout import rebuild_hint
from .records import Episode, RecordError


def _rebuilt_by(path: Path) -> str:
    """For an error in a finished stage's output: which command rebuilds it (a rerun of that stage
    finds its output damaged and redoes it, manifest.Stage.done)."""
    hint = rebuild_hint(path)
    return f". {hint} to rebuild it" if hint else ""


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


def json_text(obj: Any) -> str:
    """``obj`` as :func:`write_json` writes it."""
    return json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"


def jsonl_text(rows: Iterable[dict[str, Any]]) -> str:
    """``rows`` as :func:`write_jsonl` writes them."""
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_atomic(path, json_text(obj))


MAIN_WRITE_WAIT_S = 1800.0  # how long another process waits for the main one's copy of a file it reads next


def write_main(path: str | os.PathLike, text: str, wait_s: float | None = None) -> None:
    """One writer per file under ``accelerate launch``, on one machine or several: the main process
    (global rank 0, never a machine's "local main") writes ``text`` whole; every other process writes
    nothing, and with ``wait_s`` waits until the file holds exactly ``text`` (it is what it reads next,
    e.g. the pairs file DPO hashes as its input), then an error naming the file and both ranks."""
    from .distributed import is_main, poll, rank

    path = Path(path)
    if is_main():
        write_atomic(path, text)
        return
    if wait_s is None:
        return
    want = text.encode("utf-8")

    def same():
        try:
            return True if path.read_bytes() == want else None
        except OSError:
            return None

    try:
        poll(same, poll_s=2.0, timeout_s=wait_s)
    except TimeoutError:
        raise RuntimeError(f"[rank {rank()}] {path}: the main process (rank 0) has not written what this process built "
                           f"after {wait_s:.0f} s (the file is missing or differs): the ranks disagree on their inputs, or "
                           f"rank 0 stopped; run the same command again on every machine") from None


def write_json_if_changed(path: str | os.PathLike, obj: Any) -> bool:
    """:func:`write_json`, unless ``path`` already holds exactly these bytes (then nothing is written,
    so a rerun on a finished run folder, read-only included, leaves it as it was). True if written."""
    text = json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"
    try:
        if Path(path).read_bytes() == text.encode("utf-8"):
            return False
    except OSError:
        pass
    write_atomic(path, text)
    return True


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict[str, Any]]) -> None:
    """A whole JSON Lines file, written atomically (temporary file, then rename)."""
    write_atomic(path, jsonl_text(rows))


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
    if path.suffix == ".gz":  # a study's results folder keeps its episodes compressed (results.py)
        import gzip

        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise RecordError(f"{path}: not a whole gzip file ({exc}){_rebuilt_by(path)}") from None
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
            raise RecordError(f"{path}:{i}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
                              f"{_rebuilt_by(path)}") from None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            hint = " (truncated line?)" if i == len(lines) and tail_partial else ""
            raise RecordError(f"{path}:{i}: malformed JSON: {exc.msg} at column {exc.colno}{hint}"
                              f"{_rebuilt_by(path)}") from None
        yield i, obj


def read_episodes(path: str | os.PathLike, allow_partial_tail: bool = False) -> list[Episode]:
    out = []
    for lineno, obj in read_jsonl(path, allow_partial_tail=allow_partial_tail):
        try:
            out.append(Episode.from_dict(obj))
        except (ValueError, TypeError, KeyError) as exc:
            raise RecordError(f"{path}:{lineno}: not an episode record: {exc}{_rebuilt_by(Path(path))}") from None
    return out


def append_episodes(path: str | os.PathLike, episodes: Iterable[Episode]) -> None:
    append_jsonl(path, (ep.to_dict() for ep in episodes))


# -- content identity of a folder: hashed once, then checked by a stat per file -----------------------
#
# Hashing a 7B checkpoint reads ~13 GB; a stage checks its inputs every run. The first hash of a
# folder is kept in ``<folder>/.identity.json`` with each hashed file's relative path, size and
# mtime_ns; a later request whose listing and stats all match is answered from it (no content is
# read). The sidecar is never part of any hash (nor are its temporary files), so no hash changes.
# It moves with its folder (a stage's outputs are swapped in by rename) and stays valid across a
# ``copytree`` (which keeps mtimes). ``full=True`` or ETO_TRAIN_FULL_HASH=1 re-hashes (and refreshes it).

IDENTITY_FILE = ".identity.json"
IDENTITY_FORMAT = 1
FULL_HASH_ENV = "ETO_TRAIN_FULL_HASH"
# A file modified less than this before it was hashed is not trusted from its stats ("racily
# clean", as git calls it): a later write within the same timestamp tick (1-2 s on some file
# systems) would keep its size and mtime. Such an identity is not kept; the next request re-hashes.
IDENTITY_RACY_NS = 2_000_000_000
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def is_identity_file(name: str) -> bool:
    """The identity sidecar or one of its temporary files (see :func:`write_atomic`): never hashed."""
    return name == IDENTITY_FILE or (name.startswith(f".{IDENTITY_FILE}.") and name.endswith(".tmp"))


def full_hash_forced() -> bool:
    return os.environ.get(FULL_HASH_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def sha256_files(root: str | os.PathLike, files: list[Path]) -> str:
    """SHA-256 over each file's path relative to ``root`` followed by its bytes, in the given order."""
    root, h = Path(root), hashlib.sha256()
    for f in files:
        h.update(str(Path(f).relative_to(root)).encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _file_stats(root: Path, files: list[Path]) -> list[list]:
    out = []
    for f in files:
        st = os.stat(f)
        out.append([Path(f).relative_to(root).as_posix(), st.st_size, st.st_mtime_ns])
    return out


def _read_identities(folder: Path) -> dict[str, Any]:
    """The sidecar's entries by kind; {} when it is absent, unreadable or not ours (ignored)."""
    try:
        data = json.loads((folder / IDENTITY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != IDENTITY_FORMAT or not isinstance(data.get("entries"), dict):
        return {}
    return data["entries"]


def _valid_entry(entry: Any) -> bool:
    if not isinstance(entry, dict):
        return False
    sha, at, files = entry.get("sha256"), entry.get("hashed_at_ns"), entry.get("files")
    return (isinstance(sha, str) and bool(_SHA256_HEX.fullmatch(sha)) and type(at) is int and isinstance(files, list)
            and all(isinstance(r, list) and len(r) == 3 and isinstance(r[0], str) and type(r[1]) is int
                    and type(r[2]) is int for r in files))


def _trusted(stats: list[list], hashed_at_ns: int) -> bool:
    return all(mtime < hashed_at_ns - IDENTITY_RACY_NS for _, _, mtime in stats)


def cached_identity(folder: str | os.PathLike, kind: str) -> dict[str, Any] | None:
    """The kept identity of ``kind`` in ``folder`` ({"sha256", "hashed_at_ns", "files"}), unchecked; None if none."""
    entry = _read_identities(Path(folder)).get(kind)
    return entry if _valid_entry(entry) else None


def identity_sha256(folder: str | os.PathLike, kind: str, files: list[Path], full: bool = False) -> str:
    """:func:`sha256_files` of ``files`` under ``folder``, answered from ``folder``'s sidecar
    when it holds an identity of this ``kind`` over exactly these files with the same sizes and
    mtimes; otherwise hashed, and the sidecar updated (atomically; a folder that cannot be written,
    e.g. read-only, simply gets none). ``kind`` names the selection of files and the hashing."""
    folder = Path(folder)
    started = time.time_ns()
    stats = _file_stats(folder, files)
    if not (full or full_hash_forced()):
        entry = cached_identity(folder, kind)
        if entry is not None and entry["files"] == stats and _trusted(stats, entry["hashed_at_ns"]):
            return entry["sha256"]
    sha = sha256_files(folder, files)
    try:
        if _trusted(stats, started) and _file_stats(folder, files) == stats:  # nothing moved while hashed
            _keep_identity(folder, kind, {"sha256": sha, "hashed_at_ns": started, "files": stats})
    except OSError:  # a read-only folder, a file gone meanwhile: no sidecar, same answer
        pass
    return sha


def _keep_identity(folder: Path, kind: str, entry: dict[str, Any]) -> None:
    from .distributed import is_main

    if not os.access(folder, os.W_OK) or not is_main():  # one writer per file: the main process's sidecar
        return
    entries = {k: v for k, v in _read_identities(folder).items() if _valid_entry(v)}
    entries[kind] = entry
    write_atomic(folder / IDENTITY_FILE,
                 json.dumps({"format": IDENTITY_FORMAT, "entries": entries}, sort_keys=True) + "\n")


def file_sha256(path: str | os.PathLike, full: bool = False) -> str:
    """SHA-256 of a file (its name, then its bytes) or of a folder (each file under it, sorted: its
    relative path, then its bytes; the identity sidecar excepted).

    A folder's hash is kept in its ``.identity.json`` and answered from there while every file's
    size and mtime_ns match and none was added or removed (a stat per file, no content read);
    ``full=True`` or ETO_TRAIN_FULL_HASH=1 re-hashes every byte (see :func:`identity_sha256`)."""
    p = Path(path)
    if not p.is_dir():
        return sha256_files(p.parent, [p])
    files = sorted(f for f in p.rglob("*") if f.is_file() and not is_identity_file(f.name))
    return identity_sha256(p, "file_sha256", files, full=full)
