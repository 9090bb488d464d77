"""Token log-probabilities in the OpenAI API's two shapes (chat and completions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shunter.engine.exec.params import TokenLogprob


def token_text(table: Sequence[bytes], token_id: int) -> str:
    """A token's own text (a partial UTF-8 character shows as U+FFFD)."""
    data = table[token_id] if 0 <= token_id < len(table) else b""
    return data.decode("utf-8", errors="replace")


def chat_logprobs(entries: Sequence[TokenLogprob], table: Sequence[bytes]) -> dict[str, Any]:
    """``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        data = table[token_id] if 0 <= token_id < len(table) else b""
        return {"token": token_text(table, token_id), "logprob": logprob, "bytes": list(data)}

    return {
        "content": [
            {**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
            for e in entries
        ]
    }


def completion_logprobs(
    entries: Sequence[TokenLogprob], table: Sequence[bytes], text_offset: int
) -> dict[str, Any]:
    """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, offsets counted
    from ``text_offset`` (the length of the choice's token texts before these)."""
    tokens = [token_text(table, e.token_id) for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{token_text(table, t): lp for t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }
