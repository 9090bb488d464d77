"""Hostile client input for the gateway's and the engine's tests: bodies that Python's
JSON parser or the tokenizer choke on, raw HTTP the servers' parsers refuse, and the
check that every refusal is an OpenAI error body."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any

from hypothesis import strategies as st

GENERATE = b'{"model": "llama", "prompt": "hi", '
# (name, body, a word of the message): each a 400 invalid_request_error from both servers.
HOSTILE_BODIES: list[tuple[str, bytes, str]] = [
    ("deep arrays", b'{"model": "llama", "prompt": ' + b"[" * 9999 + b"]" * 9999 + b"}", "deep"),
    ("deep objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "deep"),
    ("unclosed arrays", b"[" * 100_000, "deep"),
    ("huge integer", GENERATE + b'"max_tokens": ' + b"9" * 5000 + b"}", "digits"),
    ("NaN", GENERATE + b'"temperature": NaN}', "NaN"),
    ("Infinity", GENERATE + b'"temperature": -Infinity}', "Infinity"),
    ("overflowing float", GENERATE + b'"temperature": 1e999}', "range"),
    ("surrogate in prompt", b'{"model": "llama", "prompt": "a\\ud800b"}', "surrogate"),
    (
        "surrogate in a message",
        b'{"model": "llama", "messages": [{"role": "user", "content": "\\udfff"}]}',
        "surrogate",
    ),
    ("surrogate in a key", GENERATE + b'"\\udc00": 1}', "surrogate"),
    ("invalid UTF-8", b'{"model": "llama", "prompt": "\xc3\x28"}', "UTF-8"),
]

GENERATION_FIELDS = (
    "model", "prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "seed",
    "stop", "n", "stream", "stream_options", "presence_penalty", "frequency_penalty", "user",
    "ignore_eos", "min_tokens", "logprobs", "top_logprobs", "max_completion_tokens",
)  # fmt: skip


def body_of_size(size: int, model: str) -> bytes:
    """A completion request for ``model`` of exactly ``size`` bytes (padded in its
    ``user`` field): for the servers' body limits at their edge."""
    head = json.dumps({"model": model, "prompt": "hi", "user": ""}).encode()
    body = head[:-2] + b"x" * (size - len(head)) + head[-2:]
    assert len(body) == size and json.loads(body)["model"] == model
    return body


def assert_openai_error(status: int, body: bytes) -> dict[str, Any]:
    """The error of a refusal: a 4xx with exactly OpenAI's error body."""
    assert 400 <= status < 500, (status, body[:500])
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, body[:500]
    assert error["message"] and "Traceback" not in error["message"]
    return dict(error)


def raw_exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` (raw HTTP/1.1) to the loopback ``port`` and read the reply until
    the server closes: status, headers (lower-case names), body. A server that refuses
    the request before it has all arrived closes while it is sent: that is not an error."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        reply = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=12,
    )


def _dump(value: Any) -> bytes:
    # Non-finite floats become NaN / Infinity literals, lone surrogates \\udxxx escapes.
    return json.dumps(value).encode()


def hostile_bodies(model: str) -> st.SearchStrategy[bytes]:
    """Request bodies of every hostile class: nesting to random depths, integers past any
    limit, lone surrogates, bytes that are not UTF-8, bodies that are not objects, and
    generation requests (one token) with a field of a random type."""
    depth = st.integers(1, 3000)
    nested = depth.map(lambda d: b"[" * d + b"]" * d) | depth.map(
        lambda d: b'{"a":' * d + b"0" + b"}" * d
    )
    # As digits, not ints: hypothesis itself cannot print an int past 4300 digits.
    digits = st.from_regex(r"\A-?[1-9][0-9]{60,6000}\Z").map(str.encode)
    huge = digits.map(
        lambda n: _dump({"model": model, "prompt": "hi", "max_tokens": 1})[:-1] + b', "seed": '
        + n + b"}"
    )
    surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1)
    lone = st.tuples(st.text(max_size=5), surrogates).map(
        lambda t: _dump({"model": model, "prompt": t[0] + t[1], "max_tokens": 1})
    )
    not_objects = _json_values().filter(lambda v: not isinstance(v, dict)).map(_dump)
    wrong_types = st.tuples(st.sampled_from(GENERATION_FIELDS), _json_values()).map(
        lambda t: _dump({"model": model, "prompt": "hi", "max_tokens": 1, t[0]: t[1]})
    )
    return st.one_of(nested, huge, lone, st.binary(max_size=64), not_objects, wrong_types)
