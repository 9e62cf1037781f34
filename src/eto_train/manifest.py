"""A stage's folder and manifest: skip, rerun aside, swap in whole (:class:`Stage`).

A stage writes into its own folder with ``manifest.json``: the config sections it used (and
their hash), its inputs' content hashes, library versions, thread counts, metrics and status.
A finished stage whose config and inputs are unchanged is skipped (and says so).

Three rules keep what was written (see :class:`Stage`):

- one writer per stage folder: a lock file beside it (holder's pid, host, start time), taken
  before the stage reads or touches anything and released when it finishes; a second process
  on the same stage stops with :class:`~eto_train.locks.StageLocked` (it does not wait);
- check, then touch: a stage reads and checks its inputs before :meth:`Stage.begin`, the first
  call that writes;
- a finished result is replaced only by a whole new one: a stage that declares its ``outputs``
  reruns a finished folder in ``<folder>/.next/`` and swaps the new outputs in when it finishes
  (a swap cut by a kill is completed by the next run), so a failed rerun leaves the last good
  result and its "done" manifest in place.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from . import tracking
from .distributed import is_main
from .locks import acquire_lock, release_lock
from .runtime import _threads, config_hash, versions
from .store import file_sha256, umask_modes, write_json

NEXT, OLD = ".next", ".old"  # a rerun of a finished stage works in NEXT; OLD holds what a swap replaces


def _read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Stage:
    """A stage's folder and manifest: ``if stage.done(): return``, check the inputs, ``stage.begin()``,
    write under ``stage.work``, then ``stage.finish(...)``.

    ``done()`` takes the stage's lock (main process only; :class:`StageLocked` when another live
    process holds it) and keeps it unless the stage is up to date; ``finish()`` (or ``release()``)
    drops it. Nothing is written before ``begin()``, so a stage that checks its inputs between
    ``done()`` and ``begin()`` fails without touching its folder.

    ``outputs`` (the names of the files and folders the stage writes in its folder) let a rerun
    of a *finished* stage (other config or inputs) work aside: ``stage.work`` is then
    ``<folder>/.next``; the manifest in the folder stays "done" and its outputs stay in place
    until ``finish()``, which marks ``.next`` done (the commit) and swaps every output name in
    (an old output the new run did not write is removed). A kill during the swap is completed by
    the next ``done()``/``begin()``; an uncommitted ``.next`` of another config is discarded, one
    of the same config is resumed. A stage that was never finished (first run, or killed before
    it finished) works in its folder, as before: an interrupted run of the same config resumes
    there. Without ``outputs``, ``stage.work`` is always the folder.
    """

    def __init__(self, name: str, out_dir: str | os.PathLike, config: dict[str, Any],
                 inputs: dict[str, str | os.PathLike] | None = None, outputs: list[str] | None = None):
        self.name, self.dir, self.config = name, Path(out_dir), config
        self.inputs = {k: str(v) for k, v in (inputs or {}).items()}
        self.outputs = list(outputs) if outputs else None
        self.manifest_path = self.dir / "manifest.json"
        self.work = self.dir
        self.started = time.time()
        self._locked = False
        self._tracked = False  # this stage's wandb run is open (tracking.start in begin)

    def _input_hashes(self) -> dict[str, str]:
        out = {}
        for k, v in self.inputs.items():
            if not Path(v).exists():
                raise FileNotFoundError(f"stage {self.name}: input {k!r} not found at {v} "
                                        f"(run the stage that writes it first)")
            out[k] = file_sha256(v)
        return out

    def _same(self, manifest: dict[str, Any] | None) -> bool:
        return bool(manifest) and manifest.get("config_hash") == config_hash(self.config) \
            and manifest.get("input_hashes") == self.input_hashes

    def _prepare(self, lock: bool) -> None:
        """Take the lock (main process), complete a committed swap, decide where this run writes."""
        if lock and is_main():
            acquire_lock(self.dir, self.name)
            self._locked = True
            self._roll_forward()
        finished = (_read_manifest(self.manifest_path) or {}).get("status") == "done"
        self.work = self.dir / NEXT if self.outputs and finished else self.dir

    def done(self, lock: bool = True) -> bool:
        """True when a finished manifest matches this config and these inputs.

        Takes the stage's lock first (``lock=False``: a look at a finished copy elsewhere, e.g. a
        sweep's cache, which takes none); the lock is kept when the stage has work to do."""
        self.input_hashes = self._input_hashes()
        self._prepare(lock)
        old = _read_manifest(self.manifest_path)
        same = bool(old) and old.get("status") == "done" and self._same(old)
        if same:
            print(f"[{self.name}] up to date in {self.dir} (same config and inputs): nothing to do")
            if self._locked:
                self._discard(self.dir / NEXT)  # a rerun of another config that never finished
                self._discard(self.dir / OLD)
            self.release()
        return same

    def begin(self) -> bool:
        """Mark the stage running (the first write of a run: check every input before it).

        True when partial work in ``self.work`` may be resumed (an interrupted run with the same
        config and inputs); False means start clean. On a finished stage (with ``outputs``) this
        run works in ``.next`` and the folder's "done" manifest and outputs stay as they are."""
        if not hasattr(self, "input_hashes"):
            self.input_hashes = self._input_hashes()
        if not self._locked:
            self._prepare(lock=True)
        manifest = {"stage": self.name, "status": "running", "config": self.config,
                    "config_hash": config_hash(self.config), "inputs": self.inputs,
                    "input_hashes": self.input_hashes, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        main = is_main()  # the other processes of `accelerate launch` read, they never write the manifest
        if main and not self._tracked:
            tracking.start(self.name, self.config, self.dir)  # this stage's wandb run (when tracking)
            self._tracked = True
        if self.work != self.dir:  # a finished result stays in place until this run is whole
            old = _read_manifest(self.work / "manifest.json")
            resumable = bool(old) and old.get("status") == "running" and self._same(old)
            if main:
                if not resumable:
                    self._discard(self.work)
                self.work.mkdir(parents=True, exist_ok=True)
                write_json(self.work / ".outputs", self.outputs)
                write_json(self.work / "manifest.json", manifest)
            return resumable
        resumable = self._same(_read_manifest(self.manifest_path))
        if main:
            self._discard(self.dir / NEXT)
            write_json(self.manifest_path, manifest)
        return resumable

    def finish(self, metrics: dict[str, Any] | None = None, **extra: Any) -> None:
        umask_modes(self.work)  # checkpoints readable by the team, like every other output
        manifest = {
            "stage": self.name, "status": "done", "config": self.config,
            "config_hash": config_hash(self.config), "inputs": self.inputs,
            "input_hashes": getattr(self, "input_hashes", None) or self._input_hashes(),
            "versions": versions(), "threads": _threads(), "seconds": round(time.time() - self.started, 2),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "metrics": metrics or {}, **extra}
        if self.work != self.dir:
            write_json(self.work / "manifest.json", manifest)  # the commit: the new result is whole
            self._roll_forward()
            self.work = self.dir
        else:
            write_json(self.manifest_path, manifest)
        if is_main():
            if not self._tracked:  # a stage that wrote without begin() (e.g. `model`)
                tracking.start(self.name, self.config, self.dir)
            tracking.finish(metrics)  # the metrics into the stage's wandb run, which ends here
            self._tracked = False
        self.release()

    def adopt(self, src: str | os.PathLike, names: list[str]) -> None:
        """Make a finished copy of this very stage (same config and inputs, e.g. in a sweep's cache)
        this stage's result: copied into ``.next`` with its manifest, then swapped in whole."""
        src, nxt = Path(src), self.dir / NEXT
        self._discard(nxt)
        nxt.mkdir(parents=True)
        write_json(nxt / ".outputs", self.outputs or names)
        for name in names:
            (shutil.copytree if (src / name).is_dir() else shutil.copyfile)(src / name, nxt / name)
        shutil.copyfile(src / "manifest.json", nxt / ".manifest.json.tmp")
        os.replace(nxt / ".manifest.json.tmp", nxt / "manifest.json")  # the commit
        self._roll_forward()
        self.work = self.dir
        self.release()

    @property
    def metrics(self) -> dict[str, Any]:
        """The metrics of the finished result in the folder (trained now, adopted or up to date)."""
        return (_read_manifest(self.manifest_path) or {}).get("metrics", {})

    def reuse(self, cache: str | os.PathLike, names: list[str]) -> bool:
        """When ``cache`` holds a finished copy of this very stage (same config and inputs, by
        content: e.g. another job of a sweep trained it), make it this stage's result
        (:meth:`adopt`) and return True. Call after :meth:`done` said there is work."""
        if not Stage(self.name, cache, self.config, self.inputs).done(lock=False):
            return False
        print(f"[{self.name}] the same work already ran: reusing {cache}")
        self.adopt(cache, names)
        return True

    def publish(self, cache: str | os.PathLike, names: list[str]) -> None:
        """Copy this finished stage's outputs ``names`` and manifest to ``cache`` for :meth:`reuse`."""
        copy_outputs(self.dir, Path(cache), names)

    def release(self) -> None:
        """Drop the stage's lock (idempotent; finish() and an up-to-date done() call it)."""
        if self._tracked:  # a stage that began and did not finish: its wandb run failed
            tracking.finish(exit_code=1)
            self._tracked = False
        if self._locked:
            release_lock(self.dir)
            self._locked = False

    def _discard(self, p: Path) -> None:
        if p.exists():
            _remove(p)

    def _roll_forward(self) -> None:
        """Swap a committed ``.next`` (its manifest says done) into the folder; idempotent, so a
        swap cut by a kill is completed by whichever run comes next.

        Phase 1 moves every output name the folder has to ``.old``; ``.next/.phase2`` then marks
        that the folder holds no old output any more; phase 2 moves the new outputs in, then the
        manifest (so the folder's manifest says done only over the new outputs)."""
        nxt, old = self.dir / NEXT, self.dir / OLD
        m = _read_manifest(nxt / "manifest.json")
        if not m or m.get("status") != "done":
            return
        outputs = json.loads((nxt / ".outputs").read_text())
        if not (nxt / ".phase2").exists():
            old.mkdir(exist_ok=True)
            for name in outputs:
                cur = self.dir / name
                if cur.exists() or cur.is_symlink():
                    self._discard(old / name)
                    os.rename(cur, old / name)
            _fsync_dir(self.dir)
            write_json(nxt / ".phase2", {"outputs": outputs})
        for name in outputs:
            if (nxt / name).exists():
                self._discard(self.dir / name)
                os.rename(nxt / name, self.dir / name)
        os.replace(nxt / "manifest.json", self.manifest_path)
        _fsync_dir(self.dir)
        self._discard(nxt)
        self._discard(old)


def copy_outputs(src: Path, dst: Path, names: list[str]) -> None:
    """Copy a finished stage's outputs (files or folders) and then its manifest, each by a
    temporary name and a rename: a half-copied stage is never seen as done. Used to share a
    stage between sweep jobs that run it with the very same config and inputs."""
    import shutil

    dst.mkdir(parents=True, exist_ok=True)
    for name in [*names, "manifest.json"]:
        tmp, final = dst / f".{name}.tmp", dst / name
        if tmp.exists():
            shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
        if (src / name).is_dir():
            shutil.copytree(src / name, tmp)
            if final.exists():
                shutil.rmtree(final)
        else:
            shutil.copyfile(src / name, tmp)
        os.replace(tmp, final)
