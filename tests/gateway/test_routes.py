"""The gateway's route table: one read shared by the requests that wait for it, read
again in the background while in use, and within its bound."""

from __future__ import annotations

import asyncio
import threading

import pytest

from shunter.engine.api.errors import ApiError
from shunter.gateway.auth import KeyGrant
from shunter.gateway.db import DB_THREADS, submit_db
from shunter.gateway.quotas import Limits
from shunter.gateway.routes import Route, RouteTable, engine_load


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def route(
    deployment_id: int, model: str = "m", status: str = "healthy", cordoned: bool = False
) -> Route:
    return Route(
        deployment_id=deployment_id,
        model_name=model,
        context_tokens=2048,
        enabled=True,
        node_name="n",
        node_status=status,
        engine_url="http://127.0.0.1:1",
        engine_token="",
        slo_header="class=standard,ttft_ms=5000,tbt_ms=100",
        ttft_ms=5000,
        node_cordoned=cordoned,
    )


def grant(*deployment_ids: int, models: frozenset[str] = frozenset()) -> KeyGrant:
    return KeyGrant(
        api_key_id=1,
        key_prefix="sk-shunter-abcd",
        tenant_id=1,
        tenant_name="t",
        tenant_active=True,
        deployment_ids=frozenset(deployment_ids),
        model_names=models,
        expires_at=None,
        revoked=False,
        limits=Limits(),
    )


class Rows:
    """The deployments as the database holds them; ``gate`` holds each read."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.table = {"m": [route(1)]}
        self.reads: list[float] = []
        self.gate = threading.Event()
        self.gate.set()

    def load(self) -> dict[str, list[Route]]:
        self.reads.append(self.clock.now)
        self.gate.wait(10)
        return {name: list(routes) for name, routes in self.table.items()}


def test_the_engine_load_is_read_from_the_cached_state_and_zero_without_it() -> None:
    state = {"models": {"m": {"requests": {"waiting": 3, "running": 2}, "kv_usage": 0.5}}}
    assert engine_load(state, "m") == (5, 0.5)
    assert engine_load(state, "other") == (0, 0.0)
    assert engine_load({}, "m") == engine_load({"models": {"m": "?"}}, "m") == (0, 0.0)
    assert engine_load({"models": {"m": {"requests": {"waiting": "x"}}}}, "m") == (0, 0.0)


async def test_requests_that_wait_for_the_table_share_one_read() -> None:
    clock = Clock()
    rows = Rows(clock)
    routes = RouteTable(ttl_s=2.0, load=rows.load, clock=clock)
    rows.gate.clear()
    waiting = [asyncio.ensure_future(routes.choose(grant(1), "m")) for _ in range(8)]
    await asyncio.sleep(0.1)
    assert rows.reads == [1000.0] and not any(task.done() for task in waiting)
    rows.gate.set()
    assert {r.deployment_id for r in await asyncio.gather(*waiting)} == {1}
    assert rows.reads == [1000.0]


async def test_the_table_is_read_again_in_the_background_and_kept_within_its_bound() -> None:
    clock = Clock()
    rows = Rows(clock)
    routes = RouteTable(ttl_s=2.0, load=rows.load, clock=clock)
    assert (await routes.choose(grant(1), "m")).deployment_id == 1

    # From half the bound on: answered at once from the table held, read again behind.
    rows.gate.clear()
    clock.now += 1.0
    for _ in range(3):
        chosen = await asyncio.wait_for(routes.choose(grant(1), "m"), timeout=1)
        assert chosen.deployment_id == 1
    for _ in range(50):  # the read starts on a database thread
        if len(rows.reads) > 1:
            break
        await asyncio.sleep(0.1)
    assert rows.reads == [1000.0, 1001.0]
    rows.table["m"] = [route(1, status="unhealthy")]
    rows.gate.set()
    for _ in range(100):  # the held read ends and its table is taken
        if not routes.reading():
            break
        await asyncio.sleep(0.05)
    with pytest.raises(ApiError) as e:  # the background read's table is in use
        await routes.choose(grant(1), "m")
    assert (e.value.status, e.value.code) == (503, "engine_unavailable")
    assert rows.reads == [1000.0, 1001.0]

    # Past the bound, a request waits for a new read.
    rows.table["m"] = [route(1)]
    rows.gate.clear()
    clock.now += 2.5
    waiting = asyncio.ensure_future(routes.choose(grant(1), "m"))
    await asyncio.sleep(0.1)
    assert not waiting.done() and rows.reads == [1000.0, 1001.0, 1003.5]
    rows.gate.set()
    assert (await waiting).deployment_id == 1

    # A deployment the grant names but the table lacks is read at once.
    rows.table["n"] = [route(2, model="n")]
    clock.now += 0.3
    assert (await routes.choose(grant(1, 2), "n")).deployment_id == 2
    assert rows.reads == [1000.0, 1001.0, 1003.5, 1003.8]


async def test_a_model_grant_reaches_a_deployment_added_later_once_the_table_holds_it() -> None:
    clock = Clock()
    rows = Rows(clock)
    routes = RouteTable(ttl_s=2.0, load=rows.load, clock=clock)
    by_model, by_id = grant(models=frozenset({"m"})), grant(1)
    assert (await routes.choose(by_model, "m")).deployment_id == 1

    # A second node of m: the model grant names no deployment the table lacks, so it
    # forces no read (the table held is used until its bound)...
    rows.table["m"] = [route(1), route(2)]
    clock.now += 0.3
    with pytest.raises(ApiError):
        await routes.choose(by_model, "m", exclude={1})
    assert rows.reads == [1000.0]
    # ...and reaches the new deployment once the table is read again within its bound.
    clock.now += 2.0
    assert [r.deployment_id for r in await routes.allowed(by_model)] == [1, 2]
    assert (await routes.choose(by_model, "m", exclude={1})).deployment_id == 2
    # A grant of deployment 1 alone does not.
    assert [r.deployment_id for r in await routes.allowed(by_id)] == [1]
    with pytest.raises(ApiError) as e:
        await routes.choose(by_id, "m", exclude={1})
    assert (e.value.status, e.value.code) == (503, "engine_unavailable")


def occupy_db_threads() -> threading.Event:
    """Hold every gateway database thread (the database is slow): reads queue behind."""
    release = threading.Event()
    for _ in range(DB_THREADS):
        submit_db(lambda: release.wait(10))
    return release


async def test_a_waiter_that_leaves_does_not_cancel_the_read_the_others_wait_for() -> None:
    clock = Clock()
    rows = Rows(clock)
    routes = RouteTable(ttl_s=2.0, load=rows.load, clock=clock)
    release = occupy_db_threads()
    try:
        waiting = [asyncio.ensure_future(routes.choose(grant(1), "m")) for _ in range(4)]
        await asyncio.sleep(0.05)
        waiting[0].cancel()  # its client disconnected while the read was queued
        await asyncio.sleep(0.05)
    finally:
        release.set()
    results = await asyncio.wait_for(asyncio.gather(*waiting[1:]), timeout=5)
    assert {r.deployment_id for r in results} == {1}
    assert waiting[0].cancelled() and rows.reads == [1000.0]
