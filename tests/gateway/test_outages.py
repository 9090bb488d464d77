"""PostgreSQL outages at the gateway, against a real database made unreachable: requests
that need a database read are refused with a 503 ``database_unavailable`` once their
cache entries expire, and the usage records of requests served meanwhile are spooled to
local disk and written when the database answers again, exactly once; so are the records
of a batch whose commit fails."""

from __future__ import annotations

import logging
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db.models import Sum

from shunter.engine.api.errors import ApiError
from shunter.gateway.auth import KeyAuthenticator, KeyGrant
from shunter.gateway.db import close_db_connections, run_db
from shunter.gateway.records import RecordWriter, replay_records
from shunter.gateway.replies import error_reply
from shunter.gateway.routes import RouteTable
from shunter.gateway.spool import PendingRecord, RecordSpool
from shunter.platform.models import Deployment
from shunter.tenants.models import RequestRecord, UsageRollup
from shunter.tenants.services import api_key_create
from tests.conftest import database_down
from tests.gateway.test_auth import Clock
from tests.gateway.test_proxy import record_fields
from tests.tenants.factories import make_deployment, make_tenant
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture(autouse=True)
def _close_gateway_connections() -> Iterator[None]:
    yield
    close_db_connections()  # the test database is flushed and dropped after us


def a_key() -> tuple[int, str]:
    """A deployment and the secret of a key that may use it."""
    deployment = make_deployment()
    _, secret = api_key_create(tenant=make_tenant(deployment), name="k", all_deployments=True)
    return deployment.pk, secret


def refused_unavailable(e: pytest.ExceptionInfo[ApiError]) -> None:
    assert e.value.status == 503
    assert e.value.body()["error"]["code"] == "database_unavailable"
    reply = error_reply(e.value, "req-1")
    assert reply.headers["Retry-After"] == "1" and reply.status == 503


async def test_with_the_database_down_a_cached_key_serves_until_its_entry_expires() -> None:
    clock = Clock()
    auth = KeyAuthenticator(ttl_s=3.0, clock=clock)
    _, secret = await run_db(a_key)
    header = f"Bearer {secret}"
    await auth.authenticate(header)
    with database_down():
        clock.now += 2.9  # within the bound: the cached grant, and a failing refresh
        await auth.authenticate(header)
        clock.now += 0.2  # expired: the read fails
        with pytest.raises(ApiError) as e:
            await auth.authenticate(header)
        refused_unavailable(e)
    assert (await auth.authenticate(header)).revoked is False  # read again: it is back


async def test_with_the_database_down_the_route_table_serves_until_it_expires() -> None:
    clock = Clock()
    routes = RouteTable(ttl_s=2.0, clock=clock)
    deployment_id, secret = await run_db(a_key)
    grant = await KeyAuthenticator().authenticate(f"Bearer {secret}")
    name = (await routes.allowed(grant))[0].model_name
    with database_down():
        clock.now += 1.9
        assert (await routes.choose(grant, name)).deployment_id == deployment_id
        clock.now += 0.2
        with pytest.raises(ApiError) as e:
            await routes.choose(grant, name)
        refused_unavailable(e)
    assert (await routes.choose(grant, name)).deployment_id == deployment_id


def grant_of(secret: str) -> KeyGrant:
    from shunter.gateway.auth import load_grant

    grant = load_grant(secret)
    assert grant is not None
    return grant


def test_records_lost_to_an_outage_are_spooled_and_written_when_it_ends(
    tmp_path: Path,
) -> None:
    deployment_id, secret = a_key()
    grant = grant_of(secret)
    writer = RecordWriter(spool_dir=tmp_path)
    with database_down():
        kept = [writer.add(grant, deployment_id, record_fields(f"down-{i}")) for i in range(5)]
        for written in kept:
            assert written.result(timeout=30) is None  # spooled: not lost
        assert len((tmp_path / "records.jsonl").read_bytes().splitlines()) == 5
    # The background replay (with backoff) writes them once the database answers.
    wait_for(
        lambda: RequestRecord.objects.filter(request_id__startswith="down-").count() == 5,
        30,
        "the spooled records in the database",
    )
    wait_for(lambda: not writer.replayer.spool.pending(), 30, "the spool emptied")
    assert RequestRecord.objects.filter(tenant_id=grant.tenant_id).count() == 5


def test_a_batch_whose_commit_fails_is_spooled_and_written_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    deployment_id, secret = a_key()
    grant = grant_of(secret)
    # The deployment's row stays cached.
    monkeypatch.setattr("shunter.gateway.records.rows.ttl_s", 3600.0)
    writer = RecordWriter(spool_dir=tmp_path)
    assert writer.add(grant, deployment_id, record_fields("commit-0")).result(timeout=30) is None
    UsageRollup.objects.filter(deployment_id=deployment_id).delete()  # they protect it
    Deployment.objects.filter(pk=deployment_id).delete()
    # The cached row makes the next records refer to a deployment deleted meanwhile: the
    # foreign keys, checked when the batch commits, fail the whole batch.
    with caplog.at_level(logging.WARNING, logger="shunter.gateway"):
        kept = [writer.add(grant, deployment_id, record_fields(f"commit-{i}")) for i in (1, 2)]
        for written in kept:
            assert written.result(timeout=30) is None  # spooled: not lost
    assert "records not written, spooled" in caplog.text and "did not commit" in caplog.text
    # The replay reads the rows again: the deployment is gone, the records keep a null.
    wait_for(
        lambda: RequestRecord.objects.filter(request_id__startswith="commit-").count() == 3,
        30,
        "the records of the batch that did not commit",
    )
    assert set(
        RequestRecord.objects.filter(request_id__in=["commit-1", "commit-2"]).values_list(
            "deployment_id", flat=True
        )
    ) == {None}
    wait_for(lambda: not writer.replayer.spool.pending(), 30, "the spool emptied")


def test_a_replay_cut_short_after_its_commit_bills_nothing_twice(tmp_path: Path) -> None:
    deployment_id, secret = a_key()
    grant = grant_of(secret)
    spool = RecordSpool(tmp_path)
    records = [
        PendingRecord(uuid.uuid4(), grant.tenant_id, grant.api_key_id, deployment_id, fields)
        for fields in (record_fields(f"spooled-{i}") for i in range(4))
    ]
    spool.append(records)
    with (tmp_path / "records.jsonl").open("ab") as handle:
        handle.write(b'{"record_key": "torn')  # a write cut short by a crash
    left_behind = tmp_path / "left-behind.jsonl"
    shutil.copy(tmp_path / "records.jsonl", left_behind)
    assert spool.replay(replay_records) == 4
    # A replayer that died after the commit, before removing its file, leaves it behind.
    left_behind.rename(tmp_path / "replaying.jsonl")
    assert spool.pending() and spool.replay(replay_records) == 4
    assert not spool.pending()
    rows = RequestRecord.objects.filter(tenant_id=grant.tenant_id)
    assert sorted(rows.values_list("record_key", flat=True)) == sorted(
        r.record_key for r in records
    )
    rollup = UsageRollup.objects.filter(tenant_id=grant.tenant_id).aggregate(n=Sum("requests"))
    assert rollup == {"n": 4}


def test_processes_sharing_a_spool_lose_and_repeat_no_record(tmp_path: Path) -> None:
    """Appends from two spools on one directory (as two processes would: separate open
    files, so separate locks) while a third replays again and again."""
    written: list[uuid.UUID] = []
    appended: list[uuid.UUID] = []
    lock = threading.Lock()

    def append(n: int) -> None:
        spool = RecordSpool(tmp_path)
        for i in range(n):
            record = PendingRecord(uuid.uuid4(), 1, 1, 1, {"request_id": f"r{i}"})
            spool.append([record])
            with lock:
                appended.append(record.record_key)

    def write(batch: list[PendingRecord]) -> None:
        written.extend(r.record_key for r in batch)

    appenders = [threading.Thread(target=append, args=(150,)) for _ in range(2)]
    for thread in appenders:
        thread.start()
    replayer = RecordSpool(tmp_path)
    while any(thread.is_alive() for thread in appenders):
        replayer.replay(write)
    for thread in appenders:
        thread.join()
    replayer.replay(write)
    assert len(written) == 300 and sorted(written) == sorted(appended)
