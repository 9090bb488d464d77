"""What the gateway's handlers take and give, independent of the server in front of them
(Django's views and the ASGI fast path both adapt to these)."""

from __future__ import annotations

import json
import os
import random
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any

from shunter.engine.api.errors import ApiError

# Ids of requests and quota leases: 128 random bits from a generator seeded from the
# system once per process (and again in a forked child), not a system call per id.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


# The Retry-After of a 503: outages of an engine or the database last seconds at least.
UNAVAILABLE_RETRY_AFTER_S = 1


def new_id() -> str:
    """A fresh random id, 32 hex digits (unique across requests and processes)."""
    return f"{_ids.getrandbits(128):032x}"


@dataclass(frozen=True)
class GatewayRequest:
    """One HTTP request: ``headers`` is case-insensitive; ``body`` the whole body."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes


@dataclass
class Reply:
    """One response: ``body``, or ``stream`` (server-sent events, sent chunk by chunk as
    the iterator yields them)."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    stream: AsyncGenerator[bytes, None] | None = None
    content_type: str = "application/json"


def json_reply(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, dict(headers or {}), json.dumps(payload).encode())


def error_reply(
    error: ApiError, request_id: str, headers: Mapping[str, str] | None = None
) -> Reply:
    """``error``'s OpenAI body, with the request id and any extra headers; a 503 (a
    part of the service is down) says when to try again (``Retry-After``) unless the
    extra headers do."""
    extra = {**(headers or {}), "X-Request-Id": request_id}
    if error.status == 503:
        extra.setdefault("Retry-After", str(UNAVAILABLE_RETRY_AFTER_S))
    return json_reply(error.body(), error.status, extra)
