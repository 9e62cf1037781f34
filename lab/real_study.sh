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
#   lab/real_study.sh seed-bc K F U    amendment 1: unit U of seed K starts from copies of the finished unit F's
#                                      experts, BC and BC's test plays (same machine: runs/ survives only there);
#                                      the stage cache takes them only where its hashes match, else redoes them
#   lab/real_study.sh prune K U        drop a committed unit's arm weights (compare/, cache/, eto/): ~4 GB a unit
#
# STUDY: the checkout whose runs/ holds the units (default: this one; e.g. STUDY=/work/study, the pinned worktree).
# RESULTS_REPO: the checkout that keeps and commits the results (default: this one; from a pinned worktree, the
# main checkout, e.g. RESULTS_REPO=/work/main). A unit whose machine is lost mid-play is played again whole.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RESULTS_REPO=${RESULTS_REPO:-$(pwd)}
DIR=docs/results/real_study2
RUNS=${STUDY:-$(pwd)}/runs/real_study2
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
  status) "$PY" scripts/stage_costs.py "$RUNS/s$2-$3" --own-seed "$2" ;;
  seed-bc) K=$2 F="$RUNS/s$2-$3" T="$RUNS/s$2-$4"
          for s in experts bc eval/bc/test_seen eval/bc/test_unseen; do
            grep -q '"status": "done"' "$F/$s/manifest.json" 2>/dev/null \
              || { echo "$F/$s: not a finished stage (no done manifest): nothing copied" >&2; exit 1; }
            [ ! -e "$T/$s" ] || { echo "$T/$s exists: nothing copied (the unit has begun)" >&2; exit 1; }
          done
          mkdir -p "$T/eval/bc"
          cp -a "$F/experts" "$F/bc" "$T/" && cp -a "$F/eval/bc/test_seen" "$F/eval/bc/test_unseen" "$T/eval/bc/"
          echo "[real_study] $T starts from $F's experts, BC and BC's test plays (amendment 1)" ;;
  prune)  [ -f "$RESULTS_REPO/$DIR/seed$2/$3/unit.json" ] \
            || { echo "seed $2 unit $3 has no committed results in $RESULTS_REPO/$DIR: nothing removed" >&2; exit 1; }
          rm -rf "$RUNS/s$2-$3/compare" "$RUNS/s$2-$3/cache" "$RUNS/s$2-$3/eto"
          echo "[real_study] removed the arm weights of $RUNS/s$2-$3 (its BC stays for seed-bc)" ;;
  *)      sed -n '2,24p' "$0"; exit 2 ;;
esac
