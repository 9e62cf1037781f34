"""Paired comparison of policies on the same seeds: overall and per game, by hand."""

from __future__ import annotations

import copy

import pytest

from eto_train.evaluation import comparison, evaluate, metrics_table
from eto_train.store import append_episodes


def _write(path, template, outcomes):
    """One episode per (game, seed, status) in ``outcomes``, built from ``template``."""
    eps = []
    for game, seed, status in outcomes:
        e = copy.deepcopy(template)
        e.game, e.seed, e.task_id, e.status = game, seed, f"{game}/train/{seed}", status
        eps.append(e)
    append_episodes(path, eps)
    return path


def test_comparison_pairs_per_game_and_against_the_control(tmp_path, expert_episodes):
    t = expert_episodes[0]
    S, F, E = "success", "failure", "environment_failure"
    # mapreader: bc 1/4, control 2/4, eto 4/4; twc: bc 2/3 (the environment failure is not scored), eto 1/3
    bc = [("mapreader", i, s) for i, s in enumerate([S, F, F, F])] + [("twc", i, s) for i, s in enumerate([S, S, F, E])]
    ctl = [("mapreader", i, s) for i, s in enumerate([S, S, F, F])] + [("twc", i, s) for i, s in enumerate([S, S, F, F])]
    eto = [("mapreader", i, s) for i, s in enumerate([S, S, S, S])] + [("twc", i, s) for i, s in enumerate([F, S, F, S])]
    files = {n: _write(tmp_path / f"{n}.jsonl", t, o) for n, o in (("bc", bc), ("control", ctl), ("eto", eto))}
    rows = comparison(files, n_boot=500, seed=0)

    assert rows["bc"]["n"] == 7 and rows["bc"]["success"] == pytest.approx(3 / 7) and "vs_bc" not in rows["bc"]
    assert "vs_control" not in rows["control"]
    e = rows["eto"]
    assert e["n"] == 8 and e["success"] == pytest.approx(6 / 8)
    # overall: paired on the 7 tasks both scored (twc seed 3 is an environment failure for bc)
    assert e["vs_bc"]["n"] == 7 and e["vs_bc"]["diff"] == pytest.approx((5 - 3) / 7)
    mr, twc = e["per_game"]["mapreader"], e["per_game"]["twc"]
    assert mr["n"] == 4 and mr["vs_bc"]["diff"] == pytest.approx(3 / 4) and mr["vs_control"]["diff"] == pytest.approx(2 / 4)
    # mapreader vs bc: 3 discordant pairs, all for eto: exact McNemar p = 2 * (1/2)^3
    assert mr["vs_bc"]["mcnemar_p"] == pytest.approx(0.25)
    assert twc["vs_bc"]["n"] == 3 and twc["vs_bc"]["diff"] == pytest.approx((1 - 2) / 3)
    assert twc["vs_control"]["n"] == 4 and twc["vs_control"]["diff"] == pytest.approx((2 - 2) / 4)
    lo, hi = mr["vs_bc"]["diff_ci95"]
    assert lo <= 0.75 <= hi


def test_metrics_table_shows_the_behaviour_rates_beside_success(expert_episodes):
    res = evaluate(expert_episodes[:2])
    assert res["overall"]["redundant_action_rate"] == 0.0 and res["overall"]["premature_stop_rate"] == 0.0
    t = metrics_table("t", {"train": res})
    assert [c.header for c in t.columns][5:11] == ["invalid", "unparsed", "steps", "loops", "redund.", "early"]
    assert list(t.columns[10].cells)[-1] == "0.0%" and list(t.columns[6].cells)[-1] == "0.0%"


def test_unparsed_rate_counts_the_policys_own_outputs_that_name_no_action(expert_episodes):
    """Hand count: 2 episodes; in the first, 1 of its steps is an expert prefix (not the policy's) and 2 of the
    policy's outputs did not parse; the second parses throughout; an environment failure is not counted."""
    import copy

    from eto_train.evaluation import unparsed_rate

    a, b, failed = (copy.deepcopy(e) for e in expert_episodes[:3])
    a.env_params = {**a.env_params, "expert_prefix": 1}
    a.steps[0].action = None  # the expert's replayed step: not the policy's output
    for s in a.steps[1:3]:
        s.raw_output, s.action = "I'm in the kitchen.", None
    failed.status = "environment_failure"
    for s in failed.steps:
        s.action = None
    own = len(a.steps) - 1 + len(b.steps)
    assert unparsed_rate([a, b, failed]) == pytest.approx(2 / own)
    assert evaluate([a, b, failed])["overall"]["unparsed_rate"] == pytest.approx(2 / own)


def test_same_episodes_counts_the_tasks_played_with_exactly_the_same_actions(tmp_path, expert_episodes):
    from eto_train.evaluation import same_episodes

    a, b, c = (copy.deepcopy(expert_episodes[i]) for i in range(3))
    changed = copy.deepcopy(b)
    changed.steps[-1].action = "look around"  # one action differs: not the same episode
    shorter = copy.deepcopy(c)
    shorter.steps = shorter.steps[:-1]        # a prefix of the same actions: not the same episode either
    crashed = copy.deepcopy(a)
    crashed.status = "environment_failure"    # not the policy's: left out, as success leaves it out
    append_episodes(tmp_path / "base.jsonl", [a, b, c])
    append_episodes(tmp_path / "other.jsonl", [changed, shorter])
    append_episodes(tmp_path / "same.jsonl", [crashed, copy.deepcopy(b), copy.deepcopy(c)])
    assert same_episodes(tmp_path / "base.jsonl", tmp_path / "other.jsonl") == {"same": 0, "tasks": 2, "rate": 0.0}
    assert same_episodes(tmp_path / "base.jsonl", tmp_path / "same.jsonl") == {"same": 2, "tasks": 2, "rate": 1.0}
    assert same_episodes(tmp_path / "base.jsonl", tmp_path / "base.jsonl")["rate"] == 1.0
