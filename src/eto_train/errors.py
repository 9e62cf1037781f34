"""What a failed command prints: one block that names the key, file or folder, and an exit status.

``eto-train`` (cli.py) runs every stage under :func:`reporting`. An error the project raises on
purpose, a bad value, a bad override, a missing or damaged input, is printed as its own message
(``eto-train <stage>: <message>``) with exit status 2, without Hydra's traceback; a full disk or
a read-only folder is printed as one block naming the stage, the path, the free space and how to
resume, exit status 1; anything else (a bug) keeps Python's traceback, exit status 1.
``ETO_TRAIN_TRACEBACK=1`` (or Hydra's own ``HYDRA_FULL_ERROR=1``) prints the full traceback
before the message.

"Raised on purpose" is: an exception class the project defines (CheckpointError, RecordError,
NonFiniteError, StageLocked, EnvironmentFailure, ConfigError, ...), a ``ValueError`` /
``RuntimeError`` / ``FileNotFoundError`` raised by a ``raise`` in the project's own code, or a
Hydra / OmegaConf config error (an unknown key, a missing config group option, a value of the
wrong type, an interpolation that does not resolve). An override of a key that the section does
not have gets the sections that do have it: ``eval.beta=0.1`` -> "did you mean eto.dpo.beta?".
"""

from __future__ import annotations

import difflib
import errno
import os
import re
import shutil
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

TRACEBACK_ENV = "ETO_TRAIN_TRACEBACK"
BAD_INPUT = 2  # a bad config value or input: the command is wrong, not the machine
FAILED = 1  # the machine (disk) or a bug
_PACKAGE = str(Path(__file__).resolve().parent)
_ON_PURPOSE = (ValueError, RuntimeError, FileNotFoundError, NotADirectoryError, FileExistsError)
full_traceback = False  # set by cli.main from wants_traceback(), before it sets HYDRA_FULL_ERROR for Hydra
DISK_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
               errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
               errno.EPERM: "operation not permitted"}


class ConfigError(ValueError):
    """A config that cannot run: every bad value named, a line ``<dotted.key>=<value>: <what is
    allowed>`` each (:func:`eto_train.config.load`), or one sentence (e.g. a finished stage made
    under another config schema, manifest.py)."""

    def __init__(self, lines: list[str] | str) -> None:
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        if isinstance(lines, str):
            text = lines
        else:
            n = len(self.lines)
            text = (f"{n} bad config value{'s' if n > 1 else ''} (nothing was run or written):\n  "
                    + "\n  ".join(self.lines))
        super().__init__(text)


def wants_traceback() -> bool:
    """ETO_TRAIN_TRACEBACK or HYDRA_FULL_ERROR set (to anything but empty / 0)."""
    return any(os.environ.get(k, "") not in ("", "0") for k in (TRACEBACK_ENV, "HYDRA_FULL_ERROR"))


def _raised_here(exc: BaseException) -> bool:
    """The innermost frame of the traceback is in this package (a ``raise`` of ours)."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and str(Path(last.tb_frame.f_code.co_filename).resolve()).startswith(_PACKAGE)


def is_config_error(exc: BaseException) -> bool:
    """Hydra's and OmegaConf's errors about the config itself (composition, keys, types)."""
    try:
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException
    except ImportError:  # pragma: no cover - both are dependencies
        return False
    return isinstance(exc, (HydraException, OmegaConfBaseException))


def is_input_error(exc: BaseException) -> bool:
    """An error the project raises on purpose about the config or an input (exit status 2)."""
    if is_disk_error(exc):
        return False
    cls = type(exc)
    ours = cls.__module__.startswith("eto_train.") and not cls.__name__.startswith("_")
    return ours or is_config_error(exc) or (isinstance(exc, _ON_PURPOSE) and _raised_here(exc))


def is_disk_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_ERRNOS


def _existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_space(path: str | Path) -> str:
    """``"<free> free of <total>"`` on the file system holding ``path`` (its nearest existing folder)."""
    try:
        usage = shutil.disk_usage(_existing(Path(path)))
    except OSError:
        return "free space unknown"
    return f"{_size(usage.free)} free of {_size(usage.total)}"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""  # unreachable


def free_inodes(path: str | Path) -> tuple[int, int] | None:
    """(free, total) inodes of the file system holding ``path``; None where it does not count them
    (a total of 0: btrfs, some network file systems)."""
    try:
        st = os.statvfs(_existing(Path(path)))
    except (OSError, AttributeError):
        return None
    return (st.f_favail, st.f_files) if st.f_files else None


def disk_message(exc: OSError, stage: str | None = None) -> str:
    """A full disk or a folder that cannot be written, as one block: stage, path, free space, what to do.
    ENOSPC on a file system with bytes left but no free inode says inodes (one per file or folder)."""
    path = exc.filename or "?"
    what = DISK_ERRNOS.get(exc.errno, exc.strerror or "cannot write")
    where = f" [{stage}]" if stage else ""
    inodes = free_inodes(path) if exc.errno == errno.ENOSPC else None
    if inodes is not None and inodes[0] == 0:
        return (f"cannot write{where} {path}: no free inodes left on its file system (0 of {inodes[1]:,} inodes free, "
                f"one per file or folder; {free_space(path)}: the space is there, the file count is not); remove "
                f"files you do not need there (many small ones, e.g. old runs' logs or caches) and rerun the same "
                f"command: finished work is kept and an interrupted stage resumes")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        todo = "free space and rerun the same command: finished work is kept and an interrupted stage resumes"
    else:
        todo = ("make the folder writable (or point paths.runs at a writable folder) and rerun the same command: "
                "finished work is kept")
    return f"cannot write{where} {path}: {what} ({free_space(path)}); {todo}"


# -- a library's write that failed for lack of space ---------------------------------------------------
# torch's zip writer (``[enforce fail at inline_container.cc:...] . unexpected pos``, ``PytorchStreamWriter
# failed writing file ...: file write failed``) and safetensors (``IoError(Os { code: 28, kind: StorageFull``)
# report a full disk without an errno or a path
_WRITER_FAILED = re.compile(r"inline_container\.cc|unexpected pos|PytorchStreamWriter failed|file write failed"
                            r"|IoError|Error while serializing", re.I)
_SAYS_FULL = re.compile(r"No space left on device|StorageFull|os error 28|code: 28\b|Disk quota exceeded"
                        r"|QuotaExceeded|os error 122", re.I)


def _full(folder: Path) -> int | None:
    """ENOSPC or EDQUOT when ``folder``'s file system cannot take 1 MiB more (tried: a file written,
    synced and removed), or has no free inode; else None."""
    inodes = free_inodes(folder)
    if inodes is not None and inodes[0] == 0:
        return errno.ENOSPC
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(prefix=".eto-space-probe-", dir=_existing(folder))
    except OSError as exc:
        return exc.errno if exc.errno in (errno.ENOSPC, errno.EDQUOT) else None
    try:
        os.write(fd, b"\0" * (1 << 20))
        os.fsync(fd)
    except OSError as exc:
        return exc.errno if exc.errno in (errno.ENOSPC, errno.EDQUOT) else None
    finally:
        os.close(fd)
        os.unlink(probe)
    return None


def as_disk_error(exc: BaseException, path: str | Path) -> OSError | None:
    """``exc`` (raised while writing under ``path``) as the disk error it is, or None: an OSError
    ENOSPC/EDQUOT anywhere in its chain, or a write of torch's or safetensors' that failed (their
    messages name neither the errno nor the file) while ``path``'s file system is full. The OSError
    names ``path``, so the CLI prints the one block (stage, path, free space, what to do)."""
    seen, e = set(), exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return OSError(e.errno, os.strerror(e.errno), e.filename or str(path))
        e = e.__cause__ or e.__context__
    text = str(exc)
    if _SAYS_FULL.search(text):
        code = errno.EDQUOT if re.search(r"quota|os error 122", text, re.I) else errno.ENOSPC
        return OSError(code, os.strerror(code), str(path))
    if _WRITER_FAILED.search(text):
        code = _full(Path(path))
        if code is not None:
            return OSError(code, os.strerror(code), str(path))
    return None


# -- a key of another section ---------------------------------------------------------------------
_OVERRIDE = re.compile(r"Could not override '([^']+)'")
_NOT_IN_STRUCT = re.compile(r"Key '([^']+)' is not in struct\s+full_key: (\S+)")


def _keys(node, prefix: str = "") -> Iterator[str]:
    from omegaconf import DictConfig

    for k in node.keys() if isinstance(node, DictConfig) else []:
        path = f"{prefix}{k}"
        yield path
        try:
            child = node._get_node(k)
        except Exception:  # pragma: no cover - a key always has a node
            continue
        if isinstance(child, DictConfig):
            yield from _keys(child, path + ".")


def suggest(key: str, cfg) -> list[str]:
    """Where a key that ``key``'s section does not have lives: the keys with the same last name
    elsewhere in the composed config, else the closest spellings."""
    keys = [k for k in _keys(cfg) if not k.startswith("hydra.")]
    leaf = key.rpartition(".")[2]
    same = [k for k in keys if k.rpartition(".")[2] == leaf and k != key]
    if same:
        return same
    leaves = difflib.get_close_matches(leaf, {k.rpartition(".")[2] for k in keys}, n=3, cutoff=0.8)
    near = [k for k in keys if k.rpartition(".")[2] in leaves]
    return near[:4] or difflib.get_close_matches(key, keys, n=3, cutoff=0.75)


def _section_keys(key: str, cfg) -> str:
    from omegaconf import DictConfig, OmegaConf

    section = key.rpartition(".")[0]
    node = OmegaConf.select(cfg, section, default=None) if section else cfg
    if not isinstance(node, DictConfig):
        return ""
    names = sorted(str(k) for k in node.keys())
    shown = ", ".join(names[:24]) + (", ..." if len(names) > 24 else "")
    return f"; {section or 'the top level'} has: {shown}"


def override_message(exc: BaseException, overrides: list[str], compose) -> str | None:
    """Hydra's "Could not override 'eval.beta' ... Key 'beta' is not in struct" as one line naming the
    key, its value, the section's keys and where a key of that name is; ``compose(overrides)`` gives
    the config composed without the bad override. None when ``exc`` is another error."""
    text = f"{exc}\n{exc.__cause__ or ''}"
    m = _OVERRIDE.search(text)
    if not m or "not in struct" not in text:
        return None
    key = m.group(1)
    given = [o for o in overrides if o.lstrip("~+").partition("=")[0] == key]
    value = given[-1].partition("=")[2] if given else "?"
    rest = [o for o in overrides if o not in given]
    try:
        cfg = compose(rest)
    except Exception:
        try:
            cfg = compose([])
        except Exception:
            cfg = None
    hint, section = "", ""
    if cfg is not None:
        found = suggest(key, cfg)
        hint = f"; did you mean {' or '.join(found)}?" if found else ""
        section = _section_keys(key, cfg)
    section_name, _, leaf = key.rpartition(".")
    return (f"{key}={value}: no such key ({section_name or 'the config'} has no {leaf!r}: not in struct){hint} "
            f"(a key added on purpose: +{key}={value}){section}")


# -- the report --------------------------------------------------------------------------------
def _print(stage: str, text: str, exc: BaseException) -> None:
    sys.stdout.flush()
    if full_traceback:
        traceback.print_exception(exc)
    sys.stderr.write(f"eto-train {stage}: {text}\n")
    sys.stderr.flush()


def message(exc: BaseException, overrides: list[str] | None = None, compose=None,
            stage: str | None = None) -> tuple[str, int] | None:
    """The block to print for ``exc`` and the exit status, or None for an error that is no one's
    input (a bug: Python's traceback)."""
    if is_disk_error(exc):
        return disk_message(exc, stage), FAILED
    if not is_input_error(exc):
        return None
    if compose is not None:
        line = override_message(exc, overrides or [], compose)
        if line is not None:
            return line, BAD_INPUT
    text = str(exc)
    if is_config_error(exc):  # Hydra's advice to set HYDRA_FULL_ERROR is ours to give
        cause = exc.__cause__
        if cause is not None and str(cause) not in text:
            text = f"{text}\n{cause}"
        text = text.split("Config search path:")[0]  # Hydra's list of its own config sources
        text = "\n".join(line for line in text.splitlines() if "HYDRA_FULL_ERROR" not in line).strip()
    cls = type(exc)
    if cls.__module__.startswith("eto_train."):  # a named error says its name (CheckpointError: ...)
        text = f"{cls.__name__}: {text}"
    return text or cls.__name__, BAD_INPUT


@contextmanager
def reporting(stage: str, overrides: list[str] | None = None, compose=None, running=None) -> Iterator[None]:
    """Print a config, input or disk error as one block and exit 2 (input) or 1 (disk); let others
    through. ``running()``: the stage (manifest name) that was running, for a disk error."""
    try:
        yield
    except Exception as exc:
        sub = None
        if is_disk_error(exc) and running is not None:
            try:
                sub = running()
            except Exception:
                sub = None
        found = message(exc, overrides, compose, stage=sub or stage)
        if found is None:
            raise
        text, code = found
        _print(stage, text, exc)
        raise SystemExit(code) from None


# -- a failed start leaves no folder ------------------------------------------------------------
HYDRA_FILES = {".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml"}


def only_hydra_files(folder: Path) -> bool:
    """``folder`` holds nothing but what Hydra writes at start: .hydra/*.yaml and an empty or
    Hydra-only ``<job>.log``."""
    if not folder.is_dir():
        return False
    files = {str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir()}
    logs = {f for f in files if "/" not in f and f.endswith(".log")}
    return files - logs <= HYDRA_FILES and len(logs) <= 1


def remove_start_folders(log_dir: Path, fresh: list[Path]) -> None:
    """Remove Hydra's log folder of a failed start (only if it holds nothing but Hydra's own
    files), then the folders in ``fresh`` (created by this command: e.g. ``<run>/logs``,
    ``<run>``) that are now empty. Nothing else is touched."""
    if only_hydra_files(log_dir):
        shutil.rmtree(log_dir, ignore_errors=True)
    for folder in fresh:
        try:
            folder.rmdir()  # only when empty
        except OSError:
            pass


def remove_empty_tree(folder: Path) -> None:
    """Remove ``folder`` and its sub-folders if they hold no file at all (bottom up)."""
    if not folder.is_dir():
        return
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        try:
            sub.rmdir()
        except OSError:
            pass
    try:
        folder.rmdir()
    except OSError:
        pass


def writable(folder: Path) -> bool:
    """Whether a folder can be created in (or under) ``folder``: tried, not guessed (root ignores
    permission bits; a read-only mount refuses root too). A full file system counts as writable."""
    import tempfile

    base = _existing(folder)
    try:
        probe = tempfile.mkdtemp(prefix=".eto-write-probe-", dir=base)
    except OSError as exc:
        # a full file system (no space, no inode, quota) is writable: the write that fails says so, in one block
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    os.rmdir(probe)
    return True
