"""The console's websockets through the real ASGI application (session cookie, origin
check, routing) and the configured channel layer: staff get a snapshot then live deltas;
anonymous users, non-staff users and unknown nodes are refused."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db import connections
from django.test import Client
from django.utils import timezone

from shunter.console.broadcaster import LEASE_KEY, Broadcaster, broadcaster
from shunter.platform.models import Node
from shunter.project.asgi import application
from tests.console.states import engine_like_state
from tests.console.test_views import record
from tests.tenants.factories import make_deployment, make_tenant

# Consumers read the database from worker threads: the rows must be committed. The
# seeded SLO classes come back after each test's flush.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

ORIGIN = (b"origin", b"http://127.0.0.1")


@pytest.fixture(autouse=True)
async def close_worker_connections() -> AsyncIterator[None]:
    """Close the connections the consumers' worker thread opened, so the test database
    can be dropped at the end of the session."""
    yield
    await sync_to_async(connections.close_all)()


def session_cookie(user: AbstractBaseUser) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


async def cookie(user: AbstractBaseUser) -> tuple[bytes, bytes]:
    return await database_sync_to_async(session_cookie)(user)  # type: ignore[no-any-return]


def communicator(path: str, *headers: tuple[bytes, bytes]) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, path, headers=[ORIGIN, *headers])


async def receive_until(
    ws: WebsocketCommunicator, accept: Any, timeout: float = 10.0
) -> dict[str, Any]:
    """Messages until one that ``accept`` takes; fails after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        left = deadline - asyncio.get_running_loop().time()
        assert left > 0, "no matching message in time"
        message: dict[str, Any] = await ws.receive_json_from(timeout=left)
        if accept(message):
            return message


@pytest.fixture
def tenant_world() -> dict[str, Any]:
    deployment = make_deployment()
    return {"deployment": deployment, "tenant": make_tenant(deployment, name="live-tenant")}


async def test_staff_get_a_snapshot_then_deltas(
    staff_user: AbstractBaseUser, tenant_world: dict[str, Any]
) -> None:
    tenant, deployment = tenant_world["tenant"], tenant_world["deployment"]
    tid = str(tenant.pk)
    ws = communicator("/ws/console/overview/", await cookie(staff_user))
    connected, _ = await ws.connect()
    assert connected
    first = await ws.receive_json_from(timeout=10)
    assert first["type"] == "snapshot"
    assert first["data"]["tenants"][tid]["windows"]["1"]["requests"] == 0
    assert broadcaster().running

    await database_sync_to_async(record)(tenant, deployment)

    def counted(message: dict[str, Any]) -> bool:
        row = message["data"].get("tenants", {}).get(tid)
        return (
            message["type"] == "delta"
            and row is not None
            and (row["windows"]["1"]["requests"] == 1)
        )

    delta = await receive_until(ws, counted)
    row = delta["data"]["tenants"][tid]
    assert row["windows"]["1"]["joint"] == 1.0 and row["status"] == "ok"
    assert row["requests_per_s"] == pytest.approx(1 / 60, abs=1e-3)
    # The 5-second series gained the request's bucket.
    assert any(v == 1.0 for v in delta["data"]["fine"][tid].values())
    await ws.disconnect()
    assert not broadcaster().running  # the last member left


async def test_tenants_created_and_deleted_while_watching_come_and_go(
    staff_user: AbstractBaseUser, tenant_world: dict[str, Any]
) -> None:
    ws = communicator("/ws/console/overview/", await cookie(staff_user))
    connected, _ = await ws.connect()
    assert connected
    first = await ws.receive_json_from(timeout=10)
    assert first["data"]["order"] == [str(tenant_world["tenant"].pk)]

    created = await database_sync_to_async(make_tenant)(name="a-newcomer")  # sorts first
    tid = str(created.pk)
    came = await receive_until(ws, lambda m: tid in m["data"].get("tenants", {}))
    assert came["data"]["tenants"][tid]["name"] == "a-newcomer"
    assert came["data"]["order"] == [tid, str(tenant_world["tenant"].pk)]
    assert came["data"]["minute"][tid] == {} and came["data"]["fine"][tid] == {}

    await database_sync_to_async(created.delete)()
    went = await receive_until(ws, lambda m: tid in m["data"].get("removed", []))
    assert went["data"]["order"] == [str(tenant_world["tenant"].pk)]
    await ws.disconnect()


async def test_node_page_gets_steps_rates_and_requests_as_deltas(
    staff_user: AbstractBaseUser,
) -> None:
    state = engine_like_state()
    t0 = timezone.now()
    node = await database_sync_to_async(make_deployment)()
    await database_sync_to_async(Node.objects.filter(pk=node.node_id).update)(
        state=state, state_at=t0, status=Node.Status.HEALTHY, last_seen=t0
    )
    ws = communicator(f"/ws/console/nodes/{node.node_id}/", await cookie(staff_user))
    connected, _ = await ws.connect()
    assert connected
    snapshot = (await ws.receive_json_from(timeout=10))["data"]
    assert snapshot["turn_holder"] == "llama"
    assert snapshot["memory_figure"]["data"]
    prefix = {m["name"]: m["prefix_hits"] for m in snapshot["models"]}
    assert prefix == {"llama": "62% (18% host)", "qwen": "-"}
    last_step = snapshot["steps"][-1][0]
    # The broadcaster's first tick has no earlier snapshot: it sends the whole view.
    first = (await receive_until(ws, lambda m: m["type"] == "delta"))["data"]
    assert first["steps"] == snapshot["steps"] and first["rates"] is None

    # A poll brings a newer state: 10 more steps, a rotation, bytes moved both ways.
    later = copy.deepcopy(state)
    later["steps"]["total"] += 10
    later["steps"]["recent_duration_s"] = later["steps"]["recent_duration_s"][10:] + [0.002] * 10
    later["transfers"]["rotations"] += 4
    later["transfers"]["bytes_d2h"] += 2_000_000_000
    later["transfers"]["bytes_h2d"] += 1_000_000_000
    later["models"]["qwen"]["requests"]["rotary"] = 3
    await database_sync_to_async(Node.objects.filter(pk=node.node_id).update)(
        state=later, state_at=t0 + timedelta(seconds=2)
    )

    def newer(message: dict[str, Any]) -> bool:
        return any(i > last_step for i, _ in message["data"].get("steps", []))

    delta = (await receive_until(ws, newer))["data"]
    new = [(i, ms) for i, ms in delta["steps"] if i > last_step]
    assert [i for i, _ in new] == list(range(last_step + 1, last_step + 11))
    assert all(ms == 2.0 for _, ms in new)
    assert "requests_figure" in delta
    rotary = next(t for t in delta["requests_figure"]["data"] if t["name"] == "rotary")
    assert rotary["y"][rotary["x"].index("qwen")] == 3
    # Two engine states 2 s apart: rates per second.
    rates = delta["rates"]
    assert rates["rotations_per_s"] == pytest.approx(2.0)
    assert rates["d2h_gb_per_s"] == pytest.approx(1.0)
    assert rates["h2d_gb_per_s"] == pytest.approx(0.5)
    await ws.disconnect()


async def test_anonymous_users_are_refused() -> None:
    ws = communicator("/ws/console/overview/")
    connected, code = await ws.connect()
    assert not connected and code == 4403


async def test_non_staff_users_are_refused(django_user_model: Any) -> None:
    user = await database_sync_to_async(django_user_model.objects.create_user)(
        username="customer", password="customer-pass"
    )
    ws = communicator("/ws/console/overview/", await cookie(user))
    connected, code = await ws.connect()
    assert not connected and code == 4403
    assert not broadcaster().running


async def test_unknown_node_is_refused(staff_user: AbstractBaseUser) -> None:
    ws = communicator("/ws/console/nodes/999999/", await cookie(staff_user))
    connected, code = await ws.connect()
    assert not connected and code == 4404


async def test_foreign_origins_are_refused(staff_user: AbstractBaseUser) -> None:
    ws = WebsocketCommunicator(
        application,
        "/ws/console/overview/",
        headers=[(b"origin", b"https://evil.example"), await cookie(staff_user)],
    )
    connected, _ = await ws.connect()
    assert not connected


async def test_one_broadcaster_holds_the_lease_at_a_time() -> None:
    await cache.adelete(LEASE_KEY)
    # Leases long enough that none lapses while the test looks, however slow the machine.
    first, second = Broadcaster(lease_ttl_s=60), Broadcaster(lease_ttl_s=60)
    try:
        assert await first.hold_lease()
        assert not await second.hold_lease()
        assert await first.hold_lease()  # renewal
        # A renewal sets the holder's TTL; then it stops renewing and the lease lapses
        # (not at once: only once the TTL has passed), and the other takes it.
        first.lease_ttl_s = 1
        assert await first.hold_lease()
        renewed = time.monotonic()
        while not await second.hold_lease():
            assert time.monotonic() - renewed < 30, "the lease never lapsed"
            await asyncio.sleep(0.05)
        assert time.monotonic() - renewed >= 0.9
        assert not await first.hold_lease()
    finally:
        await cache.adelete(LEASE_KEY)
