"""Bearer key authentication against real PostgreSQL rows: lookups, refusals in OpenAI's
format, the cache's bound on revocation, and last-use writes."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from shunter.engine.api.errors import ApiError
from shunter.gateway.auth import KeyAuthenticator, KeyGrant, bearer_secret, load_grant
from shunter.gateway.db import DB_THREADS, close_db_connections, run_db, submit_db
from shunter.tenants.keys import secret_digest
from shunter.tenants.models import ApiKey
from shunter.tenants.services import api_key_create, api_key_revoke, tenant_update
from tests.tenants.factories import make_deployment, make_model, make_tenant

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture(autouse=True)
def _close_lookup_connections() -> Iterator[None]:
    yield
    close_db_connections()  # the test database is flushed and dropped after us


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class WallClock:
    """The current time as the authenticator sees it, moved by the test."""

    def __init__(self) -> None:
        self.now = timezone.now()

    def __call__(self) -> datetime:
        return self.now


def refusal(e: pytest.ExceptionInfo[ApiError]) -> tuple[int, str | None, str]:
    body = e.value.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return e.value.status, body["code"], body["type"]


@pytest.mark.parametrize(
    "header",
    [None, "", "Basic abc", "Bearer", "Bearer sk-other-123", "Bearer sk-shunter-short"],
)
def test_malformed_headers_are_refused_without_a_lookup(header: str | None) -> None:
    with pytest.raises(ApiError) as e:
        bearer_secret(header)
    assert refusal(e) == (401, "invalid_api_key", "invalid_request_error")


def test_a_key_grants_its_scopes_within_the_tenants_deployments() -> None:
    d1, d2, other = make_deployment(), make_deployment(), make_deployment()
    tenant = make_tenant(d1, d2, rpm_limit=7, token_budget=100, budget_period="month")
    make_tenant(other)
    _, everything = api_key_create(all_deployments=True, tenant=tenant, name="all")
    key, scoped = api_key_create(tenant=tenant, name="one", scopes=[d2])
    grant = load_grant(bearer_secret(f"Bearer {everything}"))
    assert grant is not None and grant.deployment_ids == {d1.pk, d2.pk}
    assert grant.limits.rpm == 7 and grant.limits.token_budget == 100
    assert grant.limits.budget_period == "month" and grant.tenant_name == tenant.name
    grant = load_grant(scoped)
    assert grant is not None and grant.deployment_ids == {d2.pk} and grant.api_key_id == key.pk
    assert grant.may_use(d2.pk, d2.model.name) and not grant.may_use(d1.pk, d1.model.name)
    assert not grant.may_use(other.pk, other.model.name)
    # Scopes count only within the tenant's deployments: once the tenant loses d2, a key
    # scoped to d2 may use nothing.
    tenant.deployments.remove(d2)
    grant = load_grant(scoped)
    assert grant is not None and grant.deployment_ids == frozenset()


def test_a_model_grant_reaches_every_deployment_of_the_model_made_after_it() -> None:
    llama = make_model(name="llama")
    first, pinned, stranger = make_deployment(model=llama), make_deployment(), make_deployment()
    tenant = make_tenant(pinned, models=[llama])
    _, everything = api_key_create(tenant=tenant, name="all", all_deployments=True)
    _, by_model = api_key_create(tenant=tenant, name="llama", model_scopes=[llama])
    _, by_deployment = api_key_create(tenant=tenant, name="pinned", scopes=[pinned])
    read_before = load_grant(everything)
    second = make_deployment(model=llama)  # a second node serving llama, after the grants

    grant = load_grant(everything)
    assert grant is not None and grant.model_names == {"llama"}
    assert grant.deployment_ids == {first.pk, second.pk, pinned.pk}
    # A grant read before the node existed covers it too: by the model's name.
    assert read_before is not None and second.pk not in read_before.deployment_ids
    for g in (grant, read_before):
        assert all(g.may_use(d.pk, d.model.name) for d in (first, second, pinned))
        assert not g.may_use(stranger.pk, stranger.model.name)
    grant = load_grant(by_model)
    assert grant is not None and grant.model_names == {"llama"}
    assert grant.deployment_ids == {first.pk, second.pk}
    assert not grant.may_use(pinned.pk, pinned.model.name)
    grant = load_grant(by_deployment)
    assert grant is not None and grant.model_names == frozenset()
    assert grant.deployment_ids == {pinned.pk} and not grant.may_use(second.pk, "llama")

    # Model scopes count only within the tenant's models: once the tenant loses llama, a
    # key scoped to it reaches nothing, and the tenant's other keys no llama node.
    tenant.models.remove(llama)
    grant = load_grant(by_model)
    assert grant is not None and grant.model_names == grant.deployment_ids == frozenset()
    assert not grant.may_use(first.pk, "llama")
    grant = load_grant(everything)
    assert grant is not None and grant.model_names == frozenset()
    assert grant.deployment_ids == {pinned.pk}


def test_a_secret_with_a_known_prefix_but_another_tail_is_unknown() -> None:
    key, secret = api_key_create(all_deployments=True, tenant=make_tenant(), name="k")
    forged = secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")
    assert forged.startswith(key.prefix)
    assert load_grant(forged) is None
    assert ApiKey.objects.filter(digest=secret_digest(secret)).count() == 1


async def test_refusals_and_the_cache_bound_on_revocation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    clock, wall = Clock(), WallClock()
    loads: list[str] = []

    def load(secret: str) -> KeyGrant | None:
        loads.append(secret[:16])
        return load_grant(secret)

    auth = KeyAuthenticator(ttl_s=3.0, load=load, clock=clock, wall_clock=wall)
    expires_at = wall.now + timedelta(hours=1)

    def setup() -> tuple[ApiKey, str, str]:
        tenant = make_tenant(make_deployment())
        key, secret = api_key_create(all_deployments=True, tenant=tenant, name="k")
        _, expiring = api_key_create(
            all_deployments=True,
            tenant=tenant,
            name="e",
            expires_at=expires_at,
        )
        return key, secret, expiring

    key, secret, expiring = await run_db(setup)
    grant = await auth.authenticate(f"Bearer {secret}")
    assert grant.api_key_id == key.pk
    await auth.authenticate(f"Bearer {secret}")
    assert len(loads) == 1  # the second came from the cache

    await run_db(lambda: api_key_revoke(api_key=key))
    clock.now += 2.9
    await auth.authenticate(f"Bearer {secret}")  # still cached: within the bound
    clock.now += 0.2
    with pytest.raises(ApiError) as e:
        await auth.authenticate(f"Bearer {secret}")
    assert refusal(e) == (401, "invalid_api_key", "invalid_request_error")
    assert "revoked" in e.value.message

    # Expiry is checked on every request, cached or not.
    await auth.authenticate(f"Bearer {expiring}")
    wall.now = expires_at - timedelta(microseconds=1)
    await auth.authenticate(f"Bearer {expiring}")
    wall.now = expires_at
    with pytest.raises(ApiError) as e:
        await auth.authenticate(f"Bearer {expiring}")
    assert refusal(e)[:2] == (401, "invalid_api_key") and "expired" in e.value.message

    # Unknown keys are refused and cached as unknown.
    unknown = "sk-shunter-" + "x" * 43
    for _ in range(3):
        with pytest.raises(ApiError) as e:
            await auth.authenticate(f"Bearer {unknown}")
        assert refusal(e)[:2] == (401, "invalid_api_key")
    assert loads.count(unknown[:16]) == 1

    for s in (secret, expiring, unknown):
        assert s not in caplog.text


async def test_an_inactive_tenant_is_forbidden() -> None:
    def setup() -> str:
        tenant = make_tenant()
        _, secret = api_key_create(all_deployments=True, tenant=tenant, name="k")
        tenant_update(tenant=tenant, is_active=False)
        return secret

    secret = await run_db(setup)
    with pytest.raises(ApiError) as e:
        await KeyAuthenticator().authenticate(f"Bearer {secret}")
    assert refusal(e) == (403, "tenant_inactive", "permission_error")


async def test_last_use_is_written_at_most_every_interval() -> None:
    clock = Clock()
    auth = KeyAuthenticator(touch_every_s=60.0, clock=clock)

    def setup() -> tuple[ApiKey, str]:
        return api_key_create(all_deployments=True, tenant=make_tenant(), name="k")

    key, secret = await run_db(setup)

    async def used(before: object, *, changes: bool) -> object:
        """The key's last use once it differs from ``before`` (the write runs in the
        background), or after a while when it should not."""
        for _ in range(100 if changes else 4):
            await asyncio.sleep(0.05)
            value = (await run_db(lambda: ApiKey.objects.get(pk=key.pk))).last_used_at
            if value != before:
                break
        return value

    await auth.authenticate(f"Bearer {secret}")
    first = await used(None, changes=True)
    assert first is not None
    clock.now += 30
    await auth.authenticate(f"Bearer {secret}")
    assert await used(first, changes=False) == first
    clock.now += 31
    await auth.authenticate(f"Bearer {secret}")
    later = await used(first, changes=True)
    assert later is not None and later > first  # type: ignore[operator]


async def test_concurrent_misses_share_one_read_and_a_key_in_use_is_read_again_behind_it() -> None:
    clock = Clock()
    loads: list[float] = []
    gate = threading.Event()

    def load(secret: str) -> KeyGrant | None:
        loads.append(clock.now)
        gate.wait(10)
        return load_grant(secret)

    auth = KeyAuthenticator(ttl_s=3.0, load=load, clock=clock)

    def setup() -> tuple[ApiKey, str]:
        return api_key_create(all_deployments=True, tenant=make_tenant(), name="k")

    key, secret = await run_db(setup)
    waiting = [asyncio.ensure_future(auth.authenticate(f"Bearer {secret}")) for _ in range(8)]
    await asyncio.sleep(0.1)
    assert loads == [1000.0] and not any(task.done() for task in waiting)
    gate.set()
    assert {grant.api_key_id for grant in await asyncio.gather(*waiting)} == {key.pk}
    assert loads == [1000.0]

    # Half the bound on, a request is answered from the cache while the key is read
    # again behind it (the read is held), once however many requests come.
    gate.clear()
    clock.now += 1.5
    for _ in range(3):
        grant = await asyncio.wait_for(auth.authenticate(f"Bearer {secret}"), timeout=1)
        assert grant.api_key_id == key.pk
    for _ in range(50):  # the read starts on a database thread
        if len(loads) > 1:
            break
        await asyncio.sleep(0.1)
    assert loads == [1000.0, 1001.5]
    await run_db(lambda: api_key_revoke(api_key=key))
    gate.set()
    for _ in range(100):  # the held read ends and caches what it saw
        if not auth.cache.reading():
            break
        await asyncio.sleep(0.05)
    # Past the first read's bound, the second read answers: it saw the revocation.
    clock.now += 1.6
    with pytest.raises(ApiError) as e:
        await auth.authenticate(f"Bearer {secret}")
    assert refusal(e)[:2] == (401, "invalid_api_key") and "revoked" in e.value.message
    # Answered from the cache: no read at 1003.1 was waited for (the second read's entry,
    # now past half its bound, may be read again behind the answer).
    assert loads[:2] == [1000.0, 1001.5] and len(loads) <= 3


async def test_a_request_that_leaves_does_not_cancel_the_key_read_others_wait_for() -> None:
    auth = KeyAuthenticator(ttl_s=3.0, clock=Clock())

    def setup() -> tuple[ApiKey, str]:
        return api_key_create(all_deployments=True, tenant=make_tenant(), name="k")

    key, secret = await run_db(setup)
    release = threading.Event()
    for _ in range(DB_THREADS):  # the database threads are busy: the read waits its turn
        submit_db(lambda: release.wait(10))
    try:
        waiting = [asyncio.ensure_future(auth.authenticate(f"Bearer {secret}")) for _ in range(4)]
        await asyncio.sleep(0.05)
        waiting[0].cancel()  # that client disconnected
        await asyncio.sleep(0.05)
    finally:
        release.set()
    grants = await asyncio.wait_for(asyncio.gather(*waiting[1:]), timeout=5)
    assert {g.api_key_id for g in grants} == {key.pk} and waiting[0].cancelled()
