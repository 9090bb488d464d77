"""Engines that fail: killed in the middle of a stream (the client gets a terminating
error event, the record says error), or unreachable (a 503 after at most the connect
timeout, no hang).

Durations are compared with a baseline measured in the same test: the same request for
a model nobody serves, which the gateway answers without calling an engine. Each is the
best of a few tries, so that a loaded machine stretches both alike."""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shunter.gateway.upstream import CONNECT_TIMEOUT_S
from tests.conftest import free_port
from tests.gateway.conftest import (
    DB,
    HTTPS,
    Engine,
    Reply,
    World,
    bearer,
    call,
    wait_record,
)

pytestmark = [pytest.mark.slow, DB]


def best_of(tries: int, url: str, body: dict[str, Any], secret: str) -> tuple[Reply, float]:
    """The last reply to ``tries`` POSTs of ``body`` to ``url``, and the shortest time one
    took."""
    best = float("inf")
    for _ in range(tries):
        started = time.monotonic()
        reply = call("POST", url, body, headers=bearer(secret))
        best = min(best, time.monotonic() - started)
    return reply, best


def baseline(url: str, body: dict[str, Any], secret: str) -> float:
    """How long ``body`` takes when the gateway answers it without an engine: its model
    is one nobody serves (404)."""
    reply, seconds = best_of(3, url, body | {"model": "nobody-serves-this"}, secret)
    assert reply.status == 404 and reply.error["code"] == "model_not_found"
    return seconds


@pytest.fixture
def doomed_engine(model_dirs: dict[str, Path], tmp_path: Path) -> Iterator[Engine]:
    engine = Engine({"llama-doomed": model_dirs["tiny-llama"]}, tmp_path / "engine.log")
    yield engine
    engine.stop()


def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error(
    world: World, doomed_engine: Engine
) -> None:
    node = world.node("doomed-node", doomed_engine.url)
    tenant = world.tenant(world.deployment(node, "llama-doomed"))
    _, secret = world.key(tenant)
    conn = http.client.HTTPConnection("127.0.0.1", world.gateway.port, timeout=60)
    body = {
        "model": "llama-doomed",
        "messages": [{"role": "user", "content": "A long story, please."}],
        "max_tokens": 1900,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {**HTTPS, **bearer(secret), "X-Request-Id": "killed-mid-stream"}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers=headers)
    reply = conn.getresponse()
    assert reply.status == 200
    # Random weights can emit tokens whose text is held back (part of a UTF-8 character):
    # wait for two chunks that carry text, so the gateway has timed the first token.
    texts = 0
    while texts < 2:
        line = reply.readline()
        assert line.startswith(b"data: {")
        reply.readline()
        delta = json.loads(line[6:])["choices"][0]["delta"]
        texts += bool(delta.get("content"))
    doomed_engine.proc.send_signal(signal.SIGKILL)
    events = [e for e in reply.read().split(b"\n\n") if e]
    conn.close()
    assert events[-1] == b"data: [DONE]"
    error = json.loads(events[-2].removeprefix(b"data: "))["error"]
    assert (error["code"], error["type"]) == ("engine_unavailable", "service_unavailable")
    assert all("choices" in json.loads(e[6:]) for e in events[:-2])
    record = wait_record("killed-mid-stream")
    assert (record.status, record.error_type) == ("error", "engine_unavailable")
    assert not record.ttft_met and not record.tbt_met
    assert record.ttft_ms is not None and record.completion_tokens > 0
    # No usage chunk came: the prompt is counted from the engine's response header.
    assert record.prompt_tokens > 0
    # The dead engine refuses connections: the next requests fail fast, waiting for no
    # connect timeout.
    url = world.gateway.url + "/v1/chat/completions"
    r, refused = best_of(3, url, body, secret)
    assert r.status == 503 and r.error["code"] == "engine_unavailable"
    assert refused - baseline(url, body, secret) < CONNECT_TIMEOUT_S


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose accept queue is full: connection attempts get no answer at all."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = int(server.getsockname()[1])
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    yield port
    for s in [*fillers, server]:
        s.close()


@pytest.mark.parametrize("listener", ["nothing", "silent"])
def test_an_unreachable_engine_is_503_within_the_connect_timeout(
    world: World, listener: str, silent_port: int
) -> None:
    # Nothing listening refuses at once; a silent port runs into the connect timeout.
    port = free_port() if listener == "nothing" else silent_port
    engine_url = f"http://127.0.0.1:{port}"
    node = world.node("unreachable-node", engine_url)
    tenant = world.tenant(world.deployment(node, "ghost"))
    _, secret = world.key(tenant)
    body = {"model": "ghost", "prompt": "hi", "stream": True}
    url = world.gateway.url + "/v1/completions"
    r, elapsed = best_of(2, url, body, secret)
    assert r.status == 503
    assert (r.error["code"], r.error["type"]) == ("engine_unavailable", "service_unavailable")
    waited = elapsed - baseline(url, body, secret)
    if listener == "nothing":
        assert waited < CONNECT_TIMEOUT_S
    else:  # the connect timeout, once: neither the read timeout nor a second try
        assert elapsed >= 0.9 * CONNECT_TIMEOUT_S and waited < 2 * CONNECT_TIMEOUT_S
    record = wait_record(r.headers["x-request-id"])
    assert (record.status, record.http_status) == ("error", 503)
