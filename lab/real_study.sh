#!/usr/bin/env bash
# ETO on a real chat model, played in units (issue 52): the rule in docs/lab/experiments.md ("ETO on a real chat model,
# played in units: the rule (2026-12-06)"), configs/experiment/real_study2.yaml. Run it from a worktree pinned at the
# rule's commit; every step skips what is done: rerun a unit to resume it on the same machine.
#
#   lab/real_study.sh unit K U         seed K's unit U in runs/real_study2/s<K>-<U>, one process at a time, then its
#                                      results into $RESULTS_REPO/docs/results/real_study2/seed<K>/<U>/, committed
#                                      there (only that folder). Units (the rule's table):
#                                        eto         BC; ETO (2 iterations, dev-selected), the kept policy on test
#                                        trajectory  BC; the trajectory arm (ETO's iteration 1 made again), the
#                                                    SFT control of its steps
#                                        step        BC; the step and mixture arms
#                                        value       BC; the step_value arm; the untuned model
#                                        anchor      BC; the anchor arm (played after every other unit)
#   lab/real_study.sh aggregate        the table from docs/results/real_study2 alone (no runs/ needed)
#   lab/real_study.sh status K U       the unit's stages so far: seconds and peak memory
#
# RESULTS_REPO: the checkout that keeps and commits the results (default: this one; from a pinned worktree, the
# main checkout, e.g. RESULTS_REPO=/work/main). A unit whose machine is lost mid-play is played again whole.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RESULTS_REPO=${RESULTS_REPO:-$(pwd)}
DIR=docs/results/real_study2
eto-train() { "$PY" -m eto_train.cli "$@"; }
export MALLOC_ARENA_MAX=${MALLOC_ARENA_MAX:-2}   # fewer glibc arenas: less resident memory, no number changes
set -f
unit_args() {  # the unit's run: its own folder, its seed, the arms it plays
  local k=$1 u=$2 arms
  case "$u" in
    eto) arms="" ;;
    trajectory) arms="compare.variants=[trajectory] compare.control=true compare.control_of=trajectory" ;;
    step) arms="compare.variants=[step,mixture] compare.control=false compare.control_of=step" ;;
    value) arms="compare.variants=[step_value] compare.control=false compare.control_of=step_value" ;;
    anchor) arms="compare.variants=[anchor] compare.control=false compare.control_of=anchor" ;;
    *) echo "unknown unit $u: eto, trajectory, step, value or anchor" >&2; exit 2 ;;
  esac
  echo "experiment=real_study2 seeds=null seed=$k run_name=real_study2/s$k-$u $arms"
}
case "${1-}" in
  unit)   K=$2 U=$3
          A=$(unit_args "$K" "$U")
          echo "[real_study] seed $K unit $U on $(lscpu | sed -n 's/^Model name: *//p'), commit $(git rev-parse --short HEAD)"
          case "$U" in
            eto)   eto-train eto $A ;;                      # BC, BC on dev and the test splits, the ETO loop
            value) eto-train compare $A
                   eto-train eval $A eval.policy='${model.path}' eval.tag=untuned ;;
            *)     eto-train compare $A ;;                  # BC, BC on the test splits, the unit's arms
          esac
          eto-train results $A results.unit="$U" results.dir="$RESULTS_REPO/$DIR"
          git -C "$RESULTS_REPO" add "$DIR/seed$K/$U" "$DIR/seeds.json" "$DIR/seeds.md"
          git -C "$RESULTS_REPO" commit -q -m "real_study2: seed $K unit $U played (results, costs, machine)" -- \
            "$DIR/seed$K/$U" "$DIR/seeds.json" "$DIR/seeds.md"
          echo "[real_study] seed $K unit $U: results committed in $RESULTS_REPO" ;;
  aggregate) eto-train results experiment=real_study2 results.collect=false results.dir="$RESULTS_REPO/$DIR" ;;
  status) "$PY" scripts/stage_costs.py "runs/real_study2/s$2-$3" ;;
  *)      sed -n '2,22p' "$0"; exit 2 ;;
esac
