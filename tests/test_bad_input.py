"""Bad input: each gets a clear error naming the file, line or field, and nothing already
written is damaged. One test per row of docs/bad_inputs.md (rows already covered elsewhere
name their test there)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eto_train.eto_format import read_eto_file
from eto_train.model.load import CheckpointError, load_model, load_tokenizer, policy_ref
from eto_train.pairs import Pair, PairsPolicyError, check_pairs_policy, read_pairs
from eto_train.prompting import ContextTruncationWarning, fit_prompt
from eto_train.records import Episode, PolicyRef, RecordError, Step
from eto_train.store import append_episodes, read_episodes
from fixture_settings import react_prompt, rollout_config, generation


def make_episode(i: int = 0, action: str | None = "go", status: str = "success") -> Episode:
    ep = Episode(episode_id=f"ep{i}", task_id=f"g/train/{i}", env="goal", game="g", fold="train", seed=i,
                 split="train", env_version="goal-1", policy=PolicyRef(id="expert"), prompt_version="react-v1",
                 system="Act.", first_user="Task: go\nObservation: start", instruction="go",
                 first_observation="start")
    ep.steps.append(Step(index=0, raw_output=f"Action: {action}", action=action, valid=True,
                         observation="done", reward=1.0, done=True))
    ep.finish(status)
    return ep


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """A tiny model folder built in a second (no environment needed)."""
    from fixture_models import tiny_model

    texts = ["Task: reach the goal\nObservation: a room with a door", "Action: go", "Action: wait",
             "You are an agent in a text environment."] * 10
    return tiny_model(texts, tmp_path_factory.mktemp("small_model"), vocab_size=300, num_layers=1,
                      max_position_embeddings=512)


# -- JSONL episode files ----------------------------------------------------------------------
BAD_LINES = {
    "malformed": (b'{"episode_id": "x", \n', r":3: malformed JSON"),
    "truncated_last_line": (b'{"episode_id": "half', r":3: malformed JSON: .* \(truncated line\?\)"),
    "non_utf8": (b'{"episode_id": "\xff"}\n', r":3: not valid UTF-8 \(invalid start byte at byte 16\)"),
    "not_an_episode": (b'{"episode_id": "x"}\n', r":3: not an episode record: missing field"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_bad_jsonl_line_is_named_and_the_file_is_left_untouched(tmp_path, case):
    path = tmp_path / "episodes.jsonl"
    append_episodes(path, [make_episode(0), make_episode(1)])
    line, message = BAD_LINES[case]
    with open(path, "ab") as f:
        f.write(line)
    before = path.read_bytes()
    with pytest.raises(RecordError, match=str(path) + message):
        read_episodes(path)
    assert path.read_bytes() == before  # a failed read writes nothing
    if case == "truncated_last_line":  # resume reads the whole records and skips the cut one
        with pytest.warns(UserWarning, match=":3: partial last line"):
            assert [e.episode_id for e in read_episodes(path, allow_partial_tail=True)] == ["ep0", "ep1"]


# -- empty actions ----------------------------------------------------------------------------
@pytest.mark.parametrize("action", ["", "   "])
def test_empty_action_in_an_episode_record_names_the_step(tmp_path, action):
    path = tmp_path / "episodes.jsonl"
    d = make_episode(0).to_dict()
    d["steps"][0]["action"] = action
    path.write_text(json.dumps(d) + "\n")
    with pytest.raises(RecordError, match=rf"{path}:1: not an episode record: steps\[0\].action: empty action"):
        read_episodes(path)


def test_empty_action_in_a_model_output_is_an_invalid_step_not_a_crash():
    from test_faults import GoalEnv

    from eto_train.rollouts.loop import run_rollouts

    class Empty:
        def generate(self, convs):
            return [("Action:   ", 10, 3, 0) for _ in convs]

    eps = []
    task = GoalEnv().tasks("train")[0]
    run_rollouts([(task, 0)], GoalEnv, Empty(), PolicyRef(id="p@0"), react_prompt(), rollout_config(batch_size=1),
                 on_episode=eps.append)
    (ep,) = eps
    assert ep.status == "max_steps" and all(s.action is None and not s.valid for s in ep.steps)
    assert ep.steps[0].observation == react_prompt().invalid_format  # the model is told, and it is on record


# -- ETO-format trajectory files --------------------------------------------------------------
def _conv(*turns):
    return {"id": "t1", "conversations": [{"from": f, "value": v} for f, v in turns]}


ETO_CASES = {
    "no_assistant_turn": ("eto.json", [_conv(("human", "Task: go"))],
                          r"eto.json:2 \[item 0\]: not an ETO trajectory: the trajectory has no gpt \(assistant\) turn"),
    "unknown_role": ("eto.jsonl", [_conv(("human", "Task"), ("gpt", "Action: go")),
                                   _conv(("human", "Task"), ("tool", "{}"))],
                     r"eto.jsonl:2: not an ETO trajectory: conversations\[1\].from must be 'human' or 'gpt', got 'tool'"),
    "empty_action": ("eto.json", [_conv(("human", "Task"), ("gpt", "Thought: hm\nAction:"), ("human", "ok"))],
                     r"eto.json:2 \[item 0\]: not an ETO trajectory: conversations\[1\].value: empty action"),
}


@pytest.mark.parametrize("case", sorted(ETO_CASES))
def test_eto_trajectory_file_errors_name_file_line_and_field(tmp_path, case):
    name, items, message = ETO_CASES[case]
    path = tmp_path / name
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(o) + "\n" for o in items))
    else:
        path.write_text("[\n" + ",\n".join(json.dumps(o) for o in items) + "\n]\n")
    before = path.read_bytes()
    with pytest.raises(RecordError, match=message):
        read_eto_file(path)
    assert path.read_bytes() == before


def test_eto_json_file_with_non_utf8_bytes_names_the_line(tmp_path):
    path = tmp_path / "eto.json"
    path.write_bytes(b'[\n{"id": "a",\n "conversations": "\xff"}\n]\n')
    with pytest.raises(RecordError, match=rf"{path}:3: not valid UTF-8"):
        read_eto_file(path)


# -- pairs files ------------------------------------------------------------------------------
def make_pair(**kw) -> dict:
    p = {"pair_id": "p1", "task_id": "g/train/0", "kind": "trajectory", "step": None,
         "chosen_policy": "expert", "rejected_policy": "bc@abcdef012345", "chosen_score": 1.0, "rejected_score": 0.0,
         "prompt": [{"role": "system", "content": "Act."}, {"role": "user", "content": "Task: go"}],
         "chosen": [{"role": "assistant", "content": "Action: go"}],
         "rejected": [{"role": "assistant", "content": "Action: wait"}]}
    p.update(kw)
    return p


PAIR_CASES = {
    "unknown_role": (make_pair(rejected=[{"role": "tool", "content": "{}"}, {"role": "assistant", "content": "x"}]),
                     r"rejected\[0\].role: unknown role 'tool'"),
    "no_assistant_turn": (make_pair(chosen=[{"role": "user", "content": "hi"}]), r"chosen: no assistant turn"),
    "empty_action": (make_pair(chosen=[{"role": "assistant", "content": "  "}]),
                     r"chosen\[0\].content: empty assistant turn"),
    "missing_field": ({k: v for k, v in make_pair().items() if k != "rejected"}, r"missing field\(s\) \['rejected'\]"),
}


@pytest.mark.parametrize("case", sorted(PAIR_CASES))
def test_pairs_file_errors_name_file_line_and_field(tmp_path, case):
    bad, message = PAIR_CASES[case]
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(make_pair()) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RecordError, match=rf"{path}:2: not a pair record: {message}"):
        read_pairs(path)
    assert len(read_pairs_ok(tmp_path)) == 1


def read_pairs_ok(tmp_path):
    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps(make_pair()) + "\n")
    return read_pairs(ok)


def test_pairs_from_another_policy_than_the_dpo_reference_are_rejected(small_model):
    ref = policy_ref(str(small_model), name="bc")
    mine = ref.id.replace("bc@", "iter0@")  # the same weights under another stage's name: fine
    pairs = [Pair(**make_pair(pair_id="p1", rejected_policy=mine)),
             Pair(**make_pair(pair_id="p2", kind="self", chosen_policy=ref.id, rejected_policy=ref.id))]
    check_pairs_policy(pairs, ref.id, source="iter1/pairs/pairs.jsonl")
    stale = pairs + [Pair(**make_pair(pair_id="p3", rejected_policy="bc@0123456789ab"))]
    with pytest.raises(PairsPolicyError, match=r"iter1/pairs/pairs.jsonl:3: pair p3: rejected_policy is "
                                               r"'bc@0123456789ab', but the DPO reference is 'bc@"):
        check_pairs_policy(stale, ref.id, source="iter1/pairs/pairs.jsonl")
    with pytest.raises(PairsPolicyError, match="gpt2@hub"):
        check_pairs_policy([Pair(**make_pair(rejected_policy="gpt2@hub"))], "distilgpt2@hub")


# -- context window ---------------------------------------------------------------------------
def test_overlong_observation_is_truncated_with_a_warning_and_counted(small_model):
    tok = load_tokenizer(str(small_model))
    conv = [{"role": "system", "content": "You are an agent in a text environment."},
            {"role": "user", "content": "Task: reach the goal\nObservation: a room"},
            {"role": "assistant", "content": "Action: go"}, {"role": "user", "content": "a door"},
            {"role": "assistant", "content": "Action: go"}, {"role": "user", "content": "a room with a door " * 400}]
    budget = 120
    with pytest.warns(ContextTruncationWarning, match="exceeds the context budget of 120 tokens: dropped 1 oldest "
                                                      r"exchange\(s\), truncated \d+ tokens of the newest observation"):
        ids, dropped, cut = fit_prompt(tok, conv, budget)
    assert len(ids) <= budget and dropped == 1 and cut > 1000
    text = tok.decode(ids)
    # system and task turns kept, the latest exchange kept, its observation cut and marked
    assert text.startswith("<|im_start|>system\nYou are an agent") and "Task: reach the goal" in text
    assert f"[... {cut} tokens truncated]" in text and "a door<|im_end|>" not in text
    assert text.endswith("<|im_start|>assistant\n")
    short = conv[:2]
    ids, dropped, cut = fit_prompt(tok, short, budget)  # fits: untouched, no warning
    assert (dropped, cut) == (0, 0) and tok.decode(ids).count("<|im_start|>") == 3


def test_rollout_prompt_truncation_warns_and_is_counted(small_model):
    from eto_train.rollouts.loop import Policy

    pol = Policy(load_model(str(small_model)), load_tokenizer(str(small_model)), generation(max_new_tokens=8),
                 max_context=128)
    conv = [{"role": "system", "content": "Act."}, {"role": "user", "content": "Task: go\nObservation: x"},
            {"role": "assistant", "content": "Action: go"}, {"role": "user", "content": "a room " * 400}]
    with pytest.warns(ContextTruncationWarning):
        ids, dropped = pol._encode(conv)
    assert dropped >= 1 and len(ids) <= 120 and "[..." in pol.tok.decode(ids)


# -- configuration --------------------------------------------------------------------------
@pytest.mark.parametrize("override, key", [("env.faults.crash.rat=0.1", "env.faults.crash.rat"),
                                           ("export.drop_field=[x]", "export.drop_field")])
def test_unknown_hydra_key_in_a_new_config_block_is_a_clear_error(override, key):
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "configs"), version_base="1.3"):
        compose("config", overrides=["env.faults.crash.rate=0.1"])  # a known key composes
        with pytest.raises(ConfigCompositionException, match=f"Could not override '{key}'"):
            compose("config", overrides=[override])


# -- checkpoints ----------------------------------------------------------------------------
@pytest.mark.parametrize("case, message", [
    ("no_config", "not a model folder \\(no config.json\\)"),
    ("pickle_only", "no \\*.safetensors weights \\(only safetensors are loaded\\)"),
])
def test_checkpoint_folder_without_a_model_is_a_clear_error(tmp_path, small_model, case, message):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(small_model, ckpt)
    if case == "no_config":
        (ckpt / "config.json").unlink()
    else:
        (ckpt / "model.safetensors").rename(ckpt / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=f"{ckpt}: {message}"):
        load_model(str(ckpt))


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "config.json"])
def test_a_damaged_json_file_of_a_checkpoint_names_the_file_line_and_column(tmp_path, small_model, name):
    """Issue 53 item 5: was a bare JSONDecodeError from AutoTokenizer.from_pretrained, the file unnamed."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(small_model, ckpt)
    f = ckpt / name
    whole = f.read_bytes()
    lines = f.read_text().splitlines()
    lines[1] = lines[1] + " oops"
    f.write_text("\n".join(lines) + "\n")
    before = f.read_bytes()
    for load in (policy_ref, load_tokenizer, load_model):
        with pytest.raises(CheckpointError, match=rf"{f}: not valid JSON at line 2 column \d+: "):
            load(str(ckpt))
    assert f.read_bytes() == before  # left as it is
    f.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CheckpointError, match=rf"{f}: not valid JSON at line \d+ column \d+: .* \(cut short\?\)"):
        policy_ref(str(ckpt))


@pytest.mark.parametrize("case", ["garbage", "cut_short"])
def test_corrupt_checkpoint_is_a_clear_error_and_left_as_is(tmp_path, small_model, case):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(small_model, ckpt)
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(b"garbage!" * 64 if case == "garbage" else data[: len(data) // 2])
    before = weights.read_bytes()
    for load in (policy_ref, load_model, load_tokenizer):
        with pytest.raises(CheckpointError, match=f"{weights}: corrupt safetensors weights"):
            load(str(ckpt))
    assert weights.read_bytes() == before
