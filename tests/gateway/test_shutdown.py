"""``shunter web`` stopping: the gateway's upstream session and quota connections are
closed on the serving loop at lifespan shutdown, after the last request's accounting, so
the server exits without "Unclosed client session" warnings."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.gateway.conftest import DB, Gateway, World, bearer, call, wait_record

pytestmark = [pytest.mark.slow, DB]


def test_shunter_web_closes_the_gateways_connections_when_it_stops(
    world: World, tmp_path: Path
) -> None:
    node = world.node("shutdown-node", world.engine.url)
    _, secret = world.key(world.tenant(world.deployment(node, "llama")))
    gateway = Gateway(tmp_path / "gateway.log")
    try:
        body = {"model": "llama", "prompt": "hello", "max_tokens": 3}
        headers = {**bearer(secret), "X-Request-Id": "before-shutdown"}
        reply = call("POST", f"{gateway.url}/v1/completions", body, headers=headers)
        assert reply.status == 200, reply.body
        assert wait_record("before-shutdown").status == "ok"
    finally:
        # Ctrl-C: the interpreter then finalizes, and would warn about what is left open.
        gateway.proc.send_signal(signal.SIGINT)
        gateway.proc.wait(timeout=30)
        gateway.stop()
    output = gateway.log.read_text(errors="replace")
    assert "Unclosed" not in output and "Traceback" not in output, output[-3000:]
    assert "Application shutdown complete" in output
