"""What the gateway tells the engine about a request, from real rows: the request's SLO
class is the tenant's when it has one, else the deployment's. Records written in
batches, a bad one losing no other."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db.models import Sum
from django.utils import timezone

from shunter.gateway.auth import load_grant
from shunter.gateway.db import close_db_connections
from shunter.gateway.proxy import slo_header
from shunter.gateway.records import RecordWriter
from shunter.gateway.routes import load_routes
from shunter.tenants.models import RequestRecord, UsageRollup
from shunter.tenants.services import api_key_create, tenant_update
from tests.tenants.factories import make_deployment, make_tenant, slo

pytestmark = pytest.mark.django_db


def test_the_tenants_slo_class_goes_to_the_engine_else_the_deployments() -> None:
    deployment = make_deployment(slo_class=slo("standard"))
    tenant = make_tenant(deployment, slo_name="interactive")
    _, secret = api_key_create(tenant=tenant, name="k", all_deployments=True)
    (route,) = load_routes()[deployment.model.name]
    grant = load_grant(secret)
    assert grant is not None
    assert slo_header(grant, route) == slo("interactive").header()
    tenant_update(tenant=tenant, default_slo_class=None)
    grant = load_grant(secret)
    assert grant is not None
    assert slo_header(grant, route) == slo("standard").header()


@pytest.fixture
def _close_writer_connections() -> Iterator[None]:
    yield
    close_db_connections()  # the test database is flushed and dropped after us


def record_fields(request_id: str, status: str = "ok") -> dict[str, Any]:
    arrival = timezone.now()
    return {
        "request_id": request_id,
        "model_name": "m",
        "endpoint": "completions",
        "stream": True,
        "t_arrival": arrival,
        "t_first_token": arrival + timedelta(milliseconds=40),
        "t_end": arrival + timedelta(milliseconds=200),
        "prompt_tokens": 64,
        "completion_tokens": 32,
        "ttft_ms": 40.0,
        "tpot_ms": 5.0,
        "max_itl_ms": 9.0,
        "status": status,
        "error_type": "",
        "http_status": 200,
    }


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
@pytest.mark.usefixtures("_close_writer_connections")
def test_records_are_written_in_batches_and_a_bad_one_loses_no_other() -> None:
    deployment = make_deployment()
    tenant = make_tenant(deployment)
    key, secret = api_key_create(tenant=tenant, name="k", all_deployments=True)
    grant = load_grant(secret)
    assert grant is not None
    writer = RecordWriter()
    good = [writer.add(grant, deployment.pk, record_fields(f"rec-{i}")) for i in range(30)]
    bad = writer.add(grant, deployment.pk, record_fields("rec-bad", status="nonsense"))
    good += [writer.add(grant, deployment.pk, record_fields(f"rec-{i}")) for i in range(30, 40)]
    for written in good:
        assert written.result(timeout=60) is None
    assert isinstance(bad.exception(timeout=60), ValidationError)
    rows = RequestRecord.objects.filter(tenant=tenant)
    assert sorted(rows.values_list("request_id", flat=True)) == sorted(
        f"rec-{i}" for i in range(40)
    )
    assert set(rows.values_list("api_key_id", "deployment_id")) == {(key.pk, deployment.pk)}
    rollups = UsageRollup.objects.filter(tenant=tenant, deployment=deployment)
    assert rollups.aggregate(n=Sum("requests"), tokens=Sum("completion_tokens")) == {
        "n": 40,
        "tokens": 40 * 32,
    }
