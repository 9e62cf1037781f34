"""Anchor-state pairs (``eto.pairs.contrast=anchor``): hand-built cases of the rule, the schema's
rule, and end to end through the CLI on the tiny model and on a Llama-2-family fixture.

The rule (src/eto_train/pairs.py ``anchor_pairs``): the states several samples of a task share
(the whole history from the first observation) group their episodes; an action's value there is
the mean final score of the episodes that took it; the best is chosen against the worst when
they differ, one action in its context.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from eto_train.pairs import action_key, anchor_pairs, pair_from_dict
from eto_train.records import Episode, PolicyRef, Step

ROOT = Path(__file__).resolve().parents[1]
POLICY = "bc@123456789abc"


def ep(eid: str, steps: list[tuple], score: float, status: str | None = None, task: str = "g/train/1") -> Episode:
    """An episode from (action, observation) or (action, observation, raw_output) steps."""
    e = Episode(episode_id=eid, task_id=task, env="t", game="g", fold="train", seed=1, split="train",
                env_version="v", policy=PolicyRef(id=POLICY), prompt_version="react-v1", system="SYS",
                first_user="TASK+OBS0", instruction="TASK", first_observation="OBS0")
    for i, (a, o, *raw) in enumerate(steps):
        e.steps.append(Step(index=i, raw_output=raw[0] if raw else f"Action: {a}", action=a, valid=a is not None,
                            observation=o, reward=score if i == len(steps) - 1 else 0.0, done=i == len(steps) - 1))
    e.finish(status or ("success" if score == 1.0 else "failure"))
    return e


def opening(*turns: str) -> list[dict]:
    msgs = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "TASK+OBS0"}]
    for i, t in enumerate(turns):
        msgs.append({"role": "assistant" if i % 2 == 0 else "user", "content": t})
    return msgs


# -- the rule on hand-built episodes ---------------------------------------------------------------
def test_three_samples_share_a_history_then_diverge_best_against_worst():
    a = ep("e1", [("look", "room"), ("go north", "hall"), ("take key", "got it")], 1.0)
    b = ep("e2", [("look", "room"), ("go south", "yard")], 0.0, status="max_steps")
    c = ep("e3", [("look", "room"), ("take key", "no key here", "Thought: try.\nAction: take key")], 0.5)
    (p,) = anchor_pairs([b, c, a])  # input order does not matter
    # depth 0: all took "look" (one action: nothing); depth 1: after look -> room, three actions
    assert (p.kind, p.step, p.task_id) == ("anchor", 1, "g/train/1")
    assert p.prompt == opening("Action: look", "room")  # ends on the user turn that shows the state
    assert p.chosen == [{"role": "assistant", "content": "Action: go north"}]
    assert p.rejected == [{"role": "assistant", "content": "Action: go south"}]
    assert (p.chosen_score, p.rejected_score) == (1.0, 0.0)  # the middle action (0.5) is in neither side
    assert p.chosen_policy == p.rejected_policy == POLICY
    assert pair_from_dict(p.to_dict()) == p  # what pairs.jsonl stores reads back
    # depth 2 is reached by e1 alone: one action, nothing
    assert anchor_pairs([a, b, c])[0].pair_id == p.pair_id  # deterministic


def test_an_actions_value_is_the_mean_of_its_episodes_and_representatives_are_the_extremes():
    # "go north" taken by three episodes: 1.0, 0.0, 1.0 -> 2/3; "go south" by two: 0.5, 0.25 -> 0.375
    eps = [ep("n1", [("go north", "hall", "raw n1")], 1.0), ep("n2", [("go north", "hall", "raw n2")], 0.0),
           ep("n0", [("go north", "hall", "raw n0")], 1.0), ep("s1", [("go south", "yard", "raw s1")], 0.5),
           ep("s2", [("go south", "yard", "raw s2")], 0.25)]
    (p,) = anchor_pairs(eps)
    assert p.step == 0 and p.prompt == opening()
    assert p.chosen_score == pytest.approx(2 / 3) and p.rejected_score == pytest.approx(0.375)
    # chosen: the best-scoring episode of the best action, then the lowest episode id (n0 before n1)
    # rejected: the worst-scoring episode of the worst action (s2)
    assert (p.chosen[0]["content"], p.rejected[0]["content"]) == ("raw n0", "raw s2")


def test_equal_values_give_no_pair():
    eps = [ep("e1", [("go north", "hall")], 0.5), ep("e2", [("go south", "yard")], 0.5),
           ep("e3", [("go north", "hall"), ("x", "y")], 0.0), ep("e4", [("go south", "yard")], 0.0)]
    assert anchor_pairs(eps) == []  # north 0.25 vs south 0.25 at depth 0; depth 1: e3 alone


def test_one_distinct_action_gives_nothing_whatever_the_scores():
    eps = [ep("e1", [("look", "room", "Action: look")], 1.0), ep("e2", [("look", "room", "I will look.\nAction: look")], 0.0)]
    assert anchor_pairs(eps) == []  # the raw outputs differ, the action does not


def test_the_same_observation_after_different_histories_is_not_one_state():
    # e1 and e2 both see "hall" after their second action, but got there differently
    e1 = ep("e1", [("go north", "hall"), ("take key", "got it")], 1.0)
    e2 = ep("e2", [("go east", "hall"), ("open door", "locked")], 0.0)
    e3 = ep("e3", [("go north", "hall"), ("take key", "got it")], 1.0)
    (p,) = anchor_pairs([e1, e2, e3])
    assert p.step == 0  # only the first state is shared: north (1.0) against east (0.0)
    assert (p.chosen[0]["content"], p.rejected[0]["content"]) == ("Action: go north", "Action: go east")
    # depth 1: e1/e3 share a history and took one action; e2's history differs: no pair there
    e4 = ep("e4", [("go east", "hall"), ("take key", "got it")], 1.0)  # e2 and e4 share theirs: now a pair
    pairs = anchor_pairs([e1, e2, e3, e4])
    assert [(q.step, q.chosen[0]["content"], q.rejected[0]["content"]) for q in pairs] == [
        (0, "Action: go north", "Action: go east"), (1, "Action: take key", "Action: open door")]
    assert pairs[1].prompt == opening("Action: go east", "hall")


def test_nested_anchor_states_at_depths_0_and_2_each_give_one_pair():
    e1 = ep("e1", [("a", "o1"), ("b", "o2"), ("c", "win")], 1.0)
    e2 = ep("e2", [("a", "o1"), ("b", "o2"), ("d", "lose")], 0.0)
    e3 = ep("e3", [("z", "oz")], 0.25)
    pairs = anchor_pairs([e1, e2, e3])
    assert [p.step for p in pairs] == [0, 2]
    top, deep = pairs
    # depth 0: a (mean of 1.0 and 0.0 = 0.5) against z (0.25)
    assert (top.chosen_score, top.rejected_score) == (0.5, 0.25)
    assert (top.chosen[0]["content"], top.rejected[0]["content"]) == ("Action: a", "Action: z")
    assert deep.prompt == opening("Action: a", "o1", "Action: b", "o2")
    assert (deep.chosen[0]["content"], deep.rejected[0]["content"], deep.chosen_score, deep.rejected_score) == \
        ("Action: c", "Action: d", 1.0, 0.0)
    assert top.pair_id != deep.pair_id


def test_an_environment_failure_never_counts_and_unparsed_outputs_are_their_raw_text():
    good = ep("e1", [("go north", "hall")], 1.0)
    broken = ep("e2", [("go south", "yard")], 0.0, status="environment_failure")
    assert anchor_pairs([good, broken]) == []  # without it, one action: nothing
    garbled = ep("e3", [(None, "Invalid action format", "gibberish")], 0.0, status="model_failure")
    (p,) = anchor_pairs([good, broken, garbled])  # the policy's own failure does count
    assert action_key(garbled.steps[0]) == "gibberish"
    assert (p.chosen[0]["content"], p.rejected[0]["content"]) == ("Action: go north", "gibberish")
    assert p.rejected_score == 0.0


def test_episodes_of_two_tasks_are_refused():
    with pytest.raises(ValueError, match="different tasks"):
        anchor_pairs([ep("e1", [("a", "o")], 1.0), ep("e2", [("a", "o")], 0.0, task="g/train/2")])


def test_build_pairs_keeps_anchor_pairs_per_task_and_no_expert_side():
    from test_pairs import cpu_pairs
    from eto_train.stages.eto.pairs import build_pairs

    t1 = [ep("a1", [("n", "h")], 1.0), ep("a2", [("s", "y")], 0.0)]
    t2 = [ep("b1", [("n", "h")], 1.0, task="g/train/2"), ep("b2", [("n", "h")], 0.0, task="g/train/2")]
    expert = ep("x", [("n", "h")], 1.0)
    expert.policy = PolicyRef(id="expert")
    pairs, stats = build_pairs(cpu_pairs(contrast="anchor"), {"g/train/1": expert}, t1 + t2, [], seed=0)
    assert [(p.kind, p.task_id) for p in pairs] == [("anchor", "g/train/1")]
    assert stats["by_kind"]["anchor"] == 1 and stats["no_pair"] == 1 and stats["agent_lost"] == stats["agent_won"] == 0
    # chosen reads as for every contrast: self -> the whole-episode self pairs only, both -> the union
    own, _ = build_pairs(cpu_pairs(contrast="anchor", chosen="self"), {}, t1 + t2, [], seed=0)
    assert sorted(p.kind for p in own) == ["self", "self"]
    both, _ = build_pairs(cpu_pairs(contrast="anchor", chosen="both"), {}, t1 + t2, [], seed=0)
    assert sorted(p.kind for p in both) == ["anchor", "self", "self"]


# -- the schema's rule ------------------------------------------------------------------------------
def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="anchor"):
        return compose("config", overrides=overrides)


def test_anchor_needs_several_sampled_episodes_per_task_every_bad_key_named_at_once():
    from eto_train.config import ConfigError, load

    with pytest.raises(ConfigError) as err:
        load(_compose(["eto.pairs.contrast=anchor"]))
    text = str(err.value)
    assert text.startswith("2 bad config values (nothing was run or written):"), text
    assert "eto.explore.samples=1: an integer >= 2 with eto.pairs.contrast=anchor" in text
    assert "eto.explore.rollout.generation.do_sample=false: true with eto.pairs.contrast=anchor" in text
    # do_sample left to rollout.generation: that key is named
    with pytest.raises(ConfigError, match=r"rollout.generation.do_sample=false \(eto.explore.rollout.generation"
                                          r".do_sample unset\): true in either with eto.pairs.contrast=anchor"):
        load(_compose(["eto.pairs.contrast=anchor", "eto.explore.samples=2",
                       "~eto.explore.rollout.generation.do_sample"]))
    ok = ["eto.pairs.contrast=anchor", "eto.explore.samples=2"]
    assert load(_compose(ok + ["eto.explore.rollout.generation.do_sample=true"])).eto.pairs.contrast == "anchor"
    assert load(_compose(ok + ["~eto.explore.rollout.generation.do_sample", "rollout.generation.do_sample=true"]))


# -- end to end through the CLI -----------------------------------------------------------------------
# The game is tests/plugin_env's Lamps (look, then turn on the lamp the task names; a wrong lamp loses),
# named by import path (env.adapter): a BC policy of a few dozen steps writes "Action: ..." lines, and
# its samples of one task share the first state and win or lose there, which TextWorldExpress's longer
# games do not give at this size (every sample scores 0: no anchor pair anywhere).
LAMPS = """name: lamps
adapter: eto_lamps:LampsEnv
step_limit: 4
lamps: 3
splits:
  train: {start: 0, count: 12}
  dev: {start: 100, count: 2}
  seen: {start: 200, count: 3}
  unseen: {start: 300, count: 2}
"""
SIZES = [
    "bc.max_steps=100", "bc.learning_rate=1e-2", "bc.per_device_train_batch_size=4", "bc.save_steps=100",
    "wandb.enabled=false", "rollout.batch_size=4", "rollout.generation.max_new_tokens=12",
    "eto.iterations=1", "eto.explore.tasks_per_game=12", "eto.explore.rollout.batch_size=6",
    "eto.dpo.max_steps=2", "eto.dpo.per_device_train_batch_size=2", "eto.dpo.logging_steps=1",
    "eto.dpo.loss_type=[sigmoid]", "eto.dpo.loss_weights=null",  # the paper's loss: log 2 at step 0
    "runtime.train_threads=1", "runtime.rollout_threads=1",
]
TINY = ["model.tokenizer.vocab_size=300", "model.arch.hidden_size=32", "model.arch.num_layers=1",
        "model.arch.num_heads=2", "model.arch.intermediate_size=64"]
ANCHOR = ["eto.pairs.contrast=anchor", "eto.explore.samples=4", "eto.explore.rollout.generation.do_sample=true"]


def eto_cli(stage: str, runs: Path, configs: Path, extra: list[str], kill_at: str | None = None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests" / "plugin_env")}
    env.pop("ETO_TRAIN_KILL_AT", None)
    if kill_at:
        env["ETO_TRAIN_KILL_AT"] = kill_at  # eto_train.killpoints: SIGKILL at that point, as an OOM kill
    cmd = [sys.executable, "-m", "eto_train.cli", stage, "--config-dir", str(configs), "env=lamps",
           f"paths.runs={runs}", "run_name=lamps", *SIZES, *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def check_anchor_run(run: Path, samples: int = 4) -> list[dict]:
    """explore -> pairs -> dpo -> eval of a finished `eto` run with contrast=anchor; its pairs."""
    it = run / "eto" / "iter1"
    explored = _lines(it / "explore" / "episodes.jsonl")
    by_task: dict[str, list[dict]] = {}
    for e in explored:
        by_task.setdefault(e["task_id"], []).append(e)
    assert len(by_task) == 12 and all(sorted(e["sample_index"] for e in eps) == list(range(samples))
                                     for eps in by_task.values())
    assert len({e["episode_id"] for e in explored}) == len(explored) == 12 * samples  # samples are distinct records
    pairs = _lines(it / "pairs" / "pairs.jsonl")
    stats = json.loads((it / "pairs" / "stats.json").read_text())
    assert stats["pairs"] == stats["by_kind"]["anchor"] == len(pairs) >= 1 and stats["config"]["contrast"] == "anchor"
    assert all(p["kind"] == "anchor" and p["chosen_score"] > p["rejected_score"] and len(p["chosen"]) == 1
               and len(p["rejected"]) == 1 and p["chosen_policy"] == p["rejected_policy"] != "expert" for p in pairs)
    # the stage's pairs are the rule's on the recorded episodes, task by task
    want = [q.to_dict() for tid in sorted(by_task) for q in anchor_pairs([Episode.from_dict(e) for e in by_task[tid]])]
    assert pairs == want
    # a pair exists where one task's samples won and lost (lamps scores 0 or 1)
    assert any({e["final_score"] for e in eps} == {0.0, 1.0} for eps in by_task.values())
    dpo = json.loads((it / "dpo" / "manifest.json").read_text())
    assert dpo["status"] == "done" and dpo["metrics"]["optimizer_steps"] == 2 and dpo["metrics"]["pairs"] == len(pairs)
    assert abs(dpo["metrics"]["first_log"]["loss"] - 0.6931) < 1e-3  # policy == reference at step 0: log 2
    assert json.loads((it / "summary.json").read_text())["dev"]["episodes"] == 2
    result = json.loads((run / "eto" / "result.json").read_text())
    for split, n in (("seen", 3), ("unseen", 2)):
        assert result["test"][split]["episodes"] == n
    return pairs


@pytest.fixture(scope="module")
def lamps_configs(tmp_path_factory) -> Path:
    configs = tmp_path_factory.mktemp("configs")
    (configs / "env").mkdir()
    (configs / "env" / "lamps.yaml").write_text(LAMPS)
    return configs


def test_anchor_end_to_end_on_the_tiny_model_killed_in_explore_resumed_then_up_to_date(lamps_configs, tmp_path):
    runs = tmp_path / "runs"
    # killed inside exploration after 4 of its 48 sampled episodes
    proc = eto_cli("eto", runs, lamps_configs, TINY + ANCHOR, kill_at="explore/iter1:4")
    assert proc.returncode == -signal.SIGKILL, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(_lines(runs / "lamps" / "eto" / "iter1" / "explore" / "episodes.jsonl")) == 4
    proc = eto_cli("eto", runs, lamps_configs, TINY + ANCHOR)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[explore/iter1] resuming: 4 episodes already recorded, 44 to go" in " ".join(proc.stdout.split())
    run = runs / "lamps"
    check_anchor_run(run)
    # the same command again: every stage is finished, nothing is played or trained again
    manifests = {p: p.read_text() for p in run.rglob("manifest.json")}
    proc = eto_cli("eto", runs, lamps_configs, TINY + ANCHOR)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for stage in ("bc", "explore/iter1", "dpo/iter1", "eval/iter1/dev"):
        assert f"[{stage}] up to date" in proc.stdout, stage
    assert {p: p.read_text() for p in run.rglob("manifest.json")} == manifests


@pytest.mark.rehearse  # ~2-3 minutes on a CPU: BC of a 32k-vocabulary model to "Action: ..." lines (make rehearse)
def test_anchor_end_to_end_on_a_llama2_family_fixture(lamps_configs, tmp_path):
    """The same on the Llama-2 family (its real tokenizer and chat template, random weights)."""
    from fixture_models import build_fixture_model  # tests/fixture_models.py

    model = build_fixture_model("llama2", tmp_path / "llama2")
    real = ["model=llama2_7b_chat", f"model.path={model}", "model.dtype=float32", "model.max_context=1024"]
    proc = eto_cli("eto", tmp_path / "runs", lamps_configs, real + ANCHOR)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    pairs = check_anchor_run(tmp_path / "runs" / "lamps")
    assert pairs[0]["prompt"][0]["role"] == "system" and pairs[0]["prompt"][1]["content"].startswith("Task: Turn on lamp")


def test_anchor_with_one_sample_is_refused_before_any_work(lamps_configs, tmp_path):
    proc = eto_cli("eto", tmp_path / "runs", lamps_configs, TINY + ["eto.pairs.contrast=anchor"])
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "eto.explore.samples=1: an integer >= 2 with eto.pairs.contrast=anchor" in proc.stderr
    assert "eto.explore.rollout.generation.do_sample=false: true with eto.pairs.contrast=anchor" in proc.stderr
    # no stage began: the run folder holds the command's log folder only
    assert [q.name for q in (tmp_path / "runs" / "lamps").iterdir()] == ["logs"]
