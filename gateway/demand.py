"""What a generation request asks of the engine, counted from its body before it is
admitted: its sequences (prompts x ``n``, or ``best_of`` when larger) and an upper
estimate of its tokens, which the quotas reserve (``gateway.quotas``).

The gateway does not tokenize. A text's tokens are estimated by its UTF-8 byte length,
which bounds the token count of byte-level BPE tokenizers (every token covers at least
one byte), plus ``PROMPT_MARGIN`` tokens per prompt (the special tokens a tokenizer adds)
and ``MESSAGE_MARGIN`` per chat message (the template's role markers); a prompt of token
ids counts exactly. No prompt counts more than the deployment's context. A template may
add more (a default system prompt): the reservation is settled to the engine's usage
when the response ends, which corrects the estimate. Without ``max_tokens`` a chat
request may run to the end of the context, and a completions request to OpenAI's default
of 16 tokens (what the engine does).

Bodies reach here read through the request models (``engine.api.requests``), so their
fields have their types; what only the engine can check (a prompt's length against the
context) it refuses with the exact reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shunter.engine.api.protocol import COMPLETIONS_DEFAULT_MAX_TOKENS
from shunter.gateway.errors import bad_request

PROMPT_MARGIN = 8
MESSAGE_MARGIN = 8


@dataclass(frozen=True)
class Demand:
    """``sequences`` run at once, each of up to ``max_tokens`` output tokens, after
    ``prompt_tokens`` (an upper estimate, every prompt counted once)."""

    sequences: int
    prompt_tokens: int
    max_tokens: int

    @property
    def reserve(self) -> int:
        """The tokens the quotas reserve: the prompts plus every sequence's output."""
        return self.prompt_tokens + self.max_tokens * self.sequences


def _positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return None


def _utf8_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _text_tokens(text: str) -> int:
    return _utf8_bytes(text) + PROMPT_MARGIN


def _prompts(body: dict[str, Any]) -> list[int]:
    """A completions body's prompts, each as its token estimate (uncapped)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [_text_tokens(prompt)]
    if not isinstance(prompt, list) or not prompt:
        return [0]
    if all(isinstance(p, int) for p in prompt):
        return [len(prompt)]
    return [
        _text_tokens(p) if isinstance(p, str) else len(p) if isinstance(p, list) else 0
        for p in prompt
    ]


def _message_tokens(messages: Any) -> int:
    if not isinstance(messages, list):
        return 0
    total = PROMPT_MARGIN
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = "".join(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
        text = content if isinstance(content, str) else ""
        total += _utf8_bytes(text) + MESSAGE_MARGIN
    return total


def demand_of(
    body: dict[str, Any], endpoint: str, context_tokens: int, max_sequences: int
) -> Demand:
    """The demand of a ``chat`` or ``completions`` body on a deployment of
    ``context_tokens``; a 400 when it runs more than ``max_sequences`` sequences."""
    chat = endpoint == "chat"
    prompts = [_message_tokens(body.get("messages"))] if chat else _prompts(body)
    n = _positive_int(body.get("n")) or 1
    per_prompt = max(n, _positive_int(body.get("best_of")) or 1)
    sequences = len(prompts) * per_prompt
    if sequences > max_sequences:
        fan_out = "n" if per_prompt == n else "best_of"
        # The prompt list is at fault when it alone is too long (or nothing fans out).
        param = "prompt" if per_prompt == 1 or len(prompts) > max_sequences else fan_out
        raise bad_request(
            f"This request runs {sequences} sequences ({len(prompts)} prompts x "
            f"{fan_out}={per_prompt}); at most {max_sequences} are allowed per request.",
            param,
        )
    estimates = [min(p, context_tokens) for p in prompts]
    given = body.get("max_completion_tokens") if chat else None
    max_tokens = _positive_int(given) or _positive_int(body.get("max_tokens"))
    if max_tokens is None:
        room = max(1, context_tokens - max(estimates))
        max_tokens = room if chat else min(COMPLETIONS_DEFAULT_MAX_TOKENS, room)
    return Demand(sequences, sum(estimates), min(max_tokens, context_tokens))
