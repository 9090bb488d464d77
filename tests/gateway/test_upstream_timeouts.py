"""An engine that accepts a request and then goes silent: a stream is ended with a
terminating ``engine_unavailable`` event after ``STREAM_IDLE_S`` of silence, a
non-streamed request gets a 504 after the read timeout; both are recorded. A stream that
ends early counts the prompt the engine reported in a header. A non-streamed answer
without the engine's ``X-Shunter-Timing`` has no TPOT and an unknown TBT; with it, its
TPOT and max ITL are the engine's and its TBT is judged.

The engine here is a small aiohttp server on a real socket, the gateway's forwarding
(``proxy.Exchange``) runs in the test's event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp import web
from django.utils import timezone

from shunter.engine.api.timing import TIMING_HEADER
from shunter.gateway import proxy
from shunter.gateway.auth import KeyGrant, load_grant
from shunter.gateway.db import close_db_connections, run_db
from shunter.gateway.proxy import Exchange, close_upstream
from shunter.gateway.quotas import Admission, Limits
from shunter.gateway.replies import Reply
from shunter.gateway.routes import Route, load_routes
from shunter.tenants.models import RequestRecord
from shunter.tenants.services import api_key_create
from tests.tenants.factories import make_deployment, make_model, make_tenant

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

PROMPT_TOKENS = 7


class SilentEngine:
    """Answers ``/v1/chat/completions``: a stream sends its headers (with the prompt's
    token count) and one token, then nothing; a non-streamed request gets nothing, or a
    whole answer of five tokens when its body asks for ``"answer": true`` (with the
    body's ``"timing"`` as its ``X-Shunter-Timing``)."""

    def __init__(self) -> None:
        self.url = ""
        self.runner = web.AppRunner(web.Application())
        self.runner.app.router.add_post("/v1/chat/completions", self.chat)
        self.silent = asyncio.Event()  # set once a request went quiet
        self.closing = asyncio.Event()  # ends the quiet requests

    async def start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("answer"):
            usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 5}
            choice = {"index": 0, "message": {"role": "assistant", "content": "a b c d e"}}
            headers = {TIMING_HEADER: body["timing"]} if "timing" in body else None
            return web.json_response({"choices": [choice], "usage": usage}, headers=headers)
        if not body.get("stream"):
            self.silent.set()
            await self.closing.wait()
        reply = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                proxy.PROMPT_TOKENS_HEADER: str(PROMPT_TOKENS),
            }
        )
        await reply.prepare(request)
        chunk = {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}
        await reply.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self.silent.set()
        await self.closing.wait()
        return reply


@dataclasses.dataclass
class Setup:
    grant: KeyGrant
    route: Route


@pytest.fixture
def setup() -> Iterator[Setup]:
    deployment = make_deployment(model=make_model(name="silent"))
    _, secret = api_key_create(tenant=make_tenant(deployment), name="k", all_deployments=True)
    grant = load_grant(secret)
    assert grant is not None
    yield Setup(grant, load_routes()["silent"][0])
    close_db_connections()  # the test database is flushed after us


@pytest.fixture
async def engine() -> AsyncIterator[SilentEngine]:
    engine = SilentEngine()
    await engine.start()
    yield engine
    await close_upstream()  # this loop's upstream session and the record's accounting
    engine.closing.set()
    await engine.runner.cleanup()


def exchange(setup: Setup, engine: SilentEngine, request_id: str) -> Exchange:
    return Exchange(
        grant=setup.grant,
        route=dataclasses.replace(setup.route, engine_url=engine.url),
        admission=Admission(admitted=True, limits=Limits()),
        request_id=request_id,
        endpoint="chat",
        arrival=timezone.now(),
        t0=time.perf_counter(),
    )


async def wait_record(request_id: str, timeout_s: float = 30.0) -> RequestRecord:
    deadline = time.monotonic() + timeout_s
    while True:
        record = await run_db(RequestRecord.objects.filter(request_id=request_id).first)
        if record is not None:
            return record
        assert time.monotonic() < deadline, f"no record of {request_id}"
        await asyncio.sleep(0.05)


async def read_stream(reply: Reply) -> list[bytes]:
    assert reply.stream is not None
    chunks = [chunk async for chunk in reply.stream]
    return [event for event in b"".join(chunks).split(b"\n\n") if event]


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "silent", "messages": [{"role": "user", "content": "hi"}], **fields}


async def test_a_silent_stream_ends_with_an_error_event_and_is_recorded(
    setup: Setup, engine: SilentEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(proxy, "STREAM_IDLE_S", 0.5)
    reply = await exchange(setup, engine, "silent-stream").forward(body(stream=True))
    assert reply.status == 200
    started = time.monotonic()
    events = await asyncio.wait_for(read_stream(reply), timeout=20)
    assert time.monotonic() - started >= 0.4  # it waited for the silence, not less
    assert json.loads(events[0][6:])["choices"][0]["delta"]["content"] == "Hi"
    error = json.loads(events[1].removeprefix(b"data: "))["error"]
    assert (error["code"], error["type"]) == ("engine_unavailable", "service_unavailable")
    assert "sent nothing for 0.5 s" in error["message"]
    assert events[2:] == [b"data: [DONE]"]
    record = await wait_record("silent-stream")
    assert (record.status, record.error_type, record.http_status) == (
        "error",
        "engine_unavailable",
        200,
    )
    # The usage chunk never came: the prompt is the engine's header's count.
    assert (record.prompt_tokens, record.completion_tokens) == (PROMPT_TOKENS, 1)
    assert record.ttft_ms is not None and not record.ttft_met and not record.tbt_met


async def test_a_silent_non_streamed_request_is_a_504(
    setup: Setup, engine: SilentEngine, settings: Any
) -> None:
    settings.GATEWAY_READ_TIMEOUT_S = 0.5
    reply = await asyncio.wait_for(
        exchange(setup, engine, "silent-whole").forward(body()), timeout=20
    )
    assert engine.silent.is_set()
    assert reply.status == 504
    error = json.loads(reply.body)["error"]
    assert (error["code"], error["type"]) == ("engine_unavailable", "service_unavailable")
    record = await wait_record("silent-whole")
    assert (record.status, record.error_type, record.http_status) == (
        "error",
        "engine_unavailable",
        504,
    )


async def test_a_non_streamed_answer_has_no_tpot_and_an_unknown_tbt(
    setup: Setup, engine: SilentEngine
) -> None:
    reply = await exchange(setup, engine, "whole").forward(body(answer=True))
    assert reply.status == 200
    record = await wait_record("whole")
    assert (record.status, record.prompt_tokens, record.completion_tokens) == (
        "ok",
        PROMPT_TOKENS,
        5,
    )
    assert record.ttft_ms is not None and record.t_first_token == record.t_end
    assert record.tpot_ms is None and record.max_itl_ms is None
    assert record.ttft_met and record.tbt_met is None


@pytest.mark.parametrize(("tpot_ms", "tbt_met"), [(40.0, True), (150.0, False)])
async def test_a_non_streamed_answer_is_timed_by_the_engines_header(
    setup: Setup, engine: SilentEngine, tpot_ms: float, tbt_met: bool
) -> None:
    # The engine held the answer 0.5 ms after its first token; the class allows 100 ms TBT.
    timing = f"ttft_ms=1.0,tpot_ms={tpot_ms},max_itl_ms=200.0,e2e_ms=1.5"
    rid = f"timed-{tpot_ms}"
    reply = await exchange(setup, engine, rid).forward(body(answer=True, timing=timing))
    assert reply.status == 200
    record = await wait_record(rid)
    assert (record.tpot_ms, record.max_itl_ms) == (tpot_ms, 200.0)
    assert record.tbt_met is tbt_met and record.ttft_met
    # TTFT as a stream would have shown it: the gateway's end-to-end less the 0.5 ms.
    assert record.t_first_token is not None and record.ttft_ms is not None
    held = record.t_end - record.t_first_token
    assert held.total_seconds() == pytest.approx(0.0005, abs=2e-6)
    e2e_ms = (record.t_end - record.t_arrival).total_seconds() * 1000
    assert record.ttft_ms == pytest.approx(e2e_ms - 0.5, abs=2e-3)
