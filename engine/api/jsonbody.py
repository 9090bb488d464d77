"""Request bodies as JSON, refused cleanly when hostile: the one parser of the gateway's
and the engine's request bodies.

``parse_json`` answers every body it cannot take with an ``ApiError`` (413 past the
size limit, else 400 ``invalid_request_error``), never with the errors Python's own
parser lets through: ``RecursionError`` on deep nesting, ``ValueError`` on integers past
Python's digit limit, and strings with lone surrogates (``"\\ud800"``), which break every
encoder downstream (the tokenizer, the database, the logs).

The checks that would slow every body are gated by cheap scans of the raw bytes: the
nesting depth is counted over the bytes outside strings (all JSON's structure is ASCII,
so no decoding is needed), the integer hook is installed only when a long run of digits
is there, and strings are walked for surrogates only when a surrogate escape is.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NoReturn

import numpy as np

from shunter.engine.api.errors import ApiError, bad_request

MAX_BODY_BYTES = 4 * 1024 * 1024
"""Bodies past this many bytes are a 413 (the engine's ``client_max_size`` too)."""
MAX_DEPTH = 64
"""Arrays and objects nest at most this deep (tool schemas nest a dozen levels)."""
MAX_INT_DIGITS = 64
"""Integer literals have at most this many digits (token ids and seeds need 20)."""

# Escapes first (``\\`` pairs, then escaped quotes), so that what remains of a string
# is quote, no quote, quote.
_STRING = re.compile(rb'"[^"]*"')
_OPEN_CLOSE = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 / -1 as int8
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")
_LONG_DIGITS = re.compile(rb"\d{%d}" % (MAX_INT_DIGITS + 1))
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def parse_json(raw: bytes, *, max_bytes: int | None = MAX_BODY_BYTES) -> Any:
    """The JSON value of ``raw``, which must be at most ``max_bytes`` (None: the caller
    has bounded it) of UTF-8 JSON,
    nested at most ``MAX_DEPTH`` deep, with no integer literal of more than
    ``MAX_INT_DIGITS`` digits, no NaN or infinity (literal or overflowing) and only
    valid Unicode in its strings. ``ApiError`` (413, or 400) otherwise."""
    if max_bytes is not None and len(raw) > max_bytes:
        raise ApiError(
            413,
            f"The request body is too large: {len(raw)} bytes, at most {max_bytes}.",
            code="request_too_large",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_request("The request body is not valid UTF-8.") from None
    structure = _STRING.sub(b"", raw.replace(b"\\\\", b"").replace(b'\\"', b""))
    if _depth(structure) > MAX_DEPTH:
        raise bad_request(
            f"The request body nests arrays and objects more than {MAX_DEPTH} levels deep."
        )
    hooks: dict[str, Any] = {"parse_float": _finite_float, "parse_constant": _no_constant}
    if _LONG_DIGITS.search(structure):
        hooks["parse_int"] = _short_int
    try:
        value = json.loads(text, **hooks)
    except json.JSONDecodeError as e:
        raise bad_request(f"The request body is not valid JSON: {e}.") from None
    if _SURROGATE_ESCAPE.search(raw):
        _check_strings(value)
    return value


def _depth(structure: bytes) -> int:
    """The deepest nesting of ``[`` and ``{`` over any prefix (strings removed)."""
    steps = np.frombuffer(structure.translate(_OPEN_CLOSE, _NOT_BRACKET), dtype=np.int8)
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def _short_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise bad_request(f"The request body has an integer of more than {MAX_INT_DIGITS} digits.")
    return int(literal)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise bad_request(f"The request body has a number out of range: {literal[:32]}.")
    return value


def _no_constant(literal: str) -> NoReturn:
    raise bad_request(f"The request body has {literal}, which JSON does not allow.")


def _check_strings(value: Any) -> None:
    """400 if a string (key or value) anywhere in ``value`` holds a lone surrogate
    (the parser has paired every valid pair into one character)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str) and _SURROGATE.search(item):
            raise bad_request(
                "The request body has a string with a lone surrogate (\\ud800-\\udfff), "
                "which is not valid Unicode."
            )
