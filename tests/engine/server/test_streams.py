"""64 concurrent streaming clients, some leaving early: survivors complete, nothing leaks."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import threading
import time
from dataclasses import dataclass

import aiohttp

from shunter.engine.exec.params import SamplingParams
from shunter.engine.server.loop import Delta, Stream
from tests.engine.server.conftest import TOKEN, ServerThread, assert_no_leaks, request

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Streamed:
    """How one stream went: its finish reason when read to the end (else None), and
    when its first and last chunks came (``perf_counter``)."""

    finish: str | None = None
    t_first: float = 0.0
    t_last: float = 0.0
    chunks: int = 0


async def _client(url: str, i: int, leave_after: int | None, started: asyncio.Event) -> Streamed:
    """Stream one request; with ``leave_after``, drop the connection after that many
    chunks. ``started`` is set at the first chunk."""
    body = {
        "model": ("llama", "qwen")[i % 2],
        "prompt": f"request {i}: the dispatcher watches every signal",
        "max_tokens": 160,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0.7,
        "seed": i,
    }
    seen = Streamed()
    async with (
        aiohttp.ClientSession(headers=AUTH) as session,
        session.post(url + "/v1/completions", json=body) as r,
    ):
        assert r.status == 200
        async for line in r.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                return seen
            choice = json.loads(data)["choices"][0]
            seen.finish = choice["finish_reason"] or seen.finish
            seen.t_last = time.perf_counter()
            seen.t_first = seen.t_first or seen.t_last
            seen.chunks += 1
            started.set()
            if leave_after is not None and seen.chunks >= leave_after:
                r.connection.close()  # type: ignore[union-attr]
                seen.finish = None
                return seen
    raise AssertionError("the stream ended without [DONE]")


def test_concurrent_streams_with_disconnects(server: ServerThread) -> None:
    rng = random.Random(0)
    plan = [rng.choice([None, None, 1, 3, 8]) for _ in range(64)]

    async def responsive(started: asyncio.Event) -> float:
        """Seconds /v1/models takes to answer while the streams run."""
        await started.wait()
        t0 = time.perf_counter()
        async with (
            aiohttp.ClientSession(headers=AUTH) as session,
            session.get(server.url + "/v1/models") as r,
        ):
            assert r.status == 200
        return time.perf_counter() - t0

    async def run() -> tuple[list[Streamed], float]:
        started = asyncio.Event()
        probe = asyncio.create_task(responsive(started))
        streams = [_client(server.url, i, n, started) for i, n in enumerate(plan)]
        return list(await asyncio.gather(*streams)), await probe

    def aborted() -> float:
        sample = server.state.metrics.registry.get_sample_value
        return sum(
            sample("vllm:request_success_total", {"model_name": m, "finished_reason": "abort"})
            or 0.0
            for m in ("llama", "qwen")
        )

    before = aborted()
    results, probe_s = asyncio.run(run())
    for leave_after, seen in zip(plan, results, strict=True):
        if leave_after is None:
            assert seen.finish == "length"
    # The HTTP side answers while the engine works: the probe takes at most a few dozen
    # tokens' time, measured on the same streams (the median time per token of those
    # read to the end), however loaded the machine.
    per_token = statistics.median(
        (s.t_last - s.t_first) / (s.chunks - 1) for s in results if s.finish is not None
    )
    assert probe_s < 20 * per_token
    assert_no_leaks(server.wait_idle())
    assert aborted() - before == sum(n is not None for n in plan)
    # Still responsive afterwards.
    r = request(
        "POST",
        server.url + "/v1/completions",
        body=json.dumps({"model": "qwen", "prompt": "hi", "max_tokens": 2}).encode(),
        headers=AUTH,
    )
    assert r.status_code == 200
    assert_no_leaks(server.wait_idle())


def test_a_client_leaving_a_whole_response_aborts_it(server: ServerThread) -> None:
    body = {"model": "llama", "prompt": "hi", "max_tokens": 1800, "ignore_eos": True}

    async def leave_early() -> None:
        timeout = aiohttp.ClientTimeout(total=0.3)
        async with aiohttp.ClientSession(headers=AUTH, timeout=timeout) as session:
            try:
                async with session.post(server.url + "/v1/completions", json=body) as r:
                    await r.read()
            except TimeoutError:
                return
        raise AssertionError("1800 tokens came back within 0.3 s")

    sample = server.state.metrics.registry.get_sample_value
    labels = {"model_name": "llama", "finished_reason": "abort"}
    before = sample("vllm:request_success_total", labels) or 0.0
    asyncio.run(leave_early())
    assert_no_leaks(server.wait_idle())
    assert sample("vllm:request_success_total", labels) == before + 1


def test_a_stream_held_up_gets_keep_alive_comments_and_prompt_tokens(
    server: ServerThread,
) -> None:
    loop = server.state.loop
    keepalive_s, server.state.keepalive_s = server.state.keepalive_s, 0.1
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(30)

    async def read() -> tuple[str | None, bytes]:
        body = {"model": "qwen", "prompt": [1, 2, 3], "max_tokens": 2, "stream": True}
        async with (
            aiohttp.ClientSession(headers=AUTH) as session,
            session.post(server.url + "/v1/completions", json=body) as r,
        ):
            seen = b""
            # The engine thread is held: only keep-alive comments can come.
            while b": keep-alive\n\n" not in seen:
                seen += await asyncio.wait_for(r.content.readany(), 30)
            release.set()
            return r.headers.get("X-Shunter-Prompt-Tokens"), seen + await r.read()

    blocker = asyncio.run_coroutine_threadsafe(loop.call(hold), server.loop)
    try:
        assert held.wait(30)
        header, streamed = asyncio.run(read())
    finally:
        release.set()
        server.state.keepalive_s = keepalive_s
    blocker.result(30)
    assert header == "3"
    assert streamed.startswith(b": keep-alive\n\n")
    assert streamed.rstrip().endswith(b"data: [DONE]")
    assert_no_leaks(server.wait_idle())


def test_a_whole_response_carries_its_prompt_tokens(server: ServerThread) -> None:
    body = {"model": "llama", "prompt": ["hello there", "hi"], "max_tokens": 2, "n": 2}
    r = request(
        "POST", server.url + "/v1/completions", body=json.dumps(body).encode(), headers=AUTH
    )
    assert r.status_code == 200
    assert r.headers["X-Shunter-Prompt-Tokens"] == str(r.json()["usage"]["prompt_tokens"])
    assert int(r.headers["X-Shunter-Prompt-Tokens"]) > 2


def test_a_whole_response_gets_one_delta_per_choice_and_a_stream_one_per_token(
    server: ServerThread,
) -> None:
    """Whole responses are handed over when their requests end; streams as they go.
    Both carry the same tokens and text."""
    engine_loop = server.state.loop
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)

    async def run(whole: bool) -> list[tuple[int, Delta]]:
        loop = asyncio.get_running_loop()
        sink: asyncio.Queue[tuple[int, Delta]] = asyncio.Queue()
        now = engine_loop.engine.core.clock.now()
        streams = [
            Stream(i, "qwen", [5, 6, 7 + i], params, None, sink, loop, now, whole=whole)
            for i in range(4)
        ]
        engine_loop.submit(streams)
        got, ended = [], 0
        while ended < len(streams):
            index, delta = await sink.get()
            got.append((index, delta))
            ended += delta.finish_reason is not None
        return got

    whole = server.run(run(True))
    streamed = server.run(run(False))
    assert sorted(i for i, _ in whole) == [0, 1, 2, 3]
    assert all(len(d.token_ids) == 8 and d.finish_reason == "length" for _, d in whole)
    assert len(streamed) > len(whole)
    for index, delta in whole:
        parts = [d for i, d in streamed if i == index]
        assert [t for d in parts for t in d.token_ids] == delta.token_ids
        assert "".join(d.text for d in parts) == delta.text
    assert_no_leaks(server.wait_idle())
