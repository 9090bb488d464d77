"""Forwarding one admitted request to its engine, relaying the answer to the client, and
accounting for it afterwards.

Streams are relayed event by event as they arrive, never buffered, their usage and
token times tallied on the way (``accounting``).

A request that failed before a byte of it reached the client (the engine refused the
connection, reset it, answered 503 or said it does not serve the model: it is
reloading) is sent once more to another replica of the model, and the failed one
cools (``failover``); so is one whose engine is hung (``upstream.first_byte``). A
stream's head goes to the client with its first event (or keep-alive), so an engine
that fails between the two is failed over as well.

Reads time out: an engine streams an event or a keep-alive comment every few seconds,
so a stream silent for ``STREAM_IDLE_S`` is ended like a broken one (a terminating
``engine_unavailable`` event); a non-streamed answer may take up to the
``GATEWAY_READ_TIMEOUT_S`` setting, then the client gets a 504 ``engine_unavailable``.

While the exchange runs it renews its concurrency lease (``LeaseHold``). When the
response ends, however it ends (done, engine failure, client gone), a task gives back
the lease and settles the tokens to the usage recorded (retried in the background while
the quota store is unreachable), then writes the RequestRecord, off the stream's path
(``records``). A request the engine failed before any output (unreachable, refused it
with a non-200, broke before the first event) is refunded: it leaves the
requests-per-minute window.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator
from datetime import datetime
from typing import Any

import aiohttp
from django.conf import settings

from shunter.engine.api.errors import ApiError
from shunter.engine.api.headers import (
    IGNORED_HEADER,
    PROMPT_TOKENS_HEADER,
    SLO_HEADER,
    TENANT_HEADER,
    WARNING_HEADER,
)
from shunter.engine.api.timing import TIMING_HEADER, EngineTiming
from shunter.gateway.accounting import Tally, Timing, token_count
from shunter.gateway.auth import KeyGrant
from shunter.gateway.db import await_shared
from shunter.gateway.errors import engine_unavailable
from shunter.gateway.failover import Failover
from shunter.gateway.quotas import Admission, quota_limiter
from shunter.gateway.records import records
from shunter.gateway.replies import Reply, error_reply
from shunter.gateway.routes import Route
from shunter.gateway.upstream import (
    EngineHung,
    cannot_serve_now,
    chunks,
    engine_url,
    error_of,
    open_response,
    read_timeout,
    sessions,
)
from shunter.tenants.selectors import request_class

log = logging.getLogger("shunter.gateway")

# The longest silence of a stream (no event, no keep-alive) before it counts as broken.
STREAM_IDLE_S = 30.0
DONE = b"data: [DONE]\n\n"
# The engine's answer headers a client reads: which of its request's fields were ignored.
PASSED_HEADERS = (IGNORED_HEADER, WARNING_HEADER)

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


def slo_header(grant: KeyGrant, route: Route) -> str:
    """The request's SLO class as ``X-Shunter-Slo`` (``request_class``: the tenant's
    when it has one, else the deployment's, as the records are judged)."""
    header = request_class(grant.slo_header, route.slo_header)
    assert header is not None  # every deployment has a class
    return header


def tenant_label(grant: KeyGrant) -> str:
    """The tenant as the engine labels its metrics: its name when it is plain ASCII
    (header-safe), else ``tenant-<id>``."""
    name = grant.tenant_name
    if name.isascii() and name.isprintable() and "," not in name:
        return name
    return f"tenant-{grant.tenant_id}"


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
        self.failover = Failover(grant, route, request_id)
        self.admission = admission
        self.request_id = request_id
        self.endpoint = endpoint  # "chat" or "completions"
        self.arrival = arrival
        self.tally = Tally(Timing(t0))
        self._finished = False
        self._passed: dict[str, str] = {}  # the engine's answer headers the client sees
        # Renews the concurrency lease until the accounting settles it.
        self.hold = quota_limiter().hold(str(grant.tenant_id), admission)

    @property
    def route(self) -> Route:
        """The replica the request is on (``Failover``)."""
        return self.failover.route

    # -- forwarding ------------------------------------------------------------------------
    async def forward(self, body: dict[str, Any]) -> Reply:
        """Send ``body`` to the engine and answer the client (every path ends in
        ``finish_soon``)."""
        self.tally.ask_usage(body)
        path = "chat/completions" if self.endpoint == "chat" else "completions"
        read_s = STREAM_IDLE_S if self.tally.stream else settings.GATEWAY_READ_TIMEOUT_S
        data = json.dumps(body).encode()
        while True:
            self.failover.send()
            post = sessions.get().post(
                engine_url(self.route, path),
                data=data,
                headers=self._upstream_headers(),
                timeout=read_timeout(read_s),
            )
            try:
                upstream, first = await open_response(post, self.route, self.failover.other_replica)
            except aiohttp.SocketTimeoutError as e:
                return self._timed_out(read_s, e)
            except EngineHung as e:
                if await self.failover.fail_over(e):
                    continue
                return self._unavailable(str(e), e)
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                if await self.failover.fail_over(e):
                    continue
                what = f"The engine of {self.route.model_name!r} is unreachable"
                return self._unavailable(what, e)
            except BaseException:
                self._end("aborted", "client_disconnected", 499)
                raise
            prompt_tokens = upstream.headers.get(PROMPT_TOKENS_HEADER)
            self.tally.reported_prompt_tokens = token_count(prompt_tokens)
            if upstream.status == 200:
                self._passed = {h: v for h in PASSED_HEADERS if (v := upstream.headers.get(h))}
                break
            raw = await self._read(upstream)
            if isinstance(raw, Reply):
                return raw
            if cannot_serve_now(upstream.status, raw) and await self.failover.fail_over(
                f"HTTP {upstream.status}"
            ):
                continue
            return self._pass_error(upstream.status, raw)
        if upstream.content_type == "text/event-stream":
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            reply = Reply(200, headers, stream=self._relay(upstream, first))
            reply.content_type = "text/event-stream"
            return self._decorate(reply)
        return await self._collect(upstream)

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
        reply.headers.update(self._passed)
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
        error = error_of(raw)
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
        now = time.perf_counter()
        self.tally.answered(raw, now, EngineTiming.parse(upstream.headers.get(TIMING_HEADER)))
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
            async for data in chunks(first, upstream):
                now = time.perf_counter()
                buffer += data
                out = []
                while (end := buffer.find(b"\n\n")) >= 0:
                    event, buffer = buffer[: end + 2], buffer[end + 2 :]
                    if (passed := self.tally.on_event(event, now)) is not None:
                        out.append(passed)
                if out:
                    yield b"".join(out)
            if not self.tally.done:
                raise aiohttp.ClientPayloadError("the stream ended before [DONE]")
            self._end(self.tally.status, self.tally.error_type, 200)
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
            if self.tally.done:
                upstream.release()
            else:
                upstream.close()

    # -- accounting ------------------------------------------------------------------------
    def _end(self, status: str, error_type: str, http_status: int) -> None:
        """The response ended (the first call says how); start the accounting."""
        if not self._finished:
            self.tally.end(status, error_type, http_status)
        self.finish_soon()

    def finish_soon(self) -> None:
        """Start the accounting task once (lease, tokens, record)."""
        if self._finished:
            return
        self._finished = True
        self.failover.finished()
        task = asyncio.get_running_loop().create_task(self._finish())
        _background.add(task)
        task.add_done_callback(_background.discard)

    async def _finish(self) -> None:
        fields = self.tally.record_fields(
            request_id=self.request_id,
            route=self.route,
            endpoint=self.endpoint,
            arrival=self.arrival,
        )
        try:
            # Gives back the lease and replaces the reservation by the tokens used.
            tokens = fields["prompt_tokens"] + fields["completion_tokens"]
            await self.hold.release(tokens, refund=self.tally.failed_before_output)
        except Exception:
            log.exception("quota accounting of request %s failed", self.request_id)
        try:
            await await_shared(records.add(self.grant, self.route.deployment_id, fields))
        except Exception:
            log.exception("could not write the record of request %s", self.request_id)
