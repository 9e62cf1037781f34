"""The measurement helpers of `make bench` (lab/benchmarks.py), on the tiny model and real games,
and its config (configs/bench/config.yaml, checked by lab/bench.py)."""

from __future__ import annotations

import json
import sys
import time

import pytest
from hydra import compose, initialize_config_dir

from eto_train import layout
from eto_train.config import ConfigError
from fixture_settings import generation

sys.path.insert(0, str(layout.REPO_ROOT / "lab"))
from benchmarks import (compare_episodes, comparable_episodes, manifest_seconds, policy_budget,  # noqa: E402
                        simulator_of, spread, step_envs)
from eto_train.envs import StepResult, Task, make_env
from eto_train.model.load import load_model, load_tokenizer
from eto_train.rollouts.loop import Policy


def test_batched_generate_answers_each_conversation_as_it_answers_it_alone(tiny_model_dir):
    """The batched HF generate baseline (left padding, masked) gives each row what one row alone gets."""
    policy = Policy(load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)),
                    generation(max_new_tokens=6))
    sys_ = {"role": "system", "content": "Actions: take, put"}
    convs = [[sys_, {"role": "user", "content": "Task: sort\nObservation: " + "a box and a key " * n}]
             for n in (1, 6, 3)]  # three lengths: two rows are padded
    batched = policy.generate(convs)
    alone = [policy.generate([c])[0] for c in convs]
    assert batched == alone
    assert len({r[1] for r in batched}) == 3  # the prompts did differ in length


def test_the_577f8ab_engine_comes_from_git_and_answers_as_todays_engine(tiny_model_dir):
    """bench.real's old engine is commit 577f8ab's rollouts/kvbatch.py, read from git at bench time (no copy in
    the tree), once per process; as bench.real plays it (a session of that class), greedy on the tiny model,
    its rows answer exactly as today's engine's do."""
    import torch
    from bench_real import _Recorded, engine_577f8ab

    old_engine = engine_577f8ab()
    assert engine_577f8ab() is old_engine and old_engine.__module__ == "kvbatch_577f8ab"
    policy = Policy(load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)),
                    generation(max_new_tokens=6))
    old, today = _Recorded(policy, old_engine).session(), policy.session()
    assert type(old) is old_engine and type(today) is not old_engine
    convs = [[{"role": "user", "content": "Task: sort\nObservation: " + "a box and a key " * n}] for n in (1, 4)]
    with torch.inference_mode():
        for s in (old, today):
            for _ in convs:
                s.add_row()
        assert old.step(convs) == today.step(convs)


def _tasks_and_gold(twx_cfg, n):
    """``n`` training tasks spread over the games, and each one's gold path."""
    lister = make_env(twx_cfg)
    try:
        tasks = spread(lister.tasks("train"), n)
        return tasks, {t.task_id: lister.expert_actions(t) for t in tasks}
    finally:
        lister.close()


def test_step_envs_plays_gold_paths_round_robin(twx_cfg):
    # distinct tasks in play at any time: two live games of one task in one TextWorldExpress JVM
    # interfere, and from two threads which one moves first is a race (CI saw "Unknown action")
    tasks, gold = _tasks_and_gold(twx_cfg, 12)
    assert [t.game for t in tasks[:3]] == ["sorting", "arithmetic", "sorting"]  # each game in turn
    envs = [make_env(twx_cfg) for _ in range(4)]
    try:
        serial = step_envs(envs, tasks, gold, rounds=6)
        threaded = step_envs(envs, tasks, gold, rounds=6, threads=2)
    finally:
        for env in envs:
            env.close()
    assert serial["steps"] == 24 and len(serial["round_s"]) == 6 and serial["steps_per_s"] > 0
    # gold paths end (and are won), and their environments take the next task of the queue
    assert serial["resets"] == serial["gold_paths_ended"] == serial["gold_paths_won"] > 0
    assert threaded["observations"] == serial["observations"]  # the same work, answered the same
    assert threaded["resets"] == serial["resets"]


def test_step_envs_in_worker_processes_does_the_same_work(twx_cfg):
    """env.workers: a round's steps sent to the workers at once, answered as in one process."""
    from eto_train.envs.workers import hosting, placed

    # distinct tasks in play at any time: two live games of one task in one TextWorldExpress JVM
    # interfere (the first one's later actions are "Unknown action"), so which JVM hosts which
    # game would change the answers
    tasks, gold = _tasks_and_gold(twx_cfg, 12)
    local = [make_env(twx_cfg) for _ in range(4)]
    try:
        serial = step_envs(local, tasks, gold, rounds=6)
    finally:
        for env in local:
            env.close()
    with hosting() as host:
        hosted = []
        for i in range(4):
            with placed(i):
                hosted.append(make_env({**twx_cfg, "workers": 2}))
        try:
            assert len(host.pids()) == 2 and len({env.pid for env in hosted}) == 2  # slot i -> worker i % 2
            remote = step_envs(hosted, tasks, gold, rounds=6)
            with pytest.raises(ValueError, match="one thread"):
                step_envs(hosted, tasks, gold, rounds=1, threads=2)
        finally:
            for env in hosted:
                env.close()
    assert remote["observations"] == serial["observations"] and remote["resets"] == serial["resets"] > 0
    assert remote["gold_paths_won"] == serial["gold_paths_won"]


def test_policy_budget_is_the_time_of_one_generate_call():
    b = policy_budget(256, tokens_per_s=5000, tokens_per_step=40)
    assert b["generate_call_s"] == pytest.approx(2.048)
    assert b["env_steps_per_s_needed"] == pytest.approx(125) and b["ms_per_step_allowed"] == pytest.approx(8.0)


def _episode(eid, latency, path, action="take key"):
    return {"episode_id": eid, "policy": {"id": "bench@abc", "path": path},
            "steps": [{"index": 0, "action": action, "latency_s": latency, "env_s": latency / 10}]}


def test_two_plays_compare_without_latencies_and_paths(tmp_path):
    """The policy's and the environment's seconds per step and the policy's path differ between two
    plays of the same episodes: not a difference."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(e) + "\n" for e in [_episode("x", 0.1, "/one"), _episode("y", 0.2, "/one")]))
    b.write_text("".join(json.dumps(e) + "\n" for e in [_episode("y", 0.5, "/two"), _episode("x", 0.7, "/two")]))
    same = compare_episodes(comparable_episodes(a), comparable_episodes(b))
    assert same["same"] and not same["same_order"]
    b.write_text(json.dumps(_episode("x", 0.1, "/one", action="put key")) + "\n" + json.dumps(_episode("z", 0, "/one")) + "\n")
    other = compare_episodes(comparable_episodes(a), comparable_episodes(b))
    assert not other["same"] and other["differing"] == ["x"] and other["in_one_only"] == ["y", "z"]


def test_manifest_seconds_of_a_finished_stage_only(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"status": "running"}))
    with pytest.raises(RuntimeError, match="not done"):
        manifest_seconds(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"status": "done", "seconds": 12.5}))
    assert manifest_seconds(tmp_path) == 12.5


def test_spread_takes_each_game_in_turn():
    tasks = [Task("twx", g, "train", s, "train") for g in ("a", "b") for s in range(3)]
    assert [(t.game, t.seed) for t in spread(tasks, 4)] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]


class _Host:
    def __init__(self):
        self.busy, self.overlaps = False, 0


class _FakeEnv:
    """A game whose ``_host`` stands for its simulator process; a call that finds the host busy
    with another game's call counts as an overlap."""

    def __init__(self, host):
        self._host = host

    def _call(self):
        h = self._host
        h.overlaps += h.busy
        h.busy = True
        time.sleep(0.002)
        h.busy = False

    def reset(self, task):
        self._call()

    def step(self, action):
        self._call()
        return StepResult(observation=action, reward=0.0, done=False, success=False)


def test_threaded_stepping_never_calls_one_simulator_from_two_threads_at_once():
    hosts = [_Host(), _Host()]
    envs = [_FakeEnv(hosts[i % 2]) for i in range(6)]
    task = Task("fake", "g", "train", 0, "train")
    res = step_envs(envs, [task], {task.task_id: ["a", "b", "c"]}, rounds=2, threads=2)
    assert res["observations"] == ["a"] * 6 + ["b"] * 6
    assert [h.overlaps for h in hosts] == [0, 0]
    assert simulator_of(envs[0]) == simulator_of(envs[2]) != simulator_of(envs[1])
    free = [_FakeEnv(_Host()) for _ in range(4)]
    free[0]._host = free[1]._host = None  # no simulator host: each game its own lane
    assert simulator_of(free[0]) != simulator_of(free[1])


def _bench_config(overrides: list[str]):
    with initialize_config_dir(config_dir=str(layout.CONFIGS), version_base="1.3"):
        return compose(config_name="bench/config", overrides=overrides)


def test_the_bench_config_is_the_run_config_and_its_own_checked_section():
    from bench import check_bench

    cfg = _bench_config(["bench.only=envsteps", "env=sciworld"])
    b = check_bench(cfg)
    assert b.only == "envsteps" and b.policy == f"{cfg.paths.bc}/model" and cfg.env.name == "sciworld"
    with initialize_config_dir(config_dir=str(layout.CONFIGS), version_base="1.3"):
        assert "bench" not in compose(config_name="config")  # the stages' config has no bench section
    bad = _bench_config(["bench.only=bc", "bench.envsteps.workers=[2,2]", "bench.data_parallel.processes=1"])
    with pytest.raises(ConfigError) as exc:
        check_bench(bad)
    assert [line.split("=", 1)[0] for line in exc.value.lines] == \
        ["bench.only", "bench.envsteps.workers", "bench.data_parallel.processes"]


def test_training_profile_says_what_share_of_the_time_the_matmuls_take(tmp_path):
    """bench.real.train.profile: the matmuls' share of the profiled self time, the top ops, and the table
    written; off, nothing is profiled. A block of large matmuls and one of elementwise work: the first is
    mostly matmul, the second barely."""
    import torch
    from bench_real import _profiled

    a = torch.randn(256, 256)
    with _profiled(False, tmp_path / "off.txt") as off:
        a @ a
    assert off == {} and not (tmp_path / "off.txt").exists()
    with _profiled(True, tmp_path / "mm.txt") as mm:
        for _ in range(20):
            a @ a
    with _profiled(True, tmp_path / "ew.txt") as ew:
        for _ in range(20):
            (a.exp() + 1).sqrt()
        a @ a
    assert mm["matmul_share"] > 0.5 and ew["matmul_share"] < mm["matmul_share"]
    assert "aten::mm" in mm["top"] and "aten::exp" in ew["top"]
    assert "aten::mm" in (tmp_path / "mm.txt").read_text()


def test_real_section_keeps_each_finished_part_when_a_later_one_dies(tmp_path, monkeypatch):
    """bench.real writes bench/real.partial.json after every part: a run killed in training (the OOM killer
    stopped one at 23.9 GB) keeps the decode step and each game's rollouts already measured."""
    import bench_real

    cfg = _bench_config([f"paths.runs={tmp_path}", "run_name=partial", "bench.only=real",
                         "bench.real.parts=[decode,rollouts,training]"])
    monkeypatch.setattr(bench_real, "setup_runtime", lambda threads: 1)
    monkeypatch.setattr(bench_real, "engine_577f8ab", lambda: None)  # (read from git: the test above)
    monkeypatch.setattr(bench_real, "matmul_peak", lambda: {"peak": {"float32/1": 1.0}})
    monkeypatch.setattr(bench_real, "_compose", lambda overrides: cfg)
    monkeypatch.setattr("eto_train.model.load.load_model", lambda path, dtype=None: "model")
    monkeypatch.setattr("eto_train.model.load.load_tokenizer", lambda path: "tok")
    monkeypatch.setattr(bench_real, "decode_step", lambda *a: {"engine_ms": 2.0})
    monkeypatch.setattr(bench_real, "rollouts", lambda real, env, out: {"env": env})

    def killed(*a):
        raise MemoryError("killed in training")

    monkeypatch.setattr(bench_real, "training", killed)
    with pytest.raises(MemoryError):
        bench_real.run(cfg)
    kept = json.loads((tmp_path / "partial" / "bench" / "real.partial.json").read_text())
    assert kept["decode_step"] == {"engine_ms": 2.0}
    assert kept["rollouts"] == {env: {"env": env} for env in cfg.bench.real.envs} and "training" not in kept


def test_training_rate_after_warmup_leaves_out_the_first_steps():
    """bench.real.train.warmup: the rate over the steps after the first ``warmup`` (a torch.compile's first
    steps compile); none left is an error that names the key, not a rate of zero."""
    from types import SimpleNamespace

    from bench_real import _after_warmup

    logs = [{"loss": 1.0, "step": s, "train_runtime": t, "num_input_tokens_seen": 100 * s}
            for s, t in ((1, 90.0), (2, 120.0), (3, 122.0), (4, 124.0))]
    trainer = SimpleNamespace(state=SimpleNamespace(log_history=logs))
    assert _after_warmup(trainer, 2) == (200, 4.0)  # steps 3 and 4: 200 tokens in 4 s (the 120 s compile left out)
    with pytest.raises(ValueError, match="bench.real.train.warmup=4"):
        _after_warmup(trainer, 4)


def test_training_fractions_are_taken_against_the_higher_peak_of_before_and_after():
    """A busy moment while the peak is measured would lower the ceiling and raise every fraction: the
    training's fractions are against the higher of the peaks measured before and after it (both kept)."""
    from bench_real import _fraction, _highest_peak

    before = {"peak": {"float32/2": 100.0, "bfloat16/2": 400.0}}
    bc = _fraction(tokens=1000, seconds=10.0, flops_per_token=6e9, peak=before, threads=2, dtype="bfloat16")
    assert bc["gflops"] == 600.0 and bc["fraction_of_peak"] == 1.5  # against the low (busy) bf16 reading
    res = {"matmul": before, "training": {"bc": {"bfloat16": bc}, "dpo": {"float32": {"reference_pass": _fraction(
        tokens=100, seconds=1.0, flops_per_token=2e8, peak=before, threads=2, dtype="float32")}}}}
    _highest_peak(res, {"peak": {"float32/2": 80.0, "bfloat16/2": 800.0}})
    assert res["matmul"]["peak"] == {"float32/2": 100.0, "bfloat16/2": 800.0}
    assert res["matmul"]["measured"] == [{"float32/2": 100.0, "bfloat16/2": 400.0},
                                         {"float32/2": 80.0, "bfloat16/2": 800.0}]
    assert bc["fraction_of_peak"] == 0.75                                               # 600 / 800
    assert res["training"]["dpo"]["float32"]["reference_pass"]["fraction_of_peak"] == 0.2  # 20 / 100


def test_a_shared_prefix_reports_the_work_done_beside_the_trained_tokens_rate():
    """Where rows shared a prefix, the trained tokens' rate (6N each) stands, and beside it the work done:
    the share of the tokens computed, its GFLOP/s and fraction, against the higher peak as well."""
    from bench_real import _computed, _done, _fraction, _highest_peak

    assert _computed({"tokens": 0, "computed": 0}) is None  # nothing went packed: no share to report
    share = _computed({"tokens": 2000, "computed": 1500})
    before = {"peak": {"bfloat16/2": 400.0}}
    dpo = _fraction(tokens=1000, seconds=10.0, flops_per_token=6e9, peak=before, threads=2, dtype="bfloat16",
                    computed=share)
    assert (dpo["computed_share"], dpo["gflops_done"], dpo["fraction_of_peak_done"]) == (0.75, 450.0, 1.125)
    _highest_peak({"matmul": before, "training": {"dpo": {"bfloat16": dpo}}}, {"peak": {"bfloat16/2": 900.0}})
    assert (dpo["fraction_of_peak"], dpo["fraction_of_peak_done"]) == (600 / 900, 0.5)
    assert _done(dpo) == "; 75% of the tokens computed: 450 GFLOP/s done = 50%"
    assert _done(_fraction(tokens=1, seconds=1.0, flops_per_token=1.0, peak=before, threads=2, dtype="bfloat16")) == ""
