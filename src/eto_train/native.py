"""The project's C++ kernels for the CPU, built at first use (``runtime.cpu_kernels``).

Two sources, each beside the code that calls it: ``rollouts/decode_attention.cpp`` (the KV engine's decode
step) and ``training/causal_attention.cpp`` (bf16 training's attention). :func:`load` compiles one with torch's
own extension builder (``torch.utils.cpp_extension``: ninja and the system's C++ compiler) for this machine's CPU
(``-march=native``: AVX-512 where it has it; their vector helpers in ``vec16.h``), once per machine: the build
(~20 s) is kept in torch's extension folder (``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``)
under a name that carries a hash of the source and ``vec16.h``, the flags, torch's version and install (each venv
its own build: one venv's build command would otherwise rebuild the other's), and the CPU's model and flags, so a
change of any of them builds anew and none reuses another's. Where one cannot be built (no compiler, no ninja) the caller says what it falls back to, once,
and goes on with torch's kernels (slower; the same results to rounding). ``runtime.cpu_kernels: false``
(:func:`enable`, from ``setup_runtime``) never builds them.
"""

from __future__ import annotations

import hashlib
import platform
import threading
from pathlib import Path

import torch

HEADER = Path(__file__).with_name("vec16.h")  # the AVX-512 helpers both sources include
CFLAGS = ["-O3", "-march=native", "-fopenmp"]  # OpenMP: at::parallel_for over torch's own thread pool
LDFLAGS = ["-fopenmp"]  # libgomp.so.1: the one torch loaded (same soname), so one runtime and torch's threads

_lock = threading.Lock()
_built: dict[Path, object] = {}  # source -> the extension, or the reason it could not be built (a str)
_enabled = [True]


def enable(on: bool) -> None:
    """``runtime.cpu_kernels``: whether :func:`load` builds and returns kernels in this process."""
    _enabled[0] = bool(on)


def enabled() -> bool:
    return _enabled[0]


def _cpu() -> str:
    """The CPU's model name and flags (``-march=native`` compiles for them), else the platform's name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))


def name(source: Path) -> str:
    parts = [source.read_text(), HEADER.read_text(), *CFLAGS, *LDFLAGS, torch.__version__, torch.__file__, _cpu()]
    return f"eto_{source.stem}_{hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:12]}"


def load(source: Path, fallback: str):
    """The extension built from ``source``, or None: where ``runtime.cpu_kernels`` is off, or where it cannot be
    built (the first failure printed once, with its reason and ``fallback``, what the caller does instead; not
    retried in this process)."""
    if not _enabled[0]:
        return None
    got = _built.get(source)  # after the first call, no lock: training asks once per row and layer
    if got is not None:
        return None if isinstance(got, str) else got
    with _lock:
        if source not in _built:
            try:  # the builder's own imports too (setuptools and its dependencies: a bare venv may lack one)
                from torch.utils.cpp_extension import load as build

                _built[source] = build(name(source), [str(source)], extra_cflags=CFLAGS, extra_ldflags=LDFLAGS,
                                       extra_include_paths=[str(HEADER.parent)])
            except Exception as e:  # noqa: BLE001 - any build failure falls back to torch's kernels
                reason = " ".join(str(e).split())[:300] or type(e).__name__
                _built[source] = reason
                print(f"warning: the C++ kernel {source.name} could not be built ({reason}); {fallback} "
                      "(runtime.cpu_kernels=false skips the build)", flush=True)
        got = _built[source]
        return None if isinstance(got, str) else got
