"""GPU smoke test: the project's own training recipe, FSDP2, the HF rollout engine and vLLM's
start rule on one GPU, in one prepared run (scripts/gpu_smoke.sh; nothing downloaded, no Java).

A random-init Llama of about 1B parameters on the real Llama-2 chat tokenizer (vendored in
tests/data, built by tests/fixture_models.py) and a deterministic text game (scripts/gpu_smoke_env.py)
stand in for a downloaded model and a simulator. Sections, each reported done / skipped (why) /
failed (the error), in <out>/gpu_smoke.json:

- ``build``: the model and the expert conversations;
- ``gemm``: a bf16 matmul's TFLOP/s on this GPU (beside the named peak the MFU uses);
- ``sft_full``, ``sft_full_ckpt``, ``sft_lora``, ``dpo``: :func:`eto_train.training.recipe.train`
  as the stages call it (fp32 master weights, finite guard, save: adapters merged, the saved
  policy checked), then the saved policy reloaded: its weights equal the trained ones, a loss on
  it is finite; full SFT with gradient checkpointing off and on, LoRA SFT, full-fine-tuning DPO
  with precomputed reference log-probs (from sft_full's policy). Training tokens/s (non-padding)
  and MFU, over the steps after the first ``warmup``;
- ``memory``: ``torch.cuda.mem_get_info()`` once this process's training is over, against vLLM's
  start rule (free >= gpu_memory_utilization x total) for each configs/rollout/*.yaml;
- ``rollouts_hf``: the KV-cached HF engine (rollouts/loop.py) at 64, 128 and 256 rows: generated
  tokens/s over its generate calls, and env steps/s;
- ``fsdp2``: one process of ``accelerate launch --config_file configs/accelerate/fsdp.yaml``
  training full SFT through the recipe (this script with ``--fsdp-child``), last of the required
  parts (a launch that hangs cannot hide the others);
- ``rollouts_vllm``: the same as rollouts_hf with vLLM at the configured engine settings
  (optional: only when vllm is installed).

``--cpu-dry-run``: the same wiring on the CPU with a tiny model (the FSDP2 process on gloo), in
two minutes or so; tests/test_gpu_smoke.py runs it through scripts/gpu_smoke.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(1, str(ROOT / "tests"))  # tests/fixture_models.py: the fixture's builder, beside its tokenizer data

# Dense bf16 peak of one H200 that MFU is measured against: measured, not the datasheet's 989
# TFLOP/s. On the H200s lent to this project an 8192^3 bf16 matrix product through PyTorch ran at
# 769-798 TFLOP/s on random data (mean of ten after three warm-ups, 2026-10/11); 790 is that
# figure. The `gemm` section measures the card in hand beside it. Other devices: --peak-tflops.
H200_BF16_PEAK_TFLOPS = 790.0
FAMILY = "llama2"  # the real Llama-2 chat tokenizer (32k vocabulary: a small logits tensor at 1B)
SIZES = {  # 1b: 22 x (2 h^2 + 2 h (h/4) + 3 h i) + 32000 h (tied) = 1.06B parameters
    "1b": dict(hidden_size=2048, num_layers=22, num_heads=16, intermediate_size=5632),
    "tiny": dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64),
}
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
REQUIRED = ("build", "sft_full", "sft_full_ckpt", "sft_lora", "dpo", "fsdp2", "memory", "rollouts_hf")


def peak_flops(device_name: str, override_tflops: float | None) -> float | None:
    """The dense bf16 peak (FLOP/s) MFU is measured against; None when unknown (no MFU)."""
    if override_tflops:
        return override_tflops * 1e12
    return H200_BF16_PEAK_TFLOPS * 1e12 if "H200" in device_name else None


def train_flops_per_token(n_params: int, n_lora: int = 0) -> float:
    """Model FLOPs of one trained token (matmuls; attention scores left out, small at these lengths).

    Full fine-tuning: 6N (forward 2N, backward 4N: activation and weight gradients, 2N each).
    LoRA: the frozen base has no weight gradients, so 4N for it (forward 2N, activation gradients
    2N) plus 6 per adapter parameter (forward, activation and weight gradients): 4N + 6N_lora,
    with N the base's parameters. Gradient checkpointing recomputes the forward (2N more of
    hardware FLOPs) but MFU counts model FLOPs, so checkpointing shows as a lower MFU."""
    return 6.0 * n_params if not n_lora else 4.0 * n_params + 6.0 * n_lora


def mfu(flops_per_token: float, tokens_per_s: float, peak: float | None) -> float | None:
    return flops_per_token * tokens_per_s / peak if peak else None


def step_rate(log_history: list[dict], warmup: int) -> dict:
    """Trained tokens/s over the optimizer steps after the first ``warmup``, from the Trainer's
    per-step logs (logging_steps=1 with include_num_input_tokens_seen: each log carries the
    tokens seen and the seconds since training began, taken after the loss is read, a sync)."""
    logs = sorted((h for h in log_history if "loss" in h and "train_runtime" in h), key=lambda h: h["step"])
    if not logs:
        raise ValueError("no per-step logs with train_runtime (logging_steps=1, include_num_input_tokens_seen)")
    first = logs[min(warmup, len(logs) - 1) - 1] if warmup and len(logs) > warmup else None
    last = logs[-1]
    t0, n0, s0 = (first["train_runtime"], first["num_input_tokens_seen"], first["step"]) if first else (0.0, 0, 0)
    secs, toks = last["train_runtime"] - t0, last["num_input_tokens_seen"] - n0
    return {"steps_timed": last["step"] - s0, "seconds": round(secs, 3), "tokens": int(toks),
            "tokens_per_s": toks / secs if secs > 0 else 0.0, "final_loss": last["loss"]}


class TimedPolicy:
    """Wraps a rollout policy: time and tokens of its batched generation calls only."""

    def __init__(self, policy, sync):
        self.policy, self.sync, self.seconds, self.tokens, self.calls = policy, sync, 0.0, 0, 0

    def session(self):
        inner = (self.policy.session() if hasattr(self.policy, "session") else None)
        outer = self

        class _S:
            def add_row(self):
                if inner is not None:
                    inner.add_row()

            def keep(self, rows):
                if inner is not None:
                    inner.keep(rows)

            def step(self, convs):
                t0 = time.perf_counter()
                outs = inner.step(convs) if inner is not None else outer.policy.generate(convs)
                outer.sync()
                outer.seconds += time.perf_counter() - t0
                outer.tokens += sum(o[2] for o in outs)
                outer.calls += 1
                return outs

        return _S()


# -- the parts -------------------------------------------------------------------------------------
def build(out: Path, size: str, env_cfg: dict, n_experts: int):
    """The fixture model, and expert and losing episodes of the smoke game."""
    from fixture_models import build_fixture_model
    from gpu_smoke_env import Scripted, losing_actions

    from eto_train.envs import make_env
    from eto_train.experts import expert_episode
    from eto_train.config import shipped

    prompt = shipped().prompt.prompt_config()  # configs/prompt/react.yaml
    env = make_env(env_cfg)
    tasks = env.tasks("train")[:n_experts]
    experts = [expert_episode(env, t, prompt) for t in tasks]
    losers = [expert_episode(Scripted(env, losing_actions(env, t)), t, prompt) for t in tasks]
    env.close()
    build_fixture_model(FAMILY, out, max_position_embeddings=4096, seed=0, **SIZES[size])
    return experts, losers


def train_cfg(kind: str, o, lr: float, ckpt: bool) -> dict:
    """A bc-style (sft) or dpo section of the config, sized for the smoke."""
    common = {"learning_rate": lr, "num_train_epochs": 1, "max_steps": o.steps,
              "per_device_train_batch_size": o.batch if kind == "sft" else o.batch // 2 or 1,
              "gradient_accumulation_steps": 1, "lr_scheduler_type": "constant", "warmup_steps": 0.0,
              "max_length": 2048, "logging_steps": 1, "save_strategy": "no", "save_steps": 500, "save_total_limit": 1,
              "bf16": o.gpu, "use_cpu": not o.gpu, "activation_checkpointing": ckpt,
              # per-step token counts in the logs (step_rate): any TRL argument goes into the section
              "include_num_input_tokens_seen": "non_padding"}
    if kind == "sft":
        return {**common, "weight_decay": 0.0, "only_success": True}
    return {**common, "beta": 0.1, "loss_type": ["sigmoid"], "loss_weights": None, "precompute_ref_log_probs": True}


def make_job(name: str, kind: str, base: str, data, train: dict, model: dict, seed: int, out: Path):
    """The recipe's job of ``kind`` (sft or dpo) with its TRL arguments, checkpoints in ``out``, as a stage builds it."""
    from eto_train.config import BCSection, DPOSection
    from eto_train.layout import checkpoints
    from eto_train.training import recipe
    from eto_train.training.dpo import dpo_arguments
    from eto_train.training.sft import sft_arguments

    job, section, arguments = ((recipe.SFTJob, BCSection, sft_arguments) if kind == "sft" else
                               (recipe.DPOJob, DPOSection, dpo_arguments))
    return job(name, str(base), data, arguments(section.model_validate(train), checkpoints(out), seed), model)


def model_cfg(o, lora: bool) -> dict:
    return {"dtype": o.dtype, "lora": dict(LORA) if lora else None, "quantization": None}


def compare_saved(policy_dir: Path, model, base_dir: Path, sample: tuple[str, ...]) -> dict:
    """The saved policy against the trained model in memory (``model``: its weights cast to the
    file's dtype must be equal; PEFT prefixes stripped) and against the base it started from (the
    share of elements that changed), on the tensors whose names contain one of ``sample``."""
    import torch
    from safetensors import safe_open

    def tensors(folder):
        out = {}
        for f in sorted(Path(folder).glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as fh:
                out.update({k: fh.get_tensor(k) for k in fh.keys() if any(s in k for s in sample)})
        return out

    saved, base = tensors(policy_dir), tensors(base_dir)
    mem = {}
    if model is not None:
        for k, v in model.state_dict().items():
            k = k.removeprefix("base_model.model.").replace(".base_layer.", ".")
            if k in saved:
                mem[k] = v.full_tensor() if hasattr(v, "full_tensor") else v
    equal = sum(bool(torch.equal(saved[k], mem[k].detach().to(saved[k].dtype).cpu())) for k in mem)
    changed = sum(int((saved[k].float() != base[k].float()).sum()) for k in saved if k in base)
    total = sum(saved[k].numel() for k in saved if k in base)
    return {"tensors_compared": len(saved), "equal_to_trained": f"{equal}/{len(mem)}",
            "saved_dtype": str(next(iter(saved.values())).dtype) if saved else None,
            "changed_from_base": round(changed / total, 6) if total else None}


def reload_loss(policy_dir: Path, dtype: str, conv) -> float:
    """Reload the saved policy (as every later stage does) and compute a loss on one conversation."""
    import torch

    from eto_train.model.load import load_model, load_tokenizer
    from eto_train.training.masks import assistant_token_mask

    tok, model = load_tokenizer(str(policy_dir)), load_model(str(policy_dir), dtype=dtype, device="auto")
    ids, mask = assistant_token_mask(tok, conv)
    x = torch.tensor([ids], device=next(model.parameters()).device)
    labels = x.masked_fill(torch.tensor([mask], device=x.device) == 0, -100)
    with torch.no_grad():
        loss = float(model(input_ids=x, labels=labels).loss)
    if not loss == loss or loss in (float("inf"), float("-inf")):
        raise ValueError(f"{policy_dir}: the reloaded policy's loss is {loss}")
    return loss


def run_training(name, kind, base: Path, data, o, lr, ckpt=False, lora=False) -> dict:
    """One job through recipe.train, its throughput and MFU, then the saved policy checked."""
    from eto_train.layout import policy
    from eto_train.training.recipe import train
    from eto_train.training.save import check_policy

    out = o.out / name
    job = make_job(name, kind, str(base), data, train_cfg(kind, o, lr, ckpt), model_cfg(o, lora), 0, out)
    trained = train(job, out)
    tr = trained.trainer
    rate = step_rate(tr.state.log_history, o.warmup)
    n_lora = trained.trainable_parameters if lora else 0
    fpt = train_flops_per_token(_parameters(base), n_lora)  # the base's N (the adapters are merged by now)
    res = {**rate, "base": str(base), "optimizer_steps": trained.optimizer_steps, "rows": trained.rows,
           "trainable_parameters": trained.trainable_parameters, "flops_per_token": fpt,
           "mfu": mfu(fpt, rate["tokens_per_s"], o.peak), "gradient_checkpointing": ckpt,
           # after the save (adapters merged): the dtype the trained weights were held in
           "trained_dtype": str(next(tr.model.parameters()).dtype)}
    saved = policy(out)
    check_policy(saved)  # recipe.train checked it too: here its verdict is in the report
    res["saved"] = str(saved)
    res["reload"] = compare_saved(saved, tr.model, base, o.sample)
    del trained, tr
    _free()
    res["reload"]["loss"] = reload_loss(saved, o.dtype, data[0] if kind == "sft" else data[0]["prompt"]
                                        + data[0]["chosen"])
    eq, n = res["reload"]["equal_to_trained"].split("/")
    if eq != n:
        raise AssertionError(f"{name}: the saved policy differs from the trained weights ({eq} of {n} tensors equal)")
    if lora and not res["reload"]["changed_from_base"]:
        raise AssertionError(f"{name}: the merged policy equals its base (the adapter was not merged)")
    return res


def fsdp2(o, base: Path, convs) -> dict:
    """One process of `accelerate launch` with configs/accelerate/fsdp.yaml, full SFT through the
    recipe (this script, --fsdp-child); the child's report is this section's."""
    folder = o.out / "fsdp2"
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"job": {"name": "fsdp2", "kind": "sft", "base": str(base), "data": convs,
                    "train": train_cfg("sft", o, 2e-5, False), "model": model_cfg(o, False), "seed": 0},
            "cpu": not o.gpu, "warmup": o.warmup, "peak": o.peak, "sample": list(o.sample), "dtype": o.dtype}
    (folder / "spec.json").write_text(json.dumps(spec))
    (folder / "result.json").unlink(missing_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs/accelerate/fsdp.yaml"),
           "--num_processes", "1", "--main_process_port", str(port), str(Path(__file__)), "--fsdp-child", str(folder)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=o.fsdp_timeout,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    (folder / "child.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not (folder / "result.json").exists():
        log = (proc.stdout + proc.stderr).strip().splitlines()
        errors = [ln for ln in log if re.match(r"(\[rank\d+\]: )?[\w.]*(Error|Exception)\b", ln)
                  and "ChildFailedError" not in ln]  # the child's own error, not the launcher's wrapper
        raise RuntimeError(f"accelerate launch exited {proc.returncode} (log: {folder / 'child.log'}): "
                           + " | ".join([e for e in errors if e.startswith("[rank")][-1:] or errors[-1:] or log[-12:]))
    return {**json.loads((folder / "result.json").read_text()), "launch_seconds": round(time.perf_counter() - t0, 1),
            "command": " ".join(cmd[2:])}


def fsdp_child(folder: Path) -> int:
    """In the launched process: recipe.train under FSDP2, what the accelerator ran, the saved policy checked."""
    spec = json.loads((folder / "spec.json").read_text())
    # on a CPU (the dry run) setup_runtime turns FSDP on over gloo (eto_train.distributed.fsdp_on_cpu)
    from eto_train.layout import policy
    from eto_train.runtime import setup_runtime
    from eto_train.training.recipe import train
    from eto_train.training.save import check_policy

    setup_runtime(int(os.environ.get("OMP_NUM_THREADS", "1")))
    job = make_job(**spec["job"], out=folder / "run")  # the TRL arguments are built in the launched process
    trained = train(job, folder / "run")
    tr = trained.trainer
    p = next(tr.model.parameters())
    rate = step_rate(tr.state.log_history, spec["warmup"])
    fpt = train_flops_per_token(_parameters(Path(job.base)))
    res = {"distributed_type": str(tr.accelerator.distributed_type),
           "fsdp_version": getattr(tr.accelerator.state.fsdp_plugin, "fsdp_version", None),
           "parameter_type": type(p).__name__, "master_dtype": str(p.dtype), "world_size": tr.args.world_size,
           **rate, "flops_per_token": fpt, "mfu": mfu(fpt, rate["tokens_per_s"], spec["peak"])}
    saved = policy(folder / "run")
    if tr.accelerator.is_main_process:
        check_policy(saved)
        res["reload"] = compare_saved(saved, tr.model, Path(job.base), tuple(spec["sample"]))
    del trained, tr
    _free()
    if "FSDP" not in res["distributed_type"] or res["parameter_type"] != "DTensor":
        res["error"] = f"not sharded by FSDP2 ({res['distributed_type']}, parameters {res['parameter_type']})"
    elif res["reload"]["equal_to_trained"].split("/")[0] != res["reload"]["equal_to_trained"].split("/")[1]:
        res["error"] = f"the saved policy differs from the sharded weights ({res['reload']['equal_to_trained']})"
    else:
        res["reload"]["loss"] = reload_loss(saved, spec["dtype"], job.data[0])
    (folder / "result.json").write_text(json.dumps(res, indent=1, default=str))
    return 1 if "error" in res else 0


def memory(o) -> dict:
    """Free GPU memory now that training is over, against vLLM's start rule for each rollout config
    (eto_train.rollouts.vllm_engine.check_start_memory: free >= gpu_memory_utilization x total)."""
    import torch
    import yaml

    from eto_train.rollouts.vllm_engine import GiB, check_start_memory, cuda_memory

    def utilization(f: Path):  # the file's vllm.gpu_memory_utilization, else its Hydra defaults' (rollout/gpu: cpu's)
        cfg = yaml.safe_load(f.read_text()) or {}
        u = (cfg.get("vllm") or {}).get("gpu_memory_utilization")
        for d in cfg.get("defaults") or []:
            if u is None and isinstance(d, str) and (f.parent / f"{d}.yaml").is_file():
                u = utilization(f.parent / f"{d}.yaml")
        return u

    rules = {f"rollout/{f.stem}": u for f in sorted((ROOT / "configs" / "rollout").glob("*.yaml"))
             if (u := utilization(f)) is not None}
    if not o.gpu:
        return {"skipped": "no CUDA device (torch.cuda.mem_get_info)", "gpu_memory_utilization": rules}
    free, total = cuda_memory()
    res = {"free_gib": round(free / GiB, 2), "total_gib": round(total / GiB, 2),
           "allocated_gib": round(torch.cuda.memory_allocated() / GiB, 2),
           "reserved_gib": round(torch.cuda.memory_reserved() / GiB, 2), "rules": {}}
    errors = []
    for name, u in rules.items():
        try:
            check_start_memory(u, (free, total))
            ok = True
        except RuntimeError as exc:
            ok, _ = False, errors.append(f"{name}: {exc}")
        res["rules"][name] = {"gpu_memory_utilization": u, "needs_gib": round(u * total / GiB, 2), "would_start": ok}
    if errors:
        raise RuntimeError("; ".join(errors))
    return res


def rollouts(policy_obj, env_cfg, rows: int, sync) -> dict:
    """One batch of ``rows`` episodes (one per task) with ``rows`` parallel rows."""
    from eto_train.config import shipped
    from eto_train.envs import make_env
    from eto_train.records import PolicyRef
    from eto_train.rollouts.loop import RolloutConfig, run_rollouts

    lister = make_env(env_cfg)
    tasks = lister.tasks("train")[:rows]
    lister.close()
    timed, eps = TimedPolicy(policy_obj, sync), []
    t0 = time.perf_counter()
    cfg = shipped()  # configs/: the react prompt, the engine's retries
    run_rollouts([(t, 0) for t in tasks], lambda: make_env(env_cfg), timed, PolicyRef(id="smoke"),
                 cfg.prompt.prompt_config(), RolloutConfig(batch_size=rows, env_retries=cfg.rollout.env_retries, seed=0,
                                                           overlap_env=False), on_episode=eps.append)
    wall = time.perf_counter() - t0
    steps = sum(e.num_steps for e in eps)
    return {"rows": rows, "episodes": len(eps), "steps": steps, "generated_tokens": timed.tokens, "calls": timed.calls,
            "generate_seconds": round(timed.seconds, 3), "wall_seconds": round(wall, 3),
            "gen_tokens_per_s": timed.tokens / timed.seconds if timed.seconds else 0.0,
            "steps_per_s": steps / wall if wall else 0.0}


def _generation(new_tokens: int):
    """configs/rollout/cpu.yaml's generation (greedy) with the smoke's ``new_tokens``."""
    from eto_train.config import shipped

    return shipped().rollout.generation.model_copy(update={"max_new_tokens": new_tokens})


def rollouts_hf(o, path: Path, env_cfg, sync) -> dict:
    from eto_train.model.load import load_model, load_tokenizer
    from eto_train.rollouts.loop import Policy

    policy = Policy(load_model(str(path), dtype=o.dtype, device="auto"), load_tokenizer(str(path)),
                    _generation(o.new_tokens), 4096)
    rollouts(policy, env_cfg, min(8, o.rows[0]), sync)  # warm-up (kernels, allocator): not reported
    return {"policy": str(path), **{f"rows_{r}": rollouts(policy, env_cfg, r, sync) for r in o.rows}}


def rollouts_vllm(o, path: Path, env_cfg, sync) -> dict:
    import yaml

    from eto_train.rollouts.vllm_engine import VLLMPolicy

    engine = dict(yaml.safe_load((ROOT / "configs/rollout/cpu.yaml").read_text())["vllm"])  # rollout=gpu inherits it
    t0 = time.perf_counter()
    policy = VLLMPolicy.from_checkpoint(str(path), _generation(o.new_tokens), 4096,
                                        dtype="bfloat16", **engine)
    start = time.perf_counter() - t0
    try:
        return {"engine": engine, "engine_start_seconds": round(start, 1),
                **{f"rows_{r}": rollouts(policy, env_cfg, r, sync) for r in o.rows}}
    finally:
        policy.close()


def gemm(o) -> dict:
    """TFLOP/s of a large bf16 matmul on this GPU: what the card sustains, beside the named peak."""
    import torch

    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    reps, t0 = 20, time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    tflops = 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12
    return {"n": n, "tflops": round(tflops, 1), "peak_tflops_used_for_mfu": o.peak / 1e12 if o.peak else None}


def _parameters(folder: Path) -> int:
    """Parameters of a saved checkpoint, from its safetensors headers (nothing loaded)."""
    import math

    from safetensors import safe_open

    n = 0
    for f in Path(folder).glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as fh:
            n += sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys())
    return n


def _free() -> None:
    from eto_train.distributed import free_accelerator_memory

    free_accelerator_memory()


def _importable(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


# -- the run ---------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu_smoke")
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny model on the CPU: checks the wiring")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per training run")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help=f"dense bf16 peak for MFU (default: {H200_BF16_PEAK_TFLOPS:g} on an H200, else no MFU)")
    ap.add_argument("--budget-s", type=float, default=None, help="seconds before the optional parts are skipped")
    ap.add_argument("--fsdp-child", type=Path, default=None, help=argparse.SUPPRESS)
    o = ap.parse_args(argv)
    if o.fsdp_child:
        return fsdp_child(o.fsdp_child)
    import torch

    from eto_train.runtime import setup_runtime

    o.gpu = torch.cuda.is_available() and not o.cpu_dry_run
    if not o.gpu and not o.cpu_dry_run:
        print("gpu_smoke: no CUDA device (use --cpu-dry-run to check the wiring on a CPU)")
        return 2
    size = "1b" if o.gpu else "tiny"
    # 24 on a GPU: at 12 (10 timed) the first sections were still warming up (H200, 2026-12-04: sft_full 19.0%
    # MFU at 12 steps, 26.4% at 24; DPO 19.1% against 31.2%), and the whole run took about as long (186 / 188 s)
    o.steps = o.steps or (24 if o.gpu else 3)
    o.warmup = 2 if o.gpu else 1        # steps left out of the rate (allocator, kernels' first runs)
    o.batch = 32 if o.gpu else 2        # sequences per SFT step (DPO: half as many pairs)
    o.rows = (64, 128, 256) if o.gpu else (2, 4)
    o.new_tokens = 32
    o.dtype = "bfloat16" if o.gpu else "float32"
    o.fsdp_timeout = 180 if o.gpu else 240  # the child's own run: ~1 minute expected on the GPU
    o.budget_s = o.budget_s or (420 if o.gpu else 600)
    o.sample = ("embed_tokens", "layers.0.", f"layers.{SIZES[size]['num_layers'] - 1}.")  # tensors compared
    o.out.mkdir(parents=True, exist_ok=True)
    setup_runtime(max(1, (os.cpu_count() or 2) // 2) if o.gpu else 1)  # offline hub, quiet libraries
    sync = torch.cuda.synchronize if o.gpu else (lambda: None)
    device = torch.cuda.get_device_name(0) if o.gpu else "cpu"
    o.peak = peak_flops(device, o.peak_tflops)
    from eto_train.runtime import versions

    results: dict = {"device": device, "peak_flops": o.peak, "versions": versions(), "sizes": SIZES[size],
                     "family": FAMILY, "steps": o.steps, "batch": o.batch, "sections": {}}
    t_all = time.perf_counter()

    def record(name, res):
        results["sections"][name] = res
        (o.out / "gpu_smoke.json").write_text(json.dumps(results, indent=2, default=str))  # partial, if cut short
        print(f"[gpu_smoke] {name}: {json.dumps(res, default=str)}", flush=True)
        return res

    def section(name, fn, needs=()):
        lacking = [n for n in needs if results["sections"].get(n, {}).get("status") != "done"]
        if lacking:
            return record(name, {"status": "failed" if name in REQUIRED else "skipped",
                                 "why": f"needs {', '.join(lacking)}, which did not finish"})
        if name not in REQUIRED and time.perf_counter() - t_all > o.budget_s:
            return record(name, {"status": "skipped", "why": f"time budget ({o.budget_s:.0f} s) spent"})
        t0 = time.perf_counter()
        print(f"[gpu_smoke] {name} ...", flush=True)
        try:
            res = fn()
            res = {"status": "skipped", "why": res.pop("skipped"), **res} if "skipped" in res else {"status": "done", **res}
        except Exception as exc:  # keep going: one prepared run reports every part it can
            traceback.print_exc()
            res = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:2000]}
        res["seconds"] = round(time.perf_counter() - t0, 1)
        _free()
        return record(name, res)

    env_cfg = {"name": "smoke_text", "adapter": "gpu_smoke_env:SmokeTextEnv",  # scripts/ is on sys.path
               "n_tasks": max(o.rows) + 64, "max_steps": 6 if o.gpu else 3,
               "path_len": 4 if o.gpu else 2}
    base = o.out / f"model_{size}"
    data: dict = {}

    def do_build():
        from eto_train.pairs import trajectory_pair
        from eto_train.records import to_messages

        experts, losers = build(base, size, env_cfg, 64 if o.gpu else 4)
        reps = o.steps * o.batch // len(experts) + 1  # enough rows for the steps asked
        data["convs"] = [to_messages(e) for e in experts] * reps
        pairs = [trajectory_pair(e, b) for e, b in zip(experts, losers)]
        data["pairs"] = [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs if p] * reps
        n = _parameters(base)
        return {"parameters": n, "experts": len(experts), "pairs": len(pairs), "path": str(base)}

    section("build", do_build)
    if o.gpu:
        section("gemm", lambda: gemm(o))
    else:
        record("gemm", {"status": "skipped", "why": "no CUDA device"})
    section("sft_full", lambda: run_training("sft_full", "sft", base, data["convs"], o, 2e-5), needs=("build",))
    section("sft_full_ckpt", lambda: run_training("sft_full_ckpt", "sft", base, data["convs"], o, 2e-5, ckpt=True),
            needs=("build",))
    section("sft_lora", lambda: run_training("sft_lora", "sft", base, data["convs"], o, 1e-4, lora=True),
            needs=("build",))
    def trained_or_base():  # DPO and rollouts start from the SFT policy, or the base if it failed
        return o.out / "sft_full" / "model" if results["sections"]["sft_full"]["status"] == "done" else base

    section("dpo", lambda: run_training("dpo", "dpo", trained_or_base(), data["pairs"], o, 1e-6), needs=("build",))
    section("memory", lambda: memory(o))  # after the trainings of this process, before the rollouts' model
    section("rollouts_hf", lambda: rollouts_hf(o, trained_or_base(), env_cfg, sync), needs=("build",))
    section("fsdp2", lambda: fsdp2(o, base, data["convs"]), needs=("build",))  # last required: its own process
    if o.gpu and _importable("vllm"):
        section("rollouts_vllm", lambda: rollouts_vllm(o, trained_or_base(), env_cfg, sync), needs=("build",))
    else:
        record("rollouts_vllm", {"status": "skipped", "why": "needs a CUDA GPU and vllm (optional; not installed)"
                                 if o.gpu else "no CUDA device"})
    return finish(results, o, t_all)


def finish(results, o, t_all) -> int:
    results["total_seconds"] = round(time.perf_counter() - t_all, 1)
    failed = [n for n, r in results["sections"].items() if r["status"] == "failed" and n in REQUIRED]
    results["failed_required"] = failed
    (o.out / "gpu_smoke.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"\n== gpu_smoke on {results['device']} ({results['total_seconds']} s) ==")
    for name, r in results["sections"].items():
        head = f"{name:14s} {r['status']:7s}"
        if r["status"] == "failed":
            print(f"{head} {r.get('error') or r.get('why')}")
        elif r["status"] == "skipped":
            print(f"{head} {r['why']}")
        elif "tokens_per_s" in r:
            m = f", MFU {100 * r['mfu']:.1f}%" if r.get("mfu") is not None else ""
            print(f"{head} train {r['tokens_per_s']:,.0f} tokens/s{m} ({r['steps_timed']} steps timed), "
                  f"reload {r.get('reload', {}).get('equal_to_trained')} equal")
        elif name.startswith("rollouts"):
            runs = [v for v in r.values() if isinstance(v, dict) and "gen_tokens_per_s" in v]
            print(f"{head} " + "; ".join(f"{v['rows']} rows {v['gen_tokens_per_s']:,.0f} gen tokens/s" for v in runs))
        elif name == "memory":
            print(f"{head} free {r['free_gib']} of {r['total_gib']} GiB; "
                  + ", ".join(f"{k} {v['gpu_memory_utilization']}: {'starts' if v['would_start'] else 'REFUSED'}"
                              for k, v in r["rules"].items()))
        else:
            print(f"{head} {({k: v for k, v in r.items() if k not in ('status',)})}")
    print(f"-> {o.out / 'gpu_smoke.json'}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    from eto_train.interrupt import interruptible

    with interruptible(resume=False):  # Ctrl-C: one line, exit 130 (the sections finished are in gpu_smoke.json)
        sys.exit(main())
