"""Fault injection (envs/faults.py): every injected fault is retried or recorded as an
environment failure, faults are reproducible, and no faulted episode becomes a pair."""

from __future__ import annotations

import copy
import random

import pytest

from eto_train.envs import EnvironmentFailure, EnvironmentTimeout, StepResult, make_env
from eto_train.envs.faults import (
    FaultConfig,
    FaultLedger,
    FaultyEnv,
    _garble,
    check_step_result,
    fault_mark,
    fault_summary,
    new_play,
    wrap_faults,
)
from eto_train.experts import expert_episode
from eto_train.records import NOT_POLICY_FAULT, PolicyRef
from eto_train.rollouts.loop import WorkItem, run_rollouts

from episodes import untimed
from goal_env import GoalEnv
from fixture_settings import react_prompt, rollout_config

class RandomPolicy:
    """Says 'go' or 'wait' at random (seeded): a policy that wins, loses and half-wins."""

    def __init__(self, seed=0, p_go=0.7):
        self.rng, self.p_go = random.Random(seed), p_go

    def generate(self, convs):
        return [(f"Action: {'go' if self.rng.random() < self.p_go else 'wait'}", 10, 3, 0) for _ in convs]


class HashPolicy:
    """'go' or 'wait' as a fixed function of the conversation: the same in any batch order."""

    def generate(self, convs):
        import hashlib

        def act(conv):
            h = hashlib.sha256(repr(conv).encode()).digest()[0]
            return "go" if h < 180 else "wait"

        return [(f"Action: {act(c)}", 10, 3, 0) for c in convs]


FAULTS = {"timeout": {"rate": 0.05, "seed": 0}, "crash": {"rate": 0.1, "seed": 1},
          "malformed": {"rate": 0.05, "seed": 2}}
REF = PolicyRef(id="random@0")


def play(work, faults=FAULTS, retries=1, batch=4, ledger=None, policy=None):
    ledger = ledger if ledger is not None else FaultLedger()
    cfg = FaultConfig.from_dict(faults)
    eps = []
    run_rollouts(work, lambda: FaultyEnv(GoalEnv(), cfg, ledger), policy or RandomPolicy(0), REF, react_prompt(),
                 rollout_config(batch_size=batch, env_retries=retries), on_episode=eps.append)
    return eps, ledger


@pytest.fixture
def sleeps(monkeypatch):
    """Record the rollout's backoff sleeps instead of sleeping."""
    calls = []
    monkeypatch.setattr("eto_train.rollouts.loop.time.sleep", calls.append)
    return calls


def test_every_injected_fault_is_retried_or_recorded_as_environment_failure(sleeps):
    retries = 2
    work = [(t, 0) for t in GoalEnv().tasks("train")]
    mark = fault_mark()
    eps, ledger = play(work, retries=retries, policy=HashPolicy())
    assert len(eps) == len(work) and len({e.episode_id for e in eps}) == len(work)
    failed = [e for e in eps if e.status == "environment_failure"]
    recovered = [e for e in eps if e.status != "environment_failure" and e.env_errors]
    # accounting: every injected fault was met by exactly one episode, in order
    assert sorted(m for e in eps for m in e.env_errors) == sorted(
        f"{'EnvironmentTimeout' if ev.kind == 'timeout' else 'EnvironmentFailure'}: {ev.message}" for ev in ledger.events)
    per_call = {}
    for ev in ledger.events:
        per_call[ev.task_id, ev.call] = per_call.get((ev.task_id, ev.call), 0) + 1
    for e in eps:
        worst = max((n for (t, _), n in per_call.items() if t == e.task_id), default=0)
        if e.status == "environment_failure":
            assert worst == retries + 1, (e.task_id, worst)  # one call faulted on every attempt
            assert "injected fault" in e.error and f"after {retries} retries" in e.error
        else:
            assert worst <= retries, (e.task_id, worst)  # each faulted call was retried away
            assert [s.index for s in e.steps] == list(range(e.num_steps))
    # the test's seeds exercise both outcomes and every kind of fault
    assert failed and recovered
    counts = ledger.counts()
    assert all(counts[k] > 0 for k in ("timeout", "crash", "malformed", "on_reset", "on_step"))
    assert counts["injected_faults"] == len(ledger.events)
    assert fault_summary(mark) == counts  # the process-wide log a stage report reads
    # each retry waited with exponential backoff; a failure's last fault is not retried
    assert len(sleeps) == len(ledger.events) - len(failed)
    assert set(sleeps) <= {0.1, 0.2}


def test_a_recovered_episode_is_the_episode_a_fault_free_run_records(sleeps):
    """Recovery replays the episode on a fresh instance and continues where it failed."""
    work = [(t, 0) for t in GoalEnv().tasks("train")]
    clean, _ = play(work, faults={}, policy=HashPolicy())
    faulty, ledger = play(work, retries=3, policy=HashPolicy())
    recovered = [e for e in faulty if e.env_errors and e.status != "environment_failure"]
    assert len(recovered) >= 5 and any(ev.where == "step" and ev.call >= 2 for ev in ledger.events)
    by_id = {d["episode_id"]: d for d in untimed(clean)}
    for e in recovered:
        d = untimed([e])[0]
        assert d.pop("env_errors") and not by_id[e.episode_id].pop("env_errors")
        assert d == by_id[e.episode_id], e.episode_id


def test_each_play_meets_the_same_faults_whatever_ran_before_it_in_the_process(sleeps):
    """Rollout stages call new_play(): a second policy on the same seeds is faulted as often."""
    work = [(t, 0) for t in GoalEnv().tasks("train")]

    def stage(policy):
        new_play()
        mark, eps = fault_mark(), []
        run_rollouts(work, lambda: wrap_faults(GoalEnv(), FAULTS), policy, REF, react_prompt(),
                     rollout_config(batch_size=4, env_retries=3), on_episode=eps.append)
        return fault_summary(mark), sum(len(e.env_errors) for e in eps)

    first, met_first = stage(HashPolicy())
    again, met_again = stage(HashPolicy())
    assert first["injected_faults"] > 10 and first == again and met_first == met_again == first["injected_faults"]
    other, _ = stage(RandomPolicy(3))  # another policy: the same reset faults, its own step faults
    assert other["on_reset"] == first["on_reset"] and other["injected_faults"] > 10


class ForgetfulEnv(GoalEnv):
    """Crashes once at step 2; a fresh instance answers step 1 differently (not deterministic)."""

    instances = 0

    def __init__(self):
        super().__init__()
        ForgetfulEnv.instances += 1
        self.n = ForgetfulEnv.instances

    def step(self, action):
        if self.n == 1 and self.t == 1:
            raise EnvironmentFailure("simulator died")
        res = super().step(action)
        return res if self.n == 1 else StepResult(f"{res.observation} (instance {self.n})", res.reward, res.done,
                                                  res.success, valid_actions=res.valid_actions)


def test_a_replay_that_diverges_from_the_record_is_an_environment_failure(sleeps):
    ForgetfulEnv.instances = 0
    eps = []
    run_rollouts([(GoalEnv().tasks("train")[0], 0)], ForgetfulEnv, HashPolicy(), REF, react_prompt(),
                 rollout_config(batch_size=1, env_retries=2), on_episode=eps.append)
    (ep,) = eps
    assert ep.status == "environment_failure" and ep.num_steps == 1
    assert ep.env_errors[0] == "EnvironmentFailure: simulator died"
    assert all("step 0 answered differently than recorded" in m for m in ep.env_errors[1:])
    assert len(ep.env_errors) == 3 and "after 2 retries" in ep.error


def test_faults_are_deterministic_and_independent_of_parallel_order(sleeps):
    work = [(t, 0) for t in GoalEnv().tasks("train")]

    def run(batch, faults=FAULTS):
        eps, ledger = play(work, faults=faults, batch=batch, policy=HashPolicy())
        return sorted((e.task_id, e.attempt, e.call, e.kind, e.where) for e in ledger.events), eps

    a, eps_a = run(4)
    b, eps_b = run(4)
    assert a and a == b and untimed(eps_a) == untimed(eps_b)
    c, eps_c = run(1)  # other parallel order: the same faults, the same episodes
    assert a == c and untimed(eps_a) == untimed(eps_c)
    d, _ = run(4, {**FAULTS, "crash": {"rate": 0.1, "seed": 99}})  # another seed, other faults
    assert d != a


def test_a_retry_draws_afresh_and_can_succeed():
    task = GoalEnv().tasks("train")[0]
    retried_ok = 0
    for seed in range(20):
        ledger = FaultLedger()
        env = FaultyEnv(GoalEnv(), {"crash": {"rate": 0.5, "seed": seed}}, ledger)
        outcomes = []
        for _ in range(6):
            try:
                env.reset(task)
                outcomes.append("ok")
            except EnvironmentFailure:
                outcomes.append("fault")
        k = outcomes.count("fault")
        # each fault moves the call to its next attempt; once an attempt is clean it stays clean
        assert outcomes == ["fault"] * k + ["ok"] * (6 - k)
        assert [e.attempt for e in ledger.events] == list(range(k))
        retried_ok += 0 < k < 6
    assert retried_ok > 0


@pytest.mark.parametrize("pick", [0.0, 0.3, 0.6, 0.9])
def test_every_kind_of_garbled_answer_is_detected(pick):
    good = StepResult("a room", 0.5, False, False, valid_actions=["go"])
    check_step_result(good, "x")
    with pytest.raises(EnvironmentFailure, match="malformed"):
        check_step_result(_garble(good, pick), "twx step")


def test_malformed_and_timeout_faults_raise_typed_errors():
    task = GoalEnv().tasks("train")[0]
    env = FaultyEnv(GoalEnv(), {"malformed": {"rate": 1.0, "seed": 0}}, FaultLedger())
    with pytest.raises(EnvironmentFailure, match="injected fault: goal reset on g/train/0 .*malformed"):
        env.reset(task)
    assert [(e.kind, e.where, e.call) for e in env.ledger.events] == [("malformed", "reset", 0)]
    env = FaultyEnv(GoalEnv(), {"timeout": {"rate": 1.0, "seed": 0}}, FaultLedger())
    with pytest.raises(EnvironmentTimeout, match="timed out"):
        env.reset(task)


def test_real_garbage_from_the_simulator_is_an_environment_failure_not_an_injected_fault():
    task = GoalEnv().tasks("train")[0]
    ledger = FaultLedger()
    env = FaultyEnv(GoalEnv(garbage_at=2), {"crash": {"rate": 0.0}}, ledger)
    env.reset(task)
    env.step("go")
    with pytest.raises(EnvironmentFailure, match="goal step on g/train/0 \\(call 2\\): malformed observation"):
        env.step("go")
    assert ledger.events == []  # not injected: the report does not count it as one


def test_gold_path_replays_are_never_faulted():
    task = GoalEnv().tasks("train")[0]
    env = FaultyEnv(GoalEnv(), {"crash": {"rate": 1.0, "seed": 0}}, FaultLedger())
    ep = expert_episode(env, task, react_prompt())
    assert ep.success and ep.num_steps == 3 and env.ledger.events == []
    with pytest.raises(EnvironmentFailure, match="crashed"):  # a policy episode after it is faulted
        env.reset(task)


def test_faulted_episodes_never_become_pairs(sleeps):
    from test_pairs import cpu_pairs
    from eto_train.pairs import _pid
    from eto_train.stages.eto.pairs import build_pairs

    tasks = GoalEnv().tasks("train")
    experts = {t.task_id: expert_episode(GoalEnv(), t, react_prompt()) for t in tasks}
    explored, _ = play([WorkItem(t, s) for t in tasks for s in range(2)], retries=1)
    continuations, _ = play([WorkItem(t, 0, ("go",)) for t in tasks], retries=1, policy=RandomPolicy(1))
    pc = cpu_pairs(contrast="mixture", chosen="both", extra_turns=5, rejected_cut="expert_length",
               step_positions="first_divergence", step_samples=2, mixture_step_fraction=1.0)
    pairs, _ = build_pairs(pc, experts, explored, continuations, seed=0)
    assert {p.kind for p in pairs} == {"trajectory", "step", "self"}

    faulted = [e for e in explored + continuations if e.status in NOT_POLICY_FAULT]
    assert any(e.steps for e in faulted)  # partial episodes that would look like losses
    bad_ids = set()
    all_ids = [e.episode_id for e in explored + continuations]
    for f in faulted:
        for x in experts.values():
            bad_ids.add(_pid("traj", f.episode_id, x.episode_id))
            bad_ids |= {_pid("step", f.episode_id, x.episode_id, t) for t in range(6)}
        bad_ids |= {_pid("self", f.episode_id, o) for o in all_ids} | {_pid("self", o, f.episode_id) for o in all_ids}
    assert not bad_ids & {p.pair_id for p in pairs}

    # the filter is what keeps them out: relabelled as policy failures they would pair
    relabel = [copy.deepcopy(e) for e in explored + continuations]
    for e in relabel:
        if e.status in NOT_POLICY_FAULT:
            e.status = "failure"
    pairs_if_unfiltered, _ = build_pairs(pc, experts, relabel[:len(explored)], relabel[len(explored):], seed=0)
    assert bad_ids & {p.pair_id for p in pairs_if_unfiltered}


def test_make_env_applies_the_faults_block(twx_cfg):
    off = make_env({**twx_cfg, "faults": {"crash": {"rate": 0.0, "seed": 1}}})
    try:
        assert not isinstance(off, FaultyEnv)
    finally:
        off.close()
    on = make_env({**twx_cfg, "faults": {"crash": {"rate": 1.0, "seed": 1}}})
    try:
        assert isinstance(on, FaultyEnv) and on.name == "twx" and on.version.startswith("textworld-express==")
        task = on.tasks("train")[0]
        with pytest.raises(EnvironmentFailure, match="injected fault: twx reset on .* crashed"):
            on.reset(task)
    finally:
        on.close()


@pytest.mark.parametrize("faults, message", [
    ({"crashes": {"rate": 0.1}}, r"env.faults: unknown fault kind\(s\) \['crashes'\]"),
    ({"crash": {"rat": 0.1}}, r"env.faults.crash: unknown key\(s\) \['rat'\]"),
    ({"crash": {"rate": 1.5}}, r"env.faults.crash.rate: 1.5 is not a probability"),
    ({"crash": 0.1}, r"env.faults.crash: expected \{rate"),
])
def test_bad_fault_config_is_a_clear_error(faults, message):
    with pytest.raises(ValueError, match=message):
        wrap_faults(GoalEnv(), faults)
