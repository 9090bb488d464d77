"""The streaming client against servers that misbehave: every failure is recorded on the
request, none escapes, and the run goes on."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from shunter.engine.loadgen.client import RequestResult, Target, send_request, trace_config
from shunter.engine.loadgen.runner import run_schedule
from shunter.engine.workload.requests import RequestSpec
from tests.conftest import free_port


def event(payload: dict[str, Any], sep: bytes = b"\n\n") -> bytes:
    return b"data: " + json.dumps(payload).encode() + sep


def token(text: str) -> bytes:
    return event({"choices": [{"index": 0, "text": text, "finish_reason": None}]})


class Misbehaving:
    """A completions server whose behaviour is the prompt's first word."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        mode = body["prompt"].split()[0]
        if mode == "plain500":
            return web.Response(status=500, text="upstream exploded")
        if mode == "limited":
            error = {"message": "Rate limit reached.", "type": "rate_limit_exceeded"}
            return web.json_response({"error": error}, status=429)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if mode == "ok":
                for text in ("a", "b", "c"):
                    await resp.write(token(text))
                    await asyncio.sleep(0.01)
                usage = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
                await resp.write(event({"choices": [], "usage": usage}))
                await resp.write(b"data: [DONE]\n\n")
            elif mode == "chunked":
                # Two events in one write, CRLF lines, no space after 'data:', an empty
                # text chunk, and usage saying six tokens came in three text chunks.
                a = b'data:{"choices":[{"index":0,"text":"ab"}]}\r\n\r\n'
                await resp.write(a + a.replace(b"ab", b"cd"))
                await asyncio.sleep(0.02)
                await resp.write(b'data:{"choices":[{"index":0,"text":""}]}\r\n\r\n')
                await resp.write(b'data:{"choices":[{"index":0,"text":"ef"}]}\r\n\r\n')
                usage = {"prompt_tokens": 2, "completion_tokens": 6}
                await resp.write(event({"choices": [], "usage": usage}, b"\r\n\r\n"))
                await resp.write(b"data: [DONE]\r\n\r\n")
            elif mode == "error_event":
                await resp.write(token("a"))
                error = {"message": "The request was aborted: out of memory", "type": "aborted"}
                await resp.write(event({"error": error}))
                await resp.write(b"data: [DONE]\n\n")
            elif mode == "cut":
                await resp.write(token("a"))
                await resp.write(token("b"))
            elif mode == "garbage":
                await resp.write(b"data: {this is not json\n\n")
            elif mode == "not_object":
                await resp.write(b'data: "just a string"\n\n')
            elif mode == "lingering":
                await resp.write(token("a"))
                await resp.write(b"data: [DONE]\n\n")
                await asyncio.sleep(2.0)
            elif mode == "silent":
                await resp.write(token("a"))
                await asyncio.sleep(2.0)
            elif mode == "slow":
                await asyncio.sleep(0.1)
                await resp.write(token("a"))
                await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            self.in_flight -= 1


@pytest.fixture
async def server() -> AsyncIterator[tuple[Misbehaving, str]]:
    handler = Misbehaving()
    app = web.Application()
    app.router.add_post("/v1/completions", handler.completions)
    async with TestServer(app, host="127.0.0.1") as srv:
        yield handler, str(srv.make_url("")).rstrip("/")


async def send(url: str, prompt: str, *, read_timeout: float = 10.0) -> RequestResult:
    target = Target(url, "m")
    spec = RequestSpec(prompt, 1, 3)
    result = RequestResult(0, 0.0, spec.input_len, spec.output_len)
    timeout = aiohttp.ClientTimeout(sock_read=read_timeout)
    async with aiohttp.ClientSession(timeout=timeout, trace_configs=[trace_config()]) as session:
        await send_request(session, target, spec, result, time.perf_counter())
    return result


async def test_a_good_stream_is_timed_token_by_token(server: tuple[Misbehaving, str]) -> None:
    r = await send(server[1], "ok go")
    assert r.success and r.status == 200 and r.error_type is None
    assert r.output_tokens == 3 and r.input_tokens == 11  # from the server's usage
    assert len(r.token_times) == 3 and r.token_times == sorted(r.token_times)
    assert r.token_times[2] - r.token_times[0] >= 0.015  # the server's 10 ms pauses
    assert r.t_start is not None and r.t_sent is not None and r.t_end is not None
    assert 0 <= r.t_start <= r.t_sent <= r.token_times[0] <= r.t_end


async def test_chunks_crlf_and_usage(server: tuple[Misbehaving, str]) -> None:
    r = await send(server[1], "chunked")
    assert r.success
    assert len(r.token_times) == 3  # the empty-text chunk is no token
    assert r.token_times[0] == r.token_times[1]  # one read, one time
    assert r.output_tokens == 6  # usage's count, not the chunk count


@pytest.mark.parametrize(
    ("prompt", "status", "error_type", "message"),
    [
        ("plain500", 500, "http_500", "upstream exploded"),
        ("limited", 429, "rate_limit_exceeded", "Rate limit reached."),
        ("error_event", 200, "aborted", "out of memory"),
        ("cut", 200, "incomplete_stream", "before data: [DONE]"),
        ("garbage", 200, "bad_event", "not a JSON object"),
        ("not_object", 200, "bad_event", "just a string"),
    ],
)
async def test_failures_are_recorded(
    server: tuple[Misbehaving, str], prompt: str, status: int, error_type: str, message: str
) -> None:
    r = await send(server[1], prompt)
    assert not r.success
    assert (r.status, r.error_type) == (status, error_type)
    assert message in (r.error or "")
    assert r.t_end is not None


async def test_a_silent_server_times_out(server: tuple[Misbehaving, str]) -> None:
    r = await send(server[1], "silent", read_timeout=0.3)
    assert not r.success and r.error_type == "timeout" and len(r.token_times) == 1


async def test_a_stream_complete_at_done_succeeds_even_if_the_connection_lingers(
    server: tuple[Misbehaving, str],
) -> None:
    r = await send(server[1], "lingering", read_timeout=0.3)
    assert r.success and r.error_type is None and r.output_tokens == 1


async def test_refused_connection_is_a_failed_request() -> None:
    r = await send(f"http://127.0.0.1:{free_port()}", "ok")
    assert not r.success and r.status is None
    assert r.error_type == "ClientConnectorError" and r.t_sent is None


async def test_max_concurrency_caps_requests_in_flight(server: tuple[Misbehaving, str]) -> None:
    handler, url = server
    schedule = [(0.0, RequestSpec("slow one", 1, 1))] * 6
    results = await run_schedule(Target(url, "m"), schedule, max_concurrency=2)
    assert all(r.success for r in results)
    assert handler.max_in_flight == 2
    # Three waves of two: the last requests were issued about 0.2 s after their time.
    lags = sorted(r.send_lag or 0.0 for r in results)
    assert lags[-1] >= 0.15 and lags[0] < 0.05


async def test_a_run_with_failures_completes(server: tuple[Misbehaving, str]) -> None:
    prompts = ["ok", "cut", "limited", "ok", "garbage", "ok"]
    schedule = [(0.01 * i, RequestSpec(p, 1, 3)) for i, p in enumerate(prompts)]
    results = await run_schedule(Target(server[1], "m"), schedule)
    assert [r.success for r in results] == [p == "ok" for p in prompts]
    assert [r.index for r in results] == list(range(6))


async def test_a_cancelled_run_stops_sending(server: tuple[Misbehaving, str]) -> None:
    schedule = [(0.1 * i, RequestSpec("ok", 1, 3)) for i in range(20)]
    run = asyncio.create_task(run_schedule(Target(server[1], "m"), schedule))
    await asyncio.sleep(0.3)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert gc.get_freeze_count() == 0  # the collector sees everything again
    for _ in range(100):  # the server notices the closed connections
        if server[0].in_flight == 0:
            break
        await asyncio.sleep(0.05)
    assert server[0].in_flight == 0


def test_target_urls_and_bodies() -> None:
    for base in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"):
        assert Target(base, "m").url == "http://h:1/v1/completions"
    chat = Target("https://gw.example/v1", "m", api_key="k", endpoint="chat")
    assert chat.url == "https://gw.example/v1/chat/completions"
    assert chat.headers["Authorization"] == "Bearer k"
    body = json.loads(chat.body(RequestSpec("hello", 1, 7)))
    assert body["messages"] == [{"role": "user", "content": "hello"}]
    assert body["max_tokens"] == 7 and body["ignore_eos"] is True and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert "Authorization" not in Target("http://h", "m").headers
    tuned = Target(
        "http://h",
        "m",
        ignore_eos=False,
        extra_body={"temperature": 0.7, "top_k": 5, "stream": False},
        extra_headers={"X-Run": "7"},
    )
    body = json.loads(tuned.body(RequestSpec("hello", 1, 7)))
    assert body["ignore_eos"] is False and body["temperature"] == 0.7 and body["top_k"] == 5
    assert body["stream"] is True  # the client reads a stream whatever the extra body says
    assert tuned.headers["X-Run"] == "7" and tuned.headers["Content-Type"] == "application/json"
    for bad in ({"base_url": "h:1"}, {"model": ""}, {"endpoint": "embeddings"}):
        with pytest.raises(ValueError):
            Target(**{"base_url": "http://h", "model": "m", **bad})  # type: ignore[arg-type]
