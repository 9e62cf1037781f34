"""Step values by Monte Carlo (``eto.pairs.contrast=step_value``): the pair rule on hand-built
episodes, the value continuations' episode keys, and the contrast end to end through the CLI
(explore -> value continuations -> pairs -> DPO -> eval, a rerun, a kill and resume)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from test_pairs import (
    cpu_pairs,
    ep,  # tests/test_pairs.py: hand-built episodes
)
from test_pipeline import ROOT, TOY

from eto_train.envs.base import Task
from eto_train.pairs import ValueState, step_value_pair, value_sides, value_states
from eto_train.rollouts.loop import WorkItem
from eto_train.stages.eto.pairs import build_pairs
from fixture_settings import react_prompt, rollout_config

EXPERT = ep(["a", "b", "c"], 1.0)  # task g/train/1; its last action ends the episode at 1.0
AGENT = ep(["a", "x", "y"], 0.0, policy="pi@1", eid="agent-1")  # diverges at t = 1


def value_ep(t, branch, action, rollout, score, status=None, prefix=("a",)):
    """A value continuation: the expert's first t actions, ``action`` replayed, then the policy."""
    e = ep([*prefix[:t], action, "z"], score, policy="pi@1", status=status, eid=f"v-{t}-{branch}-{rollout}")
    e.env_params = {"max_steps": 6, "expert_prefix": t + 1, "parent": {
        "contrast": "step_value", "step": t, "branch": branch, "action": action, "rollout": rollout}}
    return e


# -- the pair rule --------------------------------------------------------------------------------------
def test_a_worse_agent_action_is_rejected_against_the_experts_with_their_values():
    p = step_value_pair(EXPERT, AGENT, 1, agent_values=[0.0, 0.5], expert_values=[1.0, 1.0], margin=0.1)
    assert (p.kind, p.step, p.task_id) == ("step_value", 1, "g/train/1")
    assert (p.chosen_score, p.rejected_score) == (1.0, 0.25)
    assert (p.chosen_policy, p.rejected_policy) == ("expert", "pi@1")
    # the context is the instruction and the expert's step 0, ending on the observation of step 1's state
    assert p.prompt == [{"role": "system", "content": "SYS"}, {"role": "user", "content": "TASK+OBS0"},
                        {"role": "assistant", "content": "Action: a"}, {"role": "user", "content": "obs1"}]
    assert p.chosen == [{"role": "assistant", "content": "Action: b"}]
    assert p.rejected == [{"role": "assistant", "content": "Action: x"}]


def test_no_pair_within_the_margin_when_the_agent_is_better_or_acts_as_the_expert():
    # V(expert's) = 0.375, V(agent's) = 0.25: a difference of 0.125 (exact in binary)
    assert step_value_pair(EXPERT, AGENT, 1, [0.25], [0.25, 0.5], margin=0.125) is None  # not above the margin
    assert step_value_pair(EXPERT, AGENT, 1, [0.25], [0.25, 0.5], margin=0.1) is not None
    assert step_value_pair(EXPERT, AGENT, 1, [1.0, 1.0], [0.5, 1.0], margin=0.0) is None  # the agent's is worth more
    assert step_value_pair(EXPERT, AGENT, 1, [0.5], [0.5], margin=0.0) is None  # a tie
    same = ep(["a", "b", "y"], 0.0, policy="pi@1")
    assert step_value_pair(EXPERT, same, 1, [0.0], [1.0], margin=0.1) is None  # the expert's own action
    assert step_value_pair(EXPERT, AGENT, 1, [], [1.0], margin=0.1) is None  # a side without a value


def test_build_pairs_values_each_side_by_its_continuations_and_leaves_environment_failures_out():
    pc = cpu_pairs(contrast="step_value", value_rollouts=2, value_margin=0.1)
    conts = [value_ep(1, "agent", "x", 0, 0.0), value_ep(1, "agent", "x", 1, 0.5),
             value_ep(1, "expert", "b", 0, 1.0), value_ep(1, "expert", "b", 1, 0.0, status="environment_failure")]
    pairs, stats = build_pairs(pc, {"g/train/1": EXPERT}, [AGENT], conts, seed=0)
    (p,) = pairs
    assert (p.kind, p.step, p.chosen_score, p.rejected_score) == ("step_value", 1, 1.0, 0.25)
    assert stats["by_kind"]["step_value"] == 1 and stats["value_states"] == 1 and stats["value_rollouts"] == 4
    assert stats["values"] == [{"task_id": "g/train/1", "step": 1, "agent": 0.25, "expert": 1.0}]
    assert stats["episodes"] == 1 + 4 and stats["environment_failures"] == 1
    # every continuation of the expert's side an environment failure: no value, no pair
    failed = conts[:2] + [value_ep(1, "expert", "b", i, 1.0, status="environment_failure") for i in range(2)]
    pairs, stats = build_pairs(pc, {"g/train/1": EXPERT}, [AGENT], failed, seed=0)
    assert pairs == [] and stats["value_states"] == 1 and stats["values"] == []


def test_states_and_which_side_needs_continuations():
    experts = {"g/train/1": EXPERT}
    last = ep(["a", "b", "q"], 0.0, policy="pi@1", eid="agent-2")  # diverges at the expert's last step
    same = ep(["a", "b", "c"], 1.0, policy="pi@1", eid="agent-3")  # never diverges
    again = ep(["a", "x", "w"], 0.0, policy="pi@1", eid="agent-4")  # the state and action of AGENT again
    for e in (AGENT, last, same, again):
        e.env_params = {"max_steps": 6, "expert_prefix": 0}
    states = value_states(experts, [AGENT, last, same, again], [], "first_divergence")
    assert [(s.t, s.agent.episode_id) for s in states] == [(1, "agent-1"), (2, "agent-2")]
    # t = 1: both actions leave the episode running, both sampled; t = 2: both end it, their scores are known
    assert value_sides(EXPERT, states[0]) == [("agent", "x", ("a", "x"), None, None),
                                              ("expert", "b", ("a", "b"), None, None)]
    assert value_sides(EXPERT, states[1]) == [("agent", "q", ("a", "b", "q"), None, 0.0),
                                              ("expert", "c", ("a", "b", "c"), None, 1.0)]
    # an output that did not parse is an action too: replayed after the prefix as the format checker answers it
    garbled = ep(["a", "x"], 0.0, policy="pi@1", eid="agent-5")
    garbled.steps[1].action, garbled.steps[1].raw_output, garbled.steps[1].done = None, "blah", False
    garbled.env_params = {"max_steps": 6}
    (st,) = value_states(experts, [garbled], [], "first_divergence")
    assert value_sides(EXPERT, st)[0] == ("agent", "blah", ("a",), "blah", None)
    # a step limit of 2: the action at t = 1 is the last one allowed, valued by the score it got
    capped = ValueState("g/train/1", 1, ep(["a", "x"], 0.0, policy="pi@1"))
    capped.agent.env_params = {"max_steps": 2}
    assert [known for *_, known in value_sides(EXPERT, capped)] == [0.0, 0.0]  # ep(): reward 0 before the last step
    # all | sample: the App. B continuations (value continuations are not states themselves)
    app_b = ep(["a", "x", "y"], 0.0, policy="pi@1", eid="cont-1")
    app_b.env_params = {"max_steps": 6, "expert_prefix": 1}
    states = value_states(experts, [], [app_b, value_ep(1, "agent", "x", 0, 0.0)], "all")
    assert [(s.t, s.agent.episode_id) for s in states] == [(1, "cont-1")]


def test_build_pairs_values_an_action_that_ends_the_episode_without_continuations():
    pc = cpu_pairs(contrast="step_value", value_rollouts=2, value_margin=0.1)
    last = ep(["a", "b", "q"], 0.0, policy="pi@1", eid="agent-2")
    last.env_params = {"max_steps": 6}
    pairs, stats = build_pairs(pc, {"g/train/1": EXPERT}, [last], [], seed=0)
    assert [(p.step, p.chosen_score, p.rejected_score) for p in pairs] == [(2, 1.0, 0.0)]
    assert stats["value_rollouts"] == 0 and stats["value_states"] == 1


# -- episode keys -------------------------------------------------------------------------------------
TASK = Task(env="t", game="g", fold="train", seed=1, split="train")


def test_value_continuations_of_equal_length_prefixes_get_different_ids_and_app_b_keys_stay():
    parent = {"contrast": "step_value", "step": 1, "rollout": 0}
    agent = WorkItem(TASK, 0, ("a", "x"), parent={**parent, "branch": "agent", "action": "x"})
    expert = WorkItem(TASK, 0, ("a", "b"), parent={**parent, "branch": "expert", "action": "b"})
    assert agent.key("bc@abc", 0) != expert.key("bc@abc", 0)
    assert WorkItem(TASK, 1, ("a", "x"), parent=agent.parent).key("bc@abc", 0) != agent.key("bc@abc", 0)
    # the App. B continuation from an expert prefix of 2 steps keeps the key it always had:
    # sha256("bc@abc|g/train/1|0+p2|0")[:16] (records.episode_key on the tag "<sample>+p<prefix length>")
    assert WorkItem(TASK, 0, ("a", "b")).key("bc@abc", 0) == "e6711a3c2cb7eb2b"


# -- the continuations in the rollout loop -------------------------------------------------------------
class Go:
    """A policy that always answers ``go`` (tests/goal_env.py: three in a row win)."""

    def generate(self, convs):
        return [("Action: go", 10, 3, 0) for _ in convs]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_value_continuation_replays_its_prefix_and_an_unparsed_output_and_records_its_parent(workers):
    from goal_env import GoalEnv

    from eto_train.envs.workers import WorkerPool
    from eto_train.records import PolicyRef
    from eto_train.rollouts.loop import run_rollouts

    task = GoalEnv().tasks("train")[0]
    parent = {"contrast": "step_value", "step": 1, "branch": "agent", "action": "blah", "rollout": 0}
    work = [WorkItem(task, 0, ("go",), parent=parent, unparsed="blah"),
            WorkItem(task, 0, (), parent={**parent, "step": 0}, unparsed="blah"),  # reset sent, not in line
            WorkItem(task, 0, ("go",))]  # an App. B continuation beside them
    eps = []

    def play(make):
        run_rollouts(work, make, Go(), PolicyRef(id="go@0"), react_prompt(), rollout_config(batch_size=3), eps.append)
    if workers:
        with WorkerPool(GoalEnv, workers) as pool:
            play(pool.env)
    else:
        play(GoalEnv)
    by_key = {e.episode_id: e for e in eps}
    a, b, c = (by_key[w.key("go@0", 0)] for w in work)
    invalid = react_prompt().invalid_format
    assert [(s.raw_output, s.action, s.completion_tokens) for s in a.steps] == [
        ("Action: go", "go", 0), ("blah", None, 0), ("Action: go", "go", 3), ("Action: go", "go", 3)]
    assert a.steps[1].observation == invalid and a.steps[1].reward == a.steps[0].reward == 1 / 3
    assert (a.status, a.final_score) == ("success", 1.0)
    assert [s.action for s in b.steps] == [None, "go", "go", "go"] and b.steps[0].observation == invalid
    assert a.env_params == {"max_steps": 5, "expert_prefix": 1, "parent": parent}
    assert b.env_params["parent"]["step"] == 0 and c.env_params == {"max_steps": 5, "expert_prefix": 1}


# -- end to end through the CLI --------------------------------------------------------------------------
# step_positions=all values every expert step; the expert's last action ends its episode (known
# value 1.0, the gold path wins), so wherever the policy's action at the last step differs and its
# continuations score below 1 there is a pair. value_margin=0: any value difference counts.
VALUE = ["eto.pairs.contrast=step_value", "eto.pairs.value_rollouts=2", "eto.pairs.value_margin=0",
         "eto.pairs.step_positions=all", "eto.explore.tasks_per_game=1", "eto.dev_split=null",
         "eto.early_stopping=false"]


def cli(stage: str, runs: Path, *extra: str, env=None, timeout=300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "eto_train.cli", stage, f"paths.runs={runs}", "run_name=toy", *TOY, *VALUE, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def act(step: dict) -> str:
    """A recorded step's action, or its raw output when it did not parse (what states are told apart by)."""
    return step["action"] if step["action"] is not None else step["raw_output"]


def check_value_iteration(it: Path) -> None:
    """The iteration's value continuations, pairs and stats agree with a count made here from the
    recorded episodes (the rule re-applied by hand)."""
    experts = {e["task_id"]: e for e in read(it.parents[1] / "experts" / "train.jsonl")}
    steps = read(it / "explore_step" / "episodes.jsonl")
    values = read(it / "explore_value" / "episodes.jsonl")
    assert values and all(v["env_params"]["parent"]["contrast"] == "step_value" for v in values)
    assert len({v["episode_id"] for v in values}) == len(values)  # none twice
    scores = defaultdict(list)
    for v in values:
        p = v["env_params"]["parent"]
        t = p["step"]
        assert act(v["steps"][t]) == p["action"] and v["steps"][t]["completion_tokens"] == 0  # replayed, not generated
        assert [s["action"] for s in v["steps"][:t]] == [s["action"] for s in experts[v["task_id"]]["steps"][:t]]
        if p["branch"] == "expert":
            assert p["action"] == experts[v["task_id"]]["steps"][t]["action"]
        if v["status"] not in ("environment_failure", "orchestrator_failure", "evaluator_failure"):
            scores[v["task_id"], t, p["branch"], p["action"]].append(v["final_score"])
    per_action = Counter((v["task_id"], v["env_params"]["parent"]["step"], v["env_params"]["parent"]["branch"],
                          v["env_params"]["parent"]["action"]) for v in values)
    assert set(per_action.values()) == {2}  # value_rollouts=2 continuations per valued action
    want, sampled = [], set()
    for c in steps:
        e, t = experts[c["task_id"]], c["env_params"]["expert_prefix"]
        if len(c["steps"]) <= t or act(c["steps"][t]) == e["steps"][t]["action"]:
            continue
        limit = c["env_params"]["max_steps"]

        def value(branch, step):
            if step["done"] or t + 1 >= limit:
                return step["reward"]
            sampled.add((c["task_id"], t, branch, act(step)))
            s = scores[c["task_id"], t, branch, act(step)]
            return sum(s) / len(s)
        va, ve = value("agent", c["steps"][t]), value("expert", e["steps"][t])
        if ve - va > 0:
            want.append((c["task_id"], t, ve, va))
    assert set(per_action) == sampled  # exactly the actions that need continuations were valued
    pairs = read(it / "pairs" / "pairs.jsonl")
    assert sorted((p["task_id"], p["step"], p["chosen_score"], p["rejected_score"]) for p in pairs) == sorted(want)
    assert len(pairs) > 0 and {p["kind"] for p in pairs} == {"step_value"}
    stats = json.loads((it / "pairs" / "stats.json").read_text())
    assert stats["value_rollouts"] == len(values) and stats["pairs"] == len(pairs)
    assert stats["episodes"] == len(read(it / "explore" / "episodes.jsonl")) + len(steps) + len(values)


def test_eto_iteration_with_step_values_killed_resumed_trained_evaluated_and_rerun(tmp_path):
    runs = tmp_path / "runs"
    for stage in ("experts", "model", "bc"):
        _ok(cli(stage, runs))
    it = runs / "toy" / "eto" / "iter1"
    # SIGKILL after the 3rd value continuation is recorded, then the same command resumes
    killed = cli("eto-iter", runs, env={"ETO_TRAIN_KILL_AT": "explore-value/iter1:3"})
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    part = read(it / "explore_value" / "episodes.jsonl")
    assert len(part) == 3 and not (it / "pairs").exists()
    resumed = _ok(cli("eto-iter", runs))
    values = read(it / "explore_value" / "episodes.jsonl")
    assert f"resuming: 3 episodes already recorded, {len(values) - 3} to go" in resumed.stdout
    assert "[explore/iter1] up to date" in resumed.stdout and "[explore-step/iter1] up to date" in resumed.stdout
    assert {e["episode_id"] for e in part} <= {e["episode_id"] for e in values}
    check_value_iteration(it)  # every continuation once (none doubled, none missing), the pairs as counted here
    manifest = json.loads((it / "explore_value" / "manifest.json").read_text())
    assert manifest["status"] == "done" and manifest["config"]["sampling"]["do_sample"] is True
    dpo = json.loads((it / "dpo" / "manifest.json").read_text())
    assert dpo["status"] == "done" and dpo["metrics"]["optimizer_steps"] == 2
    policy = json.loads((it / "summary.json").read_text())["policy"]
    _ok(cli("eval", runs, f"eval.policy={policy}", "eval.tag=iter1"))
    m = json.loads((runs / "toy" / "eval" / "iter1" / "seen" / "metrics.json").read_text())
    assert m["overall"]["episodes"] == 2 * 2 and m["policy"].startswith("iter1@")
    # the same iteration again (its summary removed, so that eto-iter plays iteration 1 once more): nothing is replayed
    before = (it / "explore_value" / "episodes.jsonl").read_bytes()
    (it / "summary.json").unlink()
    again = _ok(cli("eto-iter", runs))
    assert "[explore-value/iter1] up to date" in again.stdout and "[explore/iter1] up to date" in again.stdout
    assert (it / "explore_value" / "episodes.jsonl").read_bytes() == before


# -- the same on a real family's tokenizer and chat template (the Llama-2 fixture, tests/fixture_models.py) --
@pytest.mark.rehearse  # about a minute on the CPU: make rehearse runs it (make test deselects it)
def test_step_values_on_the_llama2_fixture_bc_eto_iter_eval(tmp_path):
    from fixture_models import build_fixture_model
    from test_rehearsal import CPU, SIZE, TWX, check_run, rehearse

    model = build_fixture_model("llama2", tmp_path / "llama2")
    # the paper's profiles on twx (as test_rehearsal_families.py); a step limit of 6 lets twc's
    # 4-step gold path end within it, so its last action is valued at the gold score (1.0)
    base = ["env=twx", "bc=paper", "eto=paper", "rollout=gpu", "model=llama2_7b_chat"]
    out = rehearse(base + SIZE + CPU + TWX + VALUE + ["env.step_limit=6", f"model.path={model}",
                                                      f"paths.runs={tmp_path / 'runs'}"])
    check_run(out)
    it = Path(out["cfg"].paths.eto) / "iter1"
    check_value_iteration(it)
