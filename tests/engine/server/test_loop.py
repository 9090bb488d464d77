"""The engine loop's command queue: callers that give up and commands that fail leave the
engine thread serving."""

from __future__ import annotations

import asyncio
import json
import threading

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
        with pytest.raises(RuntimeError, match="a command failed"):
            held.set()
            await loop.call(fail)
        await blocker

    server.run(give_up())
    assert ran.is_set()  # the command ran although its caller had gone
    assert server.run(loop.call(lambda: 7)) == 7
    assert _complete(server) == 200
