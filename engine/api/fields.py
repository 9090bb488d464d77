"""One field of a request body each: typed reads that raise a 400 naming the field.
Pure parsing, no torch."""

from __future__ import annotations

import math
from typing import Any

from shunter.engine.api.errors import bad_request

MAX_STOP = 4
MAX_LOGIT_BIAS = 300  # entries, as the OpenAI API bounds it


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(
    body: dict[str, Any], name: str, lo: int, hi: int | None, default: int | None
) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not is_int(value):
        raise bad_request(f"'{name}' must be an integer.", name)
    if value < lo or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise bad_request(f"'{name}' must be {bounds}, got {value}.", name)
    return int(value)


def number(
    body: dict[str, Any], name: str, lo: float, hi: float, default: float, *, open_low: bool = False
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not (is_int(value) or isinstance(value, float)) or not math.isfinite(value):
        raise bad_request(f"'{name}' must be a number.", name)
    if value < lo or value > hi or (open_low and value == lo):
        low = "(" if open_low else "["
        raise bad_request(f"'{name}' must be in {low}{lo}, {hi}], got {value}.", name)
    return float(value)


def boolean(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean.", name)
    return value


def top_k(body: dict[str, Any]) -> int:
    value = body.get("top_k")
    if value is None or value == -1:  # vLLM's "off"
        return 0
    return integer(body, "top_k", 0, None, 0) or 0


def min_tokens(body: dict[str, Any], max_tokens: int) -> int:
    value = integer(body, "min_tokens", 0, None, 0) or 0
    if value > max_tokens:
        raise bad_request(
            f"'min_tokens' ({value}) must not exceed max_tokens ({max_tokens}).", "min_tokens"
        )
    return value


def token_ids(body: dict[str, Any], name: str, vocab_size: int, limit: int) -> tuple[int, ...]:
    """A list of at most ``limit`` token ids of a ``vocab_size``-token vocabulary."""
    value = body.get(name)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(is_int(t) for t in value):
        raise bad_request(f"'{name}' must be a list of token ids.", name)
    if len(value) > limit:
        raise bad_request(f"'{name}' takes at most {limit} token ids.", name)
    if value and (min(value) < 0 or max(value) >= vocab_size):
        raise bad_request(
            f"'{name}' holds a token id outside the vocabulary ({vocab_size} tokens).", name
        )
    return tuple(value)


def logit_bias(value: Any, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: token ids (as JSON object keys) to biases in
    [-100, 100]."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise bad_request("'logit_bias' must map token ids to biases.", "logit_bias")
    if len(value) > MAX_LOGIT_BIAS:
        raise bad_request(f"'logit_bias' takes at most {MAX_LOGIT_BIAS} tokens.", "logit_bias")
    biases = []
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and key.isdigit() else -1
        if not 0 <= token < vocab_size:
            raise bad_request(
                f"'logit_bias' key {key!r} is not a token id of this model (0..{vocab_size - 1}).",
                "logit_bias",
            )
        if not (is_int(bias) or isinstance(bias, float)) or not -100 <= bias <= 100:
            raise bad_request(
                f"'logit_bias' values must be numbers in [-100, 100], got {bias!r}.",
                "logit_bias",
            )
        biases.append((token, float(bias)))
    return tuple(sorted(biases))


def stop_strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_request("'stop' must be a non-empty string or a list of them.", "stop")
    if len(stops) > MAX_STOP:
        raise bad_request(f"'stop' takes at most {MAX_STOP} strings.", "stop")
    return tuple(stops)
