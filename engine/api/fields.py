"""The checks of a request's fields that need the model (``requests`` has their types
and bounds): token ids against its vocabulary. Pure parsing, no torch."""

from __future__ import annotations

from typing import Any

from shunter.engine.api.errors import bad_request


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def token_ids(value: list[int] | None, name: str, vocab_size: int) -> tuple[int, ...]:
    """Token ids of a ``vocab_size``-token vocabulary (none: empty)."""
    if not value:
        return ()
    if min(value) < 0 or max(value) >= vocab_size:
        raise bad_request(
            f"'{name}' holds a token id outside the vocabulary ({vocab_size} tokens).", name
        )
    return tuple(value)


def logit_bias(value: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: token ids (as JSON object keys) to biases (in [-100, 100],
    ``requests`` checks)."""
    if not value:
        return ()
    biases = []
    for key, bias in value.items():
        token = int(key) if key.isdigit() else -1
        if not 0 <= token < vocab_size:
            raise bad_request(
                f"'logit_bias' key {key!r} is not a token id of this model (0..{vocab_size - 1}).",
                "logit_bias",
            )
        biases.append((token, float(bias)))
    return tuple(sorted(biases))
