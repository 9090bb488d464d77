"""Tool calls read from a model's text in each family's form; nothing else becomes one."""

from __future__ import annotations

import json

from shunter.engine.api.tool_parsers import parse_tool_calls

NAMES = {"set_switch", "release_car"}


def test_hermes_blocks_with_content_around_them() -> None:
    text = (
        'Setting it.\n<tool_call>\n{"name": "set_switch", "arguments": {"switch": 3}}\n'
        '</tool_call>\n<tool_call>{"name": "release_car", "arguments": "{\\"car\\": 7}"}'
        "</tool_call>"
    )
    content, calls = parse_tool_calls(text, NAMES)
    assert content == "Setting it."
    assert [(n, json.loads(a)) for n, a in calls] == [
        ("set_switch", {"switch": 3}),
        ("release_car", {"car": 7}),
    ]


def test_mistral_and_llama_forms() -> None:
    content, calls = parse_tool_calls(
        '[TOOL_CALLS][{"name": "set_switch", "arguments": {}}]', NAMES
    )
    assert content is None and calls == [("set_switch", "{}")]
    content, calls = parse_tool_calls(' {"name": "release_car", "parameters": {"car": 1}}', NAMES)
    assert content is None and calls == [("release_car", '{"car": 1}')]


def test_what_is_not_a_call_of_an_offered_tool_stays_content() -> None:
    for text in (
        "just text",
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',  # not offered
        "<tool_call>{not json}</tool_call>",
        '{"name": "set_switch", "arguments": [1]}',
        '[TOOL_CALLS][{"name": "set_switch"}, {"name": "other"}]',
    ):
        assert parse_tool_calls(text, NAMES) == (text, [])
