"""Structured outputs and tool calls: ``response_format``, ``tools`` and ``tool_choice``
read into the grammar that constrains a request's tokens, and what its answer becomes.

The grammar library is llguidance (guidance-ai/llguidance, MIT). Of the three libraries
vLLM can use (xgrammar, llguidance, outlines-core), it is the one that compiles nothing
ahead of time: a JSON schema becomes a grammar in microseconds and the token mask is
computed lazily at each step (about 50 us for a 128k vocabulary, its authors measure),
so a request's own schema costs no compile step on the serving path, where xgrammar and
outlines-core compile each new schema first (outlines-core builds an index over the
whole vocabulary per schema). It covers JSON Schema broadly (``anyOf``, ``$ref``,
bounds, patterns), is one abi3 wheel with no torch dependency, and is what vLLM falls
back to when xgrammar cannot compile a schema.

- ``response_format``: ``{"type": "text"}`` changes nothing; ``json_object`` constrains
  the output to one JSON object; ``json_schema`` (``{"name", "schema", "strict"}``, the
  OpenAI shape) to JSON valid against the schema, strict or not (the grammar enforces
  the schema either way, as vLLM does).
- ``tools`` (chat only, ``type: function``) with ``tool_choice``: ``none`` ignores the
  tools; ``required`` constrains the output to a JSON array of at least one call
  ``{"name": <a tool>, "parameters": <its schema>}`` (vLLM's shape; one call at most
  when ``parallel_tool_calls`` is false); a named function constrains it to that
  function's arguments; ``auto`` (the default with tools) gives the tools to the chat
  template and reads the model family's tool-call text from the output
  (``tool_parsers``).
- JSON is compact (no free whitespace): a model cannot spend its tokens on blanks.

A schema the library refuses is a 400 naming the field. No torch: the executor builds
its matchers from ``grammar`` (``SamplingParams.grammar``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from shunter.engine.api.errors import bad_request

ToolMode = Literal["required", "named", "auto"]
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


@dataclass(frozen=True)
class Tool:
    """One function a request offers: ``name``, ``description`` and the JSON schema of
    its arguments (``parameters``, an empty object schema when none is given)."""

    name: str
    description: str
    parameters: dict[str, Any]

    def render(self) -> dict[str, Any]:
        """The tool as chat templates take it (OpenAI's shape)."""
        function = {"name": self.name, "description": self.description}
        return {"type": "function", "function": {**function, "parameters": self.parameters}}


@dataclass(frozen=True)
class Structure:
    """How a request's output is constrained and read: ``grammar`` (llguidance's, None
    for free text), and with tools the ``mode`` of ``tool_choice``, the ``tools``, and
    for a named choice its ``function``."""

    grammar: str | None = None
    mode: ToolMode | None = None
    tools: tuple[Tool, ...] = ()
    function: str | None = None

    @property
    def calls_tools(self) -> bool:
        """Whether the output is read as tool calls (``tool_choice`` other than none)."""
        return self.mode is not None


def structure(body: dict[str, Any], *, chat: bool) -> Structure:
    """The body's ``response_format``, ``tools`` and ``tool_choice`` (400s name the
    field)."""
    tools = _tools(body.get("tools")) if chat else ()
    choice = body.get("tool_choice")
    if choice is None:  # left out or null: OpenAI's default
        choice = "auto" if tools else "none"
    if not chat and body.get("tools") not in (None, []):
        raise bad_request("'tools' are only for /v1/chat/completions.", "tools")
    form = _response_format(body.get("response_format"))
    if choice == "none" or not tools:
        if choice not in ("none", "auto"):
            needs = isinstance(choice, dict) or choice == "required"
            message = f"'tool_choice' {choice!r} needs 'tools'." if needs else _CHOICE_ERROR
            raise bad_request(message, "tool_choice")
        return Structure(grammar=form)
    if form is not None:
        raise bad_request(
            "'response_format' and 'tools' cannot constrain one answer together; send "
            "'tool_choice': 'none' to use the response format.",
            "response_format",
        )
    if choice == "auto":
        return Structure(mode="auto", tools=tools)
    if choice == "required":
        parallel = body.get("parallel_tool_calls", True) is not False
        return Structure(grammar=_calls_grammar(tools, parallel), mode="required", tools=tools)
    name = _named(choice)
    chosen = [t for t in tools if t.name == name]
    if not chosen:
        raise bad_request(f"'tool_choice' names {name!r}, which is not in 'tools'.", "tool_choice")
    grammar = json_grammar(chosen[0].parameters, "tool_choice")
    return Structure(grammar=grammar, mode="named", tools=tools, function=name)


_CHOICE_ERROR = (
    "'tool_choice' must be 'none', 'auto', 'required' or "
    '{"type": "function", "function": {"name": ...}}.'
)


def json_grammar(schema: dict[str, Any], param: str) -> str:
    """The grammar of JSON valid against ``schema``; a 400 on ``param`` if the grammar
    library refuses it."""
    import llguidance

    try:
        # Compact JSON: llguidance's default lets whitespace repeat between every token.
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema, overrides={"whitespace_flexible": False}
        )
    except (ValueError, TypeError) as e:
        raise bad_request(f"'{param}' has a schema that cannot be used: {e}", param) from None
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise bad_request(f"'{param}' has a schema that cannot be used: {error}", param)
    return grammar


def _response_format(value: Any) -> str | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json_grammar({"type": "object"}, "response_format")
    if kind != "json_schema":
        raise bad_request(
            "'response_format' must be {'type': 'text'}, {'type': 'json_object'} or "
            "{'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}.",
            "response_format",
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request("'response_format.json_schema' must be an object.", "response_format")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise bad_request(
            "'response_format.json_schema.name' must be 1 to 64 letters, digits, _ or -.",
            "response_format",
        )
    schema = spec.get("schema", {})
    if not isinstance(schema, dict) or not isinstance(
        spec.get("strict", False), (bool, type(None))
    ):
        raise bad_request(
            "'response_format.json_schema' needs 'schema' as an object and 'strict' as a boolean.",
            "response_format",
        )
    return json_grammar(schema, "response_format")


def _tools(value: Any) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad_request("'tools' must be a list of functions.", "tools")
    tools: list[Tool] = []
    for item in value:
        function = item.get("function") if isinstance(item, dict) else None
        if (
            not isinstance(item, dict)
            or item.get("type") != "function"
            or not isinstance(function, dict)
        ):
            raise bad_request(
                "each tool must be {'type': 'function', 'function': {'name': ...}}.", "tools"
            )
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise bad_request(
                "a tool's 'function.name' must be 1 to 64 letters, digits, _ or -.", "tools"
            )
        if any(t.name == name for t in tools):
            raise bad_request(f"two tools are named {name!r}.", "tools")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        description = function.get("description", "")
        if not isinstance(parameters, dict) or not isinstance(description, str):
            raise bad_request(
                f"tool {name!r}: 'parameters' must be an object and 'description' a string.",
                "tools",
            )
        tools.append(Tool(name, description, parameters))
    return tuple(tools)


def _named(choice: Any) -> str:
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if (
        not isinstance(choice, dict)
        or choice.get("type") != "function"
        or not isinstance(name, str)
    ):
        raise bad_request(_CHOICE_ERROR, "tool_choice")
    return name


def _calls_grammar(tools: tuple[Tool, ...], parallel: bool) -> str:
    """A JSON array of calls, each ``{"name": <tool>, "parameters": <its arguments>}``."""
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "parameters": t.parameters},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": call}
    if not parallel:
        schema["maxItems"] = 1
    return json_grammar(schema, "tools")


def required_calls(text: str) -> list[tuple[str, str]]:
    """The ``(name, arguments JSON)`` of each call in a ``required`` answer; empty when
    the output was cut before the array closed."""
    try:
        calls = json.loads(text)
    except ValueError:
        return []
    if not isinstance(calls, list):
        return []
    return [
        (str(c["name"]), json.dumps(c["parameters"]))
        for c in calls
        if isinstance(c, dict) and "name" in c and "parameters" in c
    ]
