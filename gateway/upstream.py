"""The gateway's connection to its engines: the HTTP session, the timeouts, the wait for
an engine's first byte, and reading what an engine answers.

One aiohttp session per event loop, no pool limit, a 1 s connect timeout (an
unreachable engine is a 503 ``engine_unavailable`` within 2 s), and no cookie jar (an
engine's cookie is no client's).

An engine that sends no byte for ``first_byte_s`` (a few times the deployment's TTFT
target) is probed on ``/health``: one that does not answer is hung (stopped, wedged),
and the request can move on instead of waiting out the read timeout; an engine that
answers is only slow, and is waited for.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import aiohttp
import yarl
from django.conf import settings

from shunter.engine.api.errors import ApiError
from shunter.gateway.loop_local import LoopLocal
from shunter.gateway.routes import Route

T = TypeVar("T")

CONNECT_TIMEOUT_S = 1.0
# A request without a byte of answer after this many times its TTFT target (and at
# least FIRST_BYTE_MIN_S) has its engine probed: an engine serving within its SLO
# class sends a stream's head at admission and far inside its TTFT target.
FIRST_BYTE_TTFTS = 4.0
FIRST_BYTE_MIN_S = 2.0
# A health probe unanswered this long: the engine is hung (the control plane's poll
# gives an engine's calls as long: ``engine_client.DEFAULT_TIMEOUT_S``).
HEALTH_PROBE_S = 2.0


class EngineHung(Exception):
    """An engine that holds a request without a byte of answer and does not answer its
    health probe either (stopped, wedged)."""


def first_byte_s(route: Route) -> float:
    """How long a request waits for its engine's first byte before the gateway asks
    whether the engine is alive: ``FIRST_BYTE_TTFTS`` times the deployment's TTFT
    target, at least ``FIRST_BYTE_MIN_S``."""
    return max(FIRST_BYTE_MIN_S, FIRST_BYTE_TTFTS * route.ttft_ms / 1000)


async def engine_answers(route: Route) -> bool:
    """Whether ``route``'s engine answers ``GET /health`` (any status: a draining engine
    answers) within ``HEALTH_PROBE_S``."""
    try:
        async with sessions.get().get(
            f"{route.engine_url}/health",
            timeout=aiohttp.ClientTimeout(total=HEALTH_PROBE_S),
        ) as reply:
            await reply.read()
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False
    return True


def read_timeout(read_s: float | None) -> aiohttp.ClientTimeout:
    """Connecting within ``CONNECT_TIMEOUT_S``, then at most ``read_s`` between reads."""
    return aiohttp.ClientTimeout(
        total=None, connect=CONNECT_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S, sock_read=read_s
    )


def _new_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        timeout=read_timeout(None),
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


_urls: dict[tuple[str, str], yarl.URL] = {}


def engine_url(route: Route, path: str) -> yarl.URL:
    """``route``'s engine URL of ``path``, parsed once (not on every request)."""
    key = (route.engine_url, path)
    url = _urls.get(key)
    if url is None:
        if len(_urls) > 10_000:
            _urls.clear()
        url = _urls[key] = yarl.URL(f"{route.engine_url}/v1/{path}")
    return url


sessions: LoopLocal[aiohttp.ClientSession] = LoopLocal(_new_session)


async def open_response(
    post: Awaitable[aiohttp.ClientResponse],
    route: Route,
    other_replica: Callable[[], Awaitable[Route | None]],
) -> tuple[aiohttp.ClientResponse, bytes]:
    """The engine's response once its head arrives, with a stream's first bytes
    (``b""`` for any other answer): nothing reaches the client before the stream's
    first event, so an engine that fails before it can still be failed over. A
    response whose first event does not come is closed before the error is raised.
    ``other_replica`` as ``first_byte``'s."""
    upstream = await first_byte(post, route, other_replica)
    if upstream.status != 200 or upstream.content_type != "text/event-stream":
        return upstream, b""
    try:
        return upstream, await first_byte(first_chunk(upstream), route, other_replica)
    except BaseException:
        upstream.close()
        raise


async def first_byte(
    post: Awaitable[T],
    route: Route,
    other_replica: Callable[[], Awaitable[Route | None]],
) -> T:
    """``post``'s result once the engine's head (or a stream's first event)
    arrives. While it has not, the engine is asked ``/health`` every
    ``first_byte_s(route)``: one that does not answer is hung (``EngineHung``) when
    another replica can take the request (``other_replica`` names one), or after
    ``settings.NODE_POLL_MISSES`` unanswered probes in a row when none can; one that
    answers is slow (queued, a long answer not streamed) and is waited for."""
    answer = asyncio.ensure_future(post)
    watch_s = first_byte_s(route)
    unanswered = 0
    try:
        while True:
            done, _ = await asyncio.wait({answer}, timeout=watch_s)
            if done:
                return answer.result()
            if await engine_answers(route):
                unanswered = 0
                continue
            unanswered += 1
            if unanswered >= settings.NODE_POLL_MISSES or await other_replica():
                raise EngineHung(
                    f"The engine of {route.model_name!r} on node "
                    f"{route.node_name!r} sent nothing for {watch_s:g} s and does not "
                    f"answer its health probe"
                )
    finally:
        if not answer.done():
            answer.cancel()


async def first_chunk(upstream: aiohttp.ClientResponse) -> bytes:
    """A stream's first bytes (an event, or a keep-alive comment of a queued request)."""
    chunk = await upstream.content.readany()
    if not chunk:
        raise aiohttp.ClientPayloadError("the stream ended before its first event")
    return chunk


async def chunks(first: bytes, upstream: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """A stream's bytes as they arrive, from its ``first`` bytes on."""
    yield first
    async for data in upstream.content.iter_any():
        yield data


def cannot_serve_now(status: int, raw: bytes) -> bool:
    """An engine answer that says nothing about the request, only that this replica
    cannot serve it now: 503 (draining, stalled, loading) or a 404 for the model (the
    route table says it serves it: it is reloading its models)."""
    if status == 503:
        return True
    error = error_of(raw) if status == 404 else None
    return error is not None and error.code == "model_not_found"


def error_of(raw: bytes) -> ApiError | None:
    """The ApiError of an OpenAI error body, None if ``raw`` is not one."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None
    return ApiError(
        0,
        error["message"],
        type=str(error.get("type") or "server_error"),
        param=error.get("param"),
        code=error.get("code"),
    )
