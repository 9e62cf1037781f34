"""A stage's folder and manifest: skip, rerun aside, swap in whole (:class:`Stage`).

A stage writes into its own folder with ``manifest.json``: the config sections it used (and
their hash), its inputs' content hashes, library versions, thread counts, metrics and status.
A finished stage whose config and inputs are unchanged is skipped (and says so); so is one whose
config differs only in keys that change how a training runs, not what it computes
(:data:`RESULT_NEUTRAL`: logging and checkpoint frequency, activation checkpointing).

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

Two more keep a finished result honest (:class:`DamagedManifest`, :meth:`Stage.damage`):

- a manifest that cannot be read (not JSON, cut short, not a stage's manifest) stops the stage
  with an error naming the file; it is never taken for "not finished" (which would start over
  and, for a rollout stage, replay over the finished episodes);
- done means whole: ``finish()`` records each declared output's files (sizes, mtimes) and
  content hash in the manifest; ``done()`` re-checks them (a stat per file; the hash only when a
  size or mtime changed, through ``store.identity_sha256``'s sidecar) and redoes, aside, a
  finished stage whose outputs are missing, cut or changed, naming each file. A stage's inputs
  that are another stage's outputs are checked the same way: a damaged one is an error naming
  the stage that rebuilds it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from . import memory, tracking
from .distributed import is_main
from .errors import ConfigError
from .locks import acquire_lock, cannot_write, release_lock
from .layout import MANIFEST, another_runs, rebuild_hint
from .records import RecordError
from .runtime import _threads, config_hash, versions
from .store import file_sha256, identity_sha256, is_identity_file, umask_modes, write_json

ENVIRONMENT = "environment"  # a stage config's key for what produced its episodes (envs.registry.identity)
CONFIG_SCHEMA = 2  # the config's shape (config.py): 2 = typed, TRL's names in bc / eto.dpo, a rollout section
NEXT, OLD = ".next", ".old"  # a rerun of a finished stage works in NEXT; OLD holds what a swap replaces
STATUSES = ("running", "done")
OUTPUT_FILES = "output_files"  # the manifest's record of a finished stage's outputs (see Stage.finish)
# Training keys that change how a stage runs, not its result: how often it logs and saves a checkpoint, how many
# checkpoints it keeps, whether activations are recomputed in the backward (the same weights bit for bit on the
# CPU: tests/test_dpo.py). A finished stage whose config differs from this run's in these alone is up to date,
# so turning checkpointing on to fit memory, or saving more often, never retrains a finished stage.
RESULT_NEUTRAL = frozenset({"logging_steps", "save_strategy", "save_steps", "save_total_limit",
                            "activation_checkpointing"})


def _as_read_back(config: Any) -> Any:
    """``config`` as a manifest reads it back (JSON, as :func:`~eto_train.runtime.config_hash` writes it)."""
    return json.loads(json.dumps(config, sort_keys=True, default=str))


def result_config(config: Any) -> Any:
    """``config`` without the :data:`RESULT_NEUTRAL` keys, at any depth, as a manifest reads it back."""
    def strip(c):
        return {k: strip(v) for k, v in c.items() if k not in RESULT_NEUTRAL} if isinstance(c, dict) else c
    return _as_read_back(strip(config))


class DamagedManifest(RecordError):
    """A stage's ``manifest.json`` that cannot be read as one (or is missing beside the stage's
    outputs): the stage stops before it touches anything; the message names the file and what to do."""


class DamagedInput(RecordError):
    """An input of a stage that is a finished stage's output and is no longer what that stage
    wrote (missing, cut, changed): the message names the file and the stage that rebuilds it."""


def _damaged(path: Path, why: str) -> DamagedManifest:
    folder = path.parent.parent if path.parent.name == NEXT else path.parent
    return DamagedManifest(
        f"{path}: damaged stage manifest ({why}). Nothing was changed: the stage cannot tell what its folder "
        f"holds. Restore the file (e.g. from a backup), or remove {folder} to redo the stage")


def _read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest at ``path``; None only when there is none. One that cannot be read, is not
    JSON or is not a stage manifest is a :class:`DamagedManifest`, never "not finished"."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _damaged(path, f"unreadable: {exc.strerror or exc}") from None
    try:
        m = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _damaged(path, f"not valid UTF-8 at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        cut = " (cut short?)" if exc.pos >= len(data.rstrip()) else ""
        raise _damaged(path, f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}{cut}") from None
    why = _schema_error(m)
    if why:
        raise _damaged(path, why)
    return m


def _schema_error(m: Any) -> str | None:
    if not isinstance(m, dict):
        return f"a JSON {type(m).__name__}, not an object"
    if not isinstance(m.get("stage"), str):
        return "no 'stage' name"
    if m.get("status") not in STATUSES:
        return f"status {m.get('status')!r}, not one of {', '.join(STATUSES)}"
    if not isinstance(m.get("config_hash"), str):
        return "no 'config_hash'"
    if not isinstance(m.get("input_hashes"), (dict, type(None))):
        return "'input_hashes' is not an object"
    rec = m.get(OUTPUT_FILES)
    if rec is not None and not (isinstance(rec, dict) and all(
            v is None or (isinstance(v, dict) and isinstance(v.get("sha256"), str)
                          and isinstance(v.get("files"), dict)) for v in rec.values())):
        return f"'{OUTPUT_FILES}' is not a record of output files"
    return None


def changed_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two config dicts (a key on one side only too)."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [] if old == new else [prefix.rstrip(".") or "(the config)"]
    out: list[str] = []
    for k in sorted(set(old) | set(new), key=str):
        if k not in old or k not in new:
            out.append(f"{prefix}{k}")
        else:
            out += changed_keys(old[k], new[k], f"{prefix}{k}.")
    return out


def check_schema(folder: Path, manifest: dict[str, Any] | None, config: dict[str, Any]) -> None:
    """A finished stage made before the typed config (its manifest has no ``config_schema``) whose
    config hash differs from this run's is an error, never a silent re-run over its result: the
    keys were renamed, so the difference is most likely the names, not the settings."""
    if not manifest or manifest.get("status") != "done" or "config_schema" in manifest \
            or manifest.get("config_hash") == config_hash(config):
        return
    keys = changed_keys(manifest.get("config"), config)
    shown = ", ".join(keys[:8]) + (f", ... ({len(keys)} keys)" if len(keys) > 8 else "")
    raise ConfigError(
        f"{folder}: stage {manifest.get('stage')!r} finished before the typed config (config schema 1) and its "
        f"config differs from this run's ({shown or 'the config hash'}): bc/eto.dpo keys are TRL's now "
        f"(bc.lr -> bc.learning_rate, bc.epochs -> bc.num_train_epochs, ...), rollout settings moved from eval.* "
        f"to rollout.*. Nothing was changed: use a new run_name or remove {folder}")


def check_owner(stage: "Stage", manifest: dict[str, Any] | None) -> None:
    """A finished stage in another run's folder (outside this command's run folder, e.g. reached through
    ``paths.base``: layout.another_runs) whose config or inputs differ from this run's is an error naming the
    stage, the folder and the keys, never redone in place over that run's result."""
    own = another_runs(stage.dir)
    if own is None or not manifest or manifest.get("status") != "done" or stage._same(manifest):
        return
    old, new = manifest.get("config"), _as_read_back(stage.config)

    def value(c: Any, key: str) -> str:
        for part in key.split("."):
            c = c.get(part, "<unset>") if isinstance(c, dict) else "<unset>"
        return json.dumps(c, default=str) if not isinstance(c, str) else c
    keys = [f"{k} ({value(old, k)} there, {value(new, k)} here)" for k in changed_keys(old, new)]
    keys += [f"its input {k!r} (another file)" for k in sorted(set(manifest.get("input_hashes") or {})
                                                               | set(stage.input_hashes))
             if (manifest.get("input_hashes") or {}).get(k) != stage.input_hashes.get(k)]
    shown = "; ".join(keys[:8]) + (f"; ... ({len(keys)} in all)" if len(keys) > 8 else "")
    raise ConfigError(
        f"{stage.dir}: stage {manifest.get('stage')!r} finished in another run's folder (outside this run's {own}; "
        f"paths.base or another path points there) with other settings: {shown or 'the config hash'}. Nothing was "
        f"changed: redoing it would replace that run's result in place. To keep it, give this run its own folders "
        f"(a new run_name without paths.base), or set these keys to that run's values; to redo it there, run that "
        f"run's own command or remove {stage.dir}")


def _output_files(p: Path) -> list[Path]:
    """The files of one output (a file, or every file under a folder but the identity sidecars)."""
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file() and not is_identity_file(f.name))
    return [p]


def _output_sha256(p: Path) -> str:
    """An output's content hash, answered from the identity sidecar while no size or mtime changed:
    a folder's is ``file_sha256`` (its own ``.identity.json``, which moves with it), a file's is kept
    in its stage folder's sidecar under ``output:<name>`` (store.identity_sha256)."""
    if p.is_dir():
        return file_sha256(p)
    return identity_sha256(p.parent, f"output:{p.name}", [p])


def record_outputs(folder: Path, names: list[str]) -> dict[str, Any]:
    """What :meth:`Stage.finish` keeps of each output in ``folder``: its files' sizes and mtimes
    and its content hash (None for an output the stage did not write this time)."""
    out: dict[str, Any] = {}
    for name in names:
        p = folder / name
        if not (p.exists() or p.is_symlink()):
            out[name] = None
            continue
        files = {f.relative_to(folder).as_posix(): [f.stat().st_size, f.stat().st_mtime_ns] for f in _output_files(p)}
        out[name] = {"sha256": _output_sha256(p), "files": files}
    return out


def output_damage(folder: Path, manifest: dict[str, Any], names: list[str] | None = None) -> list[str]:
    """How a finished stage's outputs (``names``; default: every recorded one) differ from what its
    manifest recorded, one line per file (empty when whole, or when the manifest predates the
    record). An output with the same files and sizes is compared by content hash, which
    ``store.identity_sha256`` answers from the sidecar by a stat per file while no mtime changed
    (no content read); otherwise it re-hashes."""
    problems: list[str] = []
    for name, rec in (manifest.get(OUTPUT_FILES) or {}).items():
        if rec is None or (names is not None and name not in names):
            continue
        p = folder / name
        if not p.exists():
            problems.append(f"{p}: missing")
            continue
        now = {f.relative_to(folder).as_posix(): [f.stat().st_size, f.stat().st_mtime_ns] for f in _output_files(p)}
        was = rec["files"]
        if set(now) == set(was) and all(now[k][0] == was[k][0] for k in now) and _output_sha256(p) == rec["sha256"]:
            continue
        lines = []
        for rel in sorted(set(now) | set(was)):
            if rel not in now:
                lines.append(f"{folder / rel}: missing")
            elif rel not in was:
                lines.append(f"{folder / rel}: not written by the stage")
            elif now[rel][0] != was[rel][0]:
                lines.append(f"{folder / rel}: {was[rel][0]} bytes when finished, now {now[rel][0]}"
                             + (" (cut short)" if now[rel][0] < was[rel][0] else ""))
            elif now[rel][1] != was[rel][1]:
                lines.append(f"{folder / rel}: changed since the stage finished (same size, other content)")
        problems.extend(lines or [f"{p}: content changed since the stage finished"])
    return problems


def check_input(key: str, path: str | os.PathLike, stage: str) -> None:
    """An input that is a finished stage's output (``<folder>/<name>`` beside that stage's manifest)
    must still be what that stage wrote: else :class:`DamagedInput` naming the stage that rebuilds it."""
    p = Path(path)
    try:
        m = _read_manifest(p.parent / MANIFEST)
    except DamagedManifest:
        return  # the writer's own run reports its manifest; the input's bytes are checked by its reader
    if not m or m.get("status") != "done" or p.name not in (m.get(OUTPUT_FILES) or {}):
        return
    damage = output_damage(p.parent, {OUTPUT_FILES: {p.name: m[OUTPUT_FILES][p.name]}})
    if damage:
        raise DamagedInput(f"stage {stage}: input {key!r} is damaged: {'; '.join(damage)}. "
                           f"{rebuild_hint(p) or 'Re-run the stage that wrote it'} to rebuild it")


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

    ``environment`` (a stage whose outputs are episodes: ``{"adapter": "module:Class", "version": ...}``,
    envs.registry.identity) enters the config, so its hash, and the hash that names a shared copy in
    a sweep's cache: a changed adapter is played again, never reused, and the stage says why. A stage
    finished before the identity was recorded (its manifest's config has no ``environment``) still
    counts as done when the rest of its config matches and the ``env_version`` its episodes record
    is this adapter's version; else it is done again, saying which version it was played with.
    """

    def __init__(self, name: str, out_dir: str | os.PathLike, config: dict[str, Any],
                 inputs: dict[str, str | os.PathLike] | None = None, outputs: list[str] | None = None,
                 environment: dict[str, str] | None = None, refuse=None):
        # refuse(manifest, folder): why a finished result does not count as done (e.g. a rollout stage whose
        # episodes are environment failures, rollouts/play.py), or None; done() and reuse() then redo it
        self.refuse = refuse
        if environment is not None:
            config = {**config, ENVIRONMENT: environment}
        self.name, self.dir, self.config, self.environment = name, Path(out_dir), config, environment
        self.inputs = {k: str(v) for k, v in (inputs or {}).items()}
        self.outputs = list(outputs) if outputs else None
        self.manifest_path = self.dir / MANIFEST
        self.work = self.dir
        self.started = time.time()
        self._locked = False
        self._unwritable: OSError | None = None  # done() looked without the lock: the folder cannot be written
        self._tracked = False  # this stage's wandb run is open (tracking.start in begin)
        self._memory: int | None = None  # this stage's peak-memory window (memory.open_window), from its lock on

    def _input_hashes(self) -> dict[str, str]:
        out = {}
        for k, v in self.inputs.items():
            if not Path(v).exists():
                raise FileNotFoundError(f"stage {self.name}: input {k!r} not found at {v} "
                                        f"(run the stage that writes it first)")
            check_input(k, v, self.name)
            out[k] = file_sha256(v)
        return out

    def _same(self, manifest: dict[str, Any] | None, folder: Path | None = None) -> bool:
        if not manifest or manifest.get("input_hashes") != self.input_hashes:
            return False
        return manifest.get("config_hash") == config_hash(self.config) or self._neutral_change(manifest) or \
            self._played_before(manifest, folder or self.dir) is True

    def _neutral_change(self, manifest: dict[str, Any]) -> list[str]:
        """The keys a finished manifest's config differs from this one's in, when all are
        :data:`RESULT_NEUTRAL` (empty otherwise, and when it records no config)."""
        old = manifest.get("config")
        if not isinstance(old, dict) or result_config(old) != result_config(self.config):
            return []
        return changed_keys(old, _as_read_back(self.config))

    def _played_before(self, manifest: dict[str, Any], folder: Path) -> bool | str | None:
        """A manifest from before the environment's identity entered stage configs: True when the
        rest of its config is this one's and its episodes (in ``folder``) were played by this
        adapter's version (or none is recorded yet), the version they record when another; None
        when the manifest is not such a one."""
        old = manifest.get("config")
        if self.environment is None or not isinstance(old, dict) or ENVIRONMENT in old:
            return None
        rest = {k: v for k, v in self.config.items() if k != ENVIRONMENT}
        if manifest.get("config_hash") != config_hash(rest):
            return None
        recorded = recorded_env_version(folder, self.outputs or [])
        return True if recorded in (None, self.environment.get("version")) else recorded

    def _environment_change(self, old: dict[str, Any]) -> str | None:
        """Why a finished stage is stale when only its environment changed (None otherwise)."""
        if self.environment is None or not isinstance(old.get("config"), dict):
            return None
        now = f"{self.environment.get('adapter')} version {self.environment.get('version')!r}"
        was = old["config"].get(ENVIRONMENT)
        if was is not None:
            rest = {k: v for k, v in self.config.items() if k != ENVIRONMENT}
            if was != self.environment and {k: v for k, v in old["config"].items() if k != ENVIRONMENT} == rest:
                return (f"another environment: it played {was.get('adapter')} version {was.get('version')!r}, "
                        f"this run has {now}")
            return None
        recorded = self._played_before(old, self.dir)
        if isinstance(recorded, str):
            return (f"another environment: its episodes record version {recorded!r} (it finished before the "
                    f"adapter's identity was part of the stage hash), this run has {now}")
        return None

    def _prepare(self, lock: bool, look: bool = False) -> None:
        """Take the lock (main process), complete a committed swap, decide where this run writes.

        ``look`` (done()): a folder that cannot be written at all (read-only mount, no permission)
        has no writer, so it is looked at without the lock; done() raises the lock's error as soon
        as there is work (begin() takes the lock, and fails, the same way)."""
        if lock and self._memory is None:  # the stage's peak memory counts from here (a cache look takes none)
            self._memory = memory.open_window()
        if lock and is_main():
            try:
                acquire_lock(self.dir, self.name)
                self._locked = True
            except OSError as exc:
                if not (look and cannot_write(exc, self.dir)):
                    raise
                self._unwritable = exc
        try:
            if self._locked:
                self._roll_forward()
            m = _read_manifest(self.manifest_path)  # a damaged one stops the stage here, nothing touched
            if lock:  # (a look at a sweep's cache takes none: an old copy there is just not reused)
                check_schema(self.dir, m, self.config)
                check_owner(self, m)  # another run's finished stage is not redone in place
            present = [n for n in self.outputs or [] if (self.dir / n).exists()]
            if m is None and present:  # outputs nobody can vouch for: never deleted, never taken as done
                raise _damaged(self.manifest_path, f"missing, beside the outputs {', '.join(present)}")
            if self.outputs:
                _read_manifest(self.dir / NEXT / MANIFEST)  # a damaged aside folder stops it too
        except BaseException:
            self.release()
            raise
        finished = (m or {}).get("status") == "done"
        self.work = self.dir / NEXT if self.outputs and finished else self.dir

    def done(self, lock: bool = True) -> bool:
        """True when a finished manifest matches this config and these inputs.

        Takes the stage's lock first (``lock=False``: a look at a finished copy elsewhere, e.g. a
        sweep's cache, which takes none); the lock is kept when the stage has work to do. A folder
        that cannot be written (e.g. a read-only copy of a finished run) is looked at without the
        lock: up to date answers True; work to do raises the OSError that taking the lock met."""
        self.input_hashes = self._input_hashes()
        self._prepare(lock, look=True)
        old = _read_manifest(self.manifest_path)
        same = bool(old) and old.get("status") == "done" and self._same(old)
        if not same and old and old.get("status") == "done" and old.get("input_hashes") == self.input_hashes:
            why = self._environment_change(old)
            if why:
                print(f"[{self.name}] finished in {self.dir} with {why}: doing it again (the finished files stay "
                      f"until the new result is whole)")
        if self._unwritable is not None and self.outputs:  # a committed swap nobody could complete
            same = same and (_read_manifest(self.dir / NEXT / MANIFEST) or {}).get("status") != "done"
        # a look at a cache (no outputs declared) checks what was copied there (copy_outputs: some outputs)
        self.damage = output_damage(self.dir, old, self.outputs if self.outputs is not None else
                                    [n for n in os.listdir(self.dir) if n != MANIFEST]) if same else []
        if self.damage:
            print(f"[{self.name}] finished in {self.dir}, but its outputs are not what it wrote: "
                  + "; ".join(self.damage) + ". Redoing it (aside; the files stay until the new result is whole)")
            same = False
        why = self.refuse(old, self.dir) if same and self.refuse is not None else None
        if why:
            print(f"[{self.name}] finished in {self.dir}, but {why}: "
                  + ("doing it again (aside; the files stay until the new result is whole)" if lock else "not reused"))
            same = False
        if self._unwritable is not None:  # work to do in a folder that cannot be written: the lock's error
            exc, self._unwritable = self._unwritable, None
            if not same:
                raise exc
        if same:
            neutral = self._neutral_change(old) if old.get("config_hash") != config_hash(self.config) else []
            why = (f"same inputs; its config differs only in {', '.join(neutral)}, which change how it runs, not "
                   "its result") if neutral else "same config and inputs"
            print(f"[{self.name}] up to date in {self.dir} ({why}): nothing to do")
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
        manifest = {"stage": self.name, "status": "running", "config_schema": CONFIG_SCHEMA, "config": self.config,
                    "config_hash": config_hash(self.config), "inputs": self.inputs,
                    "input_hashes": self.input_hashes, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        main = is_main()  # the other processes of `accelerate launch` read, they never write the manifest
        if main and not self._tracked:
            tracking.start(self.name, self.config, self.dir)  # this stage's wandb run (when tracking)
            self._tracked = True
        if self.work != self.dir:  # a finished result stays in place until this run is whole
            old = _read_manifest(self.work / MANIFEST)
            resumable = bool(old) and old.get("status") == "running" and self._same(old, self.work)
            if main:
                if not resumable:
                    self._discard(self.work)
                self.work.mkdir(parents=True, exist_ok=True)
                write_json(self.work / ".outputs", self.outputs)
                write_json(self.work / MANIFEST, manifest)
            return resumable
        resumable = self._same(_read_manifest(self.manifest_path))
        if main:
            self._discard(self.dir / NEXT)
            write_json(self.manifest_path, manifest)
        return resumable

    def finish(self, metrics: dict[str, Any] | None = None, **extra: Any) -> None:
        umask_modes(self.work)  # checkpoints readable by the team, like every other output
        manifest = {
            "stage": self.name, "status": "done", "config_schema": CONFIG_SCHEMA, "config": self.config,
            "config_hash": config_hash(self.config), "inputs": self.inputs,
            "input_hashes": getattr(self, "input_hashes", None) or self._input_hashes(),
            "versions": versions(), "threads": _threads(), "seconds": round(time.time() - self.started, 2),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "metrics": metrics or {},
            "memory": self._close_memory(), **extra}
        if self.outputs:  # done means whole: what the outputs are, re-checked by done()
            manifest[OUTPUT_FILES] = record_outputs(self.work, self.outputs)
        if self.work != self.dir:
            write_json(self.work / MANIFEST, manifest)  # the commit: the new result is whole
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
        m = _read_manifest(src / MANIFEST)
        if isinstance(m.get(OUTPUT_FILES), dict):  # the record of what was copied, not of what stayed there
            m[OUTPUT_FILES] = {k: v for k, v in m[OUTPUT_FILES].items() if k in names}
        write_json(nxt / MANIFEST, m)  # the commit (atomic)
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
        try:
            if not Stage(self.name, cache, self.config, self.inputs, refuse=self.refuse).done(lock=False):
                return False
        except DamagedManifest as exc:  # a damaged copy in the cache is not reused: this stage does the work
            print(f"[{self.name}] not reusing the cache: {exc}")
            return False
        print(f"[{self.name}] the same work already ran: reusing {cache}")
        self.adopt(cache, names)
        return True

    def publish(self, cache: str | os.PathLike, names: list[str]) -> None:
        """Copy this finished stage's outputs ``names`` and manifest to ``cache`` for :meth:`reuse`."""
        copy_outputs(self.dir, Path(cache), names)

    def _close_memory(self) -> dict[str, Any]:
        """The stage's peak memory (:mod:`eto_train.memory`): this process's resident GB, its children's,
        and on a GPU the device's; a stage that wrote without taking its lock (``model``) measures its end."""
        if self._memory is None:
            self._memory = memory.open_window()
        out, self._memory = memory.close_window(self._memory), None
        return out

    def release(self) -> None:
        """Drop the stage's lock (idempotent; finish() and an up-to-date done() call it)."""
        if self._memory is not None:  # a stage that did not finish (or had nothing to do): nothing recorded
            memory.close_window(self._memory)
            self._memory = None
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
        m = _read_manifest(nxt / MANIFEST)
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
        os.replace(nxt / MANIFEST, self.manifest_path)
        _fsync_dir(self.dir)
        self._discard(nxt)
        self._discard(old)


def recorded_env_version(folder: Path, outputs: list[str]) -> str | None:
    """The ``env_version`` the first episode of a stage's JSONL outputs in ``folder`` records (an
    imported expert's without its ``imported; `` prefix); None when there is none."""
    for name in outputs:
        if not name.endswith(".jsonl"):
            continue
        try:
            with open(folder / name, encoding="utf-8") as f:
                line = next((ln for ln in f if ln.strip()), "")
            version = json.loads(line).get("env_version") if line else None
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(version, str):
            return version.removeprefix("imported; ")
    return None


def copy_outputs(src: Path, dst: Path, names: list[str]) -> None:
    """Copy a finished stage's outputs (files or folders) and then its manifest, each by a
    temporary name and a rename: a half-copied stage is never seen as done. Used to share a
    stage between sweep jobs that run it with the very same config and inputs."""
    import shutil

    dst.mkdir(parents=True, exist_ok=True)
    for name in [*names, MANIFEST]:
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
