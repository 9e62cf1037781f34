"""Benchmarks (`make bench`): medians and ratios measured side by side in one run.

1. Rollout throughput: the batched engine (N parallel episodes, KV cache kept across turns)
   against one episode at a time, same model, same tasks, same greedy decoding, two ways: the
   same engine with one row, and plain HF ``generate`` on the whole conversation each turn
   (what one-at-a-time generation is without a cross-turn cache).
2. Behavior-cloning training throughput: tokens per second of SFT steps on the tiny model.
3. DPO: precomputed reference log-probs against TRL's on-the-fly reference.
4. ScienceWorld steps/s: the adapter's fast path against the package's plain ``step()``, same
   gold actions (needs no policy; alone: ``bench.only=sciworld``).

    python scripts/bench.py [bench.episodes=32 bench.repeats=3 bench.only=sciworld ...]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import hydra
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from eto_train.envs import make_env
from eto_train.experts import expert_episode
from eto_train.interrupt import interruptible
from eto_train.model.load import load_model, load_tokenizer, policy_ref
from eto_train.prompting import PromptConfig
from eto_train.rollout import GenerationConfig, Policy, RolloutConfig, run_rollouts
from eto_train.stage import setup_runtime, to_plain, versions
from eto_train.store import write_json


class _PlainGenerate:
    """The policy without its cross-turn KV session: the rollout engine then calls HF
    ``generate`` on the whole conversation every turn (see ``rollout._Stateless``)."""

    def __init__(self, policy):
        self.generate = policy.generate


def _rollouts(work, env_cfg, policy, ref, prompt, batch, overlap):
    eps = []
    t0 = time.perf_counter()
    run_rollouts(work, lambda: make_env(env_cfg), policy, ref, prompt,
                 RolloutConfig(batch_size=batch, overlap_env=overlap), on_episode=eps.append)
    return time.perf_counter() - t0, eps


def _sciworld(cfg) -> dict:
    """Steps/s replaying gold paths through the adapter (score and completion reads only) and
    through the package's ``ScienceWorldEnv.step`` (which also lists every valid action)."""
    import logging

    from scienceworld import ScienceWorldEnv as PackageEnv

    logging.getLogger("scienceworld").setLevel(logging.WARNING)  # it logs every load at INFO
    sb = cfg.bench.sciworld
    env_cfg = to_plain(cfg.env) if cfg.env.name == "sciworld" else \
        OmegaConf.to_container(OmegaConf.load(Path(__file__).parents[1] / "configs/env/sciworld.yaml"))
    env = make_env(env_cfg)
    package = None
    try:
        first = {}  # one variation of each task, in split order
        for t in env.tasks(sb.split):
            first.setdefault(t.game, t)
        tasks = list(first.values())[: sb.variations]
        gold = {t.task_id: env.expert_actions(t) for t in tasks}
        package = PackageEnv("", envStepLimit=10**6)
        fast, plain, wins, matches = [], [], True, []

        def replay(reset, step, task):  # (seconds spent stepping, [(observation, won)])
            reset(task)
            obs, t0 = [], time.perf_counter()
            for a in gold[task.task_id]:
                obs.append(step(a))
            return time.perf_counter() - t0, obs

        def package_reset(t):
            package.load(env.sim_names[t.game], t.seed, env.simplifications)
            package.reset()

        def package_step(a):
            o, _, done, info = package.step(a)
            return o.strip(), done and info["score"] >= 0

        def adapter_step(a):
            r = env.step(a)
            return r.observation, r.success

        # Alternated, so that drift hits both; the medians drop the package JVM's cold first pass.
        for _ in range(sb.repeats):
            runs_fast = [replay(env.reset, adapter_step, t) for t in tasks]
            runs_plain = [replay(package_reset, package_step, t) for t in tasks]
            fast.append(sum(s for s, _ in runs_fast))
            plain.append(sum(s for s, _ in runs_plain))
            wins &= all(o[-1][1] for _, o in runs_fast + runs_plain)  # every gold path won both ways
            # Observations agree step by step except where the simulator itself draws at random
            # (thermometer readings, for one, differ between two runs of the same path).
            matches += [a == b for (_, fo), (_, po) in zip(runs_fast, runs_plain) for a, b in zip(fo, po)]
    finally:
        env.close()
        if package is not None:
            package.close()
            package.close = lambda: None  # the package's __del__ closes again
    steps = sum(len(a) for a in gold.values())
    mf, mp = statistics.median(fast), statistics.median(plain)
    return {"tasks": [t.task_id for t in tasks], "steps": steps, "repeats": sb.repeats,
            "adapter_jvm": [f"-Xmx{env.heap_mb}m", *env.jvm_options], "package_jvm": "as the package starts it",
            "adapter_seconds": fast, "package_seconds": plain, "adapter_steps_per_s": steps / mf,
            "package_steps_per_s": steps / mp, "speedup": mp / mf, "all_won_both_ways": wins,
            "same_observation_fraction": sum(matches) / len(matches)}


def _sciworld_rows(t, sw) -> None:
    t.add_row(f"ScienceWorld adapter, gold paths of {len(sw['tasks'])} tasks (median of {sw['repeats']})",
              f"{sw['adapter_steps_per_s']:.0f} steps/s ({sw['steps']} steps)")
    t.add_row("ScienceWorld package step(), same actions (median)", f"{sw['package_steps_per_s']:.1f} steps/s")
    t.add_row("speedup adapter / package", f"{sw['speedup']:.1f}x")
    t.add_row("all gold paths won both ways; steps with the same observation",
              f"{sw['all_won_both_ways']}; {sw['same_observation_fraction']:.1%}")


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    with interruptible(cfg, resume=False):  # Ctrl-C: one line, exit 130
        _bench(cfg)


def _bench(cfg) -> None:
    console = Console(width=120, markup=False)
    b = cfg.bench
    if b.only not in (None, "sciworld"):
        raise ValueError(f"bench.only: {b.only!r} is not a section that runs alone (sciworld, or null for all)")
    if b.only == "sciworld":
        sw = _sciworld(cfg)
        out = Path(cfg.paths.run) / "bench"
        write_json(out / "sciworld.json", {"sciworld": sw, "versions": versions(), "config": OmegaConf.to_container(b)})
        t = Table(title="make bench: ScienceWorld")
        t.add_column("measure")
        t.add_column("value", justify="right")
        _sciworld_rows(t, sw)
        console.print(t)
        console.print(f"-> {out / 'sciworld.json'}")
        return
    setup_runtime(cfg.runtime.rollout_threads)
    env_cfg, prompt = to_plain(cfg.env), PromptConfig(**to_plain(cfg.prompt))
    policy_path = b.policy
    tok = load_tokenizer(policy_path)
    model = load_model(policy_path, dtype=cfg.model.dtype)
    ref = policy_ref(policy_path, name="bench")
    policy = Policy(model, tok, GenerationConfig(**to_plain(cfg.eval.generation)), cfg.model.max_context)
    lister = make_env(env_cfg)
    tasks = lister.tasks(b.split)[: b.episodes]
    lister.close()
    work = [(t, 0) for t in tasks]

    # -- 1. batched vs sequential rollouts, alternated so drift hits both ----------------------
    import torch

    threads = list(b.threads)
    modes = (("batched", b.episodes, policy), ("sequential", 1, policy), ("generate", 1, _PlainGenerate(policy)))
    runs = {(n, mode): [] for n in threads for mode, _, _ in modes}  # (seconds, steps) of each run
    outputs = []  # (mode, each task's raw outputs) of every run
    for _ in range(b.repeats):
        for n in threads:  # each thread count: batched then one at a time (both ways), back to back
            torch.set_num_threads(n)
            for mode, batch, pol in modes:
                s, eps = _rollouts(work, env_cfg, pol, ref, prompt, batch, cfg.eval.overlap_env)
                runs[n, mode].append((s, sum(e.num_steps for e in eps)))
                outputs.append((mode, {e.task_id: [st.raw_output for st in e.steps] for e in eps}))
                if mode == "batched":
                    eps_b = eps
    torch.set_num_threads(cfg.runtime.rollout_threads)
    steps = sum(e.num_steps for e in eps_b)
    # every run of the KV engine answers the same; plain generate may differ in a float rounding
    first = outputs[0][1]  # the first batched run
    same = all(o == first for m, o in outputs if m != "generate")
    gen_same = [o == first for m, o in outputs if m == "generate"]
    # medians of seconds and of steps/s (plain generate may play other steps: its ratio is by steps/s)
    med = {k: statistics.median(s for s, _ in v) for k, v in runs.items()}
    rate = {k: statistics.median(n / s for s, n in v) for k, v in runs.items()}
    per_threads = {n: {**{f"{m}_seconds": [s for s, _ in runs[n, m]] for m, _, _ in modes},
                       **{f"{m}_median_s": med[n, m] for m, _, _ in modes},
                       "steps_per_s": {m: rate[n, m] for m, _, _ in modes},
                       "speedup": rate[n, "batched"] / rate[n, "sequential"],
                       "speedup_vs_generate": rate[n, "batched"] / rate[n, "generate"]} for n in threads}

    # -- 2. BC training tokens/s ------------------------------------------------------------
    setup_runtime(cfg.runtime.train_threads)
    from eto_train.training.sft import make_trainer, sft_config, sft_dataset
    env = make_env(env_cfg)
    experts = [expert_episode(env, t, prompt) for t in env.tasks("train")[: b.bc_trajectories]]
    env.close()
    bc_cfg = {**to_plain(cfg.bc), "max_steps": b.bc_steps, "save_strategy": "no", "logging_steps": 1000}
    out = Path(cfg.paths.run) / "bench"
    train_model = load_model(policy_path, dtype=cfg.model.dtype)
    trainer = make_trainer(train_model, tok, sft_dataset(experts, tok),
                           sft_config(str(out / "sft"), bc_cfg, cfg.seed, report_to="none"))
    res = trainer.train()
    per_step = [len(x) for x in trainer.train_dataset["input_ids"]]
    tokens = statistics.mean(per_step) * cfg.bc.batch_size * cfg.bc.grad_accum * res.global_step
    bc_tps = tokens / res.metrics["train_runtime"]

    # -- 3. DPO: precomputed reference log-probs vs TRL's on-the-fly reference, same pairs ------
    from datasets import Dataset

    from eto_train.pairs import trajectory_pair
    from eto_train.training.dpo import dpo_config, make_dpo_trainer

    env = make_env(env_cfg)
    gold = {t.task_id: expert_episode(env, t, prompt) for t in tasks}
    env.close()
    pair_list = [p for e in eps_b if (p := trajectory_pair(gold[e.task_id], e)) is not None]
    dpo_runs = {}
    if pair_list:
        ds = Dataset.from_list([{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pair_list])
        d = {**to_plain(cfg.eto.dpo), "epochs": 1, "max_steps": None, "save_strategy": "no", "logging_steps": 1}
        d.pop("later")
        for mode in ("precomputed", "on_the_fly", "precomputed", "on_the_fly"):
            d["precompute_ref_log_probs"] = mode == "precomputed"
            t0 = time.perf_counter()
            tr = make_dpo_trainer(load_model(policy_path, dtype=cfg.model.dtype), None, tok, ds,
                                  dpo_config(str(out / "dpo"), d, cfg.seed, report_to="none"))
            r = tr.train()
            total = time.perf_counter() - t0  # includes the reference pass when precomputed
            losses = [h["loss"] for h in tr.state.log_history if "loss" in h]
            dpo_runs.setdefault(mode, []).append({"seconds": total, "final_loss": losses[-1], "steps": r.global_step})
    dpo_res = {m: {"median_s": statistics.median(x["seconds"] for x in runs), "final_loss": runs[-1]["final_loss"],
                   "steps": runs[-1]["steps"]} for m, runs in dpo_runs.items()}

    sw = _sciworld(cfg) if b.sciworld.variations else None

    results = {
        "sciworld": sw,
        "rollout": {"episodes": len(work), "steps": steps, "batch": b.episodes, "repeats": b.repeats,
                    "identical_outputs": same, "generate_runs_with_identical_outputs": sum(gen_same),
                    "default_threads": cfg.runtime.rollout_threads,
                    "overlap_env": cfg.eval.overlap_env,
                    "by_threads": per_threads},
        "bc": {"optimizer_steps": res.global_step, "seconds": res.metrics["train_runtime"],
               "tokens_per_second": bc_tps, "batch_size": cfg.bc.batch_size,
               "threads": cfg.runtime.train_threads},
        "dpo_epoch": {"pairs": len(pair_list), **dpo_res},
        "policy": ref.id, "versions": versions(), "config": OmegaConf.to_container(b),
    }
    write_json(out / "bench.json", results)
    t = Table(title=f"make bench ({ref.id})")
    t.add_column("measure")
    t.add_column("value", justify="right")
    for n, r in per_threads.items():
        sps = r["steps_per_s"]
        t.add_row(f"rollouts, {n} torch thread(s): batched x{b.episodes} (median of {b.repeats})",
                  f"{r['batched_median_s']:.2f} s  ({sps['batched']:.1f} steps/s)")
        t.add_row("  one episode at a time, HF generate per turn (median)",
                  f"{r['generate_median_s']:.2f} s  ({sps['generate']:.1f} steps/s)")
        t.add_row("  one episode at a time, same KV engine, 1 row (median)",
                  f"{r['sequential_median_s']:.2f} s  ({sps['sequential']:.1f} steps/s)")
        t.add_row("  speedup batched / HF generate one at a time (steps/s)", f"{r['speedup_vs_generate']:.1f}x")
        t.add_row("  speedup batched / KV engine one at a time", f"{r['speedup']:.1f}x")
    t.add_row("same greedy outputs in every KV-engine run", str(same))
    t.add_row("HF generate runs with the same outputs", f"{sum(gen_same)} of {len(gen_same)}")
    t.add_row(f"BC training ({res.global_step} steps, batch {cfg.bc.batch_size})", f"{bc_tps:.0f} tokens/s")
    if dpo_res:
        pre, fly = dpo_res["precomputed"], dpo_res["on_the_fly"]
        t.add_row(f"DPO epoch ({len(pair_list)} pairs), precomputed reference (median)", f"{pre['median_s']:.1f} s")
        t.add_row("DPO epoch, TRL's on-the-fly reference (median)",
                  f"{fly['median_s']:.1f} s  ({fly['median_s'] / pre['median_s']:.2f}x)")
        t.add_row("final DPO loss, precomputed / on the fly", f"{pre['final_loss']:.6f} / {fly['final_loss']:.6f}")
    if sw:
        _sciworld_rows(t, sw)
    console.print(t)
    console.print(f"-> {out / 'bench.json'}")


if __name__ == "__main__":
    with interruptible(resume=False):  # and while Hydra starts up
        main()
