"""AgentGym's AgentTraj layout (issue 29): ``experts.source=<file>`` reads it as it reads the ETO
authors' files, and ``export.format=agenttraj`` writes it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eto_train.envs.base import Task
from eto_train.envs.webshop import WebShopTask
from eto_train.eto_format import agenttraj_id, import_experts, read_eto_file
from eto_train.records import RecordError
from test_pipeline import ROOT, TOY

OPENING = [{"from": "human", "loss": None, "value": "You are web shopping. ...Action: \nclick[something]"},
           {"from": "gpt", "loss": False, "value": "Ok."}]


def entry(item_id: str, actions=("search[shorts]", "click[Buy Now]")) -> dict:
    conv = [*OPENING, {"from": "human", "loss": None, "value": "WebShop [SEP] Instruction: [SEP] shorts [SEP] Search"}]
    for i, a in enumerate(actions):
        conv.append({"from": "gpt", "loss": True, "value": f"Thought:\nI think so.\n\nAction:\n{a}"})
        if i < len(actions) - 1:
            conv.append({"from": "human", "loss": None, "value": f"page {i}"})
    return {"conversations": conv, "item_id": item_id}


def test_agenttraj_item_ids_bind_to_webshop_goals_and_agentgym_tasks(tmp_path):
    path = tmp_path / "agenttraj.json"
    path.write_text(json.dumps([entry("webshop_12"), entry("webshop_7"), entry("webshop_999"), entry("webshop_12")]))
    tasks = [WebShopTask("webshop", "webshop", "train", i, "train") for i in (7, 12, 13)]
    episodes, report = import_experts(path, tasks, "webshop-test")
    assert [e.task_id for e in episodes] == ["12", "7"]  # the goal index, as the AgentGym WebShop server numbers them
    assert report["unmatched_ids"] == ["webshop_999"] and report["duplicate_ids"] == ["12"]
    assert report["tasks_without_expert"] == 1
    ep = episodes[0]
    assert ep.opening == "instruction_ok" and ep.system.startswith("You are web shopping")  # "Ok." is the opening
    assert [s.action for s in ep.steps] == ["search[shorts]", "click[buy now]"] and ep.success  # parse_action
    assert agenttraj_id(WebShopTask("webshop", "webshop", "train", 12, "train")) == "webshop_12"
    assert agenttraj_id(Task("lamps", "lamps", "train", 3, "train")) == "lamps_lamps/train/3"  # any other env


def test_a_malformed_agenttraj_entry_names_file_and_index(tmp_path):
    bad = entry("webshop_3")
    bad["conversations"][3] = {"loss": True, "value": "Action: click[x]"}  # no 'from'
    path = tmp_path / "agenttraj.json"
    path.write_text(json.dumps([entry("webshop_1"), bad], indent=1))
    with pytest.raises(RecordError, match=r"agenttraj\.json:\d+ \[item 1\]: not an AgentTraj trajectory: "
                                          r"conversations\[3\]\.from"):
        read_eto_file(path)
    path.write_text(json.dumps([{"conversations": entry("x_1")["conversations"], "item_id": 7}]))
    with pytest.raises(RecordError, match=r"\[item 0\]: not an AgentTraj trajectory: item_id"):
        read_eto_file(path)


def test_a_file_of_another_environment_is_named(tmp_path):
    path = tmp_path / "agenttraj.jsonl"
    path.write_text("\n".join(json.dumps(entry(f"alfworld_{i}")) for i in range(3)) + "\n")
    with pytest.raises(RecordError, match=r"ids are those of environment 'alfworld'"):
        import_experts(path, [WebShopTask("webshop", "webshop", "train", 1, "train")], "v")


def _cli(stage: str, runs, run_name: str, *extra: str) -> None:
    cmd = [sys.executable, "-m", "eto_train.cli", stage, f"paths.runs={runs}", f"run_name={run_name}", *TOY, *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{stage}: " + proc.stdout[-3000:] + proc.stderr[-3000:]


def test_export_writes_agenttraj_and_bc_trains_on_it(tmp_path):
    runs = tmp_path / "runs"
    _cli("experts", runs, "gold")
    out = tmp_path / "agenttraj.json"
    _cli("export", runs, "gold", "export.format=agenttraj", f"export.output={out}")
    rows = json.loads(out.read_text())
    assert rows and all(set(r) == {"item_id", "conversations", "reward"} for r in rows)
    first = rows[0]["conversations"]
    assert first[1] == {"from": "gpt", "loss": False, "value": "Ok."}
    assert {t["loss"] for t in first if t["from"] == "human"} == {None}
    assert all(t["loss"] for t in first[2:] if t["from"] == "gpt")
    assert rows[0]["item_id"].startswith("twx_")
    for stage in ("experts", "model", "bc"):
        _cli(stage, runs, "imported", f"experts.source={out}")
    run = runs / "imported"
    experts = [json.loads(line) for line in (run / "experts" / "train.jsonl").read_text().splitlines()]
    assert len(experts) == len(rows) and all(e["env_version"].startswith("imported") for e in experts)
    assert json.loads((run / "experts" / "manifest.json").read_text())["metrics"]["unmatched"] == 0
    bc = json.loads((run / "bc" / "manifest.json").read_text())
    assert bc["status"] == "done" and bc["metrics"]["optimizer_steps"] == 3
