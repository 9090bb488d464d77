"""The server with async scheduling: each step planned while the one before runs, the
last step's outputs handed out while the next runs. Streams carry what the sequential
loop's carry, stops included, and clients that leave leak nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.engine.server.conftest import TOKEN, ServerThread, assert_no_leaks, serve_tiny_models

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def pipelined(model_dirs: dict[str, Path]) -> Iterator[ServerThread]:
    yield from serve_tiny_models(model_dirs, async_scheduling=True)


async def _stream(url: str, body: dict[str, object], leave_after: int | None) -> tuple[str, str]:
    """The text a stream carried and its finish reason ("left" when the client left)."""
    text, finish = "", ""
    async with (
        aiohttp.ClientSession(headers=AUTH) as session,
        session.post(url + "/v1/completions", json={**body, "stream": True}) as r,
    ):
        assert r.status == 200
        chunks = 0
        async for line in r.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                return text, finish
            choice = json.loads(data)["choices"][0]
            text += choice["text"]
            finish = choice["finish_reason"] or finish
            chunks += 1
            if leave_after is not None and chunks >= leave_after:
                return text, "left"
    raise AssertionError("the stream ended without [DONE]")


def _bodies() -> list[dict[str, object]]:
    """Greedy requests of both models: plain, with a stop string, a stop token or a
    length of their own, two at a time through each model's queue."""
    bodies: list[dict[str, object]] = []
    for i in range(16):
        body: dict[str, object] = {
            "model": ("llama", "qwen")[i % 2],
            "prompt": f"request {i}: the dispatcher watches every signal",
            "max_tokens": 24 + i,
            "temperature": 0,
        }
        if i % 4 == 1:
            body["stop"] = [" e", "a"]
        elif i % 4 == 2:
            body["stop_token_ids"] = [i * 31 % 500 + 4]
        elif i % 4 == 3:
            body["ignore_eos"] = True
        bodies.append(body)
    return bodies


def _serve(
    url: str, bodies: list[dict[str, object]], leave: list[int | None]
) -> list[tuple[str, str]]:
    async def run() -> list[tuple[str, str]]:
        return list(
            await asyncio.gather(*(_stream(url, b, n) for b, n in zip(bodies, leave, strict=True)))
        )

    return asyncio.run(run())


def test_streams_carry_what_the_sequential_loop_carries(
    server: ServerThread, pipelined: ServerThread
) -> None:
    bodies = _bodies()
    stay: list[int | None] = [None] * len(bodies)
    expected = _serve(server.url, bodies, stay)
    assert {finish for _, finish in expected} >= {"stop", "length"}
    assert _serve(pipelined.url, bodies, stay) == expected
    assert_no_leaks(pipelined.wait_idle())


def test_clients_that_leave_leak_nothing(pipelined: ServerThread) -> None:
    bodies = [{**b, "max_tokens": 200, "ignore_eos": True} for b in _bodies()]
    leave: list[int | None] = [(None, 1, 3, 8)[i % 4] for i in range(len(bodies))]
    results = _serve(pipelined.url, bodies, leave)
    for (_, finish), left in zip(results, leave, strict=True):
        assert finish == ("length" if left is None else "left")
    assert_no_leaks(pipelined.wait_idle())
