"""ALFWorld adapter on hand-written games: splits, the paper's unseen list, the planner's and the
hand-coded expert's actions played to a win, scoring, step limit, errors naming missing data.

ALFWorld's data cannot be downloaded here. tests/data/alfworld holds three small problems
written against the package's own PDDL domain (one per fold); the fixture turns them into game
files with the package's ``alfworld-generate`` (its grammar, its hand-coded expert's solvability
check), laid out as ``alfworld-download`` lays out the real data.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eto_train.envs import make_env
from eto_train.experts import expert_episode
from fixture_settings import env_file

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tests" / "data" / "alfworld" / "json_2.1.1"
CFG = env_file("alfworld")
APPLE = "pick_and_place_simple-Apple-None-Cabinet-1/trial_T20000101_000000_000001"
MUG = "pick_and_place_simple-Mug-None-Cabinet-3/trial_T20000101_000000_000003"
POTATO = "pick_heat_then_place_in_recep-Potato-None-DiningTable-2/trial_T20000101_000000_000002"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return generate_games(tmp_path_factory.mktemp("alfworld"))


def generate_games(folder: Path) -> Path:
    """The three test problems as ALFWorld game files under ``folder/json_2.1.1``."""
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    out = folder / "json_2.1.1"
    tool = shutil.which("alfworld-generate", path=str(Path(sys.executable).parent)) or shutil.which("alfworld-generate")
    # --end: the script slices its file list with [start:end] and end=-1 would drop the last game
    subprocess.run([sys.executable, tool, "--data_path", str(SRC), "--save_path", str(out),
                    "--domain", ALFRED_PDDL_PATH, "--grammar", ALFRED_TWL2_PATH, "--end", "1000"],
                   check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    for trial in (APPLE, MUG, POTATO):
        game = next(out.glob(f"*/{trial}/game.tw-pddl"))
        assert json.loads(game.read_text())["solvable"], trial
    return out


def _cfg(data_dir: Path, **over) -> dict:
    cfg = {**CFG, "data_dir": str(data_dir), "splits": {k: dict(v) for k, v in CFG["splits"].items()}}
    cfg["splits"]["unseen"]["ids"] = None  # the paper's 134 games are not here
    cfg["dev_holdout"] = 0  # one train game here: nothing to hold out as dev (tests/test_dev_split.py)
    return {**cfg, **over}


def _goals(task_type: str, **names) -> set[str]:
    """The goal texts ALFWorld may write for a game (alfworld-generate picks a template at random)."""
    from alfworld.gen.goal_library import gdict

    return {t.format(**names, toggle="", mrecep="") + "." for t in gdict[task_type]["templates"]}


@pytest.fixture(scope="module")
def env(data_dir):
    e = make_env(_cfg(data_dir))
    yield e
    e.close()


def test_paper_unseen_list_is_in_the_repo_and_the_config():
    ids = (ROOT / "data" / "alfworld_eto" / "gamefile_id.txt").read_text().split()
    assert len(ids) == len(set(ids)) == 134
    assert all(i.split("-")[0] in {"pick_and_place_simple", "look_at_obj_in_light",
                                   "pick_clean_then_place_in_recep", "pick_heat_then_place_in_recep",
                                   "pick_cool_then_place_in_recep", "pick_two_obj_and_place"}
               and "/trial_T" in i for i in ids)
    assert CFG["splits"]["unseen"] == {"fold": "valid_unseen", "ids": "gamefile_id.txt"}
    assert CFG["step_limit"] == 40


def test_splits_map_to_alfworld_folds(env):
    got = {s: [(t.fold, t.game, t.task_id, t.seed) for t in env.tasks(s)] for s in ("train", "seen", "unseen")}
    assert got == {"train": [("train", "pick_heat_then_place_in_recep", POTATO, 0)],
                   "seen": [("valid_seen", "pick_and_place_simple", MUG, 0)],
                   "unseen": [("valid_unseen", "pick_and_place_simple", APPLE, 0)]}
    assert env.max_steps(env.tasks("train")[0]) == 40
    # no dev split pointing at a test split: the config holds dev games out of train instead
    assert "dev" not in CFG["splits"] and CFG["dev_holdout"] > 0 and CFG["metric"] == "success_rate"
    with pytest.raises(KeyError, match="no split 'dev'"):
        env.tasks("dev")


@pytest.mark.parametrize("split", ["train", "seen", "unseen"])
def test_planner_expert_plays_each_game_to_a_win(env, prompt, split):
    task = env.tasks(split)[0]
    ep = expert_episode(env, task, prompt)
    assert ep.success and ep.status == "success"
    assert all(s.valid for s in ep.steps) and ep.steps[-1].done and ep.steps[-1].reward == 1.0
    assert all(s.reward == 0.0 and not s.done for s in ep.steps[:-1])
    assert ep.task_id == task.trial and ep.game == task.game and len(ep.steps) <= env.max_steps(task)
    if split == "unseen":  # the planner's shortest plan for the hand-written problem
        assert [s.action for s in ep.steps] == ["go to countertop 1", "take apple 1 from countertop 1",
                                                "go to cabinet 1", "open cabinet 1", "move apple 1 to cabinet 1"]
        assert ep.instruction in _goals("pick_and_place_simple", obj="apple", recep="cabinet")
        assert ep.first_observation.startswith("You are in the middle of a room.")


def test_walkthrough_expert_is_the_hand_coded_run(data_dir, prompt):
    env = make_env(_cfg(data_dir, expert="walkthrough"))
    try:
        task = env.tasks("train")[0]
        actions = env.expert_actions(task)
        assert actions[0] == "look" and "heat potato 1 with microwave 1" in actions
        ep = expert_episode(env, task, prompt)
        assert ep.success and [s.action for s in ep.steps] == actions
    finally:
        env.close()


def test_scoring_invalid_actions_and_the_papers_put_form(env):
    task = env.tasks("unseen")[0]
    goal, first = env.reset(task)
    assert goal in _goals("pick_and_place_simple", obj="apple", recep="cabinet")
    assert "a cabinet 1, a countertop 1, and a diningtable 1" in first.observation
    assert (first.reward, first.done, first.success) == (0.0, False, False)
    assert "go to countertop 1" in first.valid_actions
    res = env.step("fly to the moon")
    assert (res.observation, res.reward, res.done, res.failure) == ("Nothing happens.", 0.0, False, False)
    for a in ["go to countertop 1", "take apple 1 from countertop 1", "go to cabinet 1", "open cabinet 1"]:
        assert not env.step(a).done
    res = env.step("put apple 1 in/on cabinet 1")  # ETO's data and prompt use alfworld<0.4's form
    assert (res.reward, res.done, res.success) == (1.0, True, True)
    assert res.observation == "You move the apple 1 to the cabinet 1."


def test_id_list_restricts_a_split_and_names_missing_games(data_dir, tmp_path):
    (tmp_path / "mine.txt").write_text(f"{APPLE}\n")
    cfg = _cfg(data_dir, ids_dir=str(tmp_path))
    cfg["splits"]["unseen"]["ids"] = "mine.txt"
    env = make_env(cfg)
    try:
        assert [t.task_id for t in env.tasks("unseen")] == [APPLE]
        env.splits["unseen"]["ids"] = "gamefile_id.txt"  # the paper's list against the tiny data
        env.ids_dir = "data/alfworld_eto"
        with pytest.raises(FileNotFoundError, match=r"134 of 134 games of gamefile_id.txt"):
            env.tasks("unseen")
    finally:
        env.close()


def test_step_limit_and_task_types_from_config(data_dir):
    env = make_env(_cfg(data_dir, step_limit=7, task_types=[4]))
    try:
        assert [t.task_id for t in env.tasks("train")] == [POTATO] and env.tasks("unseen") == []
        assert env.max_steps(env.tasks("train")[0]) == 7 and "step_limit=7" in env.version
    finally:
        env.close()


def test_two_adapters_play_side_by_side(data_dir, env):
    other = make_env(_cfg(data_dir))
    try:  # each adapter has its own planner library: interleaved games must not mix
        env.reset(env.tasks("unseen")[0])
        other.reset(other.tasks("train")[0])
        assert env.step("go to countertop 1").observation.endswith("you see a apple 1.")
        assert other.step("go to fridge 1").observation == "You arrive at fridge 1. The fridge 1 is closed."
        assert env.step("take apple 1 from countertop 1").observation.startswith("You pick up the apple 1")
    finally:
        other.close()
    assert env.step("go to cabinet 1").observation == "You arrive at cabinet 1. The cabinet 1 is closed."


def test_missing_data_names_the_path(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        make_env({**CFG, "data_dir": str(tmp_path / "nowhere")})
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "alf"))
    with pytest.raises(FileNotFoundError, match=r"alfworld-download"):
        make_env({**CFG, "data_dir": None})
    (tmp_path / "alf" / "json_2.1.1").mkdir(parents=True)
    env = make_env({**CFG, "data_dir": None})
    try:
        with pytest.raises(FileNotFoundError, match=r"no train folder in .*alf/json_2.1.1"):
            env.tasks("train")
    finally:
        env.close()
