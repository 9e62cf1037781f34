"""Peak memory of a stage: the process's resident memory, its child processes', and the GPU's.

Every stage's manifest records what the stage held at its peak (:class:`~eto_train.manifest.Stage`
opens a window in ``begin()`` and closes it in ``finish()``), so a run's report and
``scripts/stage_costs.py`` show, per stage, the memory it needs beside its seconds: what decides
whether two processes fit a box side by side.

- ``peak_rss_gb``: this process, exact on Linux: the kernel's high-water mark (``VmHWM`` in
  ``/proc/self/status``), read and reset (``/proc/self/clear_refs``, value 5) by a sampling thread, so
  a short spike between two samples is still counted; elsewhere the sampled resident size.
- ``peak_children_rss_gb``: the process's children together (environment workers, a simulator's
  JVM, vLLM's engine), sampled every :data:`TICK_S`: a lower bound of their peak.
- ``peak_device_gb``: on a GPU, torch's peak of allocated memory (``torch.cuda.max_memory_allocated``,
  read and reset at each sample), and ``peak_device_reserved_gb`` the caching allocator's reserve.

Written here because no library keeps a peak per interval of one long process (``resource``'s
``ru_maxrss`` is the process's lifetime peak, and a stage is one of many in an ``eto`` process).
Windows may overlap (a stage begun inside another): each sample is folded into every open window.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

TICK_S = 0.25  # seconds between samples: children and the GPU are read this often (self is exact on Linux)
GB = 1e9
_STATUS, _CLEAR = "/proc/self/status", "/proc/self/clear_refs"


def _status_kb(field: str) -> int | None:
    """A ``/proc/self/status`` field in kB (Linux), None elsewhere or when unreadable."""
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_hwm() -> bool:
    """Reset the kernel's peak resident size of this process to its current size (Linux >= 4.0)."""
    try:
        with open(_CLEAR, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _self_rss() -> int:
    """This process's resident bytes now."""
    kb = _status_kb("VmRSS")
    if kb is not None:
        return kb * 1024
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:  # noqa: BLE001 - no way to read it here: not recorded
        return 0


def _children_rss() -> int:
    """The resident bytes of this process's children (recursively), now."""
    try:
        import psutil

        total = 0
        for c in psutil.Process().children(recursive=True):
            try:
                total += c.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return total
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable: not recorded
        return 0


def _device() -> tuple[int, int] | None:
    """(peak allocated, peak reserved) bytes on the current GPU since the last reset, then reset;
    None without CUDA or before torch set it up (a CPU run imports nothing for this)."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)  # (torch may be half imported by another thread)
    try:
        if cuda is None or not cuda.is_available() or not cuda.is_initialized():
            return None
        out = (cuda.max_memory_allocated(), cuda.max_memory_reserved())
        cuda.reset_peak_memory_stats()
        return out
    except Exception:  # noqa: BLE001 - a device in a bad state: the stage's own error says why
        return None


class _Sampler:
    """One daemon thread per process folding samples into the open windows."""

    def __init__(self):
        self.lock = threading.Lock()
        self.windows: dict[int, dict[str, int]] = {}
        self.next_id = 0
        self.thread: threading.Thread | None = None
        self.pid = None
        self.hwm = _reset_hwm() and _status_kb("VmHWM") is not None

    def sample(self) -> None:
        if self.hwm:
            kb = _status_kb("VmHWM")
            own = kb * 1024 if kb is not None else _self_rss()
            _reset_hwm()
        else:
            own = _self_rss()
        kids, dev = _children_rss(), _device()
        with self.lock:
            for w in self.windows.values():
                w["rss"] = max(w["rss"], own)
                w["children"] = max(w["children"], kids)
                if dev is not None:
                    w["device"] = max(w.get("device", 0), dev[0])
                    w["device_reserved"] = max(w.get("device_reserved", 0), dev[1])

    def _loop(self) -> None:
        while True:
            with self.lock:
                idle = not self.windows
            if not idle:
                try:
                    self.sample()
                except Exception:  # noqa: BLE001 - a failed sample is skipped; the thread must outlive it
                    pass
            time.sleep(TICK_S)

    def open(self) -> int:
        if self.thread is None or self.pid != os.getpid() or not self.thread.is_alive():
            # (a forked child has no thread of its parent's: it starts its own)
            self.pid = os.getpid()
            self.thread = threading.Thread(target=self._loop, name="eto-train-memory", daemon=True)
            self.thread.start()
        with self.lock:
            self.next_id += 1
            self.windows[self.next_id] = {"rss": 0, "children": 0}
            wid = self.next_id
        self.sample()  # what the stage starts with counts
        return wid

    def close(self, wid: int) -> dict[str, Any]:
        self.sample()  # and what it ends with
        with self.lock:
            w = self.windows.pop(wid, None)
        if w is None:
            return {}
        out = {"peak_rss_gb": round(w["rss"] / GB, 3), "peak_children_rss_gb": round(w["children"] / GB, 3)}
        if "device" in w:
            out["peak_device_gb"] = round(w["device"] / GB, 3)
            out["peak_device_reserved_gb"] = round(w["device_reserved"] / GB, 3)
        return out


_SAMPLER: _Sampler | None = None


def open_window() -> int:
    """Start measuring a stage's peak memory; returns the window's id for :func:`close_window`."""
    global _SAMPLER
    if _SAMPLER is None or _SAMPLER.pid not in (None, os.getpid()):
        _SAMPLER = _Sampler()
    return _SAMPLER.open()


def close_window(wid: int | None) -> dict[str, Any]:
    """The peaks since :func:`open_window` (GB, 3 decimals): ``peak_rss_gb``, ``peak_children_rss_gb``,
    and on a GPU ``peak_device_gb`` / ``peak_device_reserved_gb``; ``{}`` for an unknown window."""
    if wid is None or _SAMPLER is None or _SAMPLER.pid != os.getpid():
        return {}
    return _SAMPLER.close(wid)


def open_window_at_base() -> tuple[float, int]:
    """What this process holds now (GB, after a garbage collection: what earlier work left), and a window
    (:func:`open_window`) from here: a measurement's peak beside its :func:`training_floor` over that base."""
    import gc

    gc.collect()
    return _self_rss() / GB, open_window()


def training_floor(config: Any, parameters: int, tokens: int, labelled: int, *, trainable: int | None = None,
                   reference: bool = False, checkpointed: bool = True, base_gb: float = 0.0) -> dict[str, float]:
    """The least resident memory (GB) a training step of a decoder could need, part by part: fp32 weights,
    fp32 gradients and AdamW's two fp32 moments of the ``trainable`` parameters (all by default), a frozen
    reference's weights (``reference``: DPO with a reference model held in memory), and the activations of
    one micro-batch of ``tokens`` tokens (``labelled`` of them scored by the LM head) as checkpointed: every
    layer's input kept, one layer's intermediates while it is recomputed, the LM head's logits and their
    gradient over the labelled positions only; ``checkpointed=False`` keeps every layer's intermediates.
    ``base_gb``: what the process holds before the model (the interpreter, torch, the libraries), measured.

    An estimate, not a measurement (the bench prints both side by side): it leaves out the allocator's
    slack, temporary copies (bf16 autocast's cast weights) and the data. ``config``: the model's
    ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``, ``vocab_size``."""
    h, i, n_layers, v = (int(getattr(config, k)) for k in
                         ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size"))
    f32 = 4
    trainable = parameters if trainable is None else trainable
    layer = tokens * (6 * h + 4 * i) * f32  # norms, q/k/v/o, the MLP's gate, up, product and output
    acts = (n_layers * tokens * h * f32 + layer) if checkpointed else n_layers * layer
    parts = {"base": base_gb * GB, "weights": parameters * f32, "gradients": trainable * f32,
             "optimizer": 2 * trainable * f32, "reference": parameters * f32 if reference else 0,
             "activations": acts, "logits": 2 * labelled * v * f32}
    out = {k: round(x / GB, 3) for k, x in parts.items()}
    out["total"] = round(sum(parts.values()) / GB, 3)
    return out
