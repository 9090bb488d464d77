"""The usage records' writer (``gateway.records``): a batch goes to the database in one
insert and one rollup update per row, and a batch that one record fails is written
record by record, so that it loses no other and bills none twice."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.models import Sum
from django.test.utils import CaptureQueriesContext

from shunter.gateway import records, views
from shunter.gateway.auth import load_grant
from shunter.gateway.db import close_db_connections
from shunter.gateway.records import RecordWriter, starting, write_records
from shunter.gateway.replies import GatewayRequest, Reply
from shunter.gateway.spool import PendingRecord
from shunter.tenants.models import RequestRecord, UsageRollup
from shunter.tenants.services import api_key_create
from tests.gateway.test_proxy import record_fields
from tests.tenants.factories import make_deployment, make_tenant

pytestmark = pytest.mark.django_db


def pending(n: int, prefix: str = "rec") -> list[PendingRecord]:
    """``n`` records of one tenant's key on one deployment."""
    deployment = make_deployment()
    tenant = make_tenant(deployment)
    key, _ = api_key_create(tenant=tenant, name="k", all_deployments=True)
    return [
        PendingRecord(
            uuid.uuid4(), tenant.pk, key.pk, deployment.pk, record_fields(f"{prefix}-{i}")
        )
        for i in range(n)
    ]


def statements(queries: CaptureQueriesContext, verb: str, table: str) -> int:
    return sum(
        q["sql"].lstrip().upper().startswith(verb) and table in q["sql"]
        for q in queries.captured_queries
    )


def test_a_batch_is_one_insert_and_one_update_per_rollup_row() -> None:
    batch = pending(20)
    write_records(batch[:1])  # the rollup row exists, and the rows the writer reads are cached
    with CaptureQueriesContext(connection) as queries:
        assert write_records(batch[1:]) == [None] * 19
    assert statements(queries, "INSERT", RequestRecord._meta.db_table) == 1
    assert statements(queries, "UPDATE", UsageRollup._meta.db_table) == 1
    assert RequestRecord.objects.count() == 20
    rollup = UsageRollup.objects.get()
    assert (rollup.requests, rollup.completion_tokens) == (20, 20 * 32)


def test_a_record_written_already_is_not_written_twice_and_loses_no_other() -> None:
    batch = pending(6)
    assert write_records(batch[2:3]) == [None]
    # A replay repeats a record that was committed (the spool cut short after its
    # commit): the batch's insert fails on its key, and each record is written alone.
    assert write_records(batch) == [None] * 6
    rows = RequestRecord.objects.order_by("request_id")
    assert list(rows.values_list("request_id", flat=True)) == [f"rec-{i}" for i in range(6)]
    assert UsageRollup.objects.aggregate(n=Sum("requests")) == {"n": 6}


def test_a_record_the_database_refuses_fails_alone() -> None:
    batch = pending(4)
    batch[1].fields["status"] = "nonsense"
    errors = write_records(batch)
    assert [e is None for e in errors] == [True, False, True, True]
    assert "status" in str(errors[1])
    assert RequestRecord.objects.count() == 3
    assert UsageRollup.objects.aggregate(n=Sum("requests")) == {"n": 3}


@pytest.fixture
def writer() -> Iterator[RecordWriter]:
    yield RecordWriter()
    close_db_connections()  # the test database is flushed and dropped after us


def add_one(writer: RecordWriter, request_id: str) -> concurrent.futures.Future[None]:
    deployment = make_deployment()
    _, secret = api_key_create(tenant=make_tenant(deployment), name="k", all_deployments=True)
    grant = load_grant(secret)
    assert grant is not None
    return writer.add(grant, deployment.pk, record_fields(request_id))


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_records_wait_while_a_request_is_starting(
    writer: RecordWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(records, "RECORD_DEFER_S", 60.0)
    with starting:
        written = add_one(writer, "deferred")
        time.sleep(0.5)
        assert not written.done()
        assert not RequestRecord.objects.exists()
    # Its first token came: the batch goes at once.
    assert written.result(timeout=30) is None
    assert RequestRecord.objects.get().request_id == "deferred"


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_records_wait_for_starting_requests_a_bounded_time(
    writer: RecordWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(records, "RECORD_DEFER_S", 0.2)
    with starting:
        assert add_one(writer, "bounded").result(timeout=30) is None
        assert RequestRecord.objects.get().request_id == "bounded"


async def test_a_request_counts_as_starting_until_its_reply_is_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counted: list[int] = []

    async def generate(*_: object) -> Reply:
        counted.append(starting.count)
        await asyncio.sleep(0)
        return Reply(200)

    monkeypatch.setattr(views, "_generate", generate)
    request = GatewayRequest("POST", "/v1/completions", {}, b"{}")
    assert (await views.generate_reply(request, "completions", None)).status == 200
    assert counted == [1] and starting.count == 0
    # A batch waits for none now.
    assert starting.wait_idle(0.0)
