"""Hide every installed distribution a lent GPU machine would lack (tests/test_gpu_smoke.py).

Put this folder on PYTHONPATH and Python imports this module at start-up (``sitecustomize``): a
top-level module is made unfindable when no distribution providing it is in the GPU image's list
(scripts/gpu_image_packages.txt), the smoke's wheel list (scripts/gpu_smoke_wheels.txt) or the
project itself. The standard library and the project's src/ are untouched (no distribution claims
them). Only the path finder's lookup is narrowed, so ``importlib.util.find_spec`` answers None for
a hidden module, as on the bare machine (a probe like accelerate's ``is_wandb_available`` says no);
metadata (``importlib.metadata.version``) still sees it, which the wheel ``status`` step reads.
"""

import importlib.metadata as md
import importlib.util
from importlib.machinery import PathFinder
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
# the wheel list's own reader (scripts/gpu_smoke_wheels.py: pins, _key), loaded by path so that scripts/ is not
# put on every process's sys.path
_spec = importlib.util.spec_from_file_location("_gpu_smoke_wheels", _ROOT / "scripts" / "gpu_smoke_wheels.py")
_wheels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_wheels)
_ALLOWED = {_wheels._key(p.split("==")[0]) for p in
            _wheels.pins() + _wheels.pins(_ROOT / "scripts" / "gpu_image_packages.txt")} | {"eto-train"}
HIDDEN = frozenset(top for top, dists in md.packages_distributions().items()
                   if not any(_wheels._key(d) in _ALLOWED for d in dists))
_find = PathFinder.find_spec.__func__


def _find_spec(cls, name, path=None, target=None):
    if name.partition(".")[0] in HIDDEN:
        return None
    return _find(cls, name, path, target)


PathFinder.find_spec = classmethod(_find_spec)
