"""The bodies of OpenAI's completions and chat answers: each choice (whole or as a
stream chunk, with its logprobs, finish and stop reasons), the envelope around the
choices, and the usage."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

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
    ) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id
        self.model = served.name
        self.token_bytes = served.token_bytes
        self.with_logprobs = with_logprobs
        self.created = int(time.time())
        self.return_token_ids = bool(extras.get("return_token_ids"))

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
            if chunk:
                out["delta"] = {"role": "assistant", "content": ""} if first else {"content": text}
            else:
                out["message"] = {"role": "assistant", "content": text}
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
