"""Pair rules on constructed episodes (the paper's trajectory rule and App. B's step rule)."""

from __future__ import annotations

import pytest

from eto_train.pairs import first_divergence, pair_stats, self_pair, step_pair, trajectory_pair
from eto_train.records import Episode, PolicyRef, Step


def ep(actions, score, policy="expert", status=None, task="g/train/1", eid=None):
    e = Episode(episode_id=eid or f"{policy}-{task}-{len(actions)}-{score}", task_id=task, env="t", game="g",
                fold="train", seed=1, split="train", env_version="v", policy=PolicyRef(id=policy),
                prompt_version="react-v1", system="SYS", first_user="TASK+OBS0", instruction="TASK",
                first_observation="OBS0")
    for i, a in enumerate(actions):
        e.steps.append(Step(index=i, raw_output=f"Action: {a}", action=a, valid=True, observation=f"obs{i + 1}",
                            reward=score if i == len(actions) - 1 else 0.0, done=i == len(actions) - 1))
    e.finish(status or ("success" if score == 1.0 else "failure"))
    return e


def actions_of(msgs):
    return [m["content"].removeprefix("Action: ") for m in msgs if m["role"] == "assistant"]


EXPERT = ep(["a", "b", "c"], 1.0)


def cpu_pairs(**keys):
    """The ``eto.pairs`` section of the CPU profile (configs/eto/cpu.yaml: the home of its values) with ``keys``
    over it."""
    from omegaconf import OmegaConf

    from eto_train import layout
    from eto_train.config import Pairs

    return Pairs.model_validate({**OmegaConf.to_container(OmegaConf.load(layout.CONFIGS / "eto" / "cpu.yaml").pairs),
                                 **keys})


def test_lower_agent_reward_is_rejected_and_expert_chosen():
    agent = ep(["a", "x", "y"], 0.5, policy="pi@1", status="max_steps")
    p = trajectory_pair(EXPERT, agent)
    assert (p.chosen_policy, p.rejected_policy) == ("expert", "pi@1")
    assert (p.chosen_score, p.rejected_score) == (1.0, 0.5)
    assert p.prompt == [{"role": "system", "content": "SYS"}, {"role": "user", "content": "TASK+OBS0"}]
    assert actions_of(p.chosen) == ["a", "b", "c"] and actions_of(p.rejected) == ["a", "x", "y"]
    # observations between actions are part of the completion, alternating, ending on an action
    assert [m["role"] for m in p.chosen] == ["assistant", "user", "assistant", "user", "assistant"]
    assert p.chosen[1] == {"role": "user", "content": "obs1"}


def test_an_agent_that_beats_the_expert_is_chosen():
    weak_expert = ep(["a", "b"], 0.5, status="failure")
    agent = ep(["a", "b", "c"], 1.0, policy="pi@1")
    p = trajectory_pair(weak_expert, agent)
    assert (p.chosen_policy, p.rejected_policy) == ("pi@1", "expert")


def test_ties_are_dropped():
    assert trajectory_pair(EXPERT, ep(["a", "b", "z", "c"], 1.0, policy="pi@1")) is None


def test_rejected_is_cut_to_expert_length_plus_five_turns_and_ends_on_an_action():
    loop = ep(["look"] * 15, 0.0, policy="pi@1", status="max_steps")
    p = trajectory_pair(EXPERT, loop)
    assert len(actions_of(p.rejected)) == 3 + 5
    assert p.rejected[-1]["role"] == "assistant" and p.chosen[-1]["role"] == "assistant"
    assert len(actions_of(trajectory_pair(EXPERT, loop, extra_turns=2).rejected)) == 5
    short = ep(["x"], 0.0, policy="pi@1")
    assert len(actions_of(trajectory_pair(EXPERT, short).rejected)) == 1


def test_alfworld_rule_keeps_the_rejected_whole_and_a_winning_agent_is_never_cut():
    loop = ep(["a"] + ["x"] * 19, 0.0, policy="pi@1", status="max_steps")
    assert len(actions_of(trajectory_pair(EXPERT, loop, extra_turns=None).rejected)) == 20
    # the authors' construct_preference.py: an agent that beats the expert is chosen whole
    long_win = ep(["a"] * 12, 1.0, policy="pi@1", status="success")
    weak_expert = ep(["a", "b"], 0.5, status="failure")
    p = trajectory_pair(weak_expert, long_win, extra_turns=5)
    assert p.chosen_policy == "pi@1" and len(actions_of(p.chosen)) == 12 and len(actions_of(p.rejected)) == 2


def test_paper_opening_is_prompt_not_completion():
    """With the paper's opening (instruction turn answered "OK"), the prompt is the instruction,
    "OK" and the task, as the authors' pairs; the completions start on the first action."""
    e, a = ep(["a", "b"], 1.0), ep(["a", "x"], 0.0, policy="pi@1")
    for x in (e, a):
        x.opening = "instruction_ok"
    p = trajectory_pair(e, a)
    assert p.prompt == [{"role": "user", "content": "SYS"}, {"role": "assistant", "content": "OK"},
                        {"role": "user", "content": "TASK+OBS0"}]
    assert p.chosen[0] == {"role": "assistant", "content": "Action: a"}
    s = step_pair(e, a, 1)
    assert s.prompt[:3] == p.prompt and s.prompt[-1] == {"role": "user", "content": "obs1"}
    assert step_pair(e, ep(["y", "x"], 0.0, policy="pi@1"), 0).prompt == p.prompt


def test_rejected_can_end_on_its_first_divergent_action():
    agent = ep(["a", "x", "y", "y", "y"], 0.0, policy="pi@1", status="max_steps")
    p = trajectory_pair(EXPERT, agent, rejected_cut="first_divergence")
    assert actions_of(p.rejected) == ["a", "x"] and actions_of(p.chosen) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="rejected_cut"):
        trajectory_pair(EXPERT, agent, rejected_cut="middle")


@pytest.mark.parametrize("status", ["environment_failure", "orchestrator_failure", "evaluator_failure"])
def test_episodes_the_policy_is_not_to_blame_for_are_never_negatives(status):
    crashed = ep(["a"], 0.0, policy="pi@1", status=status)
    assert trajectory_pair(EXPERT, crashed) is None
    assert step_pair(EXPERT, crashed, 0) is None


def test_pairs_of_different_tasks_are_refused():
    with pytest.raises(ValueError, match="different tasks"):
        trajectory_pair(EXPERT, ep(["a"], 0.0, policy="pi@1", task="g/train/2"))


def test_step_pair_conditions_on_the_expert_prefix_and_contrasts_one_action():
    cont = ep(["a", "b", "q", "r"], 0.0, policy="pi@1", status="max_steps")  # expert's a, b then the policy
    assert first_divergence(EXPERT, cont) == 2
    p = step_pair(EXPERT, cont, 2)
    assert p.kind == "step" and p.step == 2
    assert [m["role"] for m in p.prompt] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert actions_of(p.prompt) == ["a", "b"] and p.prompt[-1]["content"] == "obs2"
    assert p.chosen == [{"role": "assistant", "content": "Action: c"}]
    assert p.rejected == [{"role": "assistant", "content": "Action: q"}]


def test_step_pair_at_the_first_step_has_the_task_as_prompt():
    p = step_pair(EXPERT, ep(["z", "z"], 0.0, policy="pi@1"), 0)
    assert [m["role"] for m in p.prompt] == ["system", "user"]
    assert actions_of(p.chosen) == ["a"] and actions_of(p.rejected) == ["z"]


def test_no_step_pair_when_the_policy_does_as_well_or_takes_the_expert_action():
    assert step_pair(EXPERT, ep(["a", "b", "d", "c"], 1.0, policy="pi@1"), 2) is None  # same final reward
    assert step_pair(EXPERT, ep(["a", "b", "c", "x"], 0.0, policy="pi@1"), 2) is None  # same action at t
    with pytest.raises(ValueError, match="expert's first 2 actions"):
        step_pair(EXPERT, ep(["a", "x", "q"], 0.0, policy="pi@1"), 2)


def test_self_pair_and_stats():
    best = ep(["a", "b", "c"], 1.0, policy="pi@1", eid="best")
    worst = ep(["x"] * 12, 0.0, policy="pi@1", status="max_steps", eid="worst")
    p = self_pair(best, worst)
    assert p.kind == "self" and len(actions_of(p.rejected)) == 8
    assert self_pair(best, best) is None
    s = pair_stats([p, trajectory_pair(EXPERT, worst)], tasks=[p.task_id, "other/1", "other/2"])
    # two pairs from one task: the other two tasks gave none (never a negative count)
    assert s["pairs"] == 2 and s["agent_lost"] == 1 and s["tasks"] == 3 and s["no_pair"] == 2
    assert s["by_kind"] == {"trajectory": 1, "step": 0, "self": 1, "step_value": 0, "anchor": 0}


# -- the expert's reward in the pair rule (eto.pairs.expert_reward) --------------------------------
# The authors' construct_preference.py (Yifan-Song793/ETO): build_preference sets
# golden_rewards[idx] = 1.0 for sciworld and item['reward'] for webshop; build_preference_alfworld
# 1.0 for alfworld. Cases: a ScienceWorld expert whose file reward is 0.72.
def env_ep(env, actions, score, policy="expert"):
    e = ep(actions, score, policy=policy, task="10_262")  # a training task of the authors' train_indices.json
    e.env = env
    return e


def built(rule, expert, agent):
    """(pairs, stats) of the pairs stage for one expert and one explored episode."""
    from eto_train.stages.eto.pairs import build_pairs

    pc = cpu_pairs(contrast="trajectory", chosen="expert", extra_turns=5, rejected_cut="expert_length", expert_reward=rule)
    return build_pairs(pc, {expert.task_id: expert}, [agent], [], seed=0)


def pairs_of(rule, expert, agent):
    return built(rule, expert, agent)[0]


def test_authors_rule_scores_a_sciworld_expert_one_so_an_agent_at_0_8_is_rejected():
    expert, agent = env_ep("sciworld", ["a", "b"], 0.72), env_ep("sciworld", ["a", "x"], 0.8, "bc@w")
    (p,) = pairs_of("authors", expert, agent)
    assert (p.chosen_policy, p.rejected_policy, p.chosen_score, p.rejected_score) == ("expert", "bc@w", 1.0, 0.8)
    stats = built("authors", expert, agent)[1]["expert_reward"]
    assert stats == {"rule": "authors", "experts_read_as_1": 1, "examples": ["10_262"]}
    (q,) = pairs_of("file", expert, agent)  # the file's reward: the agent beats 0.72 and is chosen
    assert (q.chosen_policy, q.chosen_score, q.rejected_score) == ("bc@w", 0.8, 0.72)
    assert expert.final_score == 0.72  # the expert record itself is untouched


def test_an_agent_at_the_file_reward_is_a_pair_under_authors_and_a_tie_under_file():
    expert, agent = env_ep("sciworld", ["a", "b"], 0.72), env_ep("sciworld", ["a", "x"], 0.72, "bc@w")
    (p,) = pairs_of("authors", expert, agent)
    assert p.chosen_policy == "expert" and p.rejected_score == 0.72
    assert pairs_of("file", expert, agent) == []


@pytest.mark.parametrize("env", ["alfworld", "sciworld"])
def test_authors_rule_one_for_sciworld_and_alfworld(env):
    from eto_train.pairs import pairing_reward

    assert pairing_reward(env_ep(env, ["a"], 0.0), "authors") == 1.0
    assert pairing_reward(env_ep(env, ["a"], 0.0), "file") == 0.0


@pytest.mark.parametrize("env", ["webshop", "twx"])
def test_webshop_and_other_envs_keep_the_file_reward_under_either_rule(env):
    expert, agent = env_ep(env, ["a", "b"], 0.72), env_ep(env, ["a", "x"], 0.8, "bc@w")
    for rule in ("authors", "file"):
        (p,) = pairs_of(rule, expert, agent)
        assert (p.chosen_policy, p.chosen_score, p.rejected_score) == ("bc@w", 0.8, 0.72)
    tie = env_ep(env, ["a", "x"], 0.72, "bc@w")
    assert pairs_of("authors", expert, tie) == [] == pairs_of("file", expert, tie)


def test_an_unknown_expert_reward_rule_is_refused():
    from eto_train.pairs import pairing_reward

    with pytest.raises(ValueError, match=r"eto.pairs.expert_reward='gold': one of \['file', 'authors'\]"):
        pairing_reward(EXPERT, "gold")
