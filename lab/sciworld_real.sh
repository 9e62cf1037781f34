#!/usr/bin/env bash
# ScienceWorld on the real model (issue 55), configs/experiment/real_sciworld.yaml: untuned, BC and one ETO iteration
# (selected on dev) on 11 task types' seen and unseen variations, played in pieces, each sized to finish within about
# 2 h of the slowest CPU the box has been (AMD Zen 3, AVX2, fp32, two threads), each one's results committed as it
# ends (eto-train results into docs/results/real_sciworld/seed0/<piece>/, scores.md: the paper's average final score).
# One run folder (runs/real_sciworld) holds every piece; every step skips what is done, so rerunning a piece resumes
# it on the same machine. A piece whose machine is lost is played again from the pieces committed before it (the run
# folder is rebuilt: experts and BC are deterministic for a seed; BC is retrained where its weights were lost).
#
#   lab/sciworld_real.sh piece P   one piece, then its results committed in $RESULTS_REPO:
#                                    untuned   the experts (310 gold paths); the untuned model on seen and unseen
#                                    bc        BC (2 epochs on the 310 demonstrations); BC on dev
#                                    bc-test   BC on seen and unseen
#                                    eto       ETO iteration 1: exploration, pairs, DPO, the iteration on dev
#                                    eto-test  the policy dev keeps on seen and unseen (and iteration 1 beside it
#                                              when dev keeps BC: eto.test_last_iteration)
#   lab/sciworld_real.sh all       every piece not yet committed, in that order (stops at the first that fails)
#   lab/sciworld_real.sh status    the run's stages so far: seconds and peak memory
#   lab/sciworld_real.sh aggregate the tables (seeds.md, scores.md) from docs/results/real_sciworld alone
#
# RESULTS_REPO: the checkout that keeps and commits the results (default: this one; from a pinned worktree, the main
# checkout, e.g. RESULTS_REPO=/work/main). ARGS: extra overrides for every command (e.g. a smaller measurement run:
# ARGS="run_name=sciworld_try env.limit_per_task=4 env.dev_holdout=2", with RESULTS_DIR= somewhere else).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RESULTS_REPO=${RESULTS_REPO:-$(pwd)}
DIR=${RESULTS_DIR:-docs/results/real_sciworld}
PIECES="untuned bc bc-test eto eto-test"
eto-train() { "$PY" -m eto_train.cli "$@"; }
export MALLOC_ARENA_MAX=${MALLOC_ARENA_MAX:-2}   # fewer glibc arenas: less resident memory, no number changes
set -f
A="experiment=real_sciworld ${ARGS-}"
RUN=$("$PY" - <<EOF
from hydra import compose, initialize_config_dir
with initialize_config_dir("$(pwd)/configs", version_base="1.3", job_name="sciworld_real"):
    print(compose("config", overrides="$A".split()).paths.run)
EOF
)
unit() { local i=1 p; for p in $PIECES; do [ "$p" = "$1" ] && { echo "p$i-$1"; return; }; i=$((i + 1)); done
         echo "unknown piece $1: one of $PIECES" >&2; exit 2; }
play() {  # the piece's stages; each skips what its manifest says is done
  case "$1" in
    untuned)  eto-train model $A                        # the real model: built once (make real-model)
              eto-train experts $A
              eto-train eval $A eval.policy='${model.path}' eval.tag=untuned ;;
    bc)       eto-train bc $A
              # BC on dev: the baseline ETO's selection compares with. This play alone sets no selection (eto.* is
              # not in a play's hash: the loop finds this same stage done); it was played so (67375e2), when the
              # schema still refused eval.splits=[dev] (accepted alone since 95ed189)
              eto-train eval $A eval.splits=[dev] eto.dev_split=null eto.early_stopping=false ;;
    bc-test)  eto-train eval $A ;;                      # BC on seen and unseen (eval.splits)
    eto)      eto-train eto-iter $A ;;                  # exploration, pairs, DPO, iteration 1 on dev
    eto-test) eto-train eto $A ;;                       # BC and iteration 1 found done; the kept policy on the tests
  esac
}
piece() {
  local p=$1 u
  u=$(unit "$p")
  echo "[sciworld_real] piece $p ($u) on $(lscpu | sed -n 's/^Model name: *//p'), commit $(git rev-parse --short HEAD)"
  play "$p"
  eto-train results $A results.unit="$u" results.dir="$RESULTS_REPO/$DIR"
  local kept=("$DIR/seed0/$u" "$DIR/seeds.json" "$DIR/seeds.md")
  [ -f "$RESULTS_REPO/$DIR/scores.json" ] && kept+=("$DIR/scores.json" "$DIR/scores.md")
  git -C "$RESULTS_REPO" add -- "${kept[@]}"
  if git -C "$RESULTS_REPO" diff --cached --quiet -- "${kept[@]}"; then
    echo "[sciworld_real] piece $p: its results were committed before ($DIR/seed0/$u)"
  else
    git -C "$RESULTS_REPO" commit -q -m "real_sciworld: piece $p played (results, costs, machine)" -- "${kept[@]}"
    echo "[sciworld_real] piece $p: results committed in $RESULTS_REPO ($DIR/seed0/$u)"
  fi
}
case "${1-}" in
  piece)     piece "$2" ;;
  all)       for p in $PIECES; do
               if [ -f "$RESULTS_REPO/$DIR/seed0/$(unit "$p")/unit.json" ]; then echo "[sciworld_real] $p: committed"
               else piece "$p"; fi
             done ;;
  status)    costs=lab/stage_costs.py; [ -f "$costs" ] || costs=scripts/stage_costs.py
             "$PY" "$costs" "$RUN" ;;
  aggregate) eto-train results $A results.collect=false results.dir="$RESULTS_REPO/$DIR" ;;
  *)         sed -n '2,23p' "$0"; exit 2 ;;
esac
