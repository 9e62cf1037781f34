"""Environments in worker processes (env.workers, envs/workers.py): the same episodes as in
process (faults included), a worker's error handled as an in-process one, a dead or hung
worker named (never a hang), and no process left behind."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from eto_train.envs import EnvironmentFailure, EnvironmentTimeout, make_env
from eto_train.envs.faults import INJECTED, fault_mark, new_play
from eto_train.envs.workers import FaultyWorkerEnv, WorkerEnv, WorkerPool, live_worker_pids
from eto_train.model.load import load_model, load_tokenizer, policy_ref
from eto_train.records import PolicyRef
from eto_train.rollouts.loop import Policy, RolloutConfig, WorkItem, run_rollouts

import goal_env
from episodes import untimed
from fixture_settings import env_file, generation, react_prompt, rollout_config

ROOT = Path(__file__).resolve().parents[1]
FAULTS = {"timeout": {"rate": 0.08, "seed": 0}, "crash": {"rate": 0.08, "seed": 1},
          "malformed": {"rate": 0.08, "seed": 2}}
REF = PolicyRef(id="scripted@0")


class GoalEnv(goal_env.GoalEnv):
    n_tasks = 10


class CrashyGoalEnv(GoalEnv):
    crash_seeds = (3,)


class BadDataGoalEnv(GoalEnv):
    bad_seed = 2


class HashPolicy:
    """An action as a fixed function of the conversation (the same in any batch order)."""

    def __init__(self, actions=("go", "wait")):
        self.actions = actions

    def generate(self, convs):
        out = []
        for c in convs:
            h = hashlib.sha256(repr(c).encode()).digest()[0]
            out.append((f"Action: {self.actions[0] if h < 180 else self.actions[h % len(self.actions)]}", 10, 3, 0))
        return out


def _descendants() -> dict[int, str]:
    """Processes below this one (pid -> command line), less multiprocessing's resource tracker
    (started with the first spawned process, it stays for the life of this one)."""
    found = {p.pid: " ".join(_cmdline(p.pid)) for p in psutil.Process().children(recursive=True)}
    return {pid: cmd for pid, cmd in found.items() if "resource_tracker" not in cmd}


def _wait_gone(pids, seconds: float = 20.0) -> set[int]:
    """The processes of ``pids`` still alive after up to ``seconds``."""
    end = time.monotonic() + seconds
    while True:
        alive = {p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.1)


def _rollout(work, make, policy, cfg: RolloutConfig, seen: dict[int, str] | None = None):
    """Episodes of a rollout; ``seen`` collects the processes below this one while it plays."""
    eps = []

    def on_episode(ep):
        eps.append(ep)
        if seen is not None:
            seen.update(_descendants())
    run_rollouts(work, make, policy, REF, react_prompt(), cfg, on_episode=on_episode)
    return eps


# -- the same episodes with env.workers 0 and 2 -----------------------------------------------------
def test_twx_episodes_and_faults_are_the_same_with_workers(tiny_model_dir, twx_cfg, prompt):
    """The tiny model on TextWorldExpress, faults on: workers=2 plays what workers=0 plays, draws
    the same faults in the same order, and leaves no worker (or JVM) behind."""
    tok, model = load_tokenizer(str(tiny_model_dir)), load_model(str(tiny_model_dir))
    ref = policy_ref(str(tiny_model_dir), name="tiny")
    lister = make_env(twx_cfg)
    work = [(t, 0) for t in lister.tasks("train") + lister.tasks("seen")]
    lister.close()
    before = _descendants()

    def play(workers, overlap):
        env_cfg = {**twx_cfg, "workers": workers, "faults": FAULTS}
        new_play()
        mark, eps, seen = fault_mark(), [], {}

        def on_episode(ep):
            eps.append(ep)
            seen.update(_descendants())
        run_rollouts(work, lambda: make_env(env_cfg), Policy(model, tok, generation(max_new_tokens=8)), ref,
                     prompt, rollout_config(batch_size=5, env_retries=2, overlap_env=overlap), on_episode=on_episode)
        events = [(e.task_id, e.call, e.attempt, e.kind, e.where) for e in INJECTED[mark:]]
        return untimed(eps), events, set(seen) - set(before)

    for overlap in (True, False):  # rows sent as they finish decoding (on_row), or after the batch
        in_process, faults0, _ = play(0, overlap)
        hosted, faults2, spawned = play(2, overlap)
        assert len(in_process) == len(work) and hosted == in_process
        assert faults0 and faults2 == faults0  # the same faults, in the same order
        assert any(e["env_errors"] for e in hosted)  # recovered or failed episodes: faults were met
        assert len(spawned) == 4  # 2 workers, a JVM each
        assert not _wait_gone(spawned), "a worker or JVM outlived the rollout"
    assert not live_worker_pids()


def test_sciworld_episodes_are_the_same_with_workers(prompt):
    """A few short ScienceWorld episodes (each worker starts its own JVM)."""
    cfg = env_file("sciworld")
    cfg = {**cfg, "dev_holdout": 0, "tasks": [11, 20], "limit_per_task": 2, "step_limit": 3}
    lister = make_env(cfg)
    work = [(t, 0) for t in lister.tasks("seen")][:3]
    lister.close()

    policy = HashPolicy(("look around", "open door to kitchen", "go to kitchen", "inventory", "focus on sky"))
    before = _descendants()
    eps0 = _rollout(work, lambda: make_env({**cfg, "workers": 0}), policy, rollout_config(batch_size=3))
    seen: dict[int, str] = {}
    eps2 = _rollout(work, lambda: make_env({**cfg, "workers": 2}), policy, rollout_config(batch_size=3), seen)
    assert len(eps0) == 3 and untimed(eps2) == untimed(eps0)
    assert {e.num_steps for e in eps0} == {3} and all(not e.env_errors for e in eps0)
    spawned = set(seen) - set(before)
    assert sum("java" in seen[p] for p in spawned) == 2  # each worker's own JVM
    assert not _wait_gone(spawned), "a worker or JVM outlived the rollout"


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


# -- a worker's errors ------------------------------------------------------------------------------
def test_a_worker_that_raises_is_an_environment_failure_as_in_process(monkeypatch):
    """Seed 3 crashes every reset: retried on fresh instances, then recorded as an environment
    failure, exactly as in process; the message carries the worker's traceback."""
    monkeypatch.setattr("eto_train.rollouts.loop.time.sleep", lambda s: None)
    work = [(t, 0) for t in GoalEnv().tasks("train")]
    in_process = _rollout(work, CrashyGoalEnv, HashPolicy(), rollout_config(batch_size=4, env_retries=2))
    with WorkerPool(CrashyGoalEnv, 2) as pool:
        hosted = _rollout(work, pool.env, HashPolicy(), rollout_config(batch_size=4, env_retries=2))
        assert len(pool.pids()) == 2  # a raising environment does not take its worker down
    by_seed = {e.seed: e for e in hosted}
    failed = by_seed[3]
    assert failed.status == "environment_failure" and len(failed.env_errors) == 3
    assert failed.error.startswith("EnvironmentFailure: simulator died on seed 3 [in env worker")
    assert "the worker's traceback" in failed.error and ", reset(Task(" in failed.error
    assert 'raise EnvironmentFailure(f"simulator died on seed {task.seed}")' in failed.error  # the worker's line
    # the rest of the record is the in-process one
    assert _untraced(untimed(hosted)) == untimed(in_process)


def _untraced(records):
    """Records without the worker's part of error messages (" [in env worker ...]")."""
    cut = lambda m: m and re.sub(r" \[in env worker .*\]", "", m, flags=re.S)  # noqa: E731
    return [{**d, "error": cut(d["error"]), "env_errors": [cut(m) for m in d["env_errors"]]} for d in records]


def test_a_non_environment_error_in_a_worker_stops_the_rollout_as_in_process():
    work = [(t, 0) for t in GoalEnv().tasks("train")[:4]]
    with pytest.raises(ValueError, match="no such variation 2"):
        _rollout(work, BadDataGoalEnv, HashPolicy(), rollout_config(batch_size=2))
    with WorkerPool(BadDataGoalEnv, 2) as pool:
        with pytest.raises(ValueError, match=r"no such variation 2 \[in env worker \d .*the worker's traceback"):
            _rollout(work, pool.env, HashPolicy(), rollout_config(batch_size=2))
        pids = pool.pids()
    assert not _wait_gone(pids)


def test_a_killed_worker_is_a_named_environment_failure_and_its_slot_moves_on():
    task = GoalEnv().tasks("train")[0]
    with WorkerPool(GoalEnv, 1) as pool:
        env = pool.env()
        env.reset(task)
        pid = env.pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(EnvironmentFailure, match=rf"env worker 0 \(pid {pid}\) died \(killed by SIGKILL\)"):
            env.step("go")
        with pytest.raises(EnvironmentFailure, match=rf"env worker 0 \(pid {pid}\) died"):
            env.step("go")  # and every later call to its environments
        env.close()  # closing an environment whose worker is gone is quiet
        fresh = pool.env()  # the next environment placed there starts a new process
        assert fresh.pid != pid and fresh.reset(task)[0] == "Reach goal 0."


def test_a_worker_killed_mid_rollout_is_recovered_by_replay(monkeypatch):
    """The rollout's environment-failure path: the episodes of the killed worker are rebuilt on a
    fresh one (replay) and end as a fault-free run's, their env_errors naming the worker."""
    monkeypatch.setattr("eto_train.rollouts.loop.time.sleep", lambda s: None)
    work = [(t, 0) for t in GoalEnv().tasks("train")]
    clean = _rollout(work, GoalEnv, HashPolicy(), rollout_config(batch_size=4))
    with WorkerPool(GoalEnv, 2) as pool:
        killed = []

        def on_step(n):
            if not killed:
                killed.append(pool.pids()[0])
                os.kill(killed[0], signal.SIGKILL)
        eps = []
        run_rollouts(work, pool.env, HashPolicy(), REF, react_prompt(), rollout_config(batch_size=4, env_retries=1),
                     on_episode=eps.append, on_step=on_step)
    hit = [e for e in eps if e.env_errors]
    assert hit and all(f"env worker 0 (pid {killed[0]}) died" in e.env_errors[0] for e in hit)
    assert all(e.status != "environment_failure" for e in eps)
    assert [{**d, "env_errors": []} for d in untimed(eps)] == untimed(clean)


def test_a_hung_worker_is_an_environment_timeout_not_a_hang():
    task = GoalEnv().tasks("train")[0]
    with WorkerPool(GoalEnv, 1, timeout_s=0.5, grace_s=0.5) as pool:
        env = pool.env()
        env.reset(task)
        pid = env.pid
        # the 1 s call timeout fired (no hang): the message says so
        with pytest.raises(EnvironmentTimeout, match=rf"env worker 0 \(pid {pid}\) did not answer within 1 s "
                                                     r"\(the environment's call timeout and a margin\): stopped it"):
            env.step("hang")
        assert not _wait_gone([pid], 5.0)  # stopped


def test_workers_stop_when_the_rollout_is_interrupted():
    work = [(t, 0) for t in GoalEnv().tasks("train")]
    pool = WorkerPool(GoalEnv, 2)
    seen: list[int] = []

    def on_episode(ep):
        seen.extend(pool.pids())
        raise KeyboardInterrupt

    with pool, pytest.raises(KeyboardInterrupt):
        run_rollouts(work, pool.env, HashPolicy(), REF, react_prompt(), rollout_config(batch_size=4),
                     on_episode=on_episode)
    assert len(set(seen)) == 2 and not _wait_gone(seen)


def test_twx_interrupted_rollout_leaves_no_worker_or_jvm(twx_cfg):
    lister = make_env(twx_cfg)
    work = [(t, 0) for t in lister.tasks("train")]
    lister.close()
    before, seen = _descendants(), {}

    def on_episode(ep):
        seen.update(_descendants())
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_rollouts(work, lambda: make_env({**twx_cfg, "workers": 2}), HashPolicy(("look around", "inventory")),
                     REF, react_prompt(), rollout_config(batch_size=4), on_episode=on_episode)
    spawned = set(seen) - set(before)
    assert sum("java" in seen[p] for p in spawned) == 2 and len(spawned) == 4  # 2 workers, a JVM each
    assert not _wait_gone(spawned) and not live_worker_pids()


# -- config -----------------------------------------------------------------------------------------
def test_env_workers_outside_a_rollout_builds_the_environment_here(twx_cfg):
    env = make_env({**twx_cfg, "workers": 2})  # task lists, gold paths: no worker processes
    try:
        assert not isinstance(env, WorkerEnv) and env.tasks("seen")
    finally:
        env.close()


def test_faults_around_a_worker_environment_are_injected_in_this_process():
    from eto_train.envs.faults import FaultLedger

    task = GoalEnv().tasks("train")[0]
    with WorkerPool(GoalEnv, 1) as pool:
        env = FaultyWorkerEnv(pool.env(), {"crash": {"rate": 1.0, "seed": 0}}, FaultLedger())
        with pytest.raises(EnvironmentFailure, match="injected fault: goal reset on g/train/0"):
            env.reset_async(task)  # raised as sent: nothing reached the worker
        assert [(e.kind, e.call) for e in env.ledger.events] == [("crash", 0)]


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_a_bad_env_workers_is_an_error_naming_the_key(twx_cfg, bad):
    with pytest.raises(ValueError, match=r"env\.workers="):
        make_env({**twx_cfg, "workers": bad})


@pytest.mark.parametrize("bad", ["-1", "1.5", "true"])
def test_validate_names_env_workers(bad):
    from hydra import compose, initialize_config_dir

    from eto_train.config import load

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="workers"):
        cfg = compose("config", overrides=[f"env.workers={bad}"])
    with pytest.raises(ValueError, match=rf"env\.workers={bad}: an integer >= 0"):
        load(cfg)


def test_every_env_config_has_workers_0():
    for path in sorted((ROOT / "configs" / "env").glob("*.yaml")):
        assert env_file(path.stem)["workers"] == 0, path.name


def test_work_items_with_an_expert_prefix_play_the_same_with_workers(monkeypatch):
    """Step-level continuations (expert prefix, reset in line) next to plain items (reset sent)."""
    monkeypatch.setattr("eto_train.rollouts.loop.time.sleep", lambda s: None)
    tasks = GoalEnv().tasks("train")
    work = [WorkItem(t, 0, ("go",) * (t.seed % 3)) for t in tasks] + [WorkItem(t, 1) for t in tasks]
    from eto_train.envs.faults import FaultConfig, FaultLedger, FaultyEnv

    faults = FaultConfig.from_dict(FAULTS)
    l0, l2 = FaultLedger(), FaultLedger()
    in_process = _rollout(work, lambda: FaultyEnv(GoalEnv(), faults, l0), HashPolicy(),
                          rollout_config(batch_size=6, env_retries=2))
    with WorkerPool(GoalEnv, 2) as pool:
        hosted = _rollout(work, lambda: FaultyWorkerEnv(pool.env(), faults, l2), HashPolicy(),
                          rollout_config(batch_size=6, env_retries=2))
    assert l0.events and l2.events == l0.events
    assert untimed(hosted) == untimed(in_process)


CHILD = """
import json, sys, time
import psutil
from eto_train.config import shipped
from eto_train.envs import make_env
from eto_train.interrupt import interruptible
from eto_train.records import PolicyRef
from eto_train.rollouts.loop import RolloutConfig, run_rollouts

class Slow:
    def generate(self, convs):
        time.sleep(0.2)
        return [("Action: look around", 5, 3, 0) for _ in convs]

def on_step(n, said=[]):
    if not said:
        said.append(1)
        print(" ".join(str(p.pid) for p in psutil.Process().children(recursive=True)), flush=True)

cfg, shipped_cfg = json.loads(sys.argv[1]), shipped()
with interruptible():
    lister = make_env(cfg)
    work = [(t, 0) for t in lister.tasks("train")]
    lister.close()
    run_rollouts(work, lambda: make_env(cfg), Slow(), PolicyRef(id="slow"), shipped_cfg.prompt.prompt_config(),
                 RolloutConfig(batch_size=4, env_retries=shipped_cfg.rollout.env_retries, seed=0, overlap_env=False),
                 on_episode=lambda ep: None, on_step=on_step)
"""


def test_ctrl_c_stops_the_workers_and_their_jvms(twx_cfg):
    """A terminal's Ctrl-C (SIGINT to the process group): exit 130, no traceback, nothing left."""
    import json
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps({**twx_cfg, "workers": 2})], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) >= 4  # 2 workers, their JVMs (and this process's own JVM, the resource tracker)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130
        err = proc.stderr.read()
        assert "Traceback" not in err, err
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not _wait_gone(pids), "a worker or JVM outlived the interrupted rollout"
