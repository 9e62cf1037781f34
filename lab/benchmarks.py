"""Measurement helpers of ``make bench`` (lab/bench.py holds one function per section; these
are its pieces that tests/test_bench.py checks on their own).

- :class:`PlainGenerate`: the policy without its cross-turn KV cache (HF ``generate`` on the
  whole conversation every turn), the baseline of the rollout section at any batch size.
- :func:`step_envs`: environment steps/s of one process when a rollout at a GPU batch size
  (256) steps its environments round robin after each generate call (in the process, or in
  worker processes: ``env.workers``).
- :func:`sciworld_adapter_vs_package`: ScienceWorld's fast path against the package's ``step()``.
- :func:`comparable_episodes`, :func:`compare_episodes`, :func:`manifest_seconds`: what the
  data-parallel section reads from two evaluations of the same episodes.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

from eto_train import layout
from eto_train.envs.base import Environment, Task


class PlainGenerate:
    """The policy without its cross-turn KV session: the rollout engine then calls HF
    ``generate`` on every active conversation each turn, all of them in one left-padded batch
    (``rollouts.loop._Stateless`` -> ``Policy.generate``), re-encoding the whole conversation."""

    def __init__(self, policy):
        self.generate = policy.generate


def episode_actions(episodes) -> dict[str, list[str | None]]:
    """Each episode's actions, by task (None where an output did not parse)."""
    return {e.task_id: [s.action for s in e.steps] for e in episodes}


def episode_outputs(episodes) -> dict[str, list[str]]:
    """Each episode's raw model outputs, by task."""
    return {e.task_id: [s.raw_output for s in e.steps] for e in episodes}


def spread(tasks: Sequence[Task], n: int) -> list[Task]:
    """The first ``n`` of ``tasks`` taking each game in turn (split lists run game by game)."""
    by_game: dict[str, list[Task]] = {}
    for t in tasks:
        by_game.setdefault(t.game, []).append(t)
    mixed = [t for group in itertools.zip_longest(*by_game.values()) for t in group if t is not None]
    return mixed[:n]


# -- environment steps at a GPU batch size --------------------------------------------------
def simulator_of(env) -> int:
    """Which simulator process answers ``env``: its ScienceWorld JVM host (the simulator keeps
    global state, e.g. its simplification processor, so one JVM's games are not safe to call
    from several threads: a parallel load fails with a NullPointerException); every other
    environment counts as its own."""
    return id(getattr(env, "_host", None) or env)


def step_envs(envs: Sequence[Environment], tasks: Sequence[Task], gold: dict[str, list[str]],
              rounds: int, threads: int = 1, lane: Callable[[Any], Any] = simulator_of) -> dict[str, Any]:
    """Step ``envs`` as the rollout engine does at batch ``len(envs)``, with gold actions for a policy.

    Each environment starts on the next task of a queue that cycles over ``tasks``; a round
    (what the environments do for one generate call) steps every environment once with its
    task's next gold action, then resets each environment whose episode ended on the next task
    of the queue (continuous batching). ``threads`` > 1 makes a round's calls from a pool of
    threads (the engine today makes them one after the other), the calls of one ``lane`` (one
    simulator process) in order in one thread. Environments in worker processes
    (:mod:`eto_train.envs.workers`) are stepped as the rollout engine steps them: a round's
    calls are all sent, then their answers read in order. The same arguments give the same
    work: the queue is consumed in environment order.
    """
    from eto_train.envs.workers import sends_async

    queue = itertools.cycle(tasks)
    at: list[list] = [[None, 0] for _ in envs]  # each environment's task and position in its gold path
    remote = bool(envs) and sends_async(envs[0])  # environments in worker processes (env.workers)
    if remote and threads > 1:
        raise ValueError("step_envs: environments in worker processes are stepped from one thread (threads=1)")
    pool = ThreadPoolExecutor(threads, thread_name_prefix="bench-env") if threads > 1 else None

    def run(fn: Callable, jobs: list[tuple[int, Any]]) -> list:  # fn(i, arg) of every job, in job order
        if remote:  # every call sent first (the workers answer at once), the answers read in order
            return [then() for then in [fn(i, arg) for i, arg in jobs]]
        if pool is None:
            return [fn(i, arg) for i, arg in jobs]
        lanes: dict[Any, list] = {}
        for pos, (i, arg) in enumerate(jobs):
            lanes.setdefault(lane(envs[i]), []).append((pos, i, arg))
        out: list = [None] * len(jobs)

        def play(lane_jobs):
            for pos, i, arg in lane_jobs:
                out[pos] = fn(i, arg)
        list(pool.map(play, lanes.values()))
        return out

    def reset(i: int, task: Task):  # remote: the answer, to read later
        at[i] = [task, 0]
        if remote:
            return envs[i].reset_async(task).result
        envs[i].reset(task)

    def step(i: int, _=None):
        task, k = at[i]
        path = gold[task.task_id]
        at[i][1] = k + 1
        if remote:
            sent = envs[i].step_async(path[k])
            return lambda: answer(sent.result(), k, path)
        return answer(envs[i].step(path[k]), k, path)

    def answer(res, k: int, path: list[str]) -> tuple[bool, bool, str]:
        return res.done or k + 1 >= len(path), res.success, res.observation

    try:
        t0 = time.perf_counter()
        run(reset, [(i, next(queue)) for i in range(len(envs))])
        first_reset_s = time.perf_counter() - t0
        round_s, step_s, observations = [], [], []
        resets = won = 0
        for _ in range(rounds):
            t0 = time.perf_counter()
            answers = run(step, [(i, None) for i in range(len(envs))])
            t1 = time.perf_counter()
            done = [i for i, (end, _, _) in enumerate(answers) if end]
            run(reset, [(i, next(queue)) for i in done])
            round_s.append(time.perf_counter() - t0)
            step_s.append(t1 - t0)
            observations += [obs for _, _, obs in answers]
            resets, won = resets + len(done), won + sum(answers[i][1] for i in done)
    finally:
        if pool is not None:
            pool.shutdown()
    steps = rounds * len(envs)
    total = sum(round_s)
    return {"threads": threads, "batch": len(envs), "rounds": rounds, "steps": steps, "resets": resets,
            "first_reset_s": first_reset_s, "round_s": round_s, "step_s": step_s,
            "steps_per_s": steps / total if total else float("inf"),
            "ms_per_step": 1000 * sum(step_s) / steps if steps else 0.0,  # the step calls alone
            "ms_per_reset": 1000 * (total - sum(step_s)) / resets if resets else None,
            "round_ms_median": 1000 * statistics.median(round_s) if round_s else 0.0,
            "gold_paths_ended": resets, "gold_paths_won": won, "observations": observations}


def policy_budget(batch: int, tokens_per_s: float, tokens_per_step: float) -> dict[str, float]:
    """What the environments must keep up with when a GPU answers ``batch`` rows per generate
    call at an (assumed, not measured) ``tokens_per_s`` over the batch, ``tokens_per_step`` each."""
    call_s = batch * tokens_per_step / tokens_per_s
    return {"batch": batch, "assumed_tokens_per_s": tokens_per_s, "assumed_tokens_per_step": tokens_per_step,
            "generate_call_s": call_s, "steps_per_call": batch, "env_steps_per_s_needed": batch / call_s,
            "ms_per_step_allowed": 1000 * call_s / batch}


# -- ScienceWorld: the adapter's fast path vs the package's step() --------------------------
def sciworld_adapter_vs_package(env, tasks: Sequence[Task], repeats: int) -> dict[str, Any]:
    """Steps/s of the gold paths of ``tasks`` through ``env`` (the adapter: score and completion
    reads only) and through the package's ``ScienceWorldEnv.step`` (every valid action listed too)."""
    import logging

    from scienceworld import ScienceWorldEnv as PackageEnv

    logging.getLogger("scienceworld").setLevel(logging.WARNING)  # it logs every load at INFO
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

    try:
        # Alternated, so that drift hits both; the medians drop the package JVM's cold first pass.
        for _ in range(repeats):
            runs_fast = [replay(env.reset, adapter_step, t) for t in tasks]
            runs_plain = [replay(package_reset, package_step, t) for t in tasks]
            fast.append(sum(s for s, _ in runs_fast))
            plain.append(sum(s for s, _ in runs_plain))
            wins &= all(o[-1][1] for _, o in runs_fast + runs_plain)  # every gold path won both ways
            # Observations agree step by step except where the simulator itself draws at random
            # (thermometer readings, for one, differ between two runs of the same path).
            matches += [a == b for (_, fo), (_, po) in zip(runs_fast, runs_plain) for a, b in zip(fo, po)]
    finally:
        package.close()
        package.close = lambda: None  # the package's __del__ closes again
    steps = sum(len(a) for a in gold.values())
    mf, mp = statistics.median(fast), statistics.median(plain)
    return {"tasks": [t.task_id for t in tasks], "steps": steps, "repeats": repeats,
            "adapter_jvm": [f"-Xmx{env.heap_mb}m", *env.jvm_options], "package_jvm": "as the package starts it",
            "adapter_seconds": fast, "package_seconds": plain, "adapter_steps_per_s": steps / mf,
            "package_steps_per_s": steps / mp, "speedup": mp / mf, "all_won_both_ways": wins,
            "same_observation_fraction": sum(matches) / len(matches)}


# -- two evaluations of the same episodes ----------------------------------------------------
def manifest_seconds(stage_dir: str | Path) -> float:
    """The wall seconds a finished stage's manifest records (from the stage's start to done)."""
    m = json.loads(layout.manifest(stage_dir).read_text())
    if m.get("status") != "done":
        raise RuntimeError(f"{stage_dir}: the stage is not done (status {m.get('status')!r})")
    return float(m["seconds"])


# records.Step's measured seconds: the policy's (latency_s) and the environment's (env_s, since 39fb2be)
STEP_TIMES = ("latency_s", "env_s")


def comparable_episodes(path: str | Path) -> list[dict[str, Any]]:
    """The episodes of an episodes.jsonl file, less what two plays of the same episodes may
    differ in: the steps' times (:data:`STEP_TIMES`) and the policy's path on disk."""
    out = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        if isinstance(d.get("policy"), dict):
            d["policy"].pop("path", None)
        for s in d.get("steps", []):
            for k in STEP_TIMES:
                s.pop(k, None)
        out.append(d)
    return out


def compare_episodes(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether two plays recorded the same episodes (by episode id, whatever their order)."""
    ea, eb = {e["episode_id"]: e for e in a}, {e["episode_id"]: e for e in b}
    differ = sorted(k for k in ea.keys() & eb.keys() if ea[k] != eb[k])
    only = sorted(ea.keys() ^ eb.keys())
    return {"episodes": [len(a), len(b)], "same": not differ and not only and len(a) == len(ea) == len(b) == len(eb),
            "same_order": [e["episode_id"] for e in a] == [e["episode_id"] for e in b],
            "differing": differ[:10], "in_one_only": only[:10]}
