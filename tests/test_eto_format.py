"""The authors' released data layouts, both ways: import of SFT files (instruction/"OK" opening,
thoughts, ids mapped to this project's tasks) and export of SFT and pair files.

The fixtures are written here from the released schema (never the authors' data): an
instruction turn, a gpt "OK", the task turn, then Thought/Action and Observation turns;
ScienceWorld ids ``<task number>_<variation>``, ALFWorld ``game_file`` paths, WebShop rewards.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from eto_train.eto_format import from_eto, import_experts, read_eto_file, read_eto_pairs, to_eto
from eto_train.export import export_training_data
from eto_train.pairs import trajectory_pair
from eto_train.records import Episode, PolicyRef, RecordError, Step, to_messages
from eto_train.store import write_jsonl

INSTRUCTION = "You are a helpful assistant to do some scientific experiment in an environment.\nThe available actions are: ..."


def turns(*pairs):
    return [{"from": f, "value": v} for f, v in pairs]


def sciworld_entry(id="13_5", n=2):
    conv = turns(("human", INSTRUCTION), ("gpt", "OK"), ("human", "Your task is to boil water."))
    for i in range(n):
        conv += turns(("gpt", f"Thought: step {i} is next.\nAction: act {i}"), ("human", f"Observation: saw {i}"))
    return {"id": id, "conversations": conv[:-1]}  # the file's trajectories end on the last action


def task(env, task_id, game="g"):
    return SimpleNamespace(env=env, task_id=task_id, game=game, fold="train", seed=0, split="train")


def write_json_list(path, items):
    path.write_text(json.dumps(items, indent=4))
    return path


def test_released_sft_entry_imports_opening_as_context_and_keeps_thoughts():
    ep = from_eto(sciworld_entry())
    assert ep.opening == "instruction_ok" and ep.system == INSTRUCTION
    assert ep.first_user == "Your task is to boil water."
    assert [s.action for s in ep.steps] == ["act 0", "act 1"]  # "OK" is not a step
    assert ep.steps[0].raw_output == "Thought: step 0 is next.\nAction: act 0"
    assert ep.steps[0].observation == "Observation: saw 0" and ep.final_score == 1.0 and ep.success
    msgs = to_messages(ep)
    assert [m["role"] for m in msgs[:4]] == ["user", "assistant", "user", "assistant"]
    assert msgs[1]["content"] == "OK" and msgs[3]["content"].startswith("Thought: step 0")


def test_import_maps_ids_reports_unmatched_and_binds_tasks(tmp_path):
    tasks = [task("sciworld", "13_5", "boil"), task("sciworld", "13_6", "boil")]
    path = write_json_list(tmp_path / "sciworld_sft.json",
                           [sciworld_entry("13_5"), sciworld_entry("99_0"), sciworld_entry("13_5")])
    eps, report = import_experts(path, tasks, "scienceworld==1.2")
    assert [e.task_id for e in eps] == ["13_5"] and eps[0].game == "boil" and eps[0].env == "sciworld"
    assert eps[0].env_version.startswith("imported")
    assert report | {"source": None} == {"source": None, "entries": 3, "imported": 1, "unmatched": 1,
                                        "unmatched_ids": ["99_0"], "unmatched_in_splits": {},
                                        "duplicates": 1, "duplicate_ids": ["13_5"],
                                        "tasks_without_expert": 1}


def test_alfworld_game_file_maps_to_task_folder_and_trial(tmp_path):
    tid = "pick_and_place_simple-Mug-None-Shelf-1/trial_T20190909_000000_000001"
    entry = sciworld_entry(n=1)
    del entry["id"]
    entry["game_file"] = f"json_2.1.1/train/{tid}/game.tw-pddl"
    other = dict(entry, game_file="json_2.1.1/train/look_at_obj-X/trial_T1")
    eps, report = import_experts(write_json_list(tmp_path / "alfworld_sft.json", [entry, other]),
                                 [task("alfworld", tid, "1")], "alfworld==0.3")
    assert eps[0].task_id == tid and report["unmatched_ids"] == ["json_2.1.1/train/look_at_obj-X/trial_T1"]
    assert to_eto(eps[0])["game_file"] == f"json_2.1.1/train/{tid}" and to_eto(eps[0])["id"] == tid.split("/")[1]


def test_webshop_reward_below_one_is_kept():
    ep = from_eto({**sciworld_entry("7"), "reward": 0.75})
    assert ep.final_score == 0.75 and not ep.success


@pytest.mark.parametrize("items, message", [
    ([sciworld_entry(), {"conversations": turns(("human", "i"), ("gpt", "OK"), ("human", "t"))}],
     r"alfworld_sft.json:\d+ \[item 1\]: not an ETO trajectory: the trajectory has no gpt .* after the opening"),
    ([{"id": 1, "conversations": turns(("human", "i"), ("gpt", "OK"), ("gpt", "Action: a"))}],
     r"\[item 0\]: not an ETO trajectory: conversations\[2\]: two gpt turns in a row"),
    ([{"conversations": turns(("human", "t"), ("gpt", "Action: a"))}], r"\[item 0\]: .*no 'id'"),
    ([{"id": "1", "reward": "high", "conversations": turns(("human", "t"), ("gpt", "Action: a"))}],
     r"\[item 0\]: .*reward: expected a number"),
])
def test_malformed_entries_name_file_and_index(tmp_path, items, message):
    path = write_json_list(tmp_path / "alfworld_sft.json", items)
    with pytest.raises(RecordError, match=message):
        import_experts(path, [task("sciworld", "13_5")], "v")


def test_a_file_of_another_environment_is_refused(tmp_path):
    path = write_json_list(tmp_path / "webshop_sft.json", [sciworld_entry("17"), sciworld_entry("18")])
    with pytest.raises(RecordError, match=r"none of its 2 trajectories matches a task .* another environment"):
        import_experts(path, [task("sciworld", "13_5")], "v")


# -- export ------------------------------------------------------------------------------------
def project_episode(task_id="13_5", policy="expert", actions=("a", "b"), score=1.0, sample=0):
    e = Episode(episode_id=f"{policy}-{task_id}-{sample}", task_id=task_id, env="sciworld", game="boil",
                fold="train", seed=5, split="train", env_version="v", policy=PolicyRef(id=policy),
                prompt_version="react-v1", system="SYS", first_user="TASK", instruction="TASK",
                first_observation="", sample_index=sample)
    for i, a in enumerate(actions):
        e.steps.append(Step(index=i, raw_output=f"Action: {a}", action=a, valid=True, observation=f"obs{i}",
                            reward=score if i == len(actions) - 1 else 0.0, done=i == len(actions) - 1))
    e.finish("success" if score == 1.0 else "failure")
    return e


def test_sft_export_matches_the_released_layout_and_round_trips(tmp_path):
    store = tmp_path / "episodes.jsonl"
    eps = [project_episode(), project_episode(policy="pi@1", actions=("a", "x"), score=0.0),
           project_episode("13_6")]
    write_jsonl(store, [e.to_dict() for e in eps])
    out = tmp_path / "sciworld_sft.json"
    export_training_data([store], out, {"format": "eto", "redact_patterns": []})
    rows = json.loads(out.read_text())  # a JSON list, as the authors' files
    assert [r["id"] for r in rows] == ["13_5", "13_5-1", "13_6"]  # distinct; the first keeps the task id
    assert all(set(r) == {"id", "conversations", "reward"} for r in rows)
    conv = rows[0]["conversations"]
    assert conv[:3] == turns(("human", "SYS"), ("gpt", "OK"), ("human", "TASK"))
    assert conv[3:] == turns(("gpt", "Action: a"), ("human", "obs0"), ("gpt", "Action: b"))
    back = read_eto_file(out)
    assert [m["content"] for m in to_messages(back[0])] == ["SYS", "OK", "TASK", "Action: a", "obs0", "Action: b"]
    assert [s.action for s in back[1].steps] == ["a", "x"] and back[1].final_score == 0.0
    # and back out: the same file
    write_jsonl(tmp_path / "again.jsonl", [e.to_dict() for e in back])
    export_training_data([tmp_path / "again.jsonl"], tmp_path / "again.json", {"format": "eto", "redact_patterns": []})
    assert [r["conversations"] for r in json.loads((tmp_path / "again.json").read_text())] == \
        [r["conversations"] for r in rows]


@pytest.mark.parametrize("fmt", ["eto", "messages"])
def test_pair_export_matches_layout_and_round_trips(tmp_path, fmt):
    pair = trajectory_pair(project_episode(actions=("a", "b", "c")),
                           project_episode(policy="pi@1", actions=("a", "x"), score=0.0))
    store = tmp_path / "pairs.jsonl"
    write_jsonl(store, [pair.to_dict(), pair.to_dict()])
    out = tmp_path / f"export.{'json' if fmt == 'eto' else 'jsonl'}"
    export_training_data([store], out, {"format": fmt, "redact_patterns": []})
    if fmt == "eto":
        rows = json.loads(out.read_text())
        assert [set(r) for r in rows] == [{"id", "prompt", "chosen", "rejected"}] * 2
        assert [r["id"] for r in rows] == ["13_5", "13_5-1"]
        assert rows[0]["prompt"] == turns(("human", "SYS"), ("gpt", "OK"), ("human", "TASK"))
        assert rows[0]["chosen"] == turns(("gpt", "Action: a"), ("human", "obs0"), ("gpt", "Action: b"),
                                          ("human", "obs1"), ("gpt", "Action: c"))
        assert rows[0]["rejected"] == turns(("gpt", "Action: a"), ("human", "obs0"), ("gpt", "Action: x"))
        back = read_eto_pairs(out)[0]
        assert back["prompt"] == [{"role": "user", "content": "SYS"}, {"role": "assistant", "content": "OK"},
                                  {"role": "user", "content": "TASK"}]
    else:
        back = [json.loads(line) for line in out.read_text().splitlines()][0]
        assert set(back) == {"id", "prompt", "chosen", "rejected"} and back["prompt"] == pair.prompt
    assert back["chosen"] == pair.chosen and back["rejected"] == pair.rejected


def test_bad_pair_in_released_layout_names_the_item(tmp_path):
    path = write_json_list(tmp_path / "pm.json", [{"id": "1", "prompt": turns(("human", "t")),
                                                  "chosen": turns(("human", "x")), "rejected": turns(("gpt", "y"))}])
    with pytest.raises(RecordError, match=r"pm.json:2 \[item 0\]: not an ETO preference pair: chosen: must start"):
        read_eto_pairs(path)


# -- ScienceWorld ids in task-name form; a file of another environment ------------------------------
SCIWORLD_ETO = Path(__file__).resolve().parents[1] / "data/sciworld_eto"


def sciworld_split(file: str, split: str) -> list:
    """The tasks of one of the authors' split lists (data/sciworld_eto), as the adapter names them."""
    numbers = json.loads((SCIWORLD_ETO / "taskname2id.json").read_text())
    return [SimpleNamespace(env="sciworld", task_id=f"{numbers[g]}_{v}", game=g, fold="train", seed=v, split=split)
            for g, v in json.loads((SCIWORLD_ETO / file).read_text())]


def test_sciworld_task_name_ids_map_through_taskname2id(tmp_path):
    """``task-2a-test-conductivity-of-unknown-substances_262`` is task 10, variation 262 (a training
    task of the authors' train_indices.json), by the shipped taskname2id.json (before: 'none of its 2
    trajectories matches')."""
    name = "task-2a-test-conductivity-of-unknown-substances"
    train = sciworld_split("train_indices.json", "train")
    tasks = [t for t in train if t.task_id in ("10_262", "0_3")]
    assert sorted(t.task_id for t in tasks) == ["0_3", "10_262"]
    path = write_json_list(tmp_path / "sciworld_sft.json", [sciworld_entry(f"{name}_262"), sciworld_entry("0_3"),
                                                            sciworld_entry("task-1-boil_4")])
    eps, report = import_experts(path, tasks, "v")
    assert [e.task_id for e in eps] == ["10_262", "0_3"] and eps[0].game == name
    assert report["unmatched_ids"] == ["task-1-boil_4"]


def test_an_experts_file_of_test_split_tasks_says_so_and_names_the_split(tmp_path):
    """Issue 37, item 7: an experts file whose ids are ScienceWorld tasks of the authors' test split
    (``task-2a-..._456`` = 10_456, in their test_indices.json, this project's ``unseen``) was refused
    asking "is it the file of another environment?". It now says which split they are in."""
    train = sciworld_split("train_indices.json", "train")
    others = {"'seen' (dev_indices.json)": sciworld_split("dev_indices.json", "seen"),
              "'unseen' (test_indices.json)": sciworld_split("test_indices.json", "unseen")}
    assert "10_456" in {t.task_id for t in others["'unseen' (test_indices.json)"]}
    assert "10_456" not in {t.task_id for t in train}
    path = write_json_list(tmp_path / "sciworld_sft.json", [
        sciworld_entry("task-2a-test-conductivity-of-unknown-substances_456"), sciworld_entry("10_450"),
        sciworld_entry("10_418"), sciworld_entry("99_1")])
    with pytest.raises(RecordError) as err:
        import_experts(path, train, "v", other_splits=lambda: others)
    msg = str(err.value)
    assert msg.startswith(f"{path}: none of its 4 trajectories is a task of the training split of environment 'sciworld'")
    assert ("2 in split 'unseen' (test_indices.json) (e.g. task-2a-test-conductivity-of-unknown-substances_456 = "
            "10_456, 10_450); 1 in split 'seen' (dev_indices.json) (e.g. 10_418); 1 match no task") in msg
    assert "a test task must never be trained on" in msg and "experts.source=gold" in msg
    assert "another environment" not in msg
    # beside training tasks, test tasks are imported by no one and counted by split in the report
    path = write_json_list(tmp_path / "mixed.json", [sciworld_entry("10_262"), sciworld_entry("10_450")])
    eps, report = import_experts(path, train, "v", other_splits=lambda: others)
    assert [e.task_id for e in eps] == ["10_262"]
    assert report["unmatched_in_splits"] == {"'unseen' (test_indices.json)": 1}


def test_a_sciworld_file_given_to_a_twx_run_names_the_file_and_both_environments(tmp_path):
    path = write_json_list(tmp_path / "sciworld_sft.json", [sciworld_entry("13_5"), sciworld_entry("task-1-boil_2")])
    with pytest.raises(RecordError) as err:
        import_experts(path, [task("twx", "mapreader/train/7")], "v")
    msg = str(err.value)
    assert str(path) in msg and "those of environment 'sciworld'" in msg and "this run's environment is 'twx'" in msg


def test_a_copied_experts_file_of_another_environment_is_refused_before_training(tmp_path):
    """``experts/train.jsonl`` of a ScienceWorld run in a TWX run: the readers of bc, explore and
    pairs (``read_experts(path, env)``) name the file and both environments."""
    from eto_train.experts import ExpertsEnvError, read_experts

    path = tmp_path / "experts" / "train.jsonl"
    path.parent.mkdir()
    write_jsonl(path, [project_episode("13_5").to_dict()])
    assert read_experts(path, "sciworld")[0].task_id == "13_5"
    with pytest.raises(ExpertsEnvError, match=rf"{path}: an experts file of environment 'sciworld' .*"
                                              r"this run's environment is env.name='twx'"):
        read_experts(path, "twx")
