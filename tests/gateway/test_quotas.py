"""Quotas through the gateway (Redis when the suite has it, one Lua script per admission):
no over-admission under concurrency, token budgets that count streamed responses too,
and concurrency leases given back when a client leaves mid-stream."""

from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from shunter.tenants.models import RequestRecord
from tests.gateway.conftest import (
    DB,
    HTTPS,
    REDIS_URL,
    LlamaSetup,
    bearer,
    wait_record,
)

pytestmark = [pytest.mark.slow, DB]


def test_thirty_parallel_requests_admit_exactly_ten_per_minute(llama_setup: LlamaSetup) -> None:
    tenant = llama_setup.world.tenant(llama_setup.llama, rpm_limit=10)
    _, secret = llama_setup.world.key(tenant)
    with ThreadPoolExecutor(30) as pool:
        replies = list(pool.map(lambda _: llama_setup.completion(secret), range(30)))
    assert sorted(r.status for r in replies).count(200) == 10
    refused = [r for r in replies if r.status != 200]
    assert {r.status for r in refused} == {429}
    for r in refused:
        assert (r.error["type"], r.error["code"]) == ("rate_limit_exceeded",) * 2
        assert 1 <= int(r.headers["retry-after"]) <= 60
        assert r.headers["x-ratelimit-limit-requests"] == "10"
        assert r.headers["x-ratelimit-remaining-requests"] == "0"
        assert r.headers["x-ratelimit-reset-requests"].endswith("s")
    admitted = [r for r in replies if r.status == 200]
    remaining = sorted(int(r.headers["x-ratelimit-remaining-requests"]) for r in admitted)
    assert remaining == list(range(10))
    if REDIS_URL:  # the counts live in Redis, where every gateway process sees them
        log = f"shunter:quota:{{{tenant.pk}}}:requests"
        assert redis.Redis.from_url(REDIS_URL).zcard(log) == 10


@pytest.mark.parametrize("stream", [False, True])
def test_a_spent_token_budget_stops_further_requests(llama_setup: LlamaSetup, stream: bool) -> None:
    # The first request reserves 5 + 8 (the prompt's estimate) + 24 tokens of 40; the
    # next one's reservation no longer fits what is left after it.
    tenant = llama_setup.world.tenant(llama_setup.llama, token_budget=40, budget_period="day")
    _, secret = llama_setup.world.key(tenant)
    rid = f"budget-{stream}-{tenant.pk}"
    r = llama_setup.completion(secret, rid, max_tokens=24, ignore_eos=True, stream=stream)
    assert r.status == 200
    if stream:  # the client did not ask for usage and got none
        events = [e for e in r.body.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]"
        assert all(json.loads(e[6:])["choices"] for e in events[:-1])
    record = wait_record(rid)
    assert record.completion_tokens == 24 and record.prompt_tokens > 0
    r = llama_setup.completion(secret)
    assert r.status == 429
    assert (r.error["type"], r.error["code"]) == ("insufficient_quota",) * 2
    assert "40 tokens per day" in r.error["message"]
    assert int(r.headers["retry-after"]) <= 86400


def test_a_client_that_leaves_gives_back_its_lease_and_aborts_upstream(
    llama_setup: LlamaSetup,
) -> None:
    tenant = llama_setup.world.tenant(llama_setup.llama, concurrency_limit=1)
    _, secret = llama_setup.world.key(tenant)
    conn = http.client.HTTPConnection("127.0.0.1", llama_setup.world.gateway.port, timeout=60)
    body = {
        "model": "llama",
        "prompt": "Tell me everything",
        "max_tokens": 1900,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {**HTTPS, **bearer(secret), "X-Request-Id": f"leaver-{tenant.pk}"}
    conn.request("POST", "/v1/completions", json.dumps(body), headers=headers)
    reply = conn.getresponse()
    assert reply.status == 200 and reply.readline().startswith(b"data: {")
    busy = llama_setup.completion(secret)
    assert busy.status == 429 and "concurrent" in busy.error["message"]
    assert llama_setup.world.engine.live_requests() == 1
    conn.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 10
    while (r := llama_setup.completion(secret)).status == 429:
        assert time.monotonic() < deadline, r.body
        time.sleep(0.1)
    assert r.status == 200
    record = wait_record(f"leaver-{tenant.pk}")
    assert record.status == RequestRecord.Status.ABORTED
    assert 0 < record.completion_tokens < 1900
    while llama_setup.world.engine.live_requests():
        assert time.monotonic() < deadline, "the engine still runs the abandoned request"
        time.sleep(0.1)
