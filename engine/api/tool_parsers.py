"""Tool calls read from a model's text, for ``tool_choice: auto``: the forms the model
families' chat templates teach.

- Hermes (Qwen2.5, Qwen3, our ChatML): ``<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>`` blocks; the text outside them is the content.
- Mistral: ``[TOOL_CALLS]`` followed by a JSON array of ``{"name", "arguments"}``.
- Llama 3.1 and later: the whole answer is one JSON object ``{"name": ...,
  "parameters": {...}}`` (or ``"arguments"``).

A block that is not valid JSON, or names a function the request did not offer, stays
content: nothing the model writes becomes a call it was not given."""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_MISTRAL = "[TOOL_CALLS]"


def parse_tool_calls(text: str, names: Collection[str]) -> tuple[str | None, list[tuple[str, str]]]:
    """``(content, calls)``: the text left once the calls are taken (None when nothing
    but calls was written) and each call's ``(name, arguments JSON)``, in order."""
    calls: list[tuple[str, str]] = []
    content = text
    if "<tool_call>" in text:
        kept: list[str] = []
        last = 0
        for match in _HERMES.finditer(text):
            call = _call(match.group(1), names)
            if call is None:
                continue
            kept.append(text[last : match.start()])
            last = match.end()
            calls.append(call)
        content = "".join(kept) + text[last:]
    elif text.lstrip().startswith(_MISTRAL):
        body = text.lstrip()[len(_MISTRAL) :]
        found = [_call(json.dumps(item), names) for item in _json_list(body)]
        if found and all(c is not None for c in found):
            calls = [c for c in found if c is not None]
            content = ""
    elif (call := _call(text.strip(), names)) is not None:
        calls, content = [call], ""
    if not calls:
        return text, []
    return (content.strip() or None), calls


def _json_list(text: str) -> list[Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def _call(text: str, names: Collection[str]) -> tuple[str, str] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return str(value["name"]), json.dumps(arguments)
