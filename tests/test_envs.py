from __future__ import annotations

import pytest

from eto_train.envs import EnvironmentFailure, make_env
from eto_train.envs.twx_games import ACTION_FORMS
from eto_train.experts import expert_episode


def test_every_supported_game_replays_its_gold_path_to_a_win(prompt):
    games = [{"name": g, "params": ""} for g in sorted(ACTION_FORMS)]
    cfg = {"name": "twx", "step_limit": 80, "games": games,
           "splits": {"train": {"fold": "train", "start": 0, "count": 2}}}
    env = make_env(cfg)
    try:
        for task in env.tasks("train"):
            ep = expert_episode(env, task, prompt)
            assert ep.status == "success", (task.task_id, ep.status, [s.action for s in ep.steps])
            assert ep.final_score == pytest.approx(1.0)
            assert all(s.valid for s in ep.steps), task.task_id
    finally:
        env.close()


def test_splits_are_disjoint_and_named(twx_cfg):
    env = make_env(twx_cfg)
    try:
        train = {t.task_id for t in env.tasks("train")}
        seen = env.tasks("seen")
        unseen = env.tasks("unseen")
    finally:
        env.close()
    assert not train & {t.task_id for t in seen}
    assert {t.fold for t in seen} == {"train"} and {t.fold for t in unseen} == {"dev"}
    assert {t.split for t in unseen} == {"unseen"}
    assert len(seen) == 3 * 2 and len(unseen) == 2 * 2


def test_overlapping_splits_are_rejected(twx_cfg):
    bad = {**twx_cfg, "splits": {"train": {"fold": "train", "start": 0, "count": 10},
                                 "seen": {"fold": "train", "start": 5, "count": 10}}}
    with pytest.raises(ValueError, match="env.splits.seen .*overlaps env.splits.train"):
        make_env(bad)


def test_unknown_game_and_env_names_are_clear_errors(twx_cfg):
    with pytest.raises(ValueError, match="unknown TextWorldExpress game.*nosuchgame"):
        make_env({**twx_cfg, "games": [{"name": "nosuchgame"}]})
    with pytest.raises(KeyError, match="env.name: unknown environment 'nope'"):
        make_env({**twx_cfg, "name": "nope"})


def test_a_crashed_simulator_raises_a_typed_environment_failure(twx_cfg):
    env = make_env(twx_cfg)
    task = env.tasks("train")[0]
    env.reset(task)
    from eto_train.envs.textworld_express import _SharedJVM

    _SharedJVM._host._gateway.java_process.kill()  # kill the JVM under the adapter's feet
    _SharedJVM._host._gateway.java_process.wait()
    with pytest.raises(EnvironmentFailure):
        env.step("look around")
    env.close()
    fresh = make_env(twx_cfg)  # a dead JVM is replaced on the next request
    try:
        instruction, first = fresh.reset(task)
        assert instruction and first.observation
    finally:
        fresh.close()


def test_games_in_one_jvm_are_independent(twx_cfg):
    """Interleaved episodes on one shared JVM give what each gives alone."""
    envs = [make_env(twx_cfg) for _ in range(2)]
    tasks = envs[0].tasks("train")[:2]
    try:
        gold = [envs[0].expert_actions(t) for t in tasks]
        for env, task in zip(envs, tasks):
            env.reset(task)
        interleaved = [[], []]
        for k in range(max(map(len, gold))):
            for i, env in enumerate(envs):
                if k < len(gold[i]):
                    interleaved[i].append(env.step(gold[i][k]).observation)
        for i, task in enumerate(tasks):
            envs[0].reset(task)
            alone = [envs[0].step(a).observation for a in gold[i]]
            assert alone == interleaved[i]
    finally:
        for env in envs:
            env.close()


def test_version_pins_package_and_parameters(twx_cfg):
    env = make_env(twx_cfg)
    try:
        assert "textworld-express==" in env.version and "sorting[]" in env.version
        assert "step_limit=12" in env.version
    finally:
        env.close()
