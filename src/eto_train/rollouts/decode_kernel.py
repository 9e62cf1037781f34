"""The C++ decode-attention kernel (decode_attention.cpp beside this file), built at first use.

:func:`load` compiles it with torch's own extension builder (``torch.utils.cpp_extension``, ninja and the
system's C++ compiler) for this machine's CPU (``-march=native``: AVX-512 where it has it), once per machine: the
build (~20 s) is kept in torch's extension folder (``TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``) under a name that carries a hash of the source, the flags, torch's version and
install (each venv its own build: one venv's build command would otherwise rebuild the other's), and the CPU's
model and flags, so a change of any of them builds anew and none reuses another's. Where it cannot be built
(no compiler, no ninja) the engine says so once and decodes with torch's flash kernel (slower, the same answers);
``rollout.decode_kernel: false`` never builds it.
"""

from __future__ import annotations

import hashlib
import platform
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("decode_attention.cpp")
CFLAGS = ["-O3", "-march=native", "-fopenmp"]  # OpenMP: at::parallel_for over torch's own thread pool
LDFLAGS = ["-fopenmp"]  # libgomp.so.1: the one torch loaded (same soname), so one runtime and torch's threads
DTYPES = (torch.float32, torch.bfloat16)  # the key/value dtypes it reads

_lock = threading.Lock()
_built: dict[str, object] = {}  # "module": the extension, or "error": why it could not be built


def _cpu() -> str:
    """The CPU's model name and flags (``-march=native`` compiles for them), else the platform's name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))


def name() -> str:
    parts = [SOURCE.read_text(), *CFLAGS, *LDFLAGS, torch.__version__, torch.__file__, _cpu()]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]
    return f"eto_decode_attention_{digest}"


def load():
    """The built extension (``decode_attention(q, k, v, slots, lengths, start, scale)``), or None where it cannot
    be built: the first failure is printed once, with its reason, and not retried in this process."""
    with _lock:
        if not _built:
            from torch.utils.cpp_extension import load as build

            try:
                _built["module"] = build(name(), [str(SOURCE)], extra_cflags=CFLAGS, extra_ldflags=LDFLAGS)
            except Exception as e:  # noqa: BLE001 - any build failure falls back to torch's kernel
                reason = " ".join(str(e).split())[:300] or type(e).__name__
                _built["error"] = reason
                print(f"warning: the C++ decode-attention kernel could not be built ({reason}); decode steps use "
                      "torch's flash kernel (slower, same answers; rollout.decode_kernel=false skips the build)",
                      flush=True)
        return _built.get("module")
