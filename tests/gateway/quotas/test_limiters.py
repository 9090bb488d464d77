"""Quota semantics, the same for the in-process limiter and the Redis one (real Redis)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import pytest
import redis.asyncio

from shunter.gateway.quotas import (
    Admission,
    InProcessQuotaLimiter,
    LeaseHold,
    Limits,
    QuotaLimiter,
    QuotaUnavailable,
    RedisQuotaLimiter,
    budget_period,
)
from tests import faults
from tests.conftest import free_port
from tests.faults import FaultyProxy, Mode

REDIS_URL = os.environ.get("REDIS_URL", "")
# 2031-01-31 23:59:00 UTC: a minute, a day and a month end within the next 60 s.
T0 = datetime(2031, 1, 31, 23, 59, tzinfo=UTC).timestamp()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["in-process", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[tuple[QuotaLimiter, Clock]]:
    clock = Clock(T0)
    if request.param == "in-process":
        yield InProcessQuotaLimiter(clock=clock, lease_ttl_s=120), clock
        return
    if not REDIS_URL:
        pytest.skip("REDIS_URL is not set (make test sets it)")
    redis_limiter = RedisQuotaLimiter(
        REDIS_URL, prefix=f"test:quota:{uuid.uuid4().hex}", clock=clock, lease_ttl_s=120
    )
    yield redis_limiter, clock
    for tenant in ("t", "other"):
        await redis_limiter.reset(tenant)
    await redis_limiter.aclose()


def lease() -> str:
    return uuid.uuid4().hex


async def test_thirty_parallel_requests_admit_exactly_the_rpm(
    limiter: tuple[QuotaLimiter, Clock],
) -> None:
    quotas, clock = limiter
    limits = Limits(rpm=10)
    answers = await asyncio.gather(*(quotas.admit("t", limits, lease()) for _ in range(30)))
    assert sum(a.admitted for a in answers) == 10
    refused = [a for a in answers if not a.admitted]
    assert {a.refused for a in refused} == {"requests"}
    assert all(a.error_code == "rate_limit_exceeded" for a in refused)
    assert all(59 <= a.retry_after_s <= 60 for a in refused)
    headers = refused[0].headers()
    assert headers["Retry-After"] == "60"
    assert headers["x-ratelimit-limit-requests"] == "10"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == "60.000s"
    assert "x-ratelimit-limit-tokens" not in headers
    # The window slides: a minute after the burst the whole limit is free again.
    clock.now += 60.001
    answers = await asyncio.gather(*(quotas.admit("t", limits, lease()) for _ in range(11)))
    assert sum(a.admitted for a in answers) == 10


async def test_the_request_window_slides(limiter: tuple[QuotaLimiter, Clock]) -> None:
    quotas, clock = limiter
    limits = Limits(rpm=4)
    for _ in range(2):
        assert (await quotas.admit("t", limits, lease())).admitted
    clock.now += 30
    for used in (3, 4):
        answer = await quotas.admit("t", limits, lease())
        assert answer.admitted and answer.requests_used == used
        assert answer.headers()["x-ratelimit-remaining-requests"] == str(4 - used)
    refused = await quotas.admit("t", limits, lease())
    assert refused.refused == "requests" and refused.retry_after_s == pytest.approx(30)
    clock.now += 30.5  # the first two left the window, the last two are still in it
    assert [(await quotas.admit("t", limits, lease())).admitted for _ in range(3)] == [
        True,
        True,
        False,
    ]


async def test_concurrency_leases_are_given_back_or_lapse(
    limiter: tuple[QuotaLimiter, Clock],
) -> None:
    quotas, clock = limiter
    limits = Limits(concurrency=2)
    first, second = [await quotas.admit("t", limits, lease()) for _ in range(2)]
    assert first.admitted and second.admitted and first.lease and second.lease
    third = await quotas.admit("t", limits, lease())
    assert third.refused == "concurrency" and third.lease is None
    assert third.headers()["Retry-After"] == "1"
    await quotas.settle("t", first, 0)
    await quotas.settle("t", first, 0)  # twice is harmless
    fourth = await quotas.admit("t", limits, lease())
    assert fourth.admitted
    assert not (await quotas.admit("t", limits, lease())).admitted
    # Leases nobody gave back lapse after the TTL (a gateway that crashed mid-request).
    clock.now += 121
    assert (await quotas.admit("t", limits, lease())).admitted


async def test_tokens_per_minute_refuse_until_the_next_window(
    limiter: tuple[QuotaLimiter, Clock],
) -> None:
    quotas, clock = limiter
    limits = Limits(tpm=100)
    clock.now += 20
    first = await quotas.admit("t", limits, lease())
    assert first.admitted and first.headers()["x-ratelimit-remaining-tokens"] == "100"
    await quotas.settle("t", first, 60)
    second = await quotas.admit("t", limits, lease())
    assert second.admitted and second.headers()["x-ratelimit-remaining-tokens"] == "40"
    await quotas.settle("t", second, 45)
    refused = await quotas.admit("t", limits, lease())
    assert refused.refused == "tokens" and refused.retry_after_s == pytest.approx(40)
    assert refused.headers()["x-ratelimit-remaining-tokens"] == "0"
    assert refused.headers()["x-ratelimit-reset-tokens"] == "40.000s"
    clock.now += 40
    assert (await quotas.admit("t", limits, lease())).admitted


@pytest.mark.parametrize("period", ["day", "month"])
async def test_a_spent_budget_refuses_until_the_period_ends(
    limiter: tuple[QuotaLimiter, Clock], period: str
) -> None:
    quotas, clock = limiter
    limits = Limits(token_budget=50, budget_period=period, rpm=1000)
    first = await quotas.admit("t", limits, lease())
    assert first.admitted
    await quotas.settle("t", first, 30)
    second = await quotas.admit("t", limits, lease())
    assert second.admitted
    await quotas.settle("t", second, 30)  # overshoots: the request was already running
    refused = await quotas.admit("t", limits, lease())
    assert refused.refused == "budget" and refused.error_code == "insufficient_quota"
    assert refused.budget_used == 60 and "50 tokens per " + period in refused.message()
    assert refused.retry_after_s == pytest.approx(60)  # both periods end at T0 + 60
    # Another tenant is not affected, and refusals do not count as requests.
    assert (await quotas.admit("other", limits, lease())).admitted
    assert refused.requests_used == 2
    clock.now += 60
    assert (await quotas.admit("t", limits, lease())).admitted


async def test_budget_periods_count_separately(limiter: tuple[QuotaLimiter, Clock]) -> None:
    quotas, clock = limiter
    clock.now -= 86400  # 2031-01-30 23:59: the day ends, the month goes on
    spent = await quotas.admit("t", Limits(), lease())
    await quotas.settle("t", spent, 40)
    clock.now += 60
    day, month = Limits(token_budget=40), Limits(token_budget=40, budget_period="month")
    assert (await quotas.admit("t", day, lease())).admitted
    assert (await quotas.admit("t", month, lease())).refused == "budget"


async def test_unlimited_tenants_take_no_lease_and_reset_forgets(
    limiter: tuple[QuotaLimiter, Clock],
) -> None:
    quotas, _ = limiter
    answer = await quotas.admit("t", Limits(), lease())
    assert answer.admitted and answer.lease is None and answer.headers() == {}
    limits = Limits(rpm=1, concurrency=1)
    assert (await quotas.admit("t", limits, lease())).admitted
    assert not (await quotas.admit("t", limits, lease())).admitted
    await quotas.reset("t")
    assert (await quotas.admit("t", limits, lease())).admitted


def test_budget_period_names_and_ends() -> None:
    assert budget_period(T0, "day") == ("20310131", 60.0)
    assert budget_period(T0, "month") == ("203101", 60.0)
    leap = datetime(2032, 2, 10, tzinfo=UTC).timestamp()
    assert budget_period(leap, "month") == ("203202", 20 * 86400.0)


def test_limits_refuse_an_unknown_period() -> None:
    with pytest.raises(ValueError, match="budget_period"):
        Limits(budget_period="week")


async def test_sequences_weigh_on_the_concurrency_limit(
    limiter: tuple[QuotaLimiter, Clock],
) -> None:
    quotas, _ = limiter
    limits = Limits(concurrency=4)
    wide = await quotas.admit("t", limits, lease(), sequences=3)
    assert wide.admitted and wide.lease and wide.sequences == 3
    busy = await quotas.admit("t", limits, lease(), sequences=2)
    assert busy.refused == "concurrency" and not busy.too_large
    assert "4 sequences and this request runs 2" in busy.message()
    assert (await quotas.admit("t", limits, lease(), sequences=1)).admitted  # 3 + 1 fit
    await quotas.settle("t", wide, 0)
    assert (await quotas.admit("t", limits, lease(), sequences=3)).admitted
    # More sequences than the limit can never run: refused without a retry delay.
    never = await quotas.admit("t", limits, lease(), sequences=5)
    assert never.refused == "concurrency" and never.too_large and never.lease is None
    assert "Retry-After" not in never.headers() and "5 sequences" in never.message()


async def test_reservations_count_against_tokens_per_minute_then_settle_to_usage(
    limiter: tuple[QuotaLimiter, Clock],
) -> None:
    quotas, clock = limiter
    limits = Limits(tpm=100)
    clock.now += 20
    first = await quotas.admit("t", limits, lease(), reserve=60)
    assert first.admitted and first.headers()["x-ratelimit-remaining-tokens"] == "40"
    refused = await quotas.admit("t", limits, lease(), reserve=50)  # 60 + 50 > 100
    assert refused.refused == "tokens" and refused.retry_after_s == pytest.approx(40)
    assert "60 used, this request may use up to 50" in refused.message()
    await quotas.settle("t", first, 20)  # it used 20 of the 60 it reserved
    second = await quotas.admit("t", limits, lease(), reserve=50)
    assert second.admitted and second.headers()["x-ratelimit-remaining-tokens"] == "30"
    # A request that settles after its window ended changes only its own window.
    clock.now += 40
    await quotas.settle("t", second, 90)
    third = await quotas.admit("t", limits, lease(), reserve=100)
    assert third.admitted and third.tokens_used == 100
    never = await quotas.admit("t", limits, lease(), reserve=101, sequences=8)
    assert never.refused == "tokens" and never.too_large and never.reserved == 101
    assert "up to 101 tokens" in never.message() and "8 sequences" in never.message()
    assert "Retry-After" not in never.headers()


async def test_reservations_count_against_the_budget(limiter: tuple[QuotaLimiter, Clock]) -> None:
    quotas, clock = limiter
    clock.now -= 3600
    limits = Limits(token_budget=50)
    first = await quotas.admit("t", limits, lease(), reserve=30)
    assert first.admitted and first.budget_used == 30
    refused = await quotas.admit("t", limits, lease(), reserve=30)
    assert refused.refused == "budget" and refused.error_code == "insufficient_quota"
    await quotas.settle("t", first, 45)  # the prompt estimate fell short: settle corrects
    assert (await quotas.admit("t", limits, lease(), reserve=5)).admitted
    assert (await quotas.admit("t", limits, lease(), reserve=1)).refused == "budget"
    assert (await quotas.admit("t", limits, lease(), reserve=51)).too_large


async def test_redis_unreachable_raises_quota_unavailable_and_logs_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nobody = RedisQuotaLimiter(f"redis://127.0.0.1:{free_port()}/0")
    with caplog.at_level(logging.WARNING, logger="shunter.quotas"):
        for _ in range(3):
            with pytest.raises(QuotaUnavailable):
                await nobody.admit("t", Limits(rpm=10), lease())
        with pytest.raises(QuotaUnavailable):
            await nobody.settle("t", Admission(True, Limits(), lease="x", reserved=5), 1)
    await nobody.aclose()
    lines = [r for r in caplog.records if r.name == "shunter.quotas"]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert "unavailable" in lines[0].getMessage()


async def test_a_killed_redis_connection_is_reopened() -> None:
    if not REDIS_URL:
        pytest.skip("REDIS_URL is not set (make test sets it)")
    quotas = RedisQuotaLimiter(REDIS_URL, prefix=f"test:quota:{uuid.uuid4().hex}")
    limits = Limits(rpm=10, concurrency=5)
    first = await quotas.admit("t", limits, lease(), sequences=2)
    assert first.admitted
    name = f"quota-test-{uuid.uuid4().hex}"
    await quotas._clients.get().client_setname(name)
    admin = redis.asyncio.Redis.from_url(REDIS_URL)
    killed = [c["id"] for c in await admin.client_list() if c.get("name") == name]
    assert killed
    for client_id in killed:
        await admin.client_kill_filter(_id=client_id)
    await admin.aclose()
    second = await quotas.admit("t", limits, lease(), sequences=3)
    assert second.admitted and second.requests_used == 2
    assert (await quotas.admit("t", limits, lease())).refused == "concurrency"
    await quotas.reset("t")
    await quotas.aclose()


async def test_a_refunded_request_leaves_the_request_window(
    limiter: tuple[QuotaLimiter, Clock],
) -> None:
    quotas, _ = limiter
    limits = Limits(rpm=2, tpm=100)
    failed = await quotas.admit("t", limits, lease(), reserve=30)
    served = await quotas.admit("t", limits, lease(), reserve=30)
    assert failed.entry and served.entry and failed.entry != served.entry
    assert (await quotas.admit("t", limits, lease())).refused == "requests"
    # The engine failed before accepting it: neither the request nor its tokens count.
    await quotas.settle("t", failed, 0, refund=True)
    await quotas.settle("t", served, 20)  # settled to what it used, and it counts
    again = await quotas.admit("t", limits, lease(), reserve=10)
    assert again.admitted and again.requests_used == 2 and again.tokens_used == 30
    assert (await quotas.admit("t", limits, lease())).refused == "requests"


async def test_a_renewed_lease_outlives_its_ttl_and_a_settled_one_stays_given_back(
    limiter: tuple[QuotaLimiter, Clock],
) -> None:
    quotas, clock = limiter  # lease_ttl_s=120
    limits = Limits(concurrency=1)
    running = await quotas.admit("t", limits, lease())
    clock.now += 100
    await quotas.renew("t", running)
    clock.now += 100  # 200 s after its admission, 100 s after its renewal
    assert (await quotas.admit("t", limits, lease())).refused == "concurrency"
    clock.now += 21
    late = await quotas.admit("t", limits, lease())
    assert late.admitted
    await quotas.renew("t", running)  # lapsed: not taken again
    await quotas.settle("t", late, 0)
    await quotas.renew("t", late)  # given back: not taken again
    assert (await quotas.admit("t", limits, lease())).admitted


def real_clock_limiter(kind: str, url: str, ttl_s: float) -> QuotaLimiter:
    if kind == "in-process":
        return InProcessQuotaLimiter(lease_ttl_s=ttl_s)
    if not REDIS_URL:
        pytest.skip("REDIS_URL is not set (make test sets it)")
    return RedisQuotaLimiter(url, prefix=f"test:quota:{uuid.uuid4().hex}", lease_ttl_s=ttl_s)


@pytest.mark.parametrize("kind", ["in-process", "redis"])
async def test_a_held_lease_lives_while_its_request_runs_and_lapses_after(kind: str) -> None:
    quotas = real_clock_limiter(kind, REDIS_URL, ttl_s=1.0)
    limits = Limits(concurrency=1)
    hold = quotas.hold("t", await quotas.admit("t", limits, lease()))
    deadline = time.monotonic() + 3.5  # three and a half lease lifetimes
    while time.monotonic() < deadline:
        assert (await quotas.admit("t", limits, lease())).refused == "concurrency"
        await asyncio.sleep(0.1)
    assert await hold.release(0) is True
    assert (await quotas.admit("t", limits, lease())).admitted
    await quotas.reset("t")
    await quotas.aclose()


@pytest.fixture
def redis_proxy() -> Iterator[FaultyProxy]:
    yield from faults.redis_proxy()


def through(proxy: FaultyProxy) -> str:
    """REDIS_URL with the proxy's port."""
    url = urllib.parse.urlsplit(REDIS_URL)
    return url._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()


@pytest.mark.parametrize("fault", ["refuse", "kill", "junk"])
async def test_a_settle_the_store_missed_is_retried_until_it_gets_through(
    redis_proxy: FaultyProxy, fault: Mode, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"test:quota:{uuid.uuid4().hex}"
    gateway = RedisQuotaLimiter(through(redis_proxy), prefix=prefix, lease_ttl_s=30)
    direct = RedisQuotaLimiter(REDIS_URL, prefix=prefix, lease_ttl_s=30)
    limits = Limits(concurrency=1, rpm=1)
    hold = gateway.hold("t", await gateway.admit("t", limits, lease()))
    redis_proxy.set(fault)
    with caplog.at_level(logging.WARNING, logger="shunter.quotas"):
        assert await hold.release(0, refund=True) is False  # retried in the background
    assert (await direct.admit("t", limits, lease())).refused == "concurrency"
    redis_proxy.set("forward")
    started = time.monotonic()
    while not (answer := await direct.admit("t", limits, lease())).admitted:
        assert answer.refused == "concurrency" and time.monotonic() - started < 15
        await asyncio.sleep(0.05)
    assert answer.requests_used == 1  # the refund took the first request out too
    await direct.reset("t")
    for quotas in (gateway, direct):
        await quotas.aclose()


async def test_a_settle_that_never_gets_through_gives_up_when_its_lease_lapsed(
    redis_proxy: FaultyProxy, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"test:quota:{uuid.uuid4().hex}"
    gateway = RedisQuotaLimiter(through(redis_proxy), prefix=prefix, lease_ttl_s=1.0)
    direct = RedisQuotaLimiter(REDIS_URL, prefix=prefix, lease_ttl_s=1.0)
    limits = Limits(concurrency=1)
    hold = gateway.hold("t", await gateway.admit("t", limits, lease(), reserve=7))
    redis_proxy.set("refuse")
    with caplog.at_level(logging.WARNING, logger="shunter.quotas"):
        assert await hold.release(3) is False
        retries = [t for t in LeaseHold._tasks if not t.done()]
        assert retries
        await asyncio.wait_for(asyncio.gather(*retries), timeout=15)
    assert "were not settled within 1 s" in caplog.text
    # The lease lapsed on its own meanwhile.
    assert (await direct.admit("t", limits, lease())).admitted
    await direct.reset("t")
    for quotas in (gateway, direct):
        await quotas.aclose()
