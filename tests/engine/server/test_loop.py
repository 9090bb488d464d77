"""The engine loop's command queue: callers that give up and commands that fail leave the
engine thread serving."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from tests.engine.server.conftest import TOKEN, ServerThread, request

pytestmark = pytest.mark.slow


def _complete(server: ServerThread) -> int:
    body = json.dumps({"model": "llama", "prompt": "hi", "max_tokens": 2}).encode()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return request("POST", server.url + "/v1/completions", body=body, headers=headers).status_code


def test_a_caller_that_gives_up_and_a_failing_command_leave_the_loop_serving(
    server: ServerThread,
) -> None:
    loop = server.state.loop
    held, ran = threading.Event(), threading.Event()

    def hold() -> None:
        held.wait(10)

    def late() -> str:
        ran.set()
        return "nobody waits for this"

    def fail() -> None:
        raise RuntimeError("a command failed")

    async def give_up() -> None:
        blocker = asyncio.ensure_future(loop.call(hold))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(loop.call(late), timeout=0.2)
        held.set()
        with pytest.raises(RuntimeError, match="a command failed"):
            await loop.call(fail)
        await blocker

    server.run(give_up())
    assert ran.is_set()  # the command ran although its caller had gone
    assert server.run(loop.call(lambda: 7)) == 7
    assert _complete(server) == 200


def _ttft_seconds(server: ServerThread, model: str) -> tuple[float, float]:
    """The TTFT histogram's count and sum for ``model``."""
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {TOKEN}"}
    text = request("GET", server.url + "/metrics", headers=headers).text
    values = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("model_name") == model
    }
    return (
        values["vllm:time_to_first_token_seconds_count"],
        values["vllm:time_to_first_token_seconds_sum"],
    )


def test_ttft_counts_from_the_http_arrival_not_the_engine_pickup(server: ServerThread) -> None:
    loop = server.state.loop
    clock = loop.engine.core.clock
    held, release = threading.Event(), threading.Event()
    hold_s = 0.5

    def hold() -> None:
        held.set()
        release.wait(30)

    count, total = _ttft_seconds(server, "llama")
    blocker = asyncio.run_coroutine_threadsafe(loop.call(hold), server.loop)
    assert held.wait(30)
    statuses: list[int] = []
    client = threading.Thread(target=lambda: statuses.append(_complete(server)))
    client.start()
    # The request arrived before its submission was queued behind the held command; from
    # then on it waits at least hold_s.
    deadline = time.monotonic() + 30
    while not loop.num_pending_commands:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    t_queued = clock.now()
    while clock.now() - t_queued < hold_s:
        time.sleep(0.01)
    release.set()
    client.join(60)
    blocker.result(30)
    assert statuses == [200]
    count_after, total_after = _ttft_seconds(server, "llama")
    assert count_after == count + 1
    assert total_after - total >= hold_s
