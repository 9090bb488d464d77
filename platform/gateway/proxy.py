"""Forwarding one admitted request to its engine, timing it as the client sees it, and
accounting for it afterwards.

Upstream: one aiohttp session per event loop, no pool limit, a 1 s connect timeout (an
unreachable engine is a 503 ``engine_unavailable`` within 2 s), and no cookie jar (an
engine's cookie is no client's). Streams are relayed event
by event as they arrive, never buffered; the engine is always asked for usage
(``stream_options.include_usage``) so streamed tokens count against quotas like
non-streamed ones, and the usage chunk is dropped when the client did not ask for it.
A stream that ends before its usage chunk counts the prompt the engine reported in
``X-Shunter-Prompt-Tokens``.

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

When the response ends, however it ends (done, engine failure, client gone), a task
gives back the concurrency lease, counts the tokens and writes the RequestRecord, off the
stream's path. Records are written in batches (``RecordWriter``): those that end while
one batch is being written go together in the next, one transaction on one database
thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import yarl
from django.conf import settings

from shunter.engine.server.errors import ApiError
from shunter.engine.server.timing import TIMING_HEADER, EngineTiming
from shunter.platform.gateway.errors import engine_unavailable
from shunter.platform.gateway.replies import Reply, error_reply
from shunter.platform.gateway.routes import Route
from shunter.tenants.auth import KeyGrant, submit_db
from shunter.tenants.quotas import Admission, LoopLocal, quota_limiter

log = logging.getLogger("shunter.gateway")

CONNECT_TIMEOUT_S = 1.0
# The longest silence of a stream (no event, no keep-alive) before it counts as broken.
STREAM_IDLE_S = 30.0
PROMPT_TOKENS_HEADER = "X-Shunter-Prompt-Tokens"
DONE = b"data: [DONE]\n\n"


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
        self.done = False
        self.usage: dict[str, Any] = {}
        self.reported_prompt_tokens = 0  # X-Shunter-Prompt-Tokens
        self.engine_timing: EngineTiming | None = None  # X-Shunter-Timing
        self.status = "ok"
        self.error_type = ""
        self.http_status = 200
        self.t_end: float | None = None
        self._finished = False

    # -- forwarding ------------------------------------------------------------------------
    async def forward(self, body: dict[str, Any]) -> Reply:
        """Send ``body`` to the engine and answer the client (every path ends in
        ``finish_soon``)."""
        self.stream = body.get("stream") is True
        if self.stream:
            options = body.get("stream_options")
            if options is None or isinstance(options, dict):
                self.wants_usage = bool(options and options.get("include_usage") is True)
                body["stream_options"] = {**(options or {}), "include_usage": True}
        path = "chat/completions" if self.endpoint == "chat" else "completions"
        read_s = STREAM_IDLE_S if self.stream else settings.GATEWAY_READ_TIMEOUT_S
        try:
            upstream = await sessions.get().post(
                engine_url(self.route, path),
                data=json.dumps(body).encode(),
                headers=self._upstream_headers(),
                timeout=read_timeout(read_s),
            )
        except aiohttp.SocketTimeoutError as e:
            return self._timed_out(read_s, e)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            return self._unavailable(f"The engine of {self.route.model_name!r} is unreachable", e)
        except BaseException:
            self._end("aborted", "client_disconnected", 499)
            raise
        self.reported_prompt_tokens = _count(upstream.headers.get(PROMPT_TOKENS_HEADER))
        if upstream.status != 200:
            return await self._pass_error(upstream)
        if upstream.content_type == "text/event-stream":
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            reply = Reply(200, headers, stream=self._relay(upstream))
            reply.content_type = "text/event-stream"
            return self._decorate(reply)
        return await self._collect(upstream)

    def _upstream_headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "X-Request-Id": self.request_id,
            "X-Shunter-Tenant": tenant_label(self.grant),
            "X-Shunter-Slo": slo_header(self.grant, self.route),
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

    async def _pass_error(self, upstream: aiohttp.ClientResponse) -> Reply:
        """The engine refused: its status and OpenAI error body go to the client as is
        (a body in another shape is wrapped in one)."""
        raw = await self._read(upstream)
        if isinstance(raw, Reply):
            return raw
        error = _error_of(raw)
        if error is None:
            kind = "invalid_request_error" if upstream.status < 500 else "server_error"
            text = raw.decode(errors="replace")[:500] or upstream.reason or "engine error"
            error = ApiError(upstream.status, f"The engine answered: {text}", type=kind)
            raw = json.dumps(error.body()).encode()
        self._end("error", str(error.code or error.type), upstream.status)
        return self._decorate(Reply(upstream.status, body=raw))

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

    async def _relay(self, upstream: aiohttp.ClientResponse) -> AsyncGenerator[bytes, None]:
        """The engine's events as they arrive. An engine that stops before ``[DONE]``, or
        sends nothing for ``STREAM_IDLE_S``, gets the client a terminating error event; a
        client that leaves closes the upstream connection, which aborts the request in
        the engine."""
        buffer = b""
        try:
            async for data in upstream.content.iter_any():
                now = time.perf_counter()
                buffer += data
                out = []
                while (end := buffer.find(b"\n\n")) >= 0:
                    event, buffer = buffer[: end + 2], buffer[end + 2 :]
                    if self._on_event(event, now):
                        out.append(event)
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

    def _on_event(self, event: bytes, now: float) -> bool:
        """Account for one SSE event; whether to pass it on."""
        if not event.startswith(b"data: "):
            return True
        payload = event[6:].strip()
        if payload == b"[DONE]":
            self.done = True
            return True
        try:
            chunk = json.loads(payload)
        except ValueError:
            return True
        if not isinstance(chunk, dict):
            return True
        if "error" in chunk:
            error = chunk["error"] if isinstance(chunk["error"], dict) else {}
            self.status = "error"
            self.error_type = str(error.get("code") or error.get("type") or "engine_error")
            return True
        choices = chunk.get("choices") or []
        usage = chunk.get("usage")
        if isinstance(usage, dict) and not choices:
            self.usage = usage
            return self.wants_usage
        for choice in choices:
            if isinstance(choice, dict) and _has_output(choice):
                self.timing.token(int(choice.get("index") or 0), now)
        return True

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
        task = asyncio.get_running_loop().create_task(self._finish())
        _background.add(task)
        task.add_done_callback(_background.discard)

    def record_fields(self) -> dict[str, Any]:
        """The RequestRecord of this exchange (request_record_create's arguments)."""
        t = self.timing
        t_end = self.t_end if self.t_end is not None else time.perf_counter()
        # Without the usage chunk (a stream that ended early), the engine's header.
        prompt = _count(self.usage.get("prompt_tokens")) or self.reported_prompt_tokens
        completion = _count(self.usage.get("completion_tokens")) or t.token_chunks
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

    async def _finish(self) -> None:
        limiter = quota_limiter()
        tenant = str(self.grant.tenant_id)
        fields = self.record_fields()
        try:
            if self.admission.lease is not None:
                await limiter.release(tenant, self.admission.lease)
            tokens = fields["prompt_tokens"] + fields["completion_tokens"]
            await limiter.record_tokens(tenant, tokens)
        except Exception:
            log.exception("quota accounting of request %s failed", self.request_id)
        try:
            await asyncio.wrap_future(records.add(self.grant, self.route.deployment_id, fields))
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


def write_record(grant: KeyGrant, deployment_id: int, fields: dict[str, Any]) -> None:
    """Write one RequestRecord (database threads); rows deleted meanwhile stay null."""
    from shunter.platform.models import Deployment
    from shunter.tenants.models import ApiKey, Tenant
    from shunter.tenants.services import request_record_create

    tenant = _row(
        "tenant",
        grant.tenant_id,
        lambda: (
            Tenant.objects.select_related("default_slo_class").filter(pk=grant.tenant_id).first()
        ),
    )
    if tenant is None:
        return
    api_key = _row("key", grant.api_key_id, ApiKey.objects.filter(pk=grant.api_key_id).first)
    deployment = _row(
        "deployment",
        deployment_id,
        Deployment.objects.select_related("slo_class").filter(pk=deployment_id).first,
    )
    request_record_create(tenant=tenant, api_key=api_key, deployment=deployment, **fields)


class RecordWriter:
    """Writes RequestRecords in batches on the gateway's database threads: one job at a
    time takes every record waiting, in one transaction (a savepoint each, so that a
    record that fails loses no other); the records that end meanwhile wait for the next.
    A request's record costs one commit per batch instead of one each, and one thread
    hop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[
            tuple[KeyGrant, int, dict[str, Any], concurrent.futures.Future[None]]
        ] = []
        self._writing = False

    def add(
        self, grant: KeyGrant, deployment_id: int, fields: dict[str, Any]
    ) -> concurrent.futures.Future[None]:
        """Queue one record (``write_record``'s arguments); the future ends when it is
        committed, or with the error that lost it."""
        written: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            self._waiting.append((grant, deployment_id, fields, written))
            start, self._writing = not self._writing, True
        if start:
            submit_db(self._write).add_done_callback(self._job_ended)
        return written

    def _job_ended(self, job: concurrent.futures.Future[None]) -> None:
        """A job that failed before it could write (no database connection) fails the
        records waiting, and the next record starts a new one."""
        error = job.exception()
        if error is None:
            return
        with self._lock:
            batch, self._waiting = self._waiting, []
            self._writing = False
        for *_, written in batch:
            written.set_exception(error)

    def _write(self) -> None:
        from django.db import transaction

        while True:
            with self._lock:
                batch, self._waiting = self._waiting, []
                if not batch:
                    self._writing = False
                    return
            errors: list[BaseException | None] = []
            try:
                with transaction.atomic():
                    for grant, deployment_id, fields, _ in batch:
                        try:
                            with transaction.atomic():
                                write_record(grant, deployment_id, fields)
                            errors.append(None)
                        except Exception as e:
                            errors.append(e)
            except Exception as e:  # the commit failed: the whole batch is lost
                errors = [e] * len(batch)
            for (*_, written), error in zip(batch, errors, strict=True):
                if error is None:
                    written.set_result(None)
                else:
                    written.set_exception(error)


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
