#!/usr/bin/env bash
# The stages of the real model that make demo-real leaves out, at sizes for the 2-core box (about an hour):
#   1. the contrast arms from the demo's BC (trajectory, step, step_value, anchor) and the SFT control, on `seen`;
#   2. the reading precondition of BC and the kept policy;  3. the demo's report again (with the arms);
#   4. BC with LoRA (model=smollm2_135m_lora) on the same demonstrations, on both test splits;
#   5. ScienceWorld, a handful of tasks: experts, BC, eval, one ETO iteration, report.
# Run it after make demo-real (it reads runs/demo-real). Each stage skips what is done: rerun to resume.
# Figures: docs/lab/experiments.md#a-real-chat-model-smollm2-135m-instruct.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
eto-train() { "$PY" -m eto_train.cli "$@"; }
# the demo's settings (scripts/demo_real.sh), with its run folder
DEMO=$(sed -n '/^REAL_DEMO_ARGS=/,/}$/p' scripts/demo_real.sh | sed 's/^REAL_DEMO_ARGS=\${REAL_DEMO_ARGS-//; s/}$//; s/\\$//' | tr '\n' ' ')
set -f
# 1. the arms: iteration 1's greedy exploration and trajectory DPO are reused from the demo (the content-hash
#    cache); step_value with one continuation per action, anchor on 2 samples of 4 tasks per game
eto-train compare $DEMO 'compare.variants=[trajectory,step,step_value,anchor]' 'compare.splits=[seen]' \
  eto.pairs.value_rollouts=1 compare.arms.anchor.explore.samples=2 +compare.arms.anchor.explore.tasks_per_game=4
# 2. does BC read its observation? (the demo's `seen` episodes, no new play)
eto-train reading $DEMO reading.split=seen '++reading.policies.eto_best=${paths.eto}/result.json'
# 3. the report, with the arms
eto-train report $DEMO
# 4. LoRA BC (r 16 on every projection, merged at save) on the demo's 32 demonstrations, a higher lr as LoRA needs
LORA=${DEMO/run_name=demo-real/run_name=real-lora}
LORA=${LORA/model=smollm2_135m/model=smollm2_135m_lora}
LORA=${LORA/bc.learning_rate=1e-4/bc.learning_rate=5e-4}
eto-train experts $LORA
eto-train bc $LORA
eto-train eval $LORA
# 5. ScienceWorld: two tasks (find an animal, find a plant), 4 variations each per split, the paper's prompt; its
#    example thinks before it acts ("Thought: ... Action: ..."): 64 new tokens (24 cut every answer before its Action)
SW="run_name=real-sciworld env=sciworld prompt=sciworld_eto model=smollm2_135m model.max_context=4096 \
env.tasks=[task-3-find-animal,task-3-find-plant] env.limit_per_task=4 env.dev_holdout=2 env.step_limit=15 \
bc.num_train_epochs=3 bc.per_device_train_batch_size=2 bc.learning_rate=1e-4 rollout.generation.max_new_tokens=64 \
eto.iterations=1 eto.dpo.num_train_epochs=1 eto.dpo.per_device_train_batch_size=2 eto.dpo.learning_rate=2e-5 \
eto.dpo.max_length=4096 eto.test_last_iteration=true"
eto-train experts $SW
eto-train eval $SW eval.policy='${model.path}' eval.tag=untuned
eto-train bc $SW
eto-train eto $SW
eto-train report $SW
