"""Our explorations in the authors' evaluation-output layout, read as their construct_preference.py
reads it, give the same pairs as ours (``eto.pairs.expert_reward=authors``).

Their repository (Yifan-Song793/ETO, commit a2fc5da) cannot be imported here (no network at test
time), so :func:`authors_pairs` is a minimal, faithful transcription of the file reading and the
pair rule of their ``construct_preference.py``: ``build_preference`` (lines 47-111: golden ids
from ``item['id']``, golden reward 1.0 in sciworld and ``item['reward']`` in webshop, one output
file per task keyed by ``file.split('.')[0]``, ``meta.reward``, ``conversations[pred_traj_offset:]``,
a final human turn dropped, ScienceWorld's ``"Task Description:\\n"`` cut, the rejected agent side
cut to ``len(golden) + 5*2`` turns, ties dropped, pairs not ending on gpt dropped) and
``build_preference_alfworld`` (lines 114-175: keys from ``game_file``'s last folder and from
``meta.error``'s second-to-last, the agent's reward made 0/1, golden 1.0, nothing cut). Their
``instruction_part`` constant (the prompt's opening) is replaced by the golden file's own opening.
The fixtures follow their schema (eval_agent/utils/datatypes.py ``State.to_dict``), never their data.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_pairs import cpu_pairs

from eto_train.eto_format import AUTHORS_OFFSET, IDS_FILE, file_safe, pair_to_eto
from eto_train.export import export_training_data
from eto_train.records import Episode, PolicyRef, Step
from eto_train.stages.eto.pairs import build_pairs
from eto_train.store import write_jsonl

TASK_PREFIX = "Task Description:\n"


# -- their reader (transcribed; see the module docstring for file:lines) ---------------------------
def authors_pairs(outputs: Path, model: str, task: str, golden_path: Path, offset: int) -> list[dict]:
    golden_raw = json.load(open(golden_path))
    golden_trajs, golden_rewards = {}, {}
    for item in golden_raw:
        idx = item["game_file"].split("/")[-1] if task == "alfworld" else str(item["id"])
        golden_trajs[idx] = item["conversations"][2:]
        if task in ("sciworld", "alfworld"):
            golden_rewards[idx] = 1.0
        else:  # webshop (and, beyond their script, any other environment: the file's reward)
            golden_rewards[idx] = item["reward"]
    opening = {idx: item["conversations"][:2] for idx, item in zip(golden_trajs, golden_raw)}
    pred_trajs, pred_rewards = {}, {}
    for folder in os.listdir(outputs):
        if not folder.startswith(model):
            continue
        for file in os.listdir(outputs / folder / task):
            if not file.endswith(".json"):
                continue
            pred_raw = json.load(open(outputs / folder / task / file))
            if task == "alfworld":
                idx = pred_raw["meta"]["error"].split("/")[-2]
                pred_rewards[idx] = 1.0 if pred_raw["meta"]["reward"] else 0.0
            else:
                idx = file.split(".")[0]
                pred_rewards[idx] = pred_raw["meta"]["reward"]
            pred_trajs[idx] = pred_raw["conversations"][offset:]
            if pred_trajs[idx][-1]["from"] == "human":
                pred_trajs[idx].pop()
            if task == "sciworld":
                pred_trajs[idx][0]["value"] = pred_trajs[idx][0]["value"][len(TASK_PREFIX):].strip()
    pm_data = []
    for key in pred_rewards:
        if pred_rewards[key] is None or key not in golden_trajs or key not in pred_trajs:
            continue
        g, p = golden_trajs[key], pred_trajs[key]
        if pred_rewards[key] < golden_rewards[key]:
            rejected = p[1:] if task == "alfworld" else p[:len(g) + 5 * 2][1:]
            pm_data.append({"id": key, "prompt": opening[key] + g[:1], "chosen": g[1:], "rejected": rejected})
        elif pred_rewards[key] > golden_rewards[key]:
            pm_data.append({"id": key, "prompt": opening[key] + p[:1], "chosen": p[1:], "rejected": g[1:]})
        else:
            continue
        if pm_data[-1]["chosen"][-1]["from"] != "gpt" or pm_data[-1]["rejected"][-1]["from"] != "gpt":
            pm_data.pop()
    return pm_data


# -- fixtures ------------------------------------------------------------------------------------
PROFILE = {  # env -> (prompt version, opening, system text)
    "sciworld": ("sciworld-eto", "instruction_ok", "You are a helpful assistant to do some scientific experiment."),
    "webshop": ("webshop-eto", "instruction_ok", "You are web shopping."),
    "alfworld": ("alfworld-eto", "instruction_ok", "Interact with a household to solve a task."),
    "twx": ("react-v1", "system", "You play a text game."),
}
TASKS = {
    "sciworld": ["10_262", "0_3", "13_5", "4_7", "9_1"],
    "webshop": ["17", "18", "19", "20", "21"],
    "alfworld": [f"pick_and_place_simple-Mug-None-Shelf-{i}/trial_T2019_0{i}" for i in range(5)],
    "twx": [f"mapreader/train/{i}" for i in range(5)],
}


def episode(env, task_id, policy, actions, score, status=None):
    version, opening, system = PROFILE[env]
    e = Episode(episode_id=f"{policy}-{task_id}", task_id=task_id, env=env, game="game one", fold="train",
                seed=1, split="train", env_version="v", policy=PolicyRef(id=policy), prompt_version=version,
                system=system, opening=opening, first_user=f"Your task is number {task_id}.",
                instruction="t", first_observation="")
    for i, a in enumerate(actions):
        last = i == len(actions) - 1
        e.steps.append(Step(index=i, raw_output=f"Thought: I go on.\nAction: {a}", action=a, valid=True,
                            observation=f"Observation: you did {a}", reward=score if last else 0.0, done=last))
    e.finish(status or ("success" if score == 1.0 else "failure"))
    return e


def cases(env):
    """(experts, explorations): lost and cut, lost short, beat a 0.72 file reward, tied, won."""
    t = TASKS[env]
    partial = 0.0 if env == "alfworld" else 0.3  # ALFWorld is won or not (their reader makes any reward > 0 a 1.0)
    experts = [episode(env, t[0], "expert", ["a", "b"], 0.72 if env != "alfworld" else 1.0),
               episode(env, t[1], "expert", ["a", "b", "c"], 1.0),
               episode(env, t[2], "expert", ["a"], 1.0),
               episode(env, t[3], "expert", ["a", "b"], 0.5 if env in ("webshop", "twx") else 1.0),
               episode(env, t[4], "expert", ["a", "b"], 1.0)]
    explored = [episode(env, t[0], "bc@w", ["x", "y"], 0.8 if env != "alfworld" else 0.0),
                episode(env, t[1], "bc@w", [f"w{i}" for i in range(12)], 0.0, "max_steps"),
                episode(env, t[2], "bc@w", ["a"], 1.0),
                episode(env, t[3], "bc@w", ["z"], 0.9 if env in ("webshop", "twx") else partial),
                episode(env, t[4], "bc@w", ["q", "r", "s"], partial / 2)]
    return experts, explored


def export_both(tmp_path, experts, explored, model="mymodel"):
    write_jsonl(tmp_path / "experts.jsonl", [e.to_dict() for e in experts])
    write_jsonl(tmp_path / "explore.jsonl", [e.to_dict() for e in explored])
    export_training_data(tmp_path / "experts.jsonl", tmp_path / "golden.json", {"format": "eto"})
    report = export_training_data(tmp_path / "explore.jsonl", tmp_path / "outputs" / model, {"format": "eto_eval"})
    return report


def ours(env, experts, explored):
    pc = cpu_pairs(contrast="trajectory", chosen="expert", rejected_cut="expert_length", expert_reward="authors",
               extra_turns=None if env == "alfworld" else 5)
    pairs, _ = build_pairs(pc, {e.task_id: e for e in experts}, explored, [], seed=0)
    return pairs


@pytest.mark.parametrize("env", ["sciworld", "webshop", "alfworld"])
def test_their_construct_preference_reads_our_exploration_export_and_gives_our_pairs(tmp_path, env):
    experts, explored = cases(env)
    export_both(tmp_path, experts, explored)
    files = sorted(os.listdir(tmp_path / "outputs" / "mymodel" / env))
    assert len(files) == len(explored)
    one = json.loads((tmp_path / "outputs" / "mymodel" / env / files[0]).read_text())
    assert set(one["meta"]) == {"steps", "reward", "finished", "success", "terminate_reason", "error"}
    theirs = authors_pairs(tmp_path / "outputs", "mymodel", env, tmp_path / "golden.json", AUTHORS_OFFSET[env])
    mine = [pair_to_eto(p, id=p.task_id if env != "alfworld" else p.task_id.rsplit("/", 1)[-1])
            for p in ours(env, experts, explored)]
    assert len(mine) >= 3  # lost (cut), lost, and the 0.72 / webshop cases
    by_id = {p["id"]: p for p in theirs}
    assert sorted(by_id) == sorted(p["id"] for p in mine)
    for p in mine:
        q = by_id[p["id"]]
        assert (q["chosen"], q["rejected"], q["prompt"]) == (p["chosen"], p["rejected"], p["prompt"]), p["id"]
    if env == "sciworld":  # the expert at 0.72 in the file is 1.0 to both: the agent at 0.8 is rejected
        first = by_id[TASKS[env][0]]
        assert first["chosen"][0]["value"].endswith("Action: a")
    if env != "alfworld":  # the 12-step failure is cut to the expert's 3 + 5 actions by both
        cut = by_id[TASKS[env][1]]["rejected"]
        assert sum(t["from"] == "gpt" for t in cut) == 8


def test_twx_ids_with_slashes_match_between_the_gold_file_and_the_explorations_as_exported(tmp_path):
    """Issue 37, item 7: their script keys the explorations on the file names (``mapreader+2Ftrain+2F0``);
    the gold file (``format=eto``) said ``mapreader/train/0``, so it built 0 pairs unless the ids were
    rewritten by hand. Both exports now carry the file-safe id: their rule, run on the two exports as
    they are, gives our pairs; ids.jsonl maps each file back to its id and task."""
    experts, explored = cases("twx")
    report = export_both(tmp_path, experts, explored)
    out = tmp_path / "outputs" / "mymodel"
    assert report["exported"] == 5
    names = sorted(os.listdir(out / "twx"))
    assert names == sorted(f"{file_safe(t)}.json" for t in TASKS["twx"]) and all("/" not in n for n in names)
    assert all(n.count(".") == 1 for n in names)  # their reader keeps the id up to the first "."
    golden = json.loads((tmp_path / "golden.json").read_text())
    assert [g["id"] for g in golden] == [file_safe(t) for t in TASKS["twx"]]  # the file names' ids
    mapping = {d["file"]: (d["id"], d["task_id"]) for d in map(json.loads, (out / IDS_FILE).read_text().splitlines())}
    assert mapping == {f"twx/{file_safe(t)}.json": (file_safe(t), t) for t in TASKS["twx"]}
    # their reader on the export as written: no id rewritten
    theirs = {p["id"]: p for p in authors_pairs(tmp_path / "outputs", "mymodel", "twx", tmp_path / "golden.json", 2)}
    mine = {file_safe(p.task_id): pair_to_eto(p) for p in ours("twx", experts, explored)}
    assert len(mine) >= 3 and sorted(theirs) == sorted(mine)
    for tid, p in mine.items():
        assert (theirs[tid]["chosen"], theirs[tid]["rejected"]) == (p["chosen"], p["rejected"])


def test_the_gold_file_of_a_twx_run_imports_back_onto_its_tasks(tmp_path):
    """The file-safe ids of the gold file are bound back to the training tasks they name (both ways)."""
    from types import SimpleNamespace

    from eto_train.eto_format import import_experts

    experts, _ = cases("twx")
    write_jsonl(tmp_path / "experts.jsonl", [e.to_dict() for e in experts])
    export_training_data(tmp_path / "experts.jsonl", tmp_path / "golden.json", {"format": "eto"})
    tasks = [SimpleNamespace(env="twx", task_id=t, game="mapreader", fold="train", seed=i, split="train")
             for i, t in enumerate(TASKS["twx"])]
    eps, report = import_experts(tmp_path / "golden.json", tasks, "v")
    assert [e.task_id for e in eps] == TASKS["twx"] and report["unmatched"] == 0
    assert [[s.action for s in e.steps] for e in eps] == [[s.action for s in e.steps] for e in experts]


def test_an_episode_without_the_papers_prompt_is_refused_for_their_layout(tmp_path):
    e = episode("sciworld", "13_5", "bc@w", ["a"], 0.5)
    e.prompt_version = "react-v1"
    write_jsonl(tmp_path / "explore.jsonl", [e.to_dict()])
    with pytest.raises(ValueError, match=r"2 turns before the task, but the authors' construct_preference.py "
                                         r"skips 16 in sciworld .*prompt=sciworld_eto"):
        export_training_data(tmp_path / "explore.jsonl", tmp_path / "outputs" / "m", {"format": "eto_eval"})
    assert not (tmp_path / "outputs").exists()


def test_their_layout_is_a_folder_and_holds_no_pairs(tmp_path):
    experts, explored = cases("sciworld")
    write_jsonl(tmp_path / "explore.jsonl", [e.to_dict() for e in explored])
    with pytest.raises(ValueError, match="the authors' evaluation layout is a folder"):
        export_training_data(tmp_path / "explore.jsonl", tmp_path / "x.jsonl", {"format": "eto_eval"})
    write_jsonl(tmp_path / "pairs.jsonl", [p.to_dict() for p in ours("sciworld", experts, explored)])
    with pytest.raises(ValueError, match="export pairs with format eto"):
        export_training_data(tmp_path / "pairs.jsonl", tmp_path / "out", {"format": "eto_eval"})


# -- an experts file of another environment, at stage level (issue 26's trials) --------------------
ROOT = Path(__file__).resolve().parents[1]
SMALL = ["env.splits.train.count=4", "env.splits.seen.count=2", "env.splits.unseen.count=1", "bc.max_steps=3",
         "wandb.enabled=false", "runtime.train_threads=1", "model=twx_base"]


def cli(stage, runs, *extra):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "eto_train.cli", stage, f"paths.runs={runs}", "run_name=twx",
                           *SMALL, *extra], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"OMP_NUM_THREADS": "1"})


def test_a_sciworld_experts_source_for_a_twx_run_is_refused_naming_file_and_both_environments(tmp_path):
    from eto_train.eto_format import to_eto

    experts, _ = cases("sciworld")
    src = tmp_path / "sciworld_sft.json"
    src.write_text(json.dumps([to_eto(e) for e in experts]))
    proc = cli("experts", tmp_path / "runs", f"experts.source={src}")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and str(src) in out
    assert "those of environment 'sciworld'" in out and "this run's environment is 'twx'" in out
    assert not (tmp_path / "runs" / "twx" / "experts" / "train.jsonl").exists()


def test_a_copied_sciworld_experts_file_stops_twx_bc_before_training(tmp_path):
    experts, _ = cases("sciworld")
    path = tmp_path / "runs" / "twx" / "experts" / "train.jsonl"
    path.parent.mkdir(parents=True)
    write_jsonl(path, [e.to_dict() for e in experts])
    before = path.read_bytes()
    proc = cli("bc", tmp_path / "runs")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and str(path) in out, out[-2000:]
    assert "an experts file of environment 'sciworld'" in out and "env.name='twx'" in out
    assert not (tmp_path / "runs" / "twx" / "bc" / "model").exists() and path.read_bytes() == before


def test_a_sciworld_experts_file_of_test_split_tasks_names_the_split_at_stage_level(tmp_path):
    """Issue 37, item 7: `eto-train experts env=sciworld experts.source=<file of test-split tasks>` says the
    tasks are the test split's (their test_indices.json, this project's `unseen`), one block, exit 2,
    nothing written; it used to ask whether the file was another environment's."""
    import subprocess
    import sys

    experts, _ = cases("sciworld")
    src = tmp_path / "sciworld_sft.json"
    entries = [to_eto_(e) for e in experts[:2]]
    entries[0]["id"] = "task-2a-test-conductivity-of-unknown-substances_456"  # 10_456: the authors' test split
    entries[1]["id"] = "10_450"
    src.write_text(json.dumps(entries))
    proc = subprocess.run([sys.executable, "-m", "eto_train.cli", "experts", "env=sciworld", f"paths.runs={tmp_path}/runs",
                           "run_name=sw", f"experts.source={src}", "wandb.enabled=false"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr
    assert err.startswith(f"eto-train experts: RecordError: {src}: none of its 2 trajectories is a task of the "
                          f"training split of environment 'sciworld'")
    assert ("2 in split 'unseen' (test_indices.json) (e.g. task-2a-test-conductivity-of-unknown-substances_456 = "
            "10_456, 10_450)") in err and "another environment" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def to_eto_(ep):
    from eto_train.eto_format import to_eto

    return to_eto(ep)
