#!/usr/bin/env bash
# GPU smoke test: one prepared run (< 8 minutes on one H200) on a bare GPU machine with only
# python3 and a CUDA torch (no venv, no Java, no internet). It trains through the project's own
# recipe (full SFT with checkpointing off and on, LoRA SFT, DPO with precomputed reference
# log-probs; save, merge, reload, finite checks), runs one FSDP2 process through accelerate launch,
# the HF rollout engine at 64-256 rows and vLLM's start rule on the memory left after training;
# see scripts/gpu_smoke.py. The packages come from .whl/gpu_smoke_wheels.tar.xz when this python
# lacks them at the pinned versions (scripts/gpu_smoke_wheels.py: pip install --no-index --no-deps
# --target /tmp/eto_gpu_smoke/site-packages; WHEEL_BUNDLE, GPU_SMOKE_SITE override the paths); the package
# itself runs from src/ (PYTHONPATH). PY: the python to use (default .venv/bin/python, else python3).
#   bash scripts/gpu_smoke.sh [--cpu-dry-run] [--out DIR] [--steps N] [--peak-tflops 790]
#   bash scripts/gpu_smoke.sh --download-wheels [--python 3.12] [--skip numpy,pandas]
#       (with PyPI: writes .whl/gpu_smoke_wheels.tar.xz to carry; --skip: what the target has already)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [ "${1:-}" = "--download-wheels" ]; then
  shift
  exec "$PY" scripts/gpu_smoke_wheels.py download "$@"
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
"$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.cuda.is_available(), '|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
n=$(grep -c '==' scripts/gpu_smoke_wheels.txt)
missing=$(mktemp)
if "$PY" scripts/gpu_smoke_wheels.py status >"$missing" 2>&1; then
  echo "gpu_smoke: all $n listed packages present in $PY at the pinned versions: nothing to install"
else
  echo "gpu_smoke: $(grep -c . "$missing") of $n listed packages missing or at other versions: installing the bundle"
  site=${GPU_SMOKE_SITE:-${TMPDIR:-/tmp}/eto_gpu_smoke/site-packages}  # 'site-packages': see gpu_smoke_wheels.py
  "$PY" scripts/gpu_smoke_wheels.py install --site "$site" ${WHEEL_BUNDLE:+--bundle "$WHEEL_BUNDLE"}
  export PYTHONPATH="$PYTHONPATH:$site"
  "$PY" scripts/gpu_smoke_wheels.py check || { echo "gpu_smoke: the packages do not fit together (above)"; exit 1; }
fi
rm -f "$missing"
"$PY" -c "import importlib.util as u; print(', '.join(m + (': installed' if u.find_spec(m) else ': not installed (optional)') for m in ('vllm', 'bitsandbytes')))"
# the whole run is capped below 8 minutes; the Python side writes every section it finished
rc=0
timeout 450 "$PY" scripts/gpu_smoke.py "$@" || rc=$?
[ "$rc" = 124 ] && echo "gpu_smoke: stopped by the 450 s guard (the sections done are in the JSON)"
echo "gpu_smoke: $(( $(date +%s) - start )) s in all, exit $rc"
exit "$rc"
