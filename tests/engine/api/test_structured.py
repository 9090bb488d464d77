"""``response_format``, ``tools`` and ``tool_choice`` read into a grammar and a tool mode."""

from __future__ import annotations

import json

import pytest

from shunter.engine.api.errors import ApiError
from shunter.engine.api.structured import required_calls, structure

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def test_tool_choice_defaults_to_auto_with_tools_and_none_without() -> None:
    assert structure({"tools": [TOOL]}, chat=True).mode == "auto"
    assert structure({"tools": [TOOL], "tool_choice": None}, chat=True).mode == "auto"
    plain = structure({"tools": [TOOL], "tool_choice": "none"}, chat=True)
    assert plain.mode is None and plain.grammar is None
    assert structure({}, chat=True).mode is None and structure({}, chat=False).grammar is None


def test_each_constraint_is_an_llguidance_grammar() -> None:
    for body in (
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
        {"tools": [TOOL], "tool_choice": "required"},
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
    ):
        grammar = structure(body, chat=True).grammar
        assert grammar is not None and "grammars" in json.loads(grammar), body


def test_one_call_at_most_without_parallel_calls() -> None:
    def schema(body: dict[str, object]) -> dict[str, object]:
        grammar = structure(body, chat=True).grammar
        assert grammar is not None
        found: dict[str, object] = json.loads(grammar)["grammars"][0]["json_schema"]
        return found

    required = {"tools": [TOOL], "tool_choice": "required"}
    assert schema({**required, "parallel_tool_calls": False})["maxItems"] == 1
    assert "maxItems" not in schema(required) and schema(required)["minItems"] == 1


def test_a_tool_on_completions_is_refused() -> None:
    with pytest.raises(ApiError) as e:
        structure({"tools": [TOOL]}, chat=False)
    assert e.value.param == "tools"


def test_required_calls_read_the_array_or_nothing() -> None:
    assert required_calls('[{"name": "f", "parameters": {"a": 1}}]') == [("f", '{"a": 1}')]
    assert required_calls('[{"name": "f", "parameters": {"a"') == []  # cut by the length
    assert required_calls('{"name": "f"}') == []
