"""Structured outputs and tool calls through the official openai SDK against a real
server of random-weight models: every answer that ends parses and validates against its
schema, streamed and not."""

from __future__ import annotations

import json
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel, Field

from tests.engine.server.conftest import TOKEN, ServerThread, assert_no_leaks

MESSAGES: Any = [{"role": "user", "content": "Describe the yard"}]


class Car(BaseModel):
    """Bounded fields: a random model's free string could run to max_tokens."""

    kind: Literal["coal", "grain", "timber"]
    loaded: bool
    axles: int = Field(ge=2, le=8)
    mark: str = Field(max_length=6)


SCHEMA = {
    "type": "object",
    "properties": {
        "track": {"type": "integer", "minimum": 1, "maximum": 40},
        "urgent": {"type": "boolean"},
        "cars": {"type": "array", "items": {"enum": ["A", "B"]}, "maxItems": 3},
    },
    "required": ["track", "urgent", "cars"],
    "additionalProperties": False,
}
SWITCH = {
    "type": "function",
    "function": {
        "name": "set_switch",
        "description": "Set a switch of the ladder",
        "parameters": {
            "type": "object",
            "properties": {
                "switch": {"type": "integer", "minimum": 1, "maximum": 9},
                "way": {"enum": ["left", "right"]},
            },
            "required": ["switch", "way"],
            "additionalProperties": False,
        },
    },
}
HUMP = {
    "type": "function",
    "function": {
        "name": "release_car",
        "parameters": {
            "type": "object",
            "properties": {"car": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["car"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0)


def valid(value: Any, schema: dict[str, Any]) -> bool:
    """A check of the schemas above (types, bounds, enums, required, no extras)."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return ok and schema.get("minimum", value) <= value <= schema.get("maximum", value)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        items = schema["items"]
        return (
            isinstance(value, list)
            and len(value) <= schema.get("maxItems", len(value))
            and all(valid(v, items) for v in value)
        )
    if kind == "object":
        props = schema.get("properties", {})
        return (
            isinstance(value, dict)
            and set(schema.get("required", [])) <= value.keys() <= props.keys()
            and all(valid(v, props[k]) for k, v in value.items())
        )
    raise AssertionError(f"no check for {schema}")


@pytest.mark.parametrize("model", ["llama", "qwen"])
def test_sdk_parse_with_a_pydantic_model(client: openai.OpenAI, model: str) -> None:
    for seed in range(3):
        completion = client.beta.chat.completions.parse(
            model=model,
            messages=MESSAGES,
            response_format=Car,
            max_tokens=200,
            temperature=1.0,
            seed=seed,
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Car)
        assert Car.model_validate_json(choice.message.content or "") == choice.message.parsed


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_validates(
    client: openai.OpenAI, server: ServerThread, stream: bool
) -> None:
    form: Any = {
        "type": "json_schema",
        "json_schema": {"name": "move", "schema": SCHEMA, "strict": True},
    }
    for seed in range(4):
        kwargs: Any = dict(
            model="qwen",
            messages=MESSAGES,
            response_format=form,
            max_tokens=120,
            seed=seed,
            temperature=1.0,
        )
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kwargs))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            choice = client.chat.completions.create(**kwargs).choices[0]
            text, finish = choice.message.content or "", choice.finish_reason
        assert finish == "stop", text
        assert valid(json.loads(text), SCHEMA), text
    assert_no_leaks(server.engine_state())


def test_json_object_on_completions_and_chat(client: openai.OpenAI) -> None:
    # A random model's free keys and strings may not close before max_tokens: an
    # answer that stops is one JSON object, one cut by the length is a prefix of one.
    for seed in range(6):
        choice = client.chat.completions.create(
            model="llama",
            messages=MESSAGES,
            response_format={"type": "json_object"},
            max_tokens=64,
            seed=seed,
            temperature=1.0,
        ).choices[0]
        text = choice.message.content or ""
        assert text.startswith("{")
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
        else:
            assert choice.finish_reason == "length"
    text = (
        client.completions.create(
            model="qwen",
            prompt="The yard",
            max_tokens=64,
            seed=1,
            temperature=1.0,
            extra_body={
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "m", "schema": SCHEMA},
                }
            },
        )
        .choices[0]
        .text
    )
    assert valid(json.loads(text), SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_tool_calls(client: openai.OpenAI, stream: bool) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (SWITCH, HUMP)}
    for choice_arg in ("required", {"type": "function", "function": {"name": "release_car"}}):
        kwargs: Any = dict(
            model="qwen",
            messages=MESSAGES,
            tools=[SWITCH, HUMP],
            tool_choice=choice_arg,
            max_tokens=120,
            seed=3,
            temperature=1.0,
            parallel_tool_calls=False,
        )
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kwargs))
            deltas = [c.choices[0] for c in chunks if c.choices]
            calls = [tc for d in deltas for tc in d.delta.tool_calls or []]
            finish = deltas[-1].finish_reason
            pairs = [(tc.function.name, tc.function.arguments) for tc in calls if tc.function]
            assert all(tc.id and tc.id.startswith("call_") for tc in calls)
        else:
            choice = client.chat.completions.create(**kwargs).choices[0]
            finish = choice.finish_reason
            assert choice.message.content is None
            pairs = [
                (tc.function.name, tc.function.arguments) for tc in choice.message.tool_calls or []
            ]
        assert finish == "tool_calls" and len(pairs) == 1
        name, arguments = pairs[0]
        if isinstance(choice_arg, dict):
            assert name == "release_car"
        assert valid(json.loads(arguments or ""), schemas[name or ""])


def test_a_tool_round_trip_and_auto(client: openai.OpenAI) -> None:
    first = (
        client.chat.completions.create(
            model="llama",
            messages=MESSAGES,
            tools=[SWITCH],
            tool_choice="required",
            max_tokens=80,
            seed=0,
            temperature=1.0,
        )
        .choices[0]
        .message
    )
    (call,) = first.tool_calls or []
    history: Any = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"ok": true}'},
    ]
    # The model reads the call and its answer back and goes on; with tools offered and
    # 'auto', a random model writes text, which stays content.
    answer = client.chat.completions.create(
        model="llama",
        messages=history,
        tools=[SWITCH],
        max_tokens=8,
        seed=0,  # unseeded, a random model samples its end of text within 8 tokens now and then
    ).choices[0]
    assert answer.message.tool_calls is None and answer.message.content
    assert answer.finish_reason == "length"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": {"type": "xml"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "bad name"}}},
            "response_format",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objekt"}},
                }
            },
            "response_format",
        ),
        ({"tools": [{"type": "function", "function": {}}]}, "tools"),
        (
            {"tools": [SWITCH], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [SWITCH], "tool_choice": "sometimes"}, "tool_choice"),
        (
            {
                "tools": [SWITCH],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "response_format",
        ),
        ({"functions": [{"name": "f"}]}, "functions"),
    ],
)
def test_bad_structures_are_400s_that_name_the_field(
    client: openai.OpenAI, server: ServerThread, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="qwen", messages=MESSAGES, max_tokens=4, extra_body=body
        )
    assert e.value.status_code == 400 and e.value.body["param"] == param  # type: ignore[index]
    assert_no_leaks(server.engine_state())
