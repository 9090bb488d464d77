"""Forwarding one admitted request to its engine, timing it as the client sees it, and
accounting for it afterwards.

Upstream: one aiohttp session per event loop, no pool limit, a 1 s connect timeout (an
unreachable engine is a 503 ``engine_unavailable`` within 2 s), and no cookie jar (an
engine's cookie is no client's). Streams are relayed event
by event as they arrive, never buffered; the engine is always asked for usage, on
every chunk (``stream_options.include_usage`` and ``continuous_usage_stats``), so
streamed tokens count against quotas like non-streamed ones, and a stream that ends
early counts the tokens the engine last reported, however many shared a chunk. The
usage reaches the client only as it asked for it. A stream that ends before any usage
counts the prompt the engine reported in ``X-Shunter-Prompt-Tokens``.

A request that failed before a byte of it reached the client (the engine refused the
connection, reset it, answered 503 or said it does not serve the model: it is
reloading) is sent once more to another replica of the model, and the failed one
cools (``balancer``). An engine that sends no byte for ``first_byte_s`` (a few times
the deployment's TTFT target) is probed on ``/health``: one that does not answer is
hung (stopped, wedged), and the request moves on the same way instead of waiting out
the read timeout; an engine that answers is only slow, and is waited for. A stream's
head goes to the client with its first event (or keep-alive), so an engine that fails
between the two is failed over as well.

Reads time out: an engine streams an event or a keep-alive comment every few seconds,
so a stream silent for ``STREAM_IDLE_S`` is ended like a broken one (a terminating
``engine_unavailable`` event); a non-streamed answer may take up to the
``GATEWAY_READ_TIMEOUT_S`` setting, then the client gets a 504 ``engine_unavailable``.

Timing (ARCHITECTURE.md's definitions, measured at the gateway): TTFT from the request's
arrival to the first chunk that carries output; ITL between consecutive output chunks
of a choice (max ITL kept); TPOT = (last - first) / (tokens per choice - 1). A
non-streamed response shows all its tokens at once; the engine's ``X-Shunter-Timing``
gives its TPOT and max ITL, and its TTFT is the gateway's end-to-end time less how long
the engine held the answer after its first token (engine ``e2e_ms - ttft_ms``). From an
engine without that header (vLLM) TTFT is the end-to-end time and TPOT, max ITL and
whether it met its TBT target are unknown (None).

While the exchange runs it renews its concurrency lease (``LeaseHold``). When the
response ends, however it ends (done, engine failure, client gone), a task gives back
the lease and settles the tokens to the usage recorded (retried in the background while
the quota store is unreachable), then writes the RequestRecord, off the stream's path. A
request the engine failed before any output (unreachable, refused it with a non-200,
broke before the first event) is refunded: it leaves the requests-per-minute window.
Records are written in batches (``RecordWriter``): those that end while one batch is
being written go together in the next, one transaction on one database thread; records
of a batch that did not commit (the database unreachable, the commit refused) are
spooled to local disk and replayed when it answers again (``spool``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import yarl
from django.conf import settings

from shunter.engine.api.errors import ApiError
from shunter.engine.api.headers import PROMPT_TOKENS_HEADER, SLO_HEADER, TENANT_HEADER
from shunter.engine.api.timing import TIMING_HEADER, EngineTiming
from shunter.gateway.errors import engine_unavailable
from shunter.gateway.replies import Reply, error_reply
from shunter.gateway.routes import Route, routes
from shunter.gateway.spool import PendingRecord, RecordSpool, SpoolReplayer
from shunter.tenants.auth import DATABASE_DOWN, KeyGrant, await_shared, submit_db
from shunter.tenants.quotas import Admission, LoopLocal, quota_limiter

log = logging.getLogger("shunter.gateway")
T = TypeVar("T")

CONNECT_TIMEOUT_S = 1.0
# Tries of a request that fails before its first byte reached the client: the first
# replica, then one other.
MAX_ATTEMPTS = 2
# A request without a byte of answer after this many times its TTFT target (and at
# least FIRST_BYTE_MIN_S) has its engine probed: an engine serving within its SLO
# class sends a stream's head at admission and far inside its TTFT target.
FIRST_BYTE_TTFTS = 4.0
FIRST_BYTE_MIN_S = 2.0
# A health probe unanswered this long: the engine is hung (the control plane's poll
# gives an engine's calls as long: ``engine_client.DEFAULT_TIMEOUT_S``).
HEALTH_PROBE_S = 2.0
# The longest silence of a stream (no event, no keep-alive) before it counts as broken.
STREAM_IDLE_S = 30.0
DONE = b"data: [DONE]\n\n"


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
# Nodes whose engine refused the gateway's engine token (warned about once).
_token_refused_nodes: set[str] = set()
# Accounting tasks, referenced until done (the loop keeps only weak references).
_background: set[asyncio.Task[None]] = set()
# At shutdown, how long the last requests' accounting may take before connections close.
SHUTDOWN_ACCOUNTING_S = 5.0


async def close_upstream(timeout_s: float = SHUTDOWN_ACCOUNTING_S) -> None:
    """What the server runs when it stops, on its loop, after its last request: wait (at
    most ``timeout_s``) for this loop's accounting tasks, then close the loop's upstream
    session and quota connections, so nothing is left for the collector to warn about."""
    loop = asyncio.get_running_loop()
    pending = [task for task in _background if task.get_loop() is loop]
    if pending:
        await asyncio.wait(pending, timeout=timeout_s)
    session = sessions.pop()
    if session is not None:
        await session.close()
    await quota_limiter().aclose()


@dataclass
class Timing:
    """Client-visible token times of one response (``perf_counter`` seconds)."""

    t0: float
    first: float | None = None
    last: float | None = None
    max_gap: float = 0.0
    token_chunks: int = 0
    _last_of: dict[int, float] = field(default_factory=dict)

    def token(self, index: int, now: float) -> None:
        prev = self._last_of.get(index)
        if prev is not None:
            self.max_gap = max(self.max_gap, now - prev)
        elif self.first is None:
            self.first = now
        self._last_of[index] = now
        self.last = now
        self.token_chunks += 1

    def all_at(self, now: float, engine: EngineTiming | None = None) -> None:
        """A non-streamed response: every token arrives at ``now``; with the
        ``engine``'s timing, the first when the client would have seen it streamed."""
        self.first = self.last = now
        self._last_of[0] = now
        if engine is not None:
            held_s = (engine.e2e_ms - engine.ttft_ms) / 1000
            self.first = max(self.t0, now - held_s)

    @property
    def num_choices(self) -> int:
        return max(1, len(self._last_of))


def _has_output(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return bool(text) or bool(choice.get("token_ids"))


class Exchange:
    """One admitted request: forwards it, relays the answer and accounts for it."""

    def __init__(
        self,
        *,
        grant: KeyGrant,
        route: Route,
        admission: Admission,
        request_id: str,
        endpoint: str,
        arrival: datetime,
        t0: float,
    ) -> None:
        self.grant = grant
        self.route = route
        self.admission = admission
        self.request_id = request_id
        self.endpoint = endpoint  # "chat" or "completions"
        self.arrival = arrival
        self.timing = Timing(t0)
        self.stream = False
        self.wants_usage = False
        self.wants_chunk_usage = False  # the client asked for continuous_usage_stats too
        self.done = False
        self.usage: dict[str, Any] = {}
        self.reported_prompt_tokens = 0  # X-Shunter-Prompt-Tokens
        self.engine_timing: EngineTiming | None = None  # X-Shunter-Timing
        self.status = "ok"
        self.error_type = ""
        self.http_status = 200
        self.t_end: float | None = None
        self._finished = False
        self._sent_to: int | None = None  # the deployment counted with this request
        # Renews the concurrency lease until the accounting settles it.
        self.hold = quota_limiter().hold(str(grant.tenant_id), admission)

    # -- forwarding ------------------------------------------------------------------------
    async def forward(self, body: dict[str, Any]) -> Reply:
        """Send ``body`` to the engine and answer the client (every path ends in
        ``finish_soon``)."""
        self.stream = body.get("stream") is True
        if self.stream:
            options = body.get("stream_options")
            if options is None or isinstance(options, dict):
                options = options or {}
                self.wants_usage = options.get("include_usage") is True
                self.wants_chunk_usage = (
                    self.wants_usage and options.get("continuous_usage_stats") is True
                )
                # Every chunk then carries the engine's token count so far: a stream that
                # ends early counts what the engine generated, not the chunks relayed.
                body["stream_options"] = {
                    **options,
                    "include_usage": True,
                    "continuous_usage_stats": True,
                }
        path = "chat/completions" if self.endpoint == "chat" else "completions"
        read_s = STREAM_IDLE_S if self.stream else settings.GATEWAY_READ_TIMEOUT_S
        data = json.dumps(body).encode()
        tried: set[int] = set()
        while True:
            tried.add(self.route.deployment_id)
            self._send_to(self.route)
            post = sessions.get().post(
                engine_url(self.route, path),
                data=data,
                headers=self._upstream_headers(),
                timeout=read_timeout(read_s),
            )
            try:
                upstream, first = await self._open(post, tried)
            except aiohttp.SocketTimeoutError as e:
                return self._timed_out(read_s, e)
            except EngineHung as e:
                if await self._fail_over(tried, e):
                    continue
                return self._unavailable(str(e), e)
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                if await self._fail_over(tried, e):
                    continue
                what = f"The engine of {self.route.model_name!r} is unreachable"
                return self._unavailable(what, e)
            except BaseException:
                self._end("aborted", "client_disconnected", 499)
                raise
            self.reported_prompt_tokens = _count(upstream.headers.get(PROMPT_TOKENS_HEADER))
            if upstream.status == 200:
                break
            raw = await self._read(upstream)
            if isinstance(raw, Reply):
                return raw
            if _cannot_serve_now(upstream.status, raw) and await self._fail_over(
                tried, f"HTTP {upstream.status}"
            ):
                continue
            return self._pass_error(upstream.status, raw)
        if upstream.content_type == "text/event-stream":
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            reply = Reply(200, headers, stream=self._relay(upstream, first))
            reply.content_type = "text/event-stream"
            return self._decorate(reply)
        return await self._collect(upstream)

    async def _open(
        self, post: Awaitable[aiohttp.ClientResponse], tried: set[int]
    ) -> tuple[aiohttp.ClientResponse, bytes]:
        """The engine's response once its head arrives, with a stream's first bytes
        (``b""`` for any other answer): nothing reaches the client before the stream's
        first event, so an engine that fails before it can still be failed over. A
        response whose first event does not come is closed before the error is raised."""
        upstream = await self._first_byte(post, tried)
        if upstream.status != 200 or upstream.content_type != "text/event-stream":
            return upstream, b""
        try:
            return upstream, await self._first_byte(_first_chunk(upstream), tried)
        except BaseException:
            upstream.close()
            raise

    async def _first_byte(self, post: Awaitable[T], tried: set[int]) -> T:
        """``post``'s result once the engine's head (or a stream's first event)
        arrives. While it has not, the engine is asked ``/health`` every
        ``first_byte_s(route)``: one that does not answer is hung (``EngineHung``) when
        another replica can take the request, or after ``settings.NODE_POLL_MISSES``
        unanswered probes in a row when none can; one that answers is slow (queued, a
        long answer not streamed) and is waited for."""
        answer = asyncio.ensure_future(post)
        watch_s = first_byte_s(self.route)
        unanswered = 0
        try:
            while True:
                done, _ = await asyncio.wait({answer}, timeout=watch_s)
                if done:
                    return answer.result()
                if await engine_answers(self.route):
                    unanswered = 0
                    continue
                unanswered += 1
                if unanswered >= settings.NODE_POLL_MISSES or await self._other_replica(tried):
                    raise EngineHung(
                        f"The engine of {self.route.model_name!r} on node "
                        f"{self.route.node_name!r} sent nothing for {watch_s:g} s and does not "
                        f"answer its health probe"
                    )
        finally:
            if not answer.done():
                answer.cancel()

    async def _other_replica(self, tried: set[int]) -> Route | None:
        """Another routable replica of the request's model, not ``tried``, while this
        request may be tried again (``MAX_ATTEMPTS``)."""
        if len(tried) >= MAX_ATTEMPTS:
            return None
        try:
            return await routes.choose(self.grant, self.route.model_name, exclude=tried)
        except ApiError:
            return None

    def _send_to(self, route: Route) -> None:
        """Count this request in flight on ``route`` (and no longer on the one before)."""
        if self._sent_to is not None:
            routes.balancer.finished(self._sent_to)
        self._sent_to = route.deployment_id
        routes.balancer.started(route.deployment_id)

    async def _fail_over(self, tried: set[int], why: object) -> bool:
        """Nothing reached the client yet: cool the replica that failed and move to
        another routable one of the model, once (``MAX_ATTEMPTS``); False when there is
        none to try."""
        failed = self.route
        routes.balancer.cool_down(failed.deployment_id)
        route = await self._other_replica(tried)
        if route is None:
            return False
        log.warning(
            "node %r failed request %s before its first byte (%s); retrying on node %r",
            failed.node_name,
            self.request_id,
            why,
            route.node_name,
        )
        self.route = route
        return True

    def _upstream_headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "X-Request-Id": self.request_id,
            TENANT_HEADER: tenant_label(self.grant),
            SLO_HEADER: slo_header(self.grant, self.route),
        }
        if self.route.engine_token:
            headers["Authorization"] = f"Bearer {self.route.engine_token}"
        return headers

    def _decorate(self, reply: Reply) -> Reply:
        reply.headers["X-Request-Id"] = self.request_id
        reply.headers.update(self.admission.headers())
        return reply

    def _unavailable(self, what: str, e: BaseException, status: int = 503) -> Reply:
        log.warning("%s (request %s): %r", what, self.request_id, e)
        error = engine_unavailable(f"{what}; try again later.", status=status)
        self._end("error", "engine_unavailable", status)
        return error_reply(error, self.request_id, self.admission.headers())

    def _timed_out(self, read_s: float, e: BaseException) -> Reply:
        what = f"The engine of {self.route.model_name!r} sent nothing for {read_s:g} s"
        return self._unavailable(what, e, status=504)

    async def _read(self, upstream: aiohttp.ClientResponse) -> bytes | Reply:
        """The engine's whole answer, or the 503 for an engine that failed while
        answering (504: that went silent); a client that leaves ends the exchange as
        aborted."""
        try:
            return await upstream.read()
        except aiohttp.SocketTimeoutError as e:
            return self._timed_out(settings.GATEWAY_READ_TIMEOUT_S, e)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            return self._unavailable("The engine failed while answering", e)
        except BaseException:
            self._end("aborted", "client_disconnected", 499)
            raise
        finally:
            upstream.release()

    def _pass_error(self, status: int, raw: bytes) -> Reply:
        """The engine refused with ``status`` and body ``raw``: both go to the client as
        is (a body in another shape is wrapped in one). An engine's 401 or 403 refuses
        the gateway's engine token, not the client's key: the client gets a 503
        ``engine_unavailable`` and the operator a warning (once per node)."""
        if status in (401, 403):
            node = self.route.node_name
            # Once per node and process: every request would repeat it.
            level = logging.DEBUG if node in _token_refused_nodes else logging.WARNING
            _token_refused_nodes.add(node)
            log.log(
                level,
                "the engine of node %r refused the gateway's engine token (%d): set the "
                "node's engine token to the engine's (admin or API); request %s",
                node,
                status,
                self.request_id,
            )
            name = self.route.model_name
            refusal = engine_unavailable(f"The engine of {name!r} is unavailable; try again later.")
            self._end("error", "engine_unavailable", refusal.status)
            return error_reply(refusal, self.request_id, self.admission.headers())
        error = _error_of(raw)
        if error is None:
            kind = "invalid_request_error" if status < 500 else "server_error"
            text = raw.decode(errors="replace")[:500] or "engine error"
            error = ApiError(status, f"The engine answered: {text}", type=kind)
            raw = json.dumps(error.body()).encode()
        self._end("error", str(error.code or error.type), status)
        return self._decorate(Reply(status, body=raw))

    async def _collect(self, upstream: aiohttp.ClientResponse) -> Reply:
        raw = await self._read(upstream)
        if isinstance(raw, Reply):
            return raw
        self.t_end = time.perf_counter()
        self.engine_timing = EngineTiming.parse(upstream.headers.get(TIMING_HEADER))
        self.timing.all_at(self.t_end, self.engine_timing)
        try:
            usage = json.loads(raw).get("usage")
        except (ValueError, AttributeError):
            usage = None
        self.usage = usage if isinstance(usage, dict) else {}
        self.done = True
        self._end("ok", "", 200)
        return self._decorate(Reply(200, body=raw))

    async def _relay(
        self, upstream: aiohttp.ClientResponse, first: bytes
    ) -> AsyncGenerator[bytes, None]:
        """The engine's events as they arrive, from its ``first`` bytes on. An engine
        that stops before ``[DONE]``, or sends nothing for ``STREAM_IDLE_S``, gets the
        client a terminating error event; a client that leaves closes the upstream
        connection, which aborts the request in the engine."""
        buffer = b""
        try:
            async for data in _chunks(first, upstream):
                now = time.perf_counter()
                buffer += data
                out = []
                while (end := buffer.find(b"\n\n")) >= 0:
                    event, buffer = buffer[: end + 2], buffer[end + 2 :]
                    if (passed := self._on_event(event, now)) is not None:
                        out.append(passed)
                if out:
                    yield b"".join(out)
            if not self.done:
                raise aiohttp.ClientPayloadError("the stream ended before [DONE]")
            self._end(self.status, self.error_type, 200)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            log.warning("engine stream of request %s broke: %r", self.request_id, e)
            self._end("error", "engine_unavailable", 200)
            if isinstance(e, aiohttp.SocketTimeoutError):
                what = f"The engine sent nothing for {STREAM_IDLE_S:g} s"
            else:
                what = "The engine stopped"
            error = engine_unavailable(f"{what} in the middle of the response.")
            yield b"data: " + json.dumps(error.body()).encode() + b"\n\n" + DONE
        except BaseException:
            self._end("aborted", "client_disconnected", 499)
            raise
        finally:
            if self.done:
                upstream.release()
            else:
                upstream.close()

    def _on_event(self, event: bytes, now: float) -> bytes | None:
        """Account for one SSE event; what to pass on (None: nothing). The usage every
        chunk carries (the engine's count so far) is kept as the latest count and left
        out of what the client sees unless it asked for it."""
        if not event.startswith(b"data: "):
            return event
        payload = event[6:].strip()
        if payload == b"[DONE]":
            self.done = True
            return event
        try:
            chunk = json.loads(payload)
        except ValueError:
            return event
        if not isinstance(chunk, dict):
            return event
        if "error" in chunk:
            error = chunk["error"] if isinstance(chunk["error"], dict) else {}
            self.status = "error"
            self.error_type = str(error.get("code") or error.get("type") or "engine_error")
            return event
        choices = chunk.get("choices") or []
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        if not choices:
            return event if self.wants_usage or not isinstance(usage, dict) else None
        for choice in choices:
            if isinstance(choice, dict) and _has_output(choice):
                self.timing.token(int(choice.get("index") or 0), now)
        if usage is None or self.wants_chunk_usage:
            return event
        if self.wants_usage:
            chunk["usage"] = None  # OpenAI's chunks before the usage chunk
        else:
            del chunk["usage"]
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    # -- accounting ------------------------------------------------------------------------
    def _end(self, status: str, error_type: str, http_status: int) -> None:
        """The response ended (the first call says how); start the accounting."""
        if not self._finished:
            self.t_end = self.t_end or time.perf_counter()
            self.status, self.error_type, self.http_status = status, error_type, http_status
        self.finish_soon()

    def finish_soon(self) -> None:
        """Start the accounting task once (lease, tokens, record)."""
        if self._finished:
            return
        self._finished = True
        if self._sent_to is not None:
            routes.balancer.finished(self._sent_to)
        task = asyncio.get_running_loop().create_task(self._finish())
        _background.add(task)
        task.add_done_callback(_background.discard)

    def record_fields(self) -> dict[str, Any]:
        """The RequestRecord of this exchange (request_record_create's arguments)."""
        t = self.timing
        t_end = self.t_end if self.t_end is not None else time.perf_counter()
        # The engine's latest count (its usage chunk, else the usage of the last chunk
        # relayed); an engine that sent none: its header and the output chunks relayed.
        prompt = _count(self.usage.get("prompt_tokens")) or self.reported_prompt_tokens
        if "completion_tokens" in self.usage:
            completion = _count(self.usage["completion_tokens"])
        else:
            completion = t.token_chunks
        ttft_ms = tpot_ms = max_itl_ms = None
        if t.first is not None and t.last is not None:
            ttft_ms = 1000 * (t.first - t.t0)
            per_choice = completion / t.num_choices
            if self.stream:
                if per_choice > 1:
                    tpot_ms = 1000 * (t.last - t.first) / (per_choice - 1)
                if t.token_chunks > 1:
                    max_itl_ms = 1000 * t.max_gap
            elif self.engine_timing is not None:
                tpot_ms, max_itl_ms = self.engine_timing.tpot_ms, self.engine_timing.max_itl_ms
        return {
            "request_id": self.request_id,
            "model_name": self.route.model_name,
            "node_name": self.route.node_name,
            "endpoint": self.endpoint,
            "stream": self.stream,
            "t_arrival": self.arrival,
            "t_first_token": (
                None if ttft_ms is None else self.arrival + timedelta(milliseconds=ttft_ms)
            ),
            "t_end": self.arrival + timedelta(seconds=t_end - t.t0),
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "ttft_ms": ttft_ms,
            "tpot_ms": tpot_ms,
            "max_itl_ms": max_itl_ms,
            "status": self.status,
            "error_type": self.error_type,
            "http_status": self.http_status,
        }

    @property
    def failed_before_output(self) -> bool:
        """The engine failed (unreachable, refused, broke) before any output reached the
        client: the request is refunded (it does not count as one of the minute's)."""
        return self.status == "error" and self.timing.first is None

    async def _finish(self) -> None:
        fields = self.record_fields()
        try:
            # Gives back the lease and replaces the reservation by the tokens used.
            tokens = fields["prompt_tokens"] + fields["completion_tokens"]
            await self.hold.release(tokens, refund=self.failed_before_output)
        except Exception:
            log.exception("quota accounting of request %s failed", self.request_id)
        try:
            await await_shared(records.add(self.grant, self.route.deployment_id, fields))
        except Exception:
            log.exception("could not write the record of request %s", self.request_id)


ROW_CACHE_S = 3.0  # as long as the key cache: a deleted row is noticed as soon
_rows: dict[tuple[str, int], tuple[float, Any]] = {}
_rows_lock = threading.Lock()


def _row(kind: str, pk: int, load: Callable[[], Any]) -> Any:
    """The row ``kind``/``pk`` as ``load`` reads it, kept ``ROW_CACHE_S`` seconds: every
    record of a busy key would otherwise read the same three rows again."""
    now = time.monotonic()
    with _rows_lock:
        hit = _rows.get((kind, pk))
    if hit is not None and now - hit[0] < ROW_CACHE_S:
        return hit[1]
    row = load()
    with _rows_lock:
        if len(_rows) > 10_000:
            _rows.clear()
        _rows[(kind, pk)] = (now, row)
    return row


def write_record(record: PendingRecord) -> None:
    """Write one RequestRecord (database threads), once per key; rows deleted meanwhile
    stay null."""
    from shunter.platform.models import Deployment
    from shunter.tenants.models import ApiKey, Tenant
    from shunter.tenants.services import request_record_create

    tenant = _row(
        "tenant",
        record.tenant_id,
        lambda: (
            Tenant.objects.select_related("default_slo_class").filter(pk=record.tenant_id).first()
        ),
    )
    if tenant is None:
        return
    api_key = _row("key", record.api_key_id, ApiKey.objects.filter(pk=record.api_key_id).first)
    deployment = _row(
        "deployment",
        record.deployment_id,
        Deployment.objects.select_related("slo_class").filter(pk=record.deployment_id).first,
    )
    request_record_create(
        tenant=tenant,
        api_key=api_key,
        deployment=deployment,
        record_key=record.record_key,
        **record.fields,
    )


class NotCommitted(Exception):
    """A batch of records did not commit (the database unreachable, the commit refused):
    none of its records was written, and each may be written again later."""


def write_records(batch: list[PendingRecord]) -> list[BaseException | None]:
    """Write ``batch`` in one transaction, a savepoint each (a record that fails loses
    no other); each record's error, or None. A batch that does not commit fails every
    record with ``NotCommitted``."""
    from django.db import IntegrityError, transaction

    errors: list[BaseException | None] = []
    try:
        with transaction.atomic():
            for record in batch:
                try:
                    with transaction.atomic():
                        write_record(record)
                    errors.append(None)
                except IntegrityError as e:
                    # Its key was written by another writer meanwhile: not twice.
                    errors.append(None if _key_taken(record) else e)
                except Exception as e:
                    errors.append(e)
    except Exception as e:
        # A deferred constraint fails at the commit (a row deleted after it was cached):
        # read the rows again before the next try.
        with _rows_lock:
            _rows.clear()
        lost = NotCommitted(f"the batch of {len(batch)} records did not commit: {e!r}")
        lost.__cause__ = e
        errors = [lost] * len(batch)
    return errors


def _key_taken(record: PendingRecord) -> bool:
    from shunter.tenants.models import RequestRecord

    return RequestRecord.objects.filter(record_key=record.record_key).exists()


def replay_records(batch: list[PendingRecord]) -> None:
    """Write spooled records (``RecordSpool.replay``'s writer): raises when the database
    is down or the batch did not commit, so that they stay spooled; a record the
    database refuses for itself (its data) would be refused on every try, and is
    dropped with a log line."""
    for record, error in zip(batch, write_records(batch), strict=True):
        if _is_lost(error):
            assert error is not None
            raise error
        if error is not None:
            log.error("spooled record %s refused, dropped: %r", record.record_key, error)


class RecordWriter:
    """Writes RequestRecords in batches on the gateway's database threads: one job at a
    time takes every record waiting, in one transaction (a savepoint each, so that a
    record that fails loses no other); the records that end meanwhile wait for the next.
    A request's record costs one commit per batch instead of one each, and one thread
    hop.

    Each record gets its idempotency key when it is queued. Records of a batch that did
    not commit, or that the database could not take (unreachable), go to the spool
    (``GATEWAY_SPOOL_DIR``, see ``spool``) and are replayed in the background when the
    database answers again; ``start`` replays what an earlier process left there."""

    def __init__(self, spool_dir: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._waiting: list[tuple[PendingRecord, concurrent.futures.Future[None]]] = []
        self._writing = False
        self._spool_dir = spool_dir

    @functools.cached_property
    def replayer(self) -> SpoolReplayer:
        """The spool and its replays (settings are read on first use, not at import)."""
        spool = RecordSpool(self._spool_dir or Path(settings.GATEWAY_SPOOL_DIR))
        return SpoolReplayer(spool, replay_records, submit_db)

    def start(self) -> None:
        """Replay the records an earlier process spooled (at the gateway's start)."""
        if self.replayer.spool.pending():
            self.replayer.soon(0)

    def add(
        self, grant: KeyGrant, deployment_id: int, fields: dict[str, Any]
    ) -> concurrent.futures.Future[None]:
        """Queue one record (``request_record_create``'s arguments in ``fields``); the
        future ends when it is committed or spooled, or with the error that lost it."""
        record = PendingRecord(
            record_key=uuid.uuid4(),
            tenant_id=grant.tenant_id,
            api_key_id=grant.api_key_id,
            deployment_id=deployment_id,
            fields=fields,
        )
        written: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            self._waiting.append((record, written))
            start, self._writing = not self._writing, True
        if start:
            submit_db(self._write).add_done_callback(self._job_ended)
        return written

    def _job_ended(self, job: concurrent.futures.Future[None]) -> None:
        """A job that failed before it could write (no database connection) settles the
        records waiting, and the next record starts a new one."""
        error = job.exception()
        if error is None:
            return
        with self._lock:
            batch, self._waiting = self._waiting, []
            self._writing = False
        self._settle(batch, [error] * len(batch))

    def _write(self) -> None:
        while True:
            with self._lock:
                batch, self._waiting = self._waiting, []
                if not batch:
                    self._writing = False
                    return
            self._settle(batch, write_records([record for record, _ in batch]))

    def _settle(
        self,
        batch: list[tuple[PendingRecord, concurrent.futures.Future[None]]],
        errors: list[BaseException | None],
    ) -> None:
        """End each record's future: written, spooled (the database was unreachable or
        the batch did not commit), or failed with its error."""
        lost = [(record, e) for (record, _), e in zip(batch, errors, strict=True) if _is_lost(e)]
        if lost:
            try:
                self.replayer.spool.append([record for record, _ in lost])
            except OSError as e:
                log.error("could not spool %d records: %r", len(lost), e)
                errors = [e if _is_lost(error) else error for error in errors]
            else:
                log.warning("%d records not written, spooled: %r", len(lost), lost[0][1])
                errors = [None if _is_lost(error) else error for error in errors]
                self.replayer.soon()
        for (_, written), error in zip(batch, errors, strict=True):
            if error is None:
                written.set_result(None)
            else:
                written.set_exception(error)


def _is_lost(error: BaseException | None) -> bool:
    """Whether ``error`` lost a record that a later write may keep (spool it)."""
    return isinstance(error, (*DATABASE_DOWN, NotCommitted))


records = RecordWriter()


def slo_header(grant: KeyGrant, route: Route) -> str:
    """The request's SLO class as ``X-Shunter-Slo``: the tenant's when it has one, else
    the deployment's (the rule ``request_slo_class`` applies to the records)."""
    return grant.slo_header or route.slo_header


def tenant_label(grant: KeyGrant) -> str:
    """The tenant as the engine labels its metrics: its name when it is plain ASCII
    (header-safe), else ``tenant-<id>``."""
    name = grant.tenant_name
    if name.isascii() and name.isprintable() and "," not in name:
        return name
    return f"tenant-{grant.tenant_id}"


async def _first_chunk(upstream: aiohttp.ClientResponse) -> bytes:
    """A stream's first bytes (an event, or a keep-alive comment of a queued request)."""
    chunk = await upstream.content.readany()
    if not chunk:
        raise aiohttp.ClientPayloadError("the stream ended before its first event")
    return chunk


async def _chunks(first: bytes, upstream: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    yield first
    async for data in upstream.content.iter_any():
        yield data


def _cannot_serve_now(status: int, raw: bytes) -> bool:
    """An engine answer that says nothing about the request, only that this replica
    cannot serve it now: 503 (draining, stalled, loading) or a 404 for the model (the
    route table says it serves it: it is reloading its models)."""
    if status == 503:
        return True
    error = _error_of(raw) if status == 404 else None
    return error is not None and error.code == "model_not_found"


def _count(value: Any) -> int:
    """A token count as an engine gave it (a header or a usage field); 0 when it is not
    a non-negative integer."""
    try:
        count = int(value)
    except (TypeError, ValueError):
        return 0
    return max(count, 0)


def _error_of(raw: bytes) -> ApiError | None:
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
