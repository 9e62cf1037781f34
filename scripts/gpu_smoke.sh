#!/usr/bin/env bash
# GPU smoke test (one prepared run, < 8 minutes on one H200, nothing downloaded): a random-init
# ~1B Llama; bf16 SFT steps (full, LoRA, QLoRA), HF-engine rollouts on TextWorldExpress, DPO
# steps, vLLM rollouts; prints tokens/s and MFU. Needs the package with a CUDA torch, Java 17,
# and optionally bitsandbytes (.[gpu]) and vllm (.[vllm]); parts without them are skipped.
#   bash scripts/gpu_smoke.sh [--out DIR] [--peak-tflops 989] [--cpu-dry-run]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
command -v java >/dev/null || { echo "gpu_smoke: Java 17 is needed by TextWorldExpress"; exit 1; }
"$PY" -c "import torch; print('torch', torch.__version__, '| cuda', torch.cuda.is_available(), '|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
for m in bitsandbytes vllm; do
  "$PY" -c "import $m" 2>/dev/null && echo "$m: installed" || echo "$m: not installed (its part will be skipped)"
done
start=$(date +%s)
# the whole run is capped below 8 minutes; the Python side reports every part it finished
timeout 470 "$PY" scripts/gpu_smoke.py "$@"
echo "gpu_smoke: $(( $(date +%s) - start )) s in all"
