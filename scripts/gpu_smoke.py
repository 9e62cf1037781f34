"""GPU smoke test with throughput figures (run by scripts/gpu_smoke.sh; nothing is downloaded).

A random-init Llama of about 1B parameters is built from a config, with a BPE tokenizer
trained on TextWorldExpress expert text. Then, on one GPU:

1. SFT steps in bf16: full fine-tuning, LoRA, and QLoRA (4-bit base; skipped without
   bitsandbytes), through the project's own trainer setup (training/sft.py);
2. batched rollouts on TextWorldExpress with the HF engine (KV-cached lockstep batch);
3. DPO steps (training/dpo.py) on pairs of expert vs those rollouts;
4. the same rollouts with the vLLM engine (skipped without vllm).

Training reports tokens/s (non-padding tokens) and MFU = 6 * N * tokens/s / peak bf16 FLOP/s
(the dense-model convention; LoRA skips the weight gradients, so its true share is lower).
Generation reports generated tokens/s over the engine's own time. Results go to
<out>/gpu_smoke.json. ``--cpu-dry-run`` runs the same wiring with a tiny model for seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from transformers import TrainerCallback
from trl.trainer.callbacks import RichProgressCallback

ROOT = Path(__file__).resolve().parents[1]
# Dense bf16 tensor-core peaks (FLOP/s) by device name; --peak-tflops for others.
PEAKS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}
SIZES = {  # 1b: 20 x (4 h^2 + 3 h i) = 1.03B parameters besides the small embedding
    "1b": dict(hidden_size=2048, num_layers=20, num_heads=16, intermediate_size=5632),
    "tiny": dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64),
}


def peak_flops(device_name: str, override_tflops: float | None) -> float | None:
    if override_tflops:
        return override_tflops * 1e12
    return next((v for k, v in PEAKS.items() if k in device_name), None)


def mfu(n_params: int, tokens_per_s: float, peak: float | None) -> float | None:
    return 6 * n_params * tokens_per_s / peak if peak else None


class StepClock(TrainerCallback):
    """Time and tokens seen (Trainer's non-padding count) at each step end; the first
    ``warmup`` steps (allocator, kernels' first runs) are left out of the rate."""

    def __init__(self, warmup: int, sync):
        self.warmup, self.sync, self.marks = warmup, sync, []

    def on_step_end(self, args, state, control, **kw):
        self.sync()
        self.marks.append((time.perf_counter(), state.num_input_tokens_seen, state.global_step))

    def rate(self) -> dict:
        marks = self.marks[self.warmup:] if len(self.marks) > self.warmup + 1 else self.marks
        (t0, n0, s0), (t1, n1, s1) = marks[0], marks[-1]
        return {"steps_timed": s1 - s0, "seconds": t1 - t0, "tokens": n1 - n0,
                "tokens_per_s": (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0}


class TimedPolicy:
    """Wraps a rollout policy: time and tokens of its batched generation calls only."""

    def __init__(self, policy, sync):
        self.policy, self.sync, self.seconds, self.tokens, self.calls = policy, sync, 0.0, 0, 0

    def session(self):
        inner, outer = self.policy.session(), self

        class _S:
            add_row, keep = inner.add_row, inner.keep

            def step(self, convs):
                t0 = time.perf_counter()
                outs = inner.step(convs)
                outer.sync()
                outer.seconds += time.perf_counter() - t0
                outer.tokens += sum(o[2] for o in outs)
                outer.calls += 1
                return outs

        return _S()


def build(out: Path, size: str, n_tasks: int, env_cfg: dict, prompt):
    from eto_train.envs import make_env
    from eto_train.experts import expert_episode
    from eto_train.model.tiny import build_tiny_model, save, train_tokenizer
    from eto_train.records import to_messages

    env = make_env(env_cfg)
    try:
        experts = [expert_episode(env, t, prompt) for t in env.tasks("train")[:n_tasks]]
    finally:
        env.close()
    tok = train_tokenizer([m["content"] for e in experts for m in to_messages(e)], vocab_size=4096, min_frequency=1)
    model = build_tiny_model(tok, max_position_embeddings=2048, seed=0, **SIZES[size])
    save(model, tok, out)
    return experts, tok, sum(p.numel() for p in model.parameters())


def train_sft(path, tok, experts, o, mode: str, device_ok: bool, clock_cls):
    from eto_train.model.load import load_model
    from eto_train.training.sft import make_trainer, sft_config, sft_dataset

    quant = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"} if mode == "qlora" else None
    model = load_model(str(path), dtype=o.dtype, quantization=quant)
    peft = None
    if mode in ("lora", "qlora"):
        from peft import LoraConfig
        peft = LoraConfig(task_type="CAUSAL_LM", r=16, lora_alpha=32, lora_dropout=0.0,
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    cfg = {"lr": 1e-4, "epochs": 1, "max_steps": o.steps, "batch_size": o.batch, "grad_accum": 1,
           "scheduler": "constant",
           "warmup_ratio": 0.0, "weight_decay": 0.0, "max_length": 2048, "logging_steps": 1000, "save_strategy": "no",
           "save_steps": None, "save_total_limit": 1, "bf16": device_ok, "gradient_checkpointing": False,
           "use_cpu": not device_ok}
    args = sft_config(str(o.out / f"sft_{mode}"), cfg, 0, report_to="none")
    args.include_num_input_tokens_seen = "non_padding"
    data = sft_dataset(experts * max(1, (o.steps * o.batch) // len(experts) + 1), tok)
    trainer = make_trainer(model, tok, data, args, peft)
    trainer.remove_callback(RichProgressCallback)  # the figures are printed at the end
    clock = clock_cls()
    trainer.add_callback(clock)
    trainer.train()
    return clock.rate()


def rollouts(policy_obj, env_cfg, prompt, tasks, batch, sync):
    from eto_train.envs import make_env
    from eto_train.records import PolicyRef
    from eto_train.rollouts.loop import RolloutConfig, run_rollouts

    timed, eps = TimedPolicy(policy_obj, sync), []
    t0 = time.perf_counter()
    run_rollouts([(t, 0) for t in tasks], lambda: make_env(env_cfg), timed, PolicyRef(id="smoke"), prompt,
                 RolloutConfig(batch_size=batch), on_episode=eps.append)
    wall = time.perf_counter() - t0
    steps = sum(e.num_steps for e in eps)
    return eps, {"episodes": len(eps), "steps": steps, "generated_tokens": timed.tokens, "calls": timed.calls,
                 "generate_seconds": timed.seconds, "wall_seconds": wall,
                 "gen_tokens_per_s": timed.tokens / timed.seconds if timed.seconds else 0.0,
                 "steps_per_s": steps / wall if wall else 0.0}


def train_dpo(path, tok, experts, eps, o, device_ok, clock_cls):
    from datasets import Dataset

    from eto_train.model.load import load_model
    from eto_train.pairs import trajectory_pair
    from eto_train.training.dpo import dpo_config, make_dpo_trainer

    gold = {e.task_id: e for e in experts}
    pairs = [p for e in eps if e.task_id in gold and (p := trajectory_pair(gold[e.task_id], e)) is not None]
    if not pairs:
        return {"skipped": "no pairs (every rollout tied its expert)"}
    ds = Dataset.from_list([{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs])
    d = {"beta": 0.1, "loss_type": ["sigmoid"], "loss_weights": None, "lr": 1e-6, "epochs": 1,
         "max_steps": o.steps, "batch_size": max(1, o.batch // 2), "grad_accum": 1, "scheduler": "constant",
         "warmup_ratio": 0.0, "max_length": 2048, "precompute_ref_log_probs": True, "logging_steps": 1000,
         "save_strategy": "no", "save_steps": None, "save_total_limit": 1, "bf16": device_ok, "use_cpu": not device_ok,
         "gradient_checkpointing": False}
    args = dpo_config(str(o.out / "dpo"), d, 0, report_to="none")
    args.include_num_input_tokens_seen = "non_padding"
    if len(ds) < o.steps * d["batch_size"]:  # enough pairs for the steps asked
        ds = Dataset.from_list(ds.to_list() * (o.steps * d["batch_size"] // len(ds) + 1))
    trainer = make_dpo_trainer(load_model(str(path), dtype=o.dtype), None, tok, ds, args)
    trainer.remove_callback(RichProgressCallback)
    clock = clock_cls()
    trainer.add_callback(clock)
    trainer.train()
    return {"pairs": len(pairs), **clock.rate()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu_smoke")
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny model on the CPU: checks the wiring in seconds")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per training run")
    ap.add_argument("--episodes", type=int, default=None)
    ap.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak, if the device is not known")
    o = ap.parse_args(argv)
    import torch
    from omegaconf import OmegaConf

    from eto_train.distributed import free_accelerator_memory
    from eto_train.envs import make_env
    from eto_train.model.load import load_model, load_tokenizer
    from eto_train.prompting import PromptConfig
    from eto_train.rollouts.loop import GenerationConfig, Policy
    from eto_train.runtime import setup_runtime

    gpu = torch.cuda.is_available() and not o.cpu_dry_run
    if not gpu and not o.cpu_dry_run:
        print("gpu_smoke: no CUDA device (use --cpu-dry-run to check the wiring on a CPU)")
        return 2
    size = "1b" if gpu else "tiny"
    o.steps = o.steps or (20 if gpu else 2)
    o.episodes = o.episodes or (128 if gpu else 4)
    o.batch = 32 if gpu else 2  # sequences per SFT step (DPO: half as many pairs); rollouts play 2x in parallel
    o.dtype = "bfloat16" if gpu else "float32"
    o.out.mkdir(parents=True, exist_ok=True)
    setup_runtime(2)  # offline hub, library progress bars off
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    device_name = torch.cuda.get_device_name(0) if gpu else "cpu"
    peak = peak_flops(device_name, o.peak_tflops)
    env_cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "env" / "twx.yaml"))
    env_cfg["step_limit"] = 10 if gpu else 3
    prompt = PromptConfig()
    results: dict = {"device": device_name, "peak_flops": peak, "torch": torch.__version__, "sections": {}}
    t_all = time.perf_counter()

    def section(name, fn):
        t0 = time.perf_counter()
        print(f"[gpu_smoke] {name} ...", flush=True)
        try:
            res = fn()
        except Exception as exc:  # keep going: one prepared run should report every part it can
            traceback.print_exc()
            res = {"failed": f"{type(exc).__name__}: {exc}"}
        res["section_seconds"] = round(time.perf_counter() - t0, 1)
        results["sections"][name] = res
        (o.out / "gpu_smoke.json").write_text(json.dumps(results, indent=2, default=str))  # partial, if cut short
        free_accelerator_memory()
        print(f"[gpu_smoke] {name}: {json.dumps(res, default=str)}", flush=True)
        return res

    path = o.out / f"model_{size}"
    built = {}

    def do_build():
        built["experts"], _, built["n"] = build(path, size, 64, env_cfg, prompt)
        return {"parameters": built["n"], "experts": len(built["experts"])}

    if "failed" in section("build", do_build):
        return _finish(results, o, t_all)
    n, tok, experts = built["n"], load_tokenizer(str(path)), built["experts"]
    def clock():
        return StepClock(warmup=3 if gpu else 0, sync=sync)

    def with_mfu(r):
        return {**r, "mfu": mfu(n, r["tokens_per_s"], peak)} if "tokens_per_s" in r else r

    for mode in ("full", "lora", "qlora"):
        if mode == "qlora" and not (gpu and _importable("bitsandbytes")):
            results["sections"]["sft_qlora"] = {
                "skipped": "needs a CUDA GPU and bitsandbytes (pip install -e '.[gpu]')"}
            print(f"[gpu_smoke] sft_qlora skipped: {results['sections']['sft_qlora']['skipped']}")
            continue
        section(f"sft_{mode}", lambda m=mode: with_mfu(train_sft(path, tok, experts, o, m, gpu, clock)))

    gen = GenerationConfig(max_new_tokens=32)
    lister = make_env(env_cfg)
    tasks = lister.tasks("train")[: o.episodes]  # tasks with an expert: their rollouts make DPO pairs
    lister.close()
    played = {}

    def hf_rollouts():
        policy = Policy(load_model(str(path), dtype=o.dtype, device="auto"), tok, gen, 2048)
        eps, res = rollouts(policy, env_cfg, prompt, tasks, o.batch * 2, sync)
        played["eps"] = eps
        return res

    section("rollouts_hf", hf_rollouts)
    section("dpo", lambda: with_mfu(train_dpo(path, tok, experts, played.get("eps", []), o, gpu, clock)))
    if gpu and _importable("vllm"):
        def vllm_rollouts():
            from eto_train.rollouts.vllm_engine import VLLMPolicy

            policy = VLLMPolicy.from_checkpoint(str(path), gen, 2048, dtype="bfloat16", gpu_memory_utilization=0.5,
                                                enforce_eager=True)  # no graph capture: a short startup
            try:
                return rollouts(policy, env_cfg, prompt, tasks, o.batch * 2, sync)[1]
            finally:
                policy.close()

        section("rollouts_vllm", vllm_rollouts)
    else:
        results["sections"]["rollouts_vllm"] = {"skipped": "needs a CUDA GPU and vllm (pip install -e '.[vllm]')"}
        print(f"[gpu_smoke] rollouts_vllm skipped: {results['sections']['rollouts_vllm']['skipped']}")
    return _finish(results, o, t_all)


def _importable(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def _finish(results, o, t_all) -> int:
    results["total_seconds"] = round(time.perf_counter() - t_all, 1)
    (o.out / "gpu_smoke.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"\n== gpu_smoke on {results['device']} ({results['total_seconds']} s) ==")
    for name, r in results["sections"].items():
        if "tokens_per_s" in r:
            m = f", MFU {100 * r['mfu']:.1f}%" if r.get("mfu") is not None else ""
            print(f"{name:14s} train {r['tokens_per_s']:,.0f} tokens/s{m} ({r['steps_timed']} steps timed)")
        elif "gen_tokens_per_s" in r:
            print(f"{name:14s} generate {r['gen_tokens_per_s']:,.0f} tokens/s, {r['episodes']} episodes, "
                  f"{r['steps_per_s']:.1f} env steps/s overall")
        else:
            print(f"{name:14s} {r.get('skipped') or r.get('failed') or r}")
    print(f"-> {o.out / 'gpu_smoke.json'}")
    return 1 if any("failed" in r for r in results["sections"].values()) else 0


if __name__ == "__main__":
    from eto_train.interrupt import interruptible

    with interruptible(resume=False):  # Ctrl-C: one line, exit 130 (the sections finished are in gpu_smoke.json)
        sys.exit(main())
