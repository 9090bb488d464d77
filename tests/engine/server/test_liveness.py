"""Liveness apart from step time: ``/health`` and ``/admin/state`` answer from the
loop's published snapshot while the engine thread is held, a loop busy past its stall
limit is reported, and a longest legal prompt is chunked over steps that keep another
request's tokens coming."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import torch

from shunter.engine.core import StepStats
from shunter.engine.server.models import ModelArg
from shunter.engine.server.serve import build_state
from shunter.engine.server.settings import EngineSettings
from tests.engine.server.conftest import TOKEN, ServerThread, assert_no_leaks, request
from tests.waiting import wait_for

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _hold_engine_thread(server: ServerThread) -> tuple[threading.Event, threading.Event]:
    """Run a command on the engine thread that blocks until the second event is set
    (30 s at most); the first is set while it holds the thread."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(30)
        held.clear()

    asyncio.run_coroutine_threadsafe(server.state.loop.call(hold), server.loop)
    assert held.wait(10)
    return held, release


def test_health_and_state_answer_while_the_engine_thread_is_held(server: ServerThread) -> None:
    held, release = _hold_engine_thread(server)
    try:
        health = request("GET", server.url + "/health", headers=AUTH)
        state = request("GET", server.url + "/admin/state", headers=AUTH)
        # Both answered while the engine thread was still held: neither waited for it.
        assert held.is_set()
    finally:
        release.set()
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert state.status_code == 200
    body = state.json()
    assert set(body["models"]) == {"llama", "qwen"}
    assert body["models"]["llama"]["sharing"] == "temporal"  # configuration merged in
    assert body["stalled"] is False and body["snapshot_age_s"] >= 0
    assert abs(body["t_snapshot"] - (time.time() - body["snapshot_age_s"])) < 5
    assert_no_leaks(server.wait_idle())


def test_health_reports_a_loop_busy_past_its_stall_limit(server: ServerThread) -> None:
    loop = server.state.loop
    limit = loop.stall_after_s
    loop.stall_after_s = 0.3
    try:
        _, release = _hold_engine_thread(server)
        try:
            wait_for(
                lambda: request("GET", server.url + "/health").status_code == 503,
                30,
                "/health to report the stall",
                interval=0.02,
            )
            reply = request("GET", server.url + "/health")
            assert reply.json()["status"] == "stalled" and reply.json()["snapshot_age_s"] > 0.3
            assert request("GET", server.url + "/admin/state", headers=AUTH).json()["stalled"]
        finally:
            release.set()
        wait_for(
            lambda: request("GET", server.url + "/health").status_code == 200,
            30,
            "/health to recover",
            interval=0.02,
        )
        # Waiting idle is no stall, however old the snapshot.
        wait_for(lambda: loop.snapshot.age_s() > 0.4, 30, "an old snapshot", interval=0.02)
        assert request("GET", server.url + "/health").json()["status"] == "ok"
    finally:
        loop.stall_after_s = limit


@pytest.fixture(scope="module")
def chunking(model_dirs: dict[str, Path]) -> Iterator[ServerThread]:
    """One spatial model, steps aimed at 20 ms (a prompt of a tiny model on CPU takes
    several times that in one step)."""
    settings = EngineSettings(
        models=(ModelArg("qwen", model_dirs["tiny-qwen2"], "spatial"),),
        kv_tokens=8192,
        grace_s=1.0,
        step_target_s=0.02,
    )
    srv = ServerThread(build_state(settings, torch.device("cpu"), token=TOKEN))
    yield srv
    srv.close()


def test_a_longest_prompt_is_chunked_and_another_requests_tokens_arrive_between(
    chunking: ServerThread,
) -> None:
    engine = chunking.state.loop.engine
    steps: list[StepStats] = []
    step = engine.step_with_stats

    def recorded() -> tuple[StepStats, list]:  # type: ignore[type-arg]
        stats, outputs = step()
        steps.append(stats)
        return stats, outputs

    engine.step_with_stats = recorded  # type: ignore[method-assign]
    max_context = chunking.state.models["qwen"].spec.max_context
    long_prompt = [7] * (max_context - 1)

    async def scenario() -> tuple[int, int]:
        """Tokens of the chat stream that arrived while the long prompt was in flight."""
        short = {"model": "qwen", "prompt": "hello", "max_tokens": 1500, "stream": True}
        long = {"model": "qwen", "prompt": long_prompt, "max_tokens": 1}
        async with (
            aiohttp.ClientSession(headers=AUTH) as session,
            session.post(
                chunking.url + "/v1/completions", json=short | {"ignore_eos": True}
            ) as stream,
        ):
            assert stream.status == 200
            lines = aiter(stream.content)
            await anext(lines)  # the chat request decodes
            sent = asyncio.ensure_future(session.post(chunking.url + "/v1/completions", json=long))
            during = 0
            while not sent.done():
                line = await anext(lines)
                during += line.startswith(b"data: ")
            reply = await sent
            assert reply.status == 200, await reply.text()
            usage = (await reply.json())["usage"]
            stream.connection.close()  # type: ignore[union-attr]
            return during, int(usage["prompt_tokens"])

    during, prompt_tokens = asyncio.run(scenario())
    assert prompt_tokens == max_context - 1
    engine.step_with_stats = step  # type: ignore[method-assign]
    # The prompt ran in chunks, each beside a decode of the chat request ...
    beside = [s for s in steps if s.num_prefills and s.num_decodes]
    assert len(beside) >= 3
    assert max(s.num_batch_tokens for s in steps) < prompt_tokens
    # ... whose tokens reached its client while the prompt was still in flight.
    assert during >= 3
    assert_no_leaks(chunking.wait_idle())
