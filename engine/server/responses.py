"""The bodies of OpenAI's completions and chat answers: each choice (whole or as a
stream chunk, with its logprobs, finish and stop reasons), the envelope around the
choices, and the usage."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from shunter.engine.api.structured import Structure, required_calls
from shunter.engine.api.tool_parsers import parse_tool_calls
from shunter.engine.exec.params import TokenLogprob
from shunter.engine.server.logprobs import chat_logprobs, completion_logprobs
from shunter.engine.server.models import ServedModel


@dataclass
class Choice:
    """One choice of an answer as its deltas arrive: text, token ids, logprobs, and why
    it ended."""

    index: int
    prompt_tokens: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # the stop string or token that ended it
    logprobs: list[TokenLogprob] = field(default_factory=list)
    logprob_offset: int = 0  # completions: text length of the tokens reported so far


class Call:
    """One HTTP generation request: its choices' streams and the response format."""

    def __init__(
        self,
        chat: bool,
        request_id: str,
        served: ServedModel,
        extras: dict[str, Any],
        with_logprobs: bool,
        structure: Structure | None = None,
    ) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id
        self.model = served.name
        self.token_bytes = served.token_bytes
        self.with_logprobs = with_logprobs
        self.created = int(time.time())
        self.return_token_ids = bool(extras.get("return_token_ids"))
        self.structure = structure or Structure()

    @property
    def holds_text(self) -> bool:
        """Whether a stream holds a choice's text back until it ends: an answer read as
        tool calls is sent whole, as calls (and the content left beside them)."""
        return self.chat and self.structure.calls_tools

    def tool_calls(self, c: Choice) -> tuple[str | None, list[dict[str, Any]]]:
        """A finished choice read as tool calls: its content (None when only calls were
        written) and its calls in OpenAI's shape, each with a fresh id."""
        s = self.structure
        if s.mode == "named" and s.function is not None:
            calls = [(s.function, _compact(c.text))]
            content = None
        elif s.mode == "required":
            calls, content = required_calls(c.text), None
            if not calls:  # cut before the array closed: what was written is content
                content = c.text
        else:
            content, calls = parse_tool_calls(c.text, {t.name for t in s.tools})
        return content, [
            {
                "id": "call_" + secrets.token_hex(12),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            for name, arguments in calls
        ]

    def message(self, c: Choice) -> tuple[dict[str, Any], str | None]:
        """A whole choice's ``message`` and finish reason (``tool_calls`` when it made
        calls and was not cut by the length limit)."""
        if not self.structure.calls_tools:
            return {"role": "assistant", "content": c.text}, c.finish_reason
        content, calls = self.tool_calls(c)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if not calls:
            return message, c.finish_reason
        message["tool_calls"] = calls
        return message, "tool_calls" if c.finish_reason == "stop" else c.finish_reason

    def final_delta(self, c: Choice) -> tuple[dict[str, Any], str | None]:
        """The held-back stream's last delta: the content and the calls, each call with
        its ``index``, and the finish reason."""
        message, finish = self.message(c)
        delta: dict[str, Any] = {}
        if message.get("content"):
            delta["content"] = message["content"]
        if "tool_calls" in message:
            delta["tool_calls"] = [
                {"index": i, **call} for i, call in enumerate(message["tool_calls"])
            ]
        return delta, finish

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def envelope(self, choices: list[dict[str, Any]], *, chunk: bool) -> dict[str, Any]:
        obj = self.object + (".chunk" if chunk and self.chat else "")
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def choice(
        self,
        c: Choice,
        text: str,
        token_ids: list[int],
        finish: str | None,
        *,
        chunk: bool,
        first: bool = False,
        logprobs: list[TokenLogprob] | None = None,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"index": c.index}
        if self.chat:
            if chunk and self.holds_text and finish is not None and not first:
                out["delta"], finish = self.final_delta(c)
            elif chunk:
                delta = {} if self.holds_text else {"content": text}
                out["delta"] = {"role": "assistant", "content": ""} if first else delta
            else:
                out["message"], finish = self.message(c)
        else:
            out["text"] = text
        out["logprobs"] = self._logprobs(c, logprobs or [])
        out["finish_reason"] = finish
        # vLLM's: the stop string or stop token id that ended the choice, else null.
        out["stop_reason"] = c.stop_reason if finish is not None else None
        if self.return_token_ids:
            out["token_ids"] = token_ids
        return out

    def _logprobs(self, c: Choice, entries: list[TokenLogprob]) -> dict[str, Any] | None:
        if not self.with_logprobs:
            return None
        if self.chat:
            return chat_logprobs(entries, self.token_bytes)
        out = completion_logprobs(entries, self.token_bytes, c.logprob_offset)
        c.logprob_offset += sum(len(t) for t in out["tokens"])
        return out


def usage(choices: list[Choice], prompts: list[list[int]]) -> dict[str, int]:
    prompt = sum(len(p) for p in prompts)
    completion = sum(len(c.token_ids) for c in choices)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _compact(text: str) -> str:
    """A named call's arguments as compact JSON, or as written when cut short."""
    try:
        return json.dumps(json.loads(text))
    except ValueError:
        return text
