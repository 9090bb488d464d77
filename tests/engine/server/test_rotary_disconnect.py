"""Clients leaving while their requests' KV is in host memory: a server whose device KV
holds one context, so long streams rotate through host swap space, and every aborted
request gives back its device blocks and its host blocks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import torch

from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.engine.server.models import ModelArg
from shunter.engine.server.serve import build_state
from shunter.engine.server.settings import EngineSettings
from shunter.engine.server.state import engine_state
from tests.engine.server.conftest import TOKEN, ServerThread, assert_no_leaks

pytestmark = pytest.mark.slow

AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONTEXT = 256  # tokens: the model's context, and all the device KV it gets
NUM_STREAMS = 6


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One model whose device KV holds one context of CONTEXT tokens, with host swap
    space for many more."""
    torch.set_num_threads(1)
    config = {**preset_config("tiny-qwen2"), "max_position_embeddings": CONTEXT}
    path = init_model_dir(tmp_path_factory.mktemp("short") / "qwen", config=config, seed=0)
    settings = EngineSettings(
        models=(ModelArg("qwen", path),),
        kv_tokens=CONTEXT,
        host_budget=8 << 20,
        grace_s=2.0,
    )
    state = build_state(settings, torch.device("cpu"), token=TOKEN, check_integrity=True)
    srv = ServerThread(state)
    yield srv
    srv.close()


class Hold:
    """Holds the engine thread, between two steps, at the first check that finds a
    request's KV in host memory; the admin state (integrity checked) of that moment."""

    def __init__(self, srv: ServerThread) -> None:
        assert srv.state.loop is not None
        self.srv, self.loop = srv, srv.state.loop
        self.held = threading.Event()
        self.release = threading.Event()
        self.state: dict[str, Any] | None = None

    def check(self) -> dict[str, Any] | None:
        self.loop.engine.core.check_integrity()
        state = engine_state(self.loop, self.srv.state.models)
        qwen = state["models"]["qwen"]
        if qwen["requests"]["rotary"] == 0 or qwen["host_swap_blocks_used"] == 0:
            return None
        self.state = state
        self.held.set()
        self.release.wait(60)
        return state

    def submit(self) -> concurrent.futures.Future[dict[str, Any] | None]:
        coro = self.loop.call(self.check)
        return asyncio.run_coroutine_threadsafe(coro, self.srv.loop)


async def _read(r: aiohttp.ClientResponse, chunks: list[int], i: int) -> None:
    async for line in r.content:
        if line.startswith(b"data: {"):
            chunks[i] += 1


def test_clients_leaving_rotary_requests_leave_nothing_behind(tight: ServerThread) -> None:
    total_blocks = tight.engine_state()["models"]["qwen"]["kv_blocks_total"]
    sample = tight.state.metrics.registry.get_sample_value
    labels = {"model_name": "qwen", "finished_reason": "abort"}
    aborted_before = sample("vllm:request_success_total", labels) or 0.0
    hold = Hold(tight)

    async def run() -> list[int]:
        chunks = [0] * NUM_STREAMS
        sessions = [aiohttp.ClientSession(headers=AUTH) for _ in range(NUM_STREAMS)]
        try:
            replies = []
            for i, session in enumerate(sessions):
                body = {
                    "model": "qwen",
                    "prompt": f"stream {i}: the hump yard sorts every car",
                    "max_tokens": CONTEXT - 32,
                    "stream": True,
                    "ignore_eos": True,
                }
                r = await session.post(tight.url + "/v1/completions", json=body)
                assert r.status == 200
                replies.append(r)
            readers = [asyncio.create_task(_read(r, chunks, i)) for i, r in enumerate(replies)]
            # Poll between steps until some request's KV is in host memory; then the
            # engine thread stays held while every client leaves.
            deadline = time.monotonic() + 60
            while not hold.held.is_set():
                future = hold.submit()
                while not (future.done() or hold.held.is_set()):
                    await asyncio.sleep(0.005)
                assert not any(reader.done() for reader in readers), "a stream ended first"
                assert time.monotonic() < deadline, "no request rotated to host memory"
            for reader in readers:
                reader.cancel()
            for r in replies:
                r.close()
            # Each departure queues an abort for the engine thread, still held.
            while hold.loop.num_pending_commands < NUM_STREAMS:
                assert time.monotonic() < deadline, "the server did not see the clients leave"
                await asyncio.sleep(0.005)
        finally:
            hold.release.set()
            for session in sessions:
                await session.close()
        return chunks

    try:
        chunks = asyncio.run(run())
    finally:
        hold.release.set()
    at_hold = hold.state
    assert at_hold is not None
    qwen = at_hold["models"]["qwen"]
    assert qwen["requests"]["rotary"] >= 1 and qwen["host_swap_blocks_used"] >= 1
    assert at_hold["host_swap"]["bytes_used"] > 0 and at_hold["transfers"]["blocks_d2h"] > 0
    assert at_hold["requests"]["live"] == NUM_STREAMS
    # Every stream had begun and none had finished: the rotary ones left mid-stream.
    assert all(n >= 1 for n in chunks)
    after = tight.wait_idle()
    assert_no_leaks(after)
    assert after["models"]["qwen"]["kv_blocks_total"] == total_blocks
    assert sample("vllm:request_success_total", labels) == aborted_before + NUM_STREAMS
    # No step ran after the aborts, yet the gauges say what the state says: nothing left.
    qwen = {"model_name": "qwen"}
    for gauge in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "shunter:num_requests_rotary",
    ):
        assert sample(gauge, qwen) == 0, gauge
    assert sample("vllm:kv_cache_usage_perc", qwen) == after["models"]["qwen"]["kv_usage"]
