from __future__ import annotations

import pytest

from eto_train.prompting import PromptConfig, format_action, parse_action, system_message
from fixture_settings import react_prompt, rollout_config


@pytest.mark.parametrize("text, expected", [
    ("Action: take coin", "take coin"),
    ("action:   Take   COIN  ", "take coin"),
    ("Thought: I need the coin.\nAction: take coin", "take coin"),
    ("Thought: the Action: word appears\nAction: move north", "move north"),
    ("Action: open door\nAction: move east", "move east"),  # the last action line wins
    ("take coin", None),  # no Action: prefix
    ("Action:", None),  # empty action
    ("Action:    ", None),
    ("", None),
    ("The action: is not at line start", None),
    # what a real chat model writes around its action (SmolLM2-135M-Instruct, untuned)
    ("Action: take coin from the lounge.", "take coin from the lounge"),
    ("Action: `open fridge`", "open fridge"),
    ('Thought: the map.\nAction: "move north".', "move north"),
    ("Action: .", None),
    ("I'm in the kitchen.", None),
])
def test_parse_action(text, expected):
    assert parse_action(text) == expected


def test_format_action_round_trips_through_the_parser():
    assert parse_action(format_action("put coin in box")) == "put coin in box"
    assert parse_action(format_action("read map", thought="maps help")) == "read map"


def test_system_message_names_the_action_forms():
    msg = system_message(react_prompt(), ["take <object>", "look around"])
    assert msg["role"] == "system" and "take <object>; look around" in msg["content"]


# -- the paper's prompt: instruction answered "OK", one-shot example, "Observation: " prefix ------
PAPER_LIKE = react_prompt(system="Do the task. Braces {{x}} stay.", opening="instruction_ok",
                          task_template="{task}", observation_template="Observation: {observation}",
                          example=[{"role": "user", "content": "Example task"},
                                   {"role": "assistant", "content": "Thought: t\nAction: go"},
                                   {"role": "user", "content": "Observation: ex obs"},
                                   {"role": "assistant", "content": "Action: go"}], version="paper-like")


def test_rollout_sees_opening_example_and_task_and_the_record_keeps_no_example():
    """As the authors' prompt_with_icl with one example: [instruction, OK, example turns, task];
    the episode record (BC and pair data) keeps the opening and the task, not the example."""
    from test_faults import GoalEnv

    from eto_train.records import PolicyRef, to_messages
    from eto_train.rollouts.loop import run_rollouts

    seen = []

    class Go:
        def generate(self, convs):
            seen.append([dict(m) for m in convs[0]])
            return [("Thought: onwards\nAction: go", 10, 3, 0) for _ in convs]

    eps = []
    run_rollouts([(GoalEnv().tasks("train")[0], 0)], GoalEnv, Go(), PolicyRef(id="p@0"), PAPER_LIKE,
                 rollout_config(batch_size=1), on_episode=eps.append)
    first, last = seen[0], seen[-1]
    assert [m["content"] for m in first] == ["Do the task. Braces {x} stay.", "OK", "Example task",
                                              "Thought: t\nAction: go", "Observation: ex obs", "Action: go",
                                              "Reach goal 0."]
    assert [m["role"] for m in first] == ["user", "assistant"] * 3 + ["user"]
    assert last[-1] == {"role": "user", "content": "Observation: step 2"}
    (ep,) = eps
    assert ep.success and ep.opening == "instruction_ok" and ep.steps[0].observation == "Observation: step 1"
    assert [m["content"] for m in to_messages(ep)][:4] == ["Do the task. Braces {x} stay.", "OK", "Reach goal 0.",
                                                         "Thought: onwards\nAction: go"]


def test_expert_episodes_carry_the_same_opening_and_observation_turns():
    from test_faults import GoalEnv

    from eto_train.experts import expert_episode

    env = GoalEnv()
    ep = expert_episode(env, env.tasks("train")[0], PAPER_LIKE)
    assert ep.success and ep.opening == "instruction_ok" and ep.system == "Do the task. Braces {x} stay."
    assert [s.observation for s in ep.steps] == ["Observation: step 1", "Observation: step 2", "Observation: step 3"]


@pytest.mark.parametrize("kw, message", [
    ({"opening": "chat"}, r"prompt.opening: 'chat' is not one of"),
    ({"observation_template": "{obs}"}, r"prompt.observation_template: .* not a template"),
    ({"example": [{"role": "assistant", "content": "x"}]}, r"prompt.example\[0\].role: 'assistant', expected 'user'"),
    ({"example": [{"role": "user", "content": "x"}]}, r"prompt.example: must end on an assistant turn"),
])
def test_bad_prompt_settings_name_the_key(kw, message):
    with pytest.raises(ValueError, match=message):
        react_prompt(**kw)


@pytest.mark.parametrize("name", ["react", "sciworld_eto", "alfworld_eto", "webshop_eto"])
def test_prompt_profiles_load_and_render(name):
    from pathlib import Path

    from omegaconf import OmegaConf

    from eto_train.prompting import rollout_context

    cfg = PromptConfig(**OmegaConf.to_container(OmegaConf.load(Path(__file__).parents[1] / "configs/prompt" / f"{name}.yaml")))
    text = system_message(cfg, ["go"])["content"]
    ctx = rollout_context(cfg, text, "the task")
    assert ctx[-1] == {"role": "user", "content": "the task"}
    if name != "react":  # the authors' instruction, verbatim (braces undoubled), answered "OK", one example
        assert ctx[1] == {"role": "assistant", "content": "OK"} and len(cfg.example) >= 8
        assert "{{" not in text and ("{obj}" in text) == (name == "alfworld_eto")
        assert all(parse_action(m["content"]) for m in cfg.example if m["role"] == "assistant")


def test_a_max_new_tokens_shorter_than_the_examples_answers_is_named(tmp_path):
    """The ScienceWorld trap, measured on the real model: its one-shot example answers "Thought: ...
    Action: ..."; with 24 new tokens every answer was cut inside its thought (unparsed 100%)."""
    import lzma
    from pathlib import Path

    from transformers import AutoTokenizer

    from eto_train.prompting import answer_room_warning

    src = Path(__file__).parent / "data" / "tokenizers" / "smollm2"  # SmolLM2's real tokenizer (compressed)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes(lzma.decompress((src / f"{name}.xz").read_bytes()))
    tok = AutoTokenizer.from_pretrained(tmp_path)
    thought = "Thought: I need to find an animal. The greenhouse is a good place to look first.\nAction: go to greenhouse"
    example = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "Action: look around"},
               {"role": "user", "content": "obs"}, {"role": "assistant", "content": thought}]
    need = len(tok(thought, add_special_tokens=False)["input_ids"]) + 1
    line = answer_room_warning(tok, example, need - 1)
    assert line and f"max_new_tokens={need - 1}" in line and f"at least {need}" in line
    assert answer_room_warning(tok, example, need) is None
    assert answer_room_warning(tok, [], 1) is None
