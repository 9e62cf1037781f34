#!/usr/bin/env bash
# The demo, top to bottom (make demo; eto-train demo runs this file): ETO at CPU scale on
# TextWorldExpress mapreader (find the coin by reading the exits) and twc (tidy up), from the
# shipped pretrained base to runs/demo/report.md. Every line is one stage, as you would type it.
#
#   scripts/demo.sh [hydra overrides]          e.g. scripts/demo.sh run_name=try eto.iterations=1
#   scripts/demo.sh report [hydra overrides]   only the last line: rebuild a finished demo's report.md
#
# Your overrides go to every stage after the demo's settings below, and win. Each stage skips what
# is already done (same config, same inputs: manifest.json), so a killed or interrupted demo rerun
# with the same command resumes where it stopped. On the 2-core CPU box the whole demo takes minutes.
set -euo pipefail

PY=${PY:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
eto-train() { "$PY" -m eto_train.cli "$@"; }

# The demo's settings, before your overrides (the CPU defaults of configs/ otherwise; DEMO_ARGS=
# in the environment replaces them, DEMO_ARGS="" drops them: that is `eto-train demo`):
#   run_name=demo                  everything in runs/demo/
#   model=twx_base                 BC from the shipped base models/twx-base-1.7m (a 1.73M Llama that read
#                                  9.2M tokens of mapreader/twc transcripts; `eto-train pretrain` made it)
#   env.splits.train.count=100     100 training tasks per game: 100 expert demonstrations x 2 games = 200
#   bc.learning_rate=1e-3          the BC setting docs/lab/pretrained_base.md measured from that base
#   eto.iterations=2               the paper's gains came in iterations 1-2 (`eto-train eto` alone: 3)
#   reading.split=seen, compare.splits=[seen]
#                                  the reading precondition and the contrast variants on `seen`, which BC
#                                  and the kept policy play anyway (eval.splits)
DEMO_ARGS=${DEMO_ARGS-run_name=demo model=twx_base env.splits.train.count=100 bc.learning_rate=1e-3 \
eto.iterations=2 reading.split=seen compare.splits=[seen]}
only=; if [[ ${1-} == report ]]; then only=report; shift; fi
set -f; set -- $DEMO_ARGS "$@"; set +f   # DEMO_ARGS: split on spaces, [seen] not a file pattern
if [[ $only == report ]]; then eto-train report "$@"; exit; fi

# 1. Expert trajectories: the gold path of each training task, 100 per game x 2 games = 200
#    episodes (env.step_limit 15; gold paths take 3-7 steps) -> runs/demo/experts/train.jsonl
eto-train experts "$@"

# 2. The base model: model=twx_base is shipped (model.build=false: used as it is);
#    model=tiny would build a tiny tokenizer and Llama from the experts' text here.
eto-train model "$@"

# 3. Behavior cloning (TRL's SFTTrainer, loss on the assistant's tokens) on the 200 successful
#    expert conversations: per_device_train_batch_size 8 x gradient_accumulation_steps 1 = 8 per
#    step, 200 / 8 = 25 optimizer steps per epoch x num_train_epochs 6 = 150 steps, lr 1e-3, cosine
#    after warmup 0.03 x 150 = 5 steps (configs/bc/cpu.yaml) -> runs/demo/bc/model
eto-train bc "$@"

# 4. BC on the test splits (eval.splits): seen = 50 held-out training-fold seeds per game = 100
#    episodes, unseen = 25 dev-fold seeds per game = 50; 32 episodes at a time, greedy, 20 new
#    tokens per action at most (configs/rollout/cpu.yaml) -> runs/demo/eval/bc/{seen,unseen}
eto-train eval "$@"

# 5. The ETO loop, 2 iterations, each: explore the 200 training tasks (eto.explore.tasks_per_game
#    100 x 2, one greedy episode each, 32 at a time); pairs = for each task whose final reward the
#    explorer did not reach, the expert's trajectory (chosen) against its own, cut to the expert's
#    length + 5 turns (rejected), ties dropped: at most 200 pairs; DPO from the explorer (its own
#    frozen reference) for one epoch, 8 pairs per step = ceil(pairs / 8) <= 25 steps, loss sigmoid
#    + SFT on chosen, beta 0.1 and lr 1e-5 (iteration 2: beta 0.5, lr 5e-6); then the policy on dev (50 seeds per game = 100
#    episodes, disjoint from train and test). BC is played on dev too; the loop keeps the best on
#    dev (BC included) and stops at the first iteration that does not beat it. The kept policy
#    plays seen and unseen (as BC did in 4), paired with BC -> runs/demo/eto/result.json
eto-train eto "$@"

# 6. The contrast arms from the same BC (compare.arms), on two seeds: trajectory (iteration 1's
#    pairs and DPO, reused from runs/demo/cache) and two step-level arms: step_value (Monte-Carlo
#    values at the policy's first divergence from the expert: 2 sampled continuations after its
#    action and 2 after the expert's, a pair when the expert's is worth more by 0.1) and anchor
#    (2 sampled episodes on the first 50 training tasks of each game; best against worst action
#    where their histories agree); a DPO of each as in 5, and an SFT control that continues BC on
#    the trajectory pairs' chosen sides for as many optimizer steps as their DPO took; each plays
#    seen (100 episodes), paired with BC (2000 bootstrap resamples). Smaller than the study (4
#    continuations, 4 samples on every task, five seeds, every arm: experiment=contrast_study) to
#    stay in minutes. seeds=[0,1]: seed 0 is this run, seed 1 a whole second run in
#    runs/demo/seed1 (its own BC: data order, sampling and DPO order follow the seed): whether a
#    difference survives a reseed -> runs/demo/compare/compare.md, runs/demo/seeds.md
eto-train compare seeds=[0,1] 'compare.variants=[trajectory,step_value,anchor]' eto.pairs.value_rollouts=2 \
  compare.arms.anchor.explore.samples=2 +compare.arms.anchor.explore.tasks_per_game=50 "$@"

# 7. Does each policy read its observation (ETO's precondition)? BC's and, when an iteration beat
#    BC on dev, the kept policy's seen episodes (already played): the first mapreader move and the
#    first twc take against the chance line of the policy's own mix, one-sided permutation test
#    (20000 permutations, holds at p < 0.01) -> runs/demo/reading/seen.json
eto-train reading "$@" '++reading.policies.eto_best=${paths.eto}/result.json'

# 8. The report: tables, charts and a verdict from the run folder (no training, no rollouts)
eto-train report "$@"
