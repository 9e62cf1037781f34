"""The reading test (eto_train.reading) against hand computations."""

from __future__ import annotations

import pytest

from eto_train.reading import chance_test, first_action, first_move_test, first_take_test
from eto_train.records import Episode, PolicyRef, Step


def _ep(task: str, *actions: str | None) -> Episode:
    steps = [Step(index=i, raw_output=str(a), action=a, valid=True, observation="", reward=0.0, done=False)
             for i, a in enumerate(actions)]
    return Episode(episode_id=task, task_id=task, env="twx", game="mapreader", fold="test", seed=0,
                   split="test_seen", env_version="", policy=PolicyRef("p"), prompt_version="", system="",
                   first_user="", instruction="", first_observation="", steps=steps)


def test_first_action_is_the_first_with_the_prefix():
    ep = _ep("a", "look around", None, "read map", "move west", "move north")
    assert first_action(ep, "move ") == "west"
    assert first_action(ep, "take ") is None


def test_a_default_direction_is_exactly_at_its_chance_line():
    # right: N, E, E, N. The policy says N twice and E twice: 2 hits (tasks 1 and 3).
    # Chance line: rate(N) 1/2 x 2 tasks needing N + rate(E) 1/2 x 2 needing E = 2.
    # Of the 6 distinct arrangements of N,N,E,E over the 4 tasks, 5 reach 2 hits
    # (NNEE 2, NENE 2, NEEN 4, ENNE 0, ENEN 2, EENN 2): p = 5/6.
    res = chance_test(["N", "N", "E", "E"], [{"N"}, {"E"}, {"E"}, {"N"}], permutations=6000, seed=1)
    assert res["hits"] == 2 and res["expected"] == pytest.approx(2.0)
    assert res["p"] == pytest.approx(5 / 6, abs=0.02)
    assert res["choices"] == {"N": 2, "E": 2}


def test_a_reader_beats_its_chance_line_and_a_missing_action_never_hits():
    dirs = ["north", "south", "east", "west"] * 5
    res = chance_test(list(dirs), [{d} for d in dirs], permutations=2000)
    assert res["hits"] == 20 and res["expected"] == pytest.approx(5.0)  # 20 tasks x 1/4
    assert res["p"] == pytest.approx(1 / 2001)  # no shuffle reaches 20
    # a policy that never moves: 0 hits, chance 0, p 1
    res = chance_test([None] * 4, [{"north"}] * 4, permutations=10)
    assert (res["hits"], res["expected"], res["p"], res["choices"]) == (0, 0.0, 1.0, {"(none)": 4})


def test_move_and_take_tests_read_episodes():
    eps = [_ep("t1", "read map", "move north"), _ep("t2", "move north"), _ep("t3", "take coin")]
    res = first_move_test(eps, {"t1": "north", "t2": "south", "t3": "east"}, permutations=100)
    assert (res["n"], res["hits"], res["needed"]) == (3, 1, {"north": 1, "south": 1, "east": 1})
    # rate(north) 2/3 x 1 task needing north + rate(none) x 0 = 2/3
    assert res["expected"] == pytest.approx(2 / 3)
    res = first_take_test(eps, {"t3": {"coin", "map"}, "t1": {"apple"}}, permutations=100)
    assert (res["n"], res["hits"], res["choices"]) == (2, 1, {"(none)": 1, "coin": 1})
    with pytest.raises(ValueError, match="0 choices"):
        chance_test([], [])
