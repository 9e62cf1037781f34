"""Ctrl-C in every script: one line saying what was kept, exit status 130, no traceback.

Stages write as they go (rollouts append each finished episode to ``episodes.jsonl``, trainers
save checkpoints) and a rerun of the same command resumes (tests/test_resume.py), so an
interrupted script needs no cleanup of its own beyond stopping simulators and engines. Each
script wraps its work, and its start-up::

    @hydra.main(...)
    def main(cfg):
        with interruptible(cfg):  # cfg: where to look for what was kept
            ...

    if __name__ == "__main__":
        with interruptible():  # a Ctrl-C while Hydra composes the config
            main()

On SIGINT the handler marks the process as interrupted (:func:`interrupted`; the rollout loop
then stops retrying environment calls and the adapters close their games without complaint),
silences py4j's logging (it logs a traceback for a call cut short, some of them through the root
logger, and one per Java object it can no longer reach) and raises ``KeyboardInterrupt``. When
that, or any error raised after the interrupt, reaches :func:`interruptible`, it prints one line
(the stage that was running and, for a rollout stage, how many of its episodes are recorded in
which file) and exits with status 130, the shell's status for a SIGINT.

The simulator JVMs run in their own process groups (see envs/scienceworld.py and
envs/textworld_express.py): a Ctrl-C at the terminal reaches Python only, and Python stops them,
instead of every JVM dying under calls in flight.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from . import layout

EXIT_STATUS = 130  # 128 + SIGINT, as a shell reports a Ctrl-C
_INTERRUPTED = threading.Event()
_said = threading.Event()
_active: list["_Guard"] = []


def interrupted() -> bool:
    """True once this process received SIGINT (inside :func:`interruptible`)."""
    return _INTERRUPTED.is_set()


def _from_py4j(record: logging.LogRecord) -> bool:
    return f"{os.sep}py4j{os.sep}" in (record.pathname or "") or record.name.startswith("py4j")


def _root_filter(record: logging.LogRecord) -> bool:
    """Drop py4j's records once interrupted (py4j logs some through the root logger)."""
    return not (_INTERRUPTED.is_set() and _from_py4j(record))


def quiet() -> None:
    """Silence what stopping leaves behind: py4j's loggers, errors of threads and finalizers."""
    for name in ["py4j", *[n for n in list(logging.root.manager.loggerDict) if n.startswith("py4j.")]]:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    logging.disable(logging.INFO)  # libraries' chatter at exit (torch's cache statistics, among others)
    threading.excepthook = lambda args: None  # a thread cut short by the stop
    sys.unraisablehook = lambda unraisable: None  # a __del__ that reaches a stopped JVM


class _Guard:
    def __init__(self, cfg: Any, resume: bool) -> None:
        self.cfg, self.resume, self.started = cfg, resume, time.time()

    def _roots(self) -> list[Path]:
        if self.cfg is None:
            return []
        from omegaconf import OmegaConf

        roots: list[Path] = []
        for key in ("paths.run", "paths.base"):
            try:
                value = OmegaConf.select(self.cfg, key)
            except Exception:  # an unresolvable interpolation: that root is not known
                value = None
            if value and Path(str(value)).is_dir() and Path(str(value)) not in roots:
                roots.append(Path(str(value)))
        return roots

    def _running_stage(self) -> tuple[Path, dict] | None:
        """The manifest of the stage this process left running (the newest one it touched)."""
        found = []
        for root in self._roots():
            for m in root.rglob(layout.MANIFEST):
                try:
                    if m.stat().st_mtime < self.started - 1:
                        continue
                    data = json.loads(m.read_text())
                except (OSError, ValueError):
                    continue
                if data.get("status") == "running":
                    found.append((m.stat().st_mtime, m, data))
        if not found:
            return None
        _, m, data = max(found, key=lambda x: x[0])
        return m.parent, data

    def line(self) -> str:
        """What was kept, in one line."""
        again = "rerun the same command to resume" if self.resume else "rerun the same command to start again"
        try:
            running = self._running_stage()
        except Exception:  # the message must not fail
            running = None
        if running is None:
            where = f" in {self._roots()[0]}" if self._roots() else ""
            if not self.resume:
                return f"interrupted; {again}"
            return f"interrupted: finished stages and episodes recorded so far are kept{where}; {again}"
        folder, manifest = running
        name = manifest.get("stage", folder.name)
        episodes = layout.episodes(folder)
        total = (manifest.get("config") or {}).get("episodes")
        shard_files = sorted((folder / layout.SHARDS).glob("rank*.jsonl"))
        if total is not None and not episodes.exists() and not shard_files:
            # a rollout stage stopped before its first episode (loading the policy, starting the games)
            return (f"interrupted: {name} stopped before its first episode was recorded (no {episodes} yet: nothing "
                    f"of it to keep; stages finished before it are kept); {again}")
        if episodes.exists() or total is not None:
            # a data-parallel play keeps what each rank recorded in its shard until the merge
            sharded = sum(map(_complete_lines, shard_files))
            n = _complete_lines(episodes) + sharded
            of = f" of {total}" if total is not None else ""
            where = f"{episodes} and {folder / layout.SHARDS}" if sharded else episodes
            return f"interrupted: {n}{of} episodes of {name} kept in {where}; {again}"
        # whole checkpoints only: the Trainer writes trainer_state.json last (training/resume.py)
        whole = [c for c in layout.checkpoints(folder).glob("checkpoint-*") if (c / layout.TRAINER_STATE).is_file()]
        ckpts = sorted(whole, key=_step)
        if ckpts:
            return (f"interrupted: {name} stopped; its checkpoints up to {ckpts[-1].name} are kept in "
                    f"{ckpts[-1].parent}; {again}")
        return f"interrupted: {name} stopped (nothing of it is saved yet; stages finished before it are kept); {again}"

    def say(self) -> None:
        if _said.is_set():  # one line per process, whichever guard (script, start-up) gets there first
            return
        _said.set()
        from .distributed import is_main

        if is_main():  # under accelerate every process gets the Ctrl-C; one line is enough
            sys.stdout.flush()
            sys.stderr.write(self.line() + "\n")
            sys.stderr.flush()


def _step(checkpoint: Path) -> int:
    n = checkpoint.name.rpartition("-")[2]
    return int(n) if n.isdigit() else -1


def _complete_lines(path: Path) -> int:
    """Records in a JSONL file, leaving out a last line cut short by the interrupt."""
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _on_sigint(signum, frame) -> None:
    if _INTERRUPTED.is_set():  # a second Ctrl-C while stopping: stop now (the simulator JVMs end
        if _active:            # with this process: their stdin closes)
            _active[-1].say()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(EXIT_STATUS)
    _INTERRUPTED.set()
    quiet()
    raise KeyboardInterrupt


@contextmanager
def interruptible(cfg: Any = None, resume: bool = True) -> Iterator[None]:
    """Run a script's work; a Ctrl-C ends it with one line and exit status 130.

    ``cfg``: the Hydra config (its ``paths.run`` / ``paths.base`` are searched for the stage that
    was running); ``resume``: whether rerunning the command resumes (stage scripts) or starts
    over (bench, export, reports).
    """
    guard = _Guard(cfg, resume)
    _active.append(guard)
    root_filter_added = _root_filter not in logging.root.filters
    if root_filter_added:
        logging.root.addFilter(_root_filter)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    except BaseException as exc:
        # Ctrl-C, or whatever an interrupted call raised on its way out (a simulator call cut
        # short, a closed engine): the interrupt is the cause
        if isinstance(exc, KeyboardInterrupt) or (_INTERRUPTED.is_set() and not isinstance(exc, SystemExit)):
            _INTERRUPTED.set()
            quiet()
            guard.say()
            raise SystemExit(EXIT_STATUS) from None
        raise
    finally:
        _active.remove(guard)
        if previous is not None and not _INTERRUPTED.is_set():  # once interrupted, a second Ctrl-C during
            signal.signal(signal.SIGINT, previous)              # the exit (JVMs stopping) still ends it quietly
        if root_filter_added and not _INTERRUPTED.is_set():
            logging.root.removeFilter(_root_filter)
