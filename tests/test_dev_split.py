"""Model selection never touches a test split.

- ``env.dev_holdout`` carves a ``dev`` split out of the training tasks (envs/holdout.py):
  deterministic, disjoint from train, spread over games, never a task another split lists,
  and ``train + dev`` is the original training list; held-out tasks still play.
- ``env.metric`` is the dev figure the ETO loop selects and stops on; ``eto.early_stopping:
  false`` (the paper) runs every iteration and keeps the last; ``eto.dev_split: null`` skips the
  dev evaluation.
- The checks that run before any work: a dev split that is a test split is an error naming the key.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from eto_train import layout
from eto_train.config import load
from eto_train.envs import Task, make_env
from eto_train.envs.holdout import HoldoutEnv, check_dev_config, choose_holdout
from eto_train.stages.eto import loop as eto
from fixture_settings import env_file

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def _yaml(path: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONFIGS / path))


def compose(overrides: list[str]):
    """configs/config.yaml composed with ``overrides`` and typed once (config.load): what the ETO loop takes."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(CONFIGS), version_base="1.3", job_name="test_dev_split"):
        return load(hydra_compose("config", overrides=overrides))


# -- the holdout on a stand-in environment ----------------------------------------------------
class ListEnv:
    """Just enough of an environment: fixed task lists per split."""

    name, version = "fake", "fake"

    def __init__(self, splits: dict[str, list[Task]]):
        self.splits = splits

    def tasks(self, split: str) -> list[Task]:
        if split not in self.splits:
            raise KeyError(f"env.splits has no split {split!r}")
        return list(self.splits[split])

    def close(self) -> None:
        pass


def _tasks(split: str, sizes: dict[str, int], start: int = 0) -> list[Task]:
    return [Task("fake", g, "train", start + i, split) for g, n in sizes.items() for i in range(n)]


TRAIN = _tasks("train", {"gamma": 4, "alpha": 10, "beta": 7})


def test_holdout_is_deterministic_disjoint_spread_and_adds_up_to_train():
    env = HoldoutEnv(ListEnv({"train": TRAIN}), 7, ["train"])
    train, dev = env.tasks("train"), env.tasks("dev")
    assert len(dev) == 7 and len(train) == len(TRAIN) - 7
    assert {t.task_id for t in train}.isdisjoint({t.task_id for t in dev})
    # train + dev = the original train, each in the original order; dev tasks are labelled dev
    assert sorted(t.task_id for t in train + dev) == sorted(t.task_id for t in TRAIN)
    assert [t.task_id for t in train] == [t.task_id for t in TRAIN if t.task_id not in {d.task_id for d in dev}]
    assert {t.split for t in dev} == {"dev"} and {t.split for t in train} == {"train"}
    assert {t.fold for t in dev} == {"train"}
    # round robin over the games in name order: alpha, beta, gamma, alpha, beta, gamma, alpha
    assert Counter(t.game for t in dev) == {"alpha": 3, "beta": 2, "gamma": 2}
    # deterministic, and independent of the order the adapter lists its tasks in
    shuffled = random.Random(1).sample(TRAIN, len(TRAIN))
    again = HoldoutEnv(ListEnv({"train": shuffled}), 7, ["train"])
    assert {t.task_id for t in again.tasks("dev")} == {t.task_id for t in dev}
    # other splits pass through untouched
    seen = _tasks("seen", {"alpha": 2}, start=100)
    assert HoldoutEnv(ListEnv({"train": TRAIN, "seen": seen}), 7, ["train", "seen"]).tasks("seen") == seen


def test_holdout_spreads_evenly_and_respects_each_games_half():
    dev = [TRAIN[i] for i in range(len(TRAIN)) if TRAIN[i].task_id in choose_holdout(TRAIN, 9)]
    # gamma (4 tasks) gives 2 at most; the rounds go on over the others: a b g | a b g | a b | a
    assert Counter(t.game for t in dev) == {"alpha": 4, "beta": 3, "gamma": 2}
    with pytest.raises(ValueError, match=r"env.dev_holdout=11: .* at most 10 can be held out"):
        choose_holdout(TRAIN, 11)  # 5 + 3 + 2


def test_holdout_never_takes_a_task_another_split_lists():
    overlap = [t for t in TRAIN if t.game == "alpha"][:4]
    seen = [Task("fake", t.game, t.fold, t.seed, "seen") for t in overlap]
    env = HoldoutEnv(ListEnv({"train": TRAIN, "seen": seen}), 9, ["train", "seen"])
    dev_ids = {t.task_id for t in env.tasks("dev")}
    assert len(dev_ids) == 9 and dev_ids.isdisjoint({t.task_id for t in seen})
    assert len(env.tasks("train")) == len(TRAIN) - 9


def test_a_task_train_lists_twice_stays_in_train():
    twice = TRAIN + [TRAIN[0], TRAIN[1]]
    env = HoldoutEnv(ListEnv({"train": twice}), 10, ["train"])
    dev = {t.task_id for t in env.tasks("dev")}
    assert len(dev) == 10 and not dev & {TRAIN[0].task_id, TRAIN[1].task_id}
    assert sorted(t.task_id for t in env.tasks("train") + env.tasks("dev")) == sorted(t.task_id for t in twice)


def test_held_out_adapter_tasks_keep_what_reset_needs():
    from eto_train.envs.alfworld import ALFWorldTask
    from eto_train.envs.scienceworld import SciWorldTask

    alf = [ALFWorldTask("alfworld", f"type{i % 2}", "train", i, "train", trial=f"folder{i}/trial_{i}")
           for i in range(8)]
    sci = [SciWorldTask("sciworld", f"task-{i % 2}", "dev", i, "train", number=7 + i % 2) for i in range(8)]
    for tasks in (alf, sci):
        dev = HoldoutEnv(ListEnv({"train": tasks}), 2, ["train"]).tasks("dev")
        assert len(dev) == 2 and {type(t) for t in dev} == {type(tasks[0])}
        by_id = {t.task_id: t for t in tasks}
        for d in dev:  # only the split label changes: fold, seed, trial / number (reset reads them) kept
            assert d.split == "dev" and d.__dict__ | {"split": "train"} == by_id[d.task_id].__dict__


def test_dev_config_errors_name_the_key():
    splits = {"train": "a", "seen": "b"}
    assert check_dev_config({"splits": splits}) == 0 and check_dev_config({"splits": splits, "dev_holdout": 3}) == 3
    with pytest.raises(ValueError, match=r"env.dev_holdout: expected"):
        check_dev_config({"splits": splits, "dev_holdout": -1})
    with pytest.raises(ValueError, match=r"env.dev_holdout=3 .* but env.splits.dev is set too"):
        check_dev_config({"splits": {**splits, "dev": "c"}, "dev_holdout": 3})
    with pytest.raises(ValueError, match=r"env.splits.dev is the same list as env.splits.seen"):
        check_dev_config({"splits": {**splits, "dev": "b"}})


# -- the real environments --------------------------------------------------------------------
def test_configs_hold_dev_out_of_train_and_name_their_metric():
    sci, alf, twx = env_file("sciworld"), env_file("alfworld"), env_file("twx")
    assert "dev" not in sci["splits"] and "dev" not in alf["splits"]
    assert (sci["dev_holdout"], sci["metric"]) == (48, "mean_score")
    assert (alf["dev_holdout"], alf["metric"]) == (60, "success_rate")
    assert (twx["dev_holdout"], twx["metric"]) == (0, "success_rate") and "dev" in twx["splits"]
    cpu, paper = _yaml("eto/cpu.yaml"), _yaml("eto/paper.yaml")
    assert cpu["early_stopping"] is True and cpu["dev_split"] == "dev"
    assert paper["early_stopping"] is False and paper["dev_split"] is None


def test_sciworld_holds_out_two_variations_of_each_task_and_they_play(prompt):
    from eto_train.experts import expert_episode

    cfg = env_file("sciworld")
    env, paper = make_env(cfg), make_env({**cfg, "dev_holdout": 0})
    try:
        train, dev = env.tasks("train"), env.tasks("dev")
        original = paper.tasks("train")
        assert len(original) == 1483 and len(dev) == 48 and len(train) == 1435
        assert set(Counter(t.game for t in dev).values()) == {2} and len({t.game for t in dev}) == 24
        assert sorted(t.task_id for t in train + dev) == sorted(t.task_id for t in original)
        tests = {t.task_id for s in ("seen", "unseen") for t in env.tasks(s)}
        assert tests.isdisjoint(t.task_id for t in dev)  # ETO's train list shares 54 with `seen`: never dev
        assert [t.task_id for t in make_env(cfg).tasks("dev")] == [t.task_id for t in dev]  # deterministic
        task = min(dev, key=lambda t: paper.max_steps(t))
        ep = expert_episode(env, task, prompt)  # a held-out task resets and plays as any other
        assert ep.success and ep.split == "dev" and ep.task_id == task.task_id
    finally:
        env.close()
        paper.close()


def test_twx_holdout_through_make_env(twx_cfg, prompt):
    from eto_train.experts import expert_episode

    plain, held = make_env(twx_cfg), make_env({**twx_cfg, "dev_holdout": 4})
    try:
        original, train, dev = plain.tasks("train"), held.tasks("train"), held.tasks("dev")
        assert Counter(t.game for t in dev) == {"sorting": 2, "arithmetic": 2}
        assert sorted(t.task_id for t in train + dev) == sorted(t.task_id for t in original)
        ep = expert_episode(held, dev[0], prompt)
        assert ep.success and ep.split == "dev" and ep.fold == "train"
    finally:
        plain.close()
        held.close()


# -- selection ----------------------------------------------------------------------------------
def _m(success: float, score: float) -> dict:
    return {"success_rate": success, "mean_score": score, "success_ci95": [0.0, 1.0], "scored_episodes": 10}


# success and mean score disagree: success peaks at iteration 1, mean score at iteration 2
DEV = {0: _m(0.30, 0.50), 1: _m(0.40, 0.45), 2: _m(0.35, 0.60), 3: _m(0.20, 0.70)}


def _history() -> list[dict]:
    return [{"iteration": k, "policy": f"p{k}", "dev": DEV[k]} for k in range(4)]


def test_select_uses_the_configured_metric():
    by = {m: eto.Selection("dev", m, True, 0.0) for m in eto.METRICS}
    h = _history()
    assert eto.select(h[:2], by["success_rate"]) == (h[1], False)
    assert eto.select(h[:3], by["success_rate"]) == (h[1], True)  # 0.35 does not beat 0.40: stop, keep 1
    assert eto.select(h[:2], by["mean_score"]) == (h[0], True)  # 0.45 does not beat BC's 0.50: stop, keep BC
    assert eto.select(h, eto.Selection("dev", "mean_score", True, 0.15)) == (h[0], True)  # min_improvement
    assert eto.select(h, eto.Selection(None, "success_rate", False, 0.0)) == (h[3], False)  # no selection: last


@pytest.fixture
def fake_loop(monkeypatch):
    """eto.run with BC, the iterations, the evaluations and the comparison replaced by stand-ins
    that replay the DEV table; returns the calls made."""
    calls = {"iterations": [], "evaluations": []}

    def evaluate_policy(cfg, policy, tag, splits, out_root):
        calls["evaluations"].append((tag, list(splits)))
        return {s: {"overall": DEV[0] if tag == "bc" else _m(0.5, 0.5)} for s in splits}

    def run_iteration(cfg, k, policy, sel):
        calls["iterations"].append((k, policy))
        return {"iteration": k, "policy": f"p{k}", "pairs": 3, "dev": DEV[k] if sel.dev_split else None}

    vs = {"diff": 0.0, "diff_ci95": [0.0, 0.0], "n": 1, "mcnemar_p": 1.0}
    monkeypatch.setattr(eto, "prepare_bc", lambda cfg: None)
    monkeypatch.setattr(eto, "evaluate_policy", evaluate_policy)
    monkeypatch.setattr(eto, "run_iteration", run_iteration)
    monkeypatch.setattr(eto, "comparison", lambda files, n, seed: {"best": {"vs_bc": vs, "per_game": {}}})
    return calls


@pytest.mark.parametrize("metric,ran,best", [("success_rate", [1, 2], 1), ("mean_score", [1], 0)])
def test_early_stopping_selects_on_the_envs_metric(fake_loop, tmp_path, capsys, metric, ran, best):
    cfg = compose([f"paths.runs={tmp_path}", f"env.metric={metric}", "eto.iterations=3"])
    result = eto.run(cfg)
    assert [k for k, _ in fake_loop["iterations"]] == ran and result["best_iteration"] == best
    assert result["selection"]["metric"] == metric and result["selection"]["early_stopping"] is True
    saved = json.loads((Path(cfg.paths.eto) / "result.json").read_text())
    assert saved["selection"]["metric"] == metric and saved["best_iteration"] == best
    assert fake_loop["evaluations"][0] == ("bc", ["dev", "seen", "unseen"])
    out = capsys.readouterr().out
    assert f"selected by dev {metric}" in out and "(selects)" in out


def test_without_early_stopping_every_iteration_runs_and_the_last_is_kept(fake_loop, tmp_path, capsys):
    cfg = compose([f"paths.runs={tmp_path}", "eto.early_stopping=false", "eto.dev_split=null", "eto.iterations=3"])
    result = eto.run(cfg)
    assert [k for k, _ in fake_loop["iterations"]] == [1, 2, 3]
    assert [p for _, p in fake_loop["iterations"]][1:] == ["p1", "p2"]  # each iteration starts from the previous
    assert result["best_iteration"] == 3 and result["best_policy"] == "p3"
    assert result["selection"] == {**result["selection"], "dev_split": None, "early_stopping": False}
    assert all(h["dev"] is None for h in result["history"])
    # no dev evaluation at all: BC on the test splits, then the last policy on them
    assert fake_loop["evaluations"] == [("bc", ["seen", "unseen"]), ("eto_best", ["seen", "unseen"])]
    assert "no selection: the last iteration (3)" in capsys.readouterr().out


def test_without_early_stopping_a_dev_split_is_evaluated_but_selects_nothing(fake_loop, tmp_path):
    result = eto.run(compose([f"paths.runs={tmp_path}", "eto.early_stopping=false", "eto.iterations=3"]))
    assert result["best_iteration"] == 3 and [h["dev"] for h in result["history"]] == [DEV[k] for k in range(4)]


def test_an_iteration_without_dev_split_evaluates_nothing(monkeypatch, tmp_path):
    cfg = compose([f"paths.runs={tmp_path}", "eto=paper"])
    monkeypatch.setattr(eto, "usable_experts", lambda path, env: {})
    monkeypatch.setattr(eto.explore, "run", lambda cfg, k, policy, experts, out: ([], []))
    monkeypatch.setattr(eto.pairs, "run", lambda cfg, k, experts, explored, cont, out: ["a pair"])
    monkeypatch.setattr(eto.dpo, "run", lambda cfg, k, policy, pairs, out: eto.dpo.DPOResult("new-policy", {}, {}))

    def no_eval(*a, **k):
        raise AssertionError("dev evaluated with eto.dev_split=null")

    monkeypatch.setattr(eto, "evaluate_policy", no_eval)
    summary = eto.run_iteration(cfg, 1, "old-policy")
    assert summary["dev"] is None and summary["dev_split"] is None and summary["policy"] == "new-policy"
    assert json.loads((layout.RunLayout.of(cfg).iteration(1) / layout.SUMMARY).read_text())["dev"] is None


def test_an_iteration_without_a_pair_stops_before_dpo(monkeypatch, tmp_path):
    """ETO and compare share explore -> pairs -> DPO (eto.explore_pair_train); no pair means no DPO there, and an
    ETO iteration then stops naming the pairs' stats (compare keeps the arm at BC instead)."""
    cfg = compose([f"paths.runs={tmp_path}", "eto=paper"])
    monkeypatch.setattr(eto, "usable_experts", lambda path, env: {})
    monkeypatch.setattr(eto.explore, "run", lambda cfg, k, policy, experts, out: ([], []))
    monkeypatch.setattr(eto.pairs, "run", lambda cfg, k, experts, explored, cont, out: [])

    def no_dpo(*a, **k):
        raise AssertionError("DPO trained on no pairs")

    monkeypatch.setattr(eto.dpo, "run", no_dpo)
    with pytest.raises(ValueError, match=r"iteration 1: no pairs to train on \(see .*iter1/pairs/stats.json\)"):
        eto.run_iteration(cfg, 1, "old-policy")


# -- the checks before any work -----------------------------------------------------------------
@pytest.mark.parametrize("overrides,message", [
    (["eto.dev_split=null"], r"eto.dev_split is null but eto.early_stopping is true"),
    (["eto.dev_split=seen"], r"eto.dev_split='seen': .*not a test split"),
    (["eto.dev_split=seen", "eto.early_stopping=false"], r"eto.dev_split='seen': .*not a test split"),
    (["eto.dev_split=unseen", "eval.splits=[seen]"], r"eto.dev_split='unseen': .*not a test split"),
    (["eto.dev_split=test_seen"], r"eto.dev_split='test_seen': .*not a test split"),
    (["eto.dev_split=train"], r"eto.dev_split='train': .*not the split ETO explores"),
    (["eval.splits=[dev]"], r"eval.splits=\['dev'\]: the ETO loop selects on eto.dev_split='dev' and plays "
                            r"eval.splits as its test splits; eval.splits=\[dev\] alone is a dev play"),
    (["eto.dev_split=nope"], r"eto.dev_split='nope': the environment has no such split"),
    (["env.metric=reward"], r"env.metric='reward'"),
    (["env=sciworld", "env.dev_holdout=0"], r"eto.dev_split='dev': the environment has no such split"),
    (["env=sciworld", "env.dev_holdout=0", "+env.splits.dev=dev_indices.json"],
     r"env.splits.dev is the same list as env.splits.seen"),
    (["env=sciworld", "env.dev_holdout=0", "+env.splits.mine=dev_indices.json", "eto.dev_split=mine"],
     r"eto.dev_split='mine' shares 194 tasks with the split 'seen'"),
])
def test_selection_settings_are_checked_before_any_work(overrides, message, tmp_path, monkeypatch):
    monkeypatch.setattr(eto, "prepare_bc", lambda cfg: pytest.fail("work started before the checks"))
    with pytest.raises(ValueError, match=message):
        eto.run(compose([f"paths.runs={tmp_path}", *overrides]))


@pytest.mark.parametrize("overrides,expected", [
    ([], ("dev", "success_rate", True)),
    (["env=sciworld"], ("dev", "mean_score", True)),
    (["env=sciworld", "env.dev_holdout=0", "eto=paper"], (None, "mean_score", False)),  # the paper's setup
    (["eto=paper"], (None, "success_rate", False)),
])
def test_valid_selection_settings_pass(overrides, expected):
    sel = eto.check_selection(compose(overrides))  # a stage's steps get the typed config
    assert (sel.dev_split, sel.metric, sel.early_stopping) == expected
