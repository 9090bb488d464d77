"""Fan-out through the gateway (real engines, gateways and Redis): a request's sequences
are bounded before admission, quotas count sequences and reserved tokens, an
unreachable quota store fails closed, and a stream that ends early counts the tokens
the engine reported, not the chunks relayed."""

from __future__ import annotations

import http.client
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shunter.tenants.models import RequestRecord
from tests.conftest import free_port
from tests.gateway.conftest import (
    DB,
    HTTPS,
    REDIS_URL,
    Engine,
    Gateway,
    LlamaSetup,
    Process,
    bearer,
    wait_record,
)

pytestmark = [pytest.mark.slow, DB]


def test_a_fan_out_past_the_bound_is_refused_before_admission(llama_setup: LlamaSetup) -> None:
    tenant = llama_setup.world.tenant(llama_setup.llama, rpm_limit=1)
    _, secret = llama_setup.world.key(tenant)
    r = llama_setup.completion(secret, prompt=["Hello"] * 3000, n=8)
    assert r.status == 400
    assert (r.error["type"], r.error["param"]) == ("invalid_request_error", "prompt")
    assert "24000 sequences (3000 prompts x n=8)" in r.error["message"]
    assert "at most 128" in r.error["message"]
    r = llama_setup.completion(secret, prompt=["Hello"] * 32, n=8)
    assert r.status == 400 and r.error["param"] == "n"
    assert llama_setup.world.engine.live_requests() == 0
    # Refused before admission: the one request a minute is still there.
    assert llama_setup.completion(secret).status == 200


def wait_fresh_minute(needed_s: float = 15.0) -> None:
    """Wait for a token window with ``needed_s`` left: the test's counts must share one."""
    while time.time() % 60 > 60 - needed_s:
        time.sleep(0.2)


def test_tokens_per_minute_reserve_every_sequence_then_settle(llama_setup: LlamaSetup) -> None:
    tenant = llama_setup.world.tenant(llama_setup.llama, tpm_limit=100)
    _, secret = llama_setup.world.key(tenant)
    wait_fresh_minute()
    # "Hello": 5 bytes + 8 margin; 20 tokens for its one sequence.
    rid = f"tpm-{tenant.pk}"
    r = llama_setup.completion(secret, rid, max_tokens=20, ignore_eos=True)
    assert r.status == 200 and r.headers["x-ratelimit-remaining-tokens"] == str(100 - 33)
    record = wait_record(rid)
    used = record.prompt_tokens + record.completion_tokens
    assert record.completion_tokens == 20
    # 8 sequences of 64 tokens could never fit 100 tokens a minute.
    r = llama_setup.completion(secret, n=8, max_tokens=64)
    assert r.status == 400 and r.error["param"] == "max_tokens"
    assert "up to 525 tokens" in r.error["message"] and "8 sequences" in r.error["message"]
    # The first request's reservation was settled to what it used.
    r = llama_setup.completion(secret, max_tokens=1)
    assert r.status == 200
    assert r.headers["x-ratelimit-remaining-tokens"] == str(100 - used - 14)
    # What is left cannot hold 4 sequences of 20 more.
    r = llama_setup.completion(secret, n=4, max_tokens=20)
    assert r.status == 429 and r.error["code"] == "rate_limit_exceeded"
    assert "this request may use up to 93" in r.error["message"]


def test_concurrency_counts_sequences(llama_setup: LlamaSetup) -> None:
    tenant = llama_setup.world.tenant(llama_setup.llama, concurrency_limit=2)
    _, secret = llama_setup.world.key(tenant)
    r = llama_setup.completion(secret, n=3)
    assert r.status == 400 and r.error["param"] == "n"
    assert "3 sequences" in r.error["message"] and "limit of 2" in r.error["message"]
    conn = http.client.HTTPConnection("127.0.0.1", llama_setup.world.gateway.port, timeout=60)
    body = {"model": "llama", "prompt": "Go on", "max_tokens": 1900, "n": 2}
    body |= {"ignore_eos": True, "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {**HTTPS, **bearer(secret)})
    reply = conn.getresponse()
    assert reply.status == 200 and reply.readline().startswith(b"data: {")
    busy = llama_setup.completion(secret)
    assert busy.status == 429 and "2 sequences and this request runs 1" in busy.error["message"]
    conn.close()
    deadline = time.monotonic() + 10
    while (r := llama_setup.completion(secret, n=2)).status == 429:
        assert time.monotonic() < deadline, r.body
        time.sleep(0.1)
    assert r.status == 200 and len(r.json()["choices"]) == 2


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[Process, str]]:
    """A Redis server of this test alone (it is stopped while a gateway uses it)."""
    port = free_port()
    command = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"]
    server = Process(command, dict(os.environ), tmp_path / "redis.log")
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.05)
    yield server, url
    server.stop()


def test_an_unreachable_quota_store_fails_closed(
    llama_setup: LlamaSetup, own_redis: tuple[Process, str], tmp_path: Path
) -> None:
    server, url = own_redis
    tenant = llama_setup.world.tenant(llama_setup.llama, rpm_limit=100)
    _, secret = llama_setup.world.key(tenant)
    gateway = Gateway(tmp_path / "gateway.log", {"REDIS_URL": url})
    try:
        assert llama_setup.completion(secret, url=gateway.url).status == 200
        server.stop()  # the pooled connection breaks, and nothing listens any more
        for _ in range(3):
            r = llama_setup.completion(secret, url=gateway.url)
            assert r.status == 503, r.body
            assert (r.error["type"], r.error["code"]) == (
                "service_unavailable",
                "quota_unavailable",
            )
            assert r.headers["retry-after"] == "1"
        log = gateway.output()
        assert log.count("quota store redis://127.0.0.1") == 1  # one line, not one each
        assert "Traceback" not in log
    finally:
        gateway.stop()


def test_a_killed_redis_connection_is_no_error(llama_setup: LlamaSetup) -> None:
    if not REDIS_URL:
        pytest.skip("REDIS_URL is not set (make test sets it)")
    tenant = llama_setup.world.tenant(llama_setup.llama, rpm_limit=100, concurrency_limit=4)
    _, secret = llama_setup.world.key(tenant)
    assert llama_setup.completion(secret).status == 200
    admin = redis.Redis.from_url(REDIS_URL)
    own = admin.client_id()
    db = redis.connection.parse_url(REDIS_URL).get("db", 0)
    victims = [c["id"] for c in admin.client_list() if int(c["db"]) == int(db) and c["id"] != own]
    assert victims  # the gateway's quota connections
    for victim in victims:
        admin.client_kill_filter(_id=victim)
    statuses = [llama_setup.completion(secret).status for _ in range(3)]
    assert statuses == [200] * 3


def test_a_stream_that_ends_early_counts_the_engines_tokens(
    llama_setup: LlamaSetup, model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    engine = Engine({"llama": model_dirs["tiny-llama"]}, tmp_path / "engine.log")
    try:
        node = llama_setup.world.node("doomed-node", engine.url)
        tenant = llama_setup.world.tenant(llama_setup.world.deployment(node, "llama"))
        _, secret = llama_setup.world.key(tenant)
        rid = f"early-{tenant.pk}"
        conn = http.client.HTTPConnection("127.0.0.1", llama_setup.world.gateway.port, timeout=60)
        body = {"model": "llama", "prompt": "Tell me everything", "max_tokens": 1900}
        body |= {"ignore_eos": True, "stream": True}
        headers = {**HTTPS, **bearer(secret), "X-Request-Id": rid}
        conn.request("POST", "/v1/completions", json.dumps(body), headers)
        reply = conn.getresponse()
        assert reply.status == 200
        chunks: list[dict[str, object]] = []
        error = None
        while (line := reply.readline()) != b"data: [DONE]\n":
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"]
                continue
            chunks.append(event)
            if len(chunks) == 200:
                engine.proc.kill()  # the engine dies mid-stream
        conn.close()
    finally:
        engine.stop()
    assert error is not None and error["code"] == "engine_unavailable"
    assert all("usage" not in chunk for chunk in chunks)  # the client did not ask
    # One chunk per generated token; some made no text visible (held back).
    assert 200 <= len(chunks) < 1900
    assert any(chunk["choices"][0]["text"] == "" for chunk in chunks)  # type: ignore[index]
    record = wait_record(rid)
    assert record.status == RequestRecord.Status.ERROR
    assert record.completion_tokens == len(chunks)
