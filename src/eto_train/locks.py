"""One writer per stage folder: a lock file beside it (holder's pid, host, start time), taken
before the stage reads or touches anything and released when it finishes; a second process on
the same stage stops with :class:`StageLocked` (it does not wait). A process that ends (an error
included) leaves no lock file behind. :class:`eto_train.manifest.Stage` takes and drops it.
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any


class StageLocked(RuntimeError):
    """Another live process is running the same stage (its lock file names it)."""


# the lock file cannot be created: a read-only mount (EROFS, root included) or a folder without write permission
_CANNOT_WRITE = (errno.EROFS, errno.EACCES, errno.EPERM)


def cannot_write(exc: BaseException, stage_dir: str | os.PathLike) -> bool:
    """Whether ``exc`` (from :func:`acquire_lock`) says the stage's folder cannot be written at all, so
    that no writer can be there either: a finished stage may then be looked at without its lock. A
    lock file that exists but cannot be opened (another user's, perhaps live) is not such a case."""
    if not isinstance(exc, OSError) or exc.errno not in _CANNOT_WRITE:
        return False
    return exc.errno == errno.EROFS or not os.path.lexists(lock_path(stage_dir))


_held: dict[str, tuple[int, int]] = {}  # lock file -> (descriptor holding its flock, pid that took it)


def lock_path(stage_dir: str | os.PathLike) -> Path:
    """The lock file of a stage folder: beside it, so that it is never part of the folder's content."""
    d = Path(stage_dir)
    return d.parent / f".{d.name}.lock"


def _read_lock(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire_lock(stage_dir: str | os.PathLike, name: str) -> Path:
    """Take the stage's lock, or raise :class:`StageLocked` naming the live holder.

    The lock is an ``flock`` on the lock file, which the kernel drops when its holder dies (even
    by SIGKILL), so a lock left by a dead process is stale and simply taken over; the file says
    who holds it (pid, host, start time) for the error message. Where the file system has no
    ``flock``, the file alone decides: held unless its pid is no longer alive on this host.
    Re-entrant within one process (a stage retried in the same process takes its own lock again).
    """
    path = lock_path(stage_dir)
    key = os.path.abspath(path)
    if key in _held and _held[key][1] == os.getpid():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            info = _read_lock(path)
            if info.get("host") == host and isinstance(info.get("pid"), int) and not _pid_alive(info["pid"]):
                info["pid"] = f"{info['pid']} (exited; a process it forked still holds the lock)"
            _raise_locked(name, stage_dir, path, info)
        except (ImportError, OSError) as exc:  # no flock here: the pid rule
            if isinstance(exc, OSError) and exc.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                os.close(fd)
                raise
            info = _read_lock(path)
            pid = info.get("pid")
            if info and pid != os.getpid() and (info.get("host") != host or (isinstance(pid, int) and _pid_alive(pid))):
                os.close(fd)
                _raise_locked(name, stage_dir, path, info)
        try:  # the file may have been released (unlinked) between our open and our flock: retry then
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    info = {"pid": os.getpid(), "host": host, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "stage": name,
            "command": " ".join(sys.argv)[:500]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info, sort_keys=True) + "\n").encode(), 0)
    os.fsync(fd)
    _held[key] = (fd, os.getpid())
    return path


def _raise_locked(name: str, stage_dir, path: Path, info: dict[str, Any]) -> None:
    who = (f"pid {info.get('pid')} on {info.get('host')}, since {info.get('started_at')}"
           + (f": {info['command']}" if info.get("command") else "")) if info else "a process that is still starting"
    raise StageLocked(f"[{name}] {stage_dir} is being written by another process ({who}; lock file {path}). "
                      f"One writer per stage: this process stopped before touching it. Let the other one finish "
                      f"(or stop it), then run again.")


def release_lock(stage_dir: str | os.PathLike) -> None:
    """Drop the stage's lock if this process holds it (the file is removed first, then the flock)."""
    _release(lock_path(stage_dir))


def _release(path: Path) -> None:
    fd, pid = _held.pop(os.path.abspath(path), (None, None))
    if fd is None:
        return
    if pid != os.getpid():  # a forked child: the lock is its parent's
        os.close(fd)
        return
    try:
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            path.unlink()
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


@atexit.register
def _release_all() -> None:  # a process that ends (an error included) leaves no lock file behind
    for key in list(_held):
        _release(Path(key))
