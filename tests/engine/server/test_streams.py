"""64 concurrent streaming clients, some leaving early: survivors complete, nothing leaks."""

from __future__ import annotations

import asyncio
import json
import random
import time

import aiohttp

from tests.engine.server.conftest import TOKEN, ServerThread, assert_no_leaks, request

AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _client(url: str, i: int, leave_after: int | None) -> str | None:
    """Stream one request; with ``leave_after``, drop the connection after that many
    chunks. Returns the finish reason of a stream read to the end."""
    body = {
        "model": ("llama", "qwen")[i % 2],
        "prompt": f"request {i}: the dispatcher watches every signal",
        "max_tokens": 160,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0.7,
        "seed": i,
    }
    async with (
        aiohttp.ClientSession(headers=AUTH) as session,
        session.post(url + "/v1/completions", json=body) as r,
    ):
        assert r.status == 200
        chunks, finish = 0, None
        async for line in r.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                return finish
            choice = json.loads(data)["choices"][0]
            finish = choice["finish_reason"] or finish
            chunks += 1
            if leave_after is not None and chunks >= leave_after:
                r.connection.close()  # type: ignore[union-attr]
                return None
    raise AssertionError("the stream ended without [DONE]")


def test_concurrent_streams_with_disconnects(server: ServerThread) -> None:
    rng = random.Random(0)
    plan = [rng.choice([None, None, 1, 3, 8]) for _ in range(64)]

    async def responsive() -> float:
        """Seconds /v1/models takes to answer while the streams run."""
        await asyncio.sleep(0.2)
        t0 = time.perf_counter()
        async with (
            aiohttp.ClientSession(headers=AUTH) as session,
            session.get(server.url + "/v1/models") as r,
        ):
            assert r.status == 200
        return time.perf_counter() - t0

    async def run() -> tuple[list[str | None], float]:
        probe = asyncio.create_task(responsive())
        finishes = await asyncio.gather(*(_client(server.url, i, n) for i, n in enumerate(plan)))
        return list(finishes), await probe

    def aborted() -> float:
        sample = server.state.metrics.registry.get_sample_value
        return sum(
            sample("vllm:request_success_total", {"model_name": m, "finished_reason": "abort"})
            or 0.0
            for m in ("llama", "qwen")
        )

    before = aborted()
    results, probe_s = asyncio.run(run())
    assert probe_s < 2.0
    for leave_after, finish in zip(plan, results, strict=True):
        if leave_after is None:
            assert finish == "length"
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
