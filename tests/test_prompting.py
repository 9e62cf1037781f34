from __future__ import annotations

import pytest

from eto_train.prompting import PromptConfig, format_action, parse_action, system_message


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
])
def test_parse_action(text, expected):
    assert parse_action(text) == expected


def test_format_action_round_trips_through_the_parser():
    assert parse_action(format_action("put coin in box")) == "put coin in box"
    assert parse_action(format_action("read map", thought="maps help")) == "read map"


def test_system_message_names_the_action_forms():
    msg = system_message(PromptConfig(), ["take <object>", "look around"])
    assert msg["role"] == "system" and "take <object>; look around" in msg["content"]
