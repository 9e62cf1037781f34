#!/usr/bin/env bash
# ETO on a real chat model across seeds (issue 36): the study of docs/experiments.md ("ETO on a real chat model
# across seeds: the rule"), configs/experiment/real_study.yaml. Every step skips what is done: rerun to resume.
#
#   scripts/real_study.sh              everything, one process at a time (one torch thread): the untuned model,
#                                      seeds 0, 1 and 2, then the aggregate. Not two seeds at once: a real-model
#                                      DPO reaches 11-19 GB resident, two of them do not fit 24 GiB (the study's
#                                      play log in docs/experiments.md); the other core can play the 1.7M study
#   scripts/real_study.sh seed K       seed K's ETO (2 iterations, dev-selected) and its compare arms
#   scripts/real_study.sh untuned      the model before BC on both test splits (once: greedy play needs no seed)
#   scripts/real_study.sh aggregate    every seed up to date -> runs/real_study/seeds.{json,md}
#   scripts/real_study.sh status       each stage's manifest so far: status, seconds (and success on dev only)
#
# Each seed's machine (CPU model, torch's CPU capability) goes to runs/real_study/machines.txt when it starts: bf16
# greedy choices can differ between CPUs, and the rule plays a seed on one machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
eto-train() { "$PY" -m eto_train.cli "$@"; }
S=experiment=real_study
machine() {
  mkdir -p runs/real_study
  echo "$(date -u +%FT%TZ) $1: $(lscpu | sed -n 's/^Model name: *//p'), torch $("$PY" -c 'import torch; print(torch.__version__, torch.backends.cpu.get_cpu_capability())'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" >> runs/real_study/machines.txt
}
export MALLOC_ARENA_MAX=${MALLOC_ARENA_MAX:-2}   # fewer glibc arenas: less resident memory, no number changes
set -f
case "${1-all}" in
  untuned)   machine untuned
             eto-train eval $S seeds=null eval.policy='${model.path}' eval.tag=untuned ;;
  seed)      machine "seed $2"
             eto-train eto $S "seeds=[$2]"
             eto-train compare $S "seeds=[$2]" ;;
  aggregate) eto-train eto $S
             eto-train compare $S ;;
  all)       "$0" untuned
             for k in 0 1 2; do "$0" seed "$k"; done
             "$0" aggregate ;;
  status)    "$PY" - <<'PY'
import json, pathlib
for m in sorted(pathlib.Path("runs/real_study").rglob("manifest.json"), key=lambda p: p.stat().st_mtime):
    if "cache" in m.parts or "diag" in m.parts:
        continue
    d = json.loads(m.read_text())
    metrics = m.parent / "metrics.json"
    ok = json.loads(metrics.read_text())["overall"].get("success_rate") if metrics.exists() and m.parent.name == "dev" else None
    print(f"{str(m.parent):60} {d.get('status'):8} {d.get('seconds') or '':>8} {'' if ok is None else f'{100 * ok:.1f}%'}")
PY
             ;;
  *)         sed -n '2,16p' "$0"; exit 2 ;;
esac
