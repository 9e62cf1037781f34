"""Per-step credit (validity, progress, redundancy, loop) and the behaviour rates, on hand-built episodes."""

from __future__ import annotations

import json

import pytest

from eto_train.credit import credit_of, episode_rates, rates
from eto_train.evaluation import behaviour, has_loop, summarize
from eto_train.records import Episode, PolicyRef, Step, loop_marks, step_credit
from eto_train.store import append_episodes, read_episodes


def ep(steps, status="failure", task="g/train/1"):
    """``steps``: (action or None, valid, observation after, cumulative reward) per step."""
    e = Episode(episode_id=f"e-{task}-{status}", task_id=task, env="t", game="g", fold="train", seed=1,
                split="train", env_version="v", policy=PolicyRef(id="pi@1"), prompt_version="react-v1",
                system="SYS", first_user="TASK+OBS0", instruction="TASK", first_observation="OBS0")
    for i, (a, valid, obs, r) in enumerate(steps):
        e.steps.append(Step(index=i, raw_output=f"Action: {a}" if a else "gibberish", action=a, valid=valid,
                            observation=obs, reward=r, done=i == len(steps) - 1))
    e.finish(status)
    return e


def col(e, key):
    return [c[key] for c in credit_of(e)]


# state before each step: OBS0, A, B, A, A, bad format   (the state is the observation before the action)
WALK = ep([("go", True, "A", 0.25), ("look", True, "B", 0.25), ("go", True, "A", 0.75),
           ("look", True, "A", 0.75), (None, False, "bad format", 0.75), ("take", True, "C", 0.5)])


def test_progress_is_the_score_change_of_each_step():
    assert col(WALK, "progress") == [0.25, 0.0, 0.5, 0.0, 0.0, -0.25]
    assert col(WALK, "validity") == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]


def test_redundant_means_same_state_and_same_action_earlier():
    # step 3: "look" in state A, already done at step 1 (state A) -> redundant
    # step 2: "go" again, but in state B, not OBS0 -> not redundant
    assert col(WALK, "redundant") == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    same_room = ep([("look", True, "R", 0.0), ("look", True, "R", 0.0)])  # state OBS0, then R: not redundant
    assert col(same_room, "redundant") == [0.0, 0.0]
    first_state = ep([("look", True, "OBS0", 0.0), ("look", True, "X", 0.0)])  # the first observation is a state
    assert col(first_state, "redundant") == [0.0, 1.0]


@pytest.mark.parametrize("acts, marks", [
    ("aaa", [0, 0, 1]),
    ("aaaa", [0, 0, 1, 1]),
    ("xababab", [0, 0, 0, 0, 0, 0, 1]),
    ("ababa", [0] * 5),  # near miss: A-B-A-B-A is short of three cycles
    ("aabaab", [0] * 6),  # near miss: never three in a row, not an A-B cycle
    ("abcabc", [0] * 6),
])
def test_loop_marks_the_step_that_closes_the_pattern(acts, marks):
    e = ep([(a, True, f"o{i}", 0.0) for i, a in enumerate(acts)])
    assert col(e, "loop") == [float(m) for m in marks] == [float(m) for m in loop_marks(list(acts))]
    assert has_loop(e) == any(marks)


def test_finish_stores_the_credit_and_an_old_record_computes_the_same():
    d = WALK.to_dict()
    assert [s["credit"] for s in d["steps"]] == step_credit(WALK)
    old = json.loads(json.dumps(d))
    for s in old["steps"]:
        del s["credit"]  # a record written before the credit was stored
    back = Episode.from_dict(old)
    assert all(s.credit is None for s in back.steps)
    assert credit_of(back) == credit_of(Episode.from_dict(json.loads(json.dumps(d)))) == step_credit(WALK)


def test_rates_and_premature_stop_per_status(tmp_path):
    loop = ep([("a", True, "o", 0.0)] * 3, status="max_steps", task="g/train/2")  # states OBS0, o, o: 1 redundant
    win = ep([("go", True, "A", 1.0)], status="success", task="g/train/3")
    quit_ = ep([(None, False, "bad", 0.0), ("go", True, "A", 0.0)], status="model_failure", task="g/train/4")
    broken = ep([(None, False, "x", 0.0)] * 4, status="environment_failure", task="g/train/5")  # not scored
    eps = [WALK, loop, win, quit_, broken]
    assert [episode_rates(e)["premature_stop"] for e in eps] == [1.0, 0.0, 0.0, 1.0, 0.0]
    # scored: WALK (6 steps, 1 invalid, 1 redundant, failure), loop (3, 0, 1, max_steps), win (1, 0, 0),
    # quit_ (2, 1, 0, model_failure): 12 steps
    want = {"invalid_action_rate": 2 / 12, "loop_rate": 1 / 4, "redundant_action_rate": 2 / 12,
            "premature_stop_rate": 2 / 4}
    assert rates(eps) == pytest.approx(want)
    m = summarize(eps)
    assert {k: m[k] for k in want} == pytest.approx(want)
    assert m["scored_episodes"] == 4 and m["max_steps_rate"] == 0.25
    path = tmp_path / "episodes.jsonl"
    append_episodes(path, eps)
    # unparsed (outputs with no action): WALK's 5th and quit_'s 1st of the 12 scored steps
    assert behaviour(path) == pytest.approx({**want, "unparsed_rate": 2 / 12})
    assert credit_of(read_episodes(path)[0]) == step_credit(WALK)


def test_report_shows_the_rates_beside_success_per_policy():
    from eto_train.stages.report import behaviour_section

    b = {"invalid_action_rate": 0.25, "unparsed_rate": 0.375, "loop_rate": 0.5, "redundant_action_rate": 0.125,
         "premature_stop_rate": 0.0}
    lines = behaviour_section({"test": {"bc": {"success": 0.75, "behaviour": b},
                                        "older": {"success": 0.5, "behaviour": {k: v for k, v in b.items()
                                                                                 if k != "unparsed_rate"}},
                                        "old": {"success": 0.5}}})
    assert "| test | bc | 75.0% | 25.0% | 37.5% | 50.0% | 12.5% | 0.0% |" in lines
    assert "| test | older | 50.0% | 25.0% | 0.0% | 50.0% | 12.5% | 0.0% |" in lines  # rates from before unparsed_rate
    assert not any("| old |" in x for x in lines)  # a row without the rates (an older report.json) is left out


def test_the_report_names_what_each_environment_plays():
    """The report's first line named TextWorldExpress's games only: on ScienceWorld (which has tasks, not games)
    `eto-train report` failed with AttributeError after the whole run had finished."""
    from hydra import compose, initialize_config_dir

    from eto_train.config import load
    from eto_train.layout import CONFIGS
    from eto_train.stages.report import env_scope

    def env(*overrides):
        with initialize_config_dir(str(CONFIGS), version_base="1.3", job_name="report_scope"):
            return load(compose("config", overrides=list(overrides))).env

    assert env_scope(env()) == " (mapreader, twc)"
    assert env_scope(env("env=sciworld", "env.tasks=[task-3-find-animal,task-3-find-plant]")) \
        == " (task-3-find-animal, task-3-find-plant)"
    assert env_scope(env("env=sciworld", "env.tasks=null")) == " (all tasks)"
