from __future__ import annotations

import json

import pytest

from eto_train.eto_format import from_eto, to_eto
from eto_train.records import Episode, RecordError, to_messages
from eto_train.store import append_episodes, drop_partial_tail, read_episodes, read_jsonl, write_atomic


def test_episode_round_trips_through_jsonl(tmp_path, expert_episodes):
    path = tmp_path / "eps.jsonl"
    append_episodes(path, expert_episodes[:3])
    append_episodes(path, expert_episodes[3:])
    back = read_episodes(path)
    assert [e.to_dict() for e in back] == [e.to_dict() for e in expert_episodes]


def test_expert_record_carries_what_reproduction_needs(expert_episodes):
    ep = expert_episodes[0]
    assert ep.policy.id == "expert" and ep.prompt_version == "react-v1"
    assert ep.env_version.startswith("textworld-express==")
    assert ep.task_id == f"{ep.game}/train/{ep.seed}"
    assert ep.reward_components == {"outcome": 1.0, "progress": 1.0, "validity": 1.0,
                                    "cost": float(len(ep.steps))}
    s = ep.steps[0]
    assert s.raw_output == f"Action: {s.action}" and s.valid and s.observation
    # finish() stored each step's credit: every expert step is valid, the progress adds up to the score
    assert all(st.credit["validity"] == 1.0 for st in ep.steps)
    assert sum(st.credit["progress"] for st in ep.steps) == pytest.approx(ep.final_score)


def test_to_messages_alternates_and_ends_on_an_action(expert_episodes):
    ep = expert_episodes[0]
    msgs = to_messages(ep)
    roles = [m["role"] for m in msgs]
    assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
    assert roles[2:] == ["assistant", "user"] * (len(ep.steps) - 1) + ["assistant"]
    assert msgs[1]["content"].startswith("Task: ") and ep.first_observation in msgs[1]["content"]
    cut = to_messages(ep, max_turns=2)
    assert [m["role"] for m in cut][-1] == "assistant" and sum(m["role"] == "assistant" for m in cut) == 2


def test_eto_format_export_and_import(expert_episodes):
    ep = expert_episodes[0]
    eto = to_eto(ep)
    assert [t["from"] for t in eto["conversations"]][:3] == ["human", "gpt", "human"]
    assert [t["value"] for t in eto["conversations"]][:2] == [ep.system, "OK"]  # the authors' opening
    back = from_eto(json.loads(json.dumps(eto)))
    assert [s.action for s in back.steps] == [s.action for s in ep.steps]
    assert back.success and back.final_score == pytest.approx(1.0)
    # the imported conversation renders to the same turns, the system turn as the paper's opening
    assert back.opening == "instruction_ok" and back.system == ep.system
    assert [m["content"] for m in to_messages(back)][2:] == [m["content"] for m in to_messages(ep)][1:]


@pytest.mark.parametrize("obj, message", [
    ({"id": "x"}, "conversations"),
    ({"conversations": []}, "non-empty"),
    ({"conversations": [{"from": "system", "value": "hi"}]}, "conversations\\[0\\].from must be 'human' or 'gpt'"),
    ({"conversations": [{"from": "human", "value": "task"}]}, "no gpt"),
    ({"conversations": [{"from": "human", "value": "t"}, {"from": "gpt", "value": 3}]}, "conversations\\[1\\].value"),
    ({"conversations": [{"from": "gpt", "value": "Action: x"}]}, "must be a human turn"),
])
def test_eto_import_rejects_bad_trajectories(obj, message):
    with pytest.raises(ValueError, match=message):
        from_eto(obj)


def test_malformed_jsonl_line_names_file_and_line(tmp_path, expert_episodes):
    path = tmp_path / "eps.jsonl"
    append_episodes(path, expert_episodes[:2])
    with open(path, "a") as f:
        f.write('{"episode_id": "x", \n')
    with pytest.raises(RecordError, match=rf"{path}:3: malformed JSON"):
        read_episodes(path)


def test_not_an_episode_and_bad_bytes_are_named(tmp_path):
    path = tmp_path / "eps.jsonl"
    path.write_text('{"episode_id": "x"}\n')
    with pytest.raises(RecordError, match=rf"{path}:1: not an episode record: missing field"):
        read_episodes(path)
    path.write_bytes(b'{"a": "\xff"}\n')
    with pytest.raises(RecordError, match=rf"{path}:1: not valid UTF-8"):
        list(read_jsonl(path))


def test_unknown_status_and_unknown_fields_are_rejected(expert_episodes):
    d = expert_episodes[0].to_dict()
    with pytest.raises(ValueError, match="status 'won'"):
        Episode.from_dict({**d, "status": "won"})
    with pytest.raises(ValueError, match="unknown field"):
        Episode.from_dict({**d, "colour": "blue"})


def test_partial_tail_is_dropped_without_touching_whole_records(tmp_path, expert_episodes):
    path = tmp_path / "eps.jsonl"
    append_episodes(path, expert_episodes[:2])
    whole = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"episode_id": "half')
    with pytest.warns(UserWarning, match="partial last line"):
        assert len(read_episodes(path, allow_partial_tail=True)) == 2
    with pytest.warns(UserWarning):
        assert drop_partial_tail(path) > 0
    assert path.read_bytes() == whole


def test_write_atomic_leaves_old_content_on_failure(tmp_path):
    path = tmp_path / "m.json"
    write_atomic(path, "old")

    class Boom:
        def __str__(self):
            raise RuntimeError

    with pytest.raises(TypeError):
        write_atomic(path, Boom())  # a failing write must not clobber the file
    assert path.read_text() == "old" and len(list(tmp_path.iterdir())) == 1
