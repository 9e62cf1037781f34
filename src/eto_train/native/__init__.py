"""The CPU speed layer's C++ kernels, in one place: their sources, their header, their builder (here) and the
Python that calls them.

- ``decode_attention.cpp`` (:mod:`.decode_kernel`): the KV engine's decode step (rollouts/kvbatch.py);
- ``causal_attention.cpp`` (:mod:`.attention_kernel`): bf16 training's attention over the packed rows of
  training/right_padding.py;
- ``vec16.h``: the AVX-512 vector helpers both include.

:func:`load` compiles one with torch's own extension builder (``torch.utils.cpp_extension``: ninja and the system's
C++ compiler) for this machine's CPU (``-march=native``: AVX-512 where it has it), once per machine: the build
(~20 s) is kept in torch's extension folder (``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``)
under a name that carries a hash of the source and ``vec16.h``, the flags, torch's version and install, the source's
path (each venv and each checkout its own build: one's build command would otherwise rebuild the other's), and the
CPU's model and flags, so a change of any of them builds anew and none reuses another's. One process builds a kernel
at a time, and a build killed half-way does not block the next (:func:`_one_builder`). Where one cannot be built (no
compiler, no ninja) the caller says what it falls back to, once, and goes on with torch's kernels (slower; the same
results to rounding).

The switch, ``runtime.cpu_kernels``, is read once per process, at the entry point (:func:`eto_train.runtime.configure`
calls :func:`enable`); nothing passes it on. ``false`` never builds them.

Used only where they are the faster (:func:`faster`, decided here for every caller): their vector path is AVX-512
(``vec16.h``); without it they run plain loops, slower than torch's kernels, which torch vectorizes for AVX2 too.
So ``runtime.cpu_kernels: true`` means "allowed": a kernel is built and used where the build targets what its
vector path needs (:data:`NEEDS`), torch's kernel otherwise, without building. :func:`force` uses them anyway (the
bench's side by side, the tests of the kernels themselves).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import platform
import sys
import threading
from pathlib import Path

import torch

HEADER = Path(__file__).with_name("vec16.h")  # the AVX-512 helpers both sources include
CFLAGS = ["-O3", "-march=native", "-fopenmp"]  # OpenMP: at::parallel_for over torch's own thread pool
LDFLAGS = ["-fopenmp"]  # libgomp.so.1: the one torch loaded (same soname), so one runtime and torch's threads

# What each kernel (by its source's stem) needs of the CPU to be faster than torch's kernel: the instructions of its
# vector path (and, for bf16 training's, of the bf16 matmuls it runs instead of torch's flash kernel), as
# /proc/cpuinfo names them. Measured (make bench-real, SmolLM2-135M, 2 threads, 2 cores):
# - decode step, batch 32, 1,400-token contexts: on an AMD EPYC Zen 4 (avx512f, avx512_bf16) 146.6 ms with the C++
#   kernel against 185.5 with torch's (fa5b038, 2026-12-05); on an AMD EPYC Zen 3 (AVX2 only: plain loops) 435
#   against 345 (2026-12-06; docs/lab/bench.md);
# - bf16 training on the Zen 4: BC 1.44x and DPO 1.37x tokens/s with the C++ kernel; its bf16 matmuls need the
#   CPU's bf16 dot products (avx512_bf16): on the Zen 3, without them, a bf16 matmul is ~80x slower than fp32.
NEEDS = {"decode_attention": ("avx512f",), "causal_attention": ("avx512f", "avx512_bf16")}

_lock = threading.Lock()
_built: dict[Path, object] = {}  # source -> the extension, or the reason it could not be built (a str)
_enabled = [True]
_forced = [False]
_faster: dict[Path, bool] = {}  # source -> faster(source) on this machine, decided once


def enable(on: bool) -> None:
    """``runtime.cpu_kernels``: whether :func:`load` builds and returns kernels in this process (set once, by
    :func:`eto_train.runtime.configure`; the bench's baselines flip it)."""
    _enabled[0] = bool(on)


def enabled() -> bool:
    return _enabled[0]


def force(on: bool) -> bool:
    """Use the kernels where ``runtime.cpu_kernels`` allows, even where torch's are the faster (:func:`faster`):
    the bench's side by side and the tests of the kernels; returns the setting before."""
    before, _forced[0] = _forced[0], bool(on)
    return before


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's flags as /proc/cpuinfo names them (``avx512f``, ``avx512_bf16``); none where it cannot be read."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return frozenset()
    return frozenset(next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), []))


def _norm(flag: str) -> str:
    return flag.replace("_", "").lower()  # /proc/cpuinfo's avx512_bf16 is the compiler's -mavx512bf16


def target(flags, cflags=None) -> set[str]:
    """The CPU flags (without underscores: ``avx512bf16``) a build with ``cflags`` (:data:`CFLAGS`) targets on a CPU
    with ``flags``: ``-march=native`` takes them all (the compiler defines ``__AVX512F__`` exactly where the CPU has
    avx512f; another ``-march``: none), ``-mX`` adds X and ``-mno-X`` takes it off (``-mno-avx512f`` every AVX-512
    one, as the compiler does: the kernels then build their plain loops on any machine)."""
    cflags = CFLAGS if cflags is None else cflags
    out = {_norm(f) for f in flags} if "-march=native" in cflags else set()
    for c in cflags:
        if c.startswith("-mno-"):
            off = _norm(c[5:])
            out = {f for f in out if f != off and not (off == "avx512f" and f.startswith("avx512"))}
        elif c.startswith("-m") and "=" not in c:
            out.add(_norm(c[2:]))
    return out


def faster(source: Path, flags=None, cflags=None) -> bool:
    """Whether the kernel built from ``source`` is faster than torch's on a CPU with ``flags`` (this one's by
    default) built with ``cflags`` (:data:`CFLAGS`): where the build targets every flag of :data:`NEEDS`."""
    needs = NEEDS.get(Path(source).stem, ("avx512f",))
    return {_norm(n) for n in needs} <= target(cpu_flags() if flags is None else flags, cflags)


def _use(source: Path) -> bool:
    if not _enabled[0]:
        return False
    if _forced[0]:
        return True
    got = _faster.get(source)
    if got is None:
        got = _faster[source] = faster(source)
    return got


def choices() -> str:
    """What each kernel's callers run in this process (the stage manifests' ``versions.cpu_kernels``)."""
    parts = []
    for stem, needs in NEEDS.items():
        if not _enabled[0]:
            what = "torch's (runtime.cpu_kernels=false)"
        elif _forced[0]:
            what = "C++ (forced)"
        elif faster(Path(stem)):
            what = "C++"
        else:
            missing = [n for n in needs if _norm(n) not in target(cpu_flags())]
            what = f"torch's (the build targets no {', '.join(missing)})"
        parts.append(f"{stem}: {what}")
    return "; ".join(parts)


def _cpu() -> str:
    """The CPU's model name and flags (``-march=native`` compiles for them), else the platform's name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))


def name(source: Path) -> str:
    # the source's path too: ninja rebuilds when a build's command line changes, so two checkouts sharing a venv
    # (a pinned worktree beside the main one) would otherwise rebuild each other's kernel on every switch
    parts = [source.read_text(), HEADER.read_text(), *CFLAGS, *LDFLAGS, torch.__version__, torch.__file__, _cpu(),
             str(Path(source).resolve())]
    return f"eto_{source.stem}_{hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:12]}"


def build_directory(source: Path) -> Path:
    """Where the kernel built from ``source`` lives, handed to torch's builder: ``TORCH_EXTENSIONS_DIR`` if set,
    else torch's default root / ``py3XX_cpu`` (torch's own folder name on a CPU build; a CUDA build of torch would
    name its own folder ``cuXXX``, this one keeps ``_cpu``: the kernels are CPU code) / :func:`name`."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        from torch.utils.cpp_extension import get_default_build_root

        root = Path(get_default_build_root()) / f"py{sys.version_info.major}{sys.version_info.minor}_cpu"
    return Path(root) / name(source)


@contextlib.contextmanager
def _one_builder(directory: Path):
    """One builder of ``directory`` at a time across processes, and no wait on a dead one's lock.

    Written by hand because torch's builder marks a build with a plain file (``<directory>/lock``, its FileBaton)
    that only the builder removes: a process killed while it holds it (a test's timeout, an out-of-memory kill,
    ``kill -9`` of a stage) leaves it, and every later load on the machine waits for it forever (it happened: a
    ScienceWorld play waited on one left by a killed test run). An ``flock`` is let go by the kernel when its holder
    dies, so under it a baton left in ``directory`` belongs to no live builder of ours and is removed. (Not
    covered: the killed builder's compiler, a child that outlives it for the seconds of its compile, could still
    be writing; the next build then at worst fails, and the caller falls back to torch's kernels.) Where the file
    system refuses the lock (no flock on some network mounts), the build goes on without it, as torch's alone."""
    directory.mkdir(parents=True, exist_ok=True)
    path, handle = directory.parent / f"{directory.name}.flock", None
    try:
        handle = open(path, "a")  # noqa: SIM115 - held across the yield, closed below
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process's build of {directory.name} ({path})", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
    except OSError as e:
        if handle is not None:
            handle.close()
        print(f"note: no build lock ({path}: {e}); building without it", flush=True)
        yield
        return
    try:
        baton = directory / "lock"
        if baton.exists():
            baton.unlink(missing_ok=True)
            print(f"note: removed {baton}, left by a build that was killed before it ended", flush=True)
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def load(source: Path, fallback: str):
    """The extension built from ``source``, or None: where ``runtime.cpu_kernels`` is off, where torch's kernel is
    the faster on this CPU (:func:`faster`; not built), or where it cannot be built (the first failure printed
    once, with its reason and ``fallback``, what the caller does instead; not retried in this process)."""
    if not _use(source):
        return None
    got = _built.get(source)  # after the first call, no lock: training asks once per row and layer
    if got is not None:
        return None if isinstance(got, str) else got
    with _lock:
        if source not in _built:
            try:  # the builder's own imports too (setuptools and its dependencies: a bare venv may lack one)
                from torch.utils.cpp_extension import load as build

                directory = build_directory(source)
                with _one_builder(directory):
                    _built[source] = build(name(source), [str(source)], extra_cflags=CFLAGS, extra_ldflags=LDFLAGS,
                                           extra_include_paths=[str(HEADER.parent)], build_directory=str(directory))
            except Exception as e:  # noqa: BLE001 - any build failure falls back to torch's kernels
                reason = " ".join(str(e).split())[:300] or type(e).__name__
                _built[source] = reason
                print(f"warning: the C++ kernel {source.name} could not be built ({reason}); {fallback} "
                      "(runtime.cpu_kernels=false skips the build)", flush=True)
        got = _built[source]
        return None if isinstance(got, str) else got
