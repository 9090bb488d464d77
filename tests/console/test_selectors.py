"""The console's selectors on PostgreSQL: attainment windows from rollups, rates and the
5-second view from records, quota usage, and a fixed number of queries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shunter.console import selectors
from shunter.platform.models import SloClass
from shunter.tenants.models import RequestRecord
from tests.console.test_views import record
from tests.tenants.factories import make_deployment, make_node, make_tenant, slo

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 30, 20, tzinfo=UTC)


def at(seconds_ago: float, **fields: Any) -> dict[str, Any]:
    """Record fields of a request that arrived ``seconds_ago`` before NOW and took 1 s."""
    arrival = NOW - timedelta(seconds=seconds_ago)
    return {
        "t_arrival": arrival,
        "t_first_token": arrival,
        "t_end": arrival + timedelta(seconds=1),
        **fields,
    }


def test_attainment_windows_count_the_minutes_overlapping_each_window() -> None:
    deployment = make_deployment()
    tenant = make_tenant(deployment)
    record(tenant, deployment, **at(10))  # this minute: met
    record(tenant, deployment, **at(50, ttft_ms=9000.0))  # previous minute: TTFT missed
    record(tenant, deployment, **at(4 * 60, tpot_ms=500.0))  # 4 minutes ago: TBT missed
    record(tenant, deployment, **at(30 * 60, status="error", http_status=502))  # 30 min
    record(tenant, deployment, **at(2 * 3600))  # outside every window
    row = selectors.overview(now=NOW)["tenants"][str(tenant.pk)]
    w = row["windows"]
    assert [w[k]["requests"] for k in ("1", "5", "15", "60")] == [2, 3, 3, 4]
    assert w["1"]["ttft"] == 0.5 and w["1"]["tbt"] == 1.0 and w["1"]["joint"] == 0.5
    assert w["5"]["joint"] == pytest.approx(1 / 3)
    assert w["60"]["errors"] == 1 and w["60"]["joint"] == 0.25
    assert row["status"] == w["5"]["status"] == "miss"  # target 0.9


def test_attainment_uses_the_record_flags_of_each_tenants_class() -> None:
    standard = make_deployment(slo_class=slo("standard"))  # 5000 ms TTFT
    interactive = make_deployment(slo_class=slo("interactive"))
    SloClass.objects.filter(name="interactive").update(attainment_target=0.95)
    patient = make_tenant(standard, slo_name="batch")  # 60 s TTFT, target 0.9
    plain = make_tenant(standard, interactive, slo_name=None)
    for tenant in (patient, plain):
        record(tenant, standard, **at(10, ttft_ms=9000.0))
    rows = selectors.overview(now=NOW)["tenants"]
    row = rows[str(patient.pk)]
    assert (row["slo_class"], row["target"]) == ("batch", 0.9)
    assert row["windows"]["1"]["joint"] == 1.0 and row["status"] == "ok"
    # Without a class: the deployment's judged the request, the strictest target shows.
    row = rows[str(plain.pk)]
    assert (row["slo_class"], row["target"]) == ("per deployment", 0.95)
    assert row["windows"]["1"]["joint"] == 0.0 and row["status"] == "miss"
    lone = make_tenant(slo_name=None)  # no class and no deployments: the field's default
    target = selectors.overview(now=NOW)["tenants"][str(lone.pk)]["target"]
    assert target == SloClass._meta.get_field("attainment_target").get_default()
    # Granted a model: its deployments' classes count, as they do for the gateway.
    by_model = make_tenant(slo_name=None, models=[interactive.model])
    target = selectors.overview(now=NOW)["tenants"][str(by_model.pk)]["target"]
    assert target == 0.95


def test_statuses_against_the_target() -> None:
    assert selectors.attainment_status(None, 0.9) == "idle"
    assert selectors.attainment_status(0.9, 0.9) == "ok"
    assert selectors.attainment_status(0.86, 0.9) == "warn"
    assert selectors.attainment_status(0.8, 0.9) == "miss"


def test_rates_count_requests_that_ended_in_the_last_minute() -> None:
    deployment = make_deployment()
    tenant = make_tenant(deployment)
    record(tenant, deployment, completion_tokens=30, **at(20))
    record(tenant, deployment, completion_tokens=30, **at(30, status="aborted"))
    record(tenant, deployment, completion_tokens=60, **at(90))  # ended 89 s ago: out
    row = selectors.overview(now=NOW)["tenants"][str(tenant.pk)]
    assert row["requests_per_s"] == round(2 / 60, 3)
    assert row["tokens_per_s"] == 1.0
    assert row["errors"] == 1


def test_five_second_and_minute_series() -> None:
    deployment = make_deployment()
    tenant, idle = make_tenant(deployment), make_tenant(deployment)
    record(tenant, deployment, **at(1))  # bucket 12:30:15
    record(tenant, deployment, **at(3, ttft_ms=9000.0))  # bucket 12:30:15
    record(tenant, deployment, **at(7))  # bucket 12:30:10
    record(tenant, deployment, **at(400))  # outside the 5-minute view
    data = selectors.overview(now=NOW)
    fine = data["fine"][str(tenant.pk)]
    b15 = str(int(datetime(2026, 3, 1, 12, 30, 15, tzinfo=UTC).timestamp()))
    b10 = str(int(datetime(2026, 3, 1, 12, 30, 10, tzinfo=UTC).timestamp()))
    assert fine == {b15: 0.5, b10: 1.0}
    assert data["fine_since"] <= int(b10) and data["fine_since"] > NOW.timestamp() - 300
    minute = data["minute"][str(tenant.pk)]
    m30 = str(int(datetime(2026, 3, 1, 12, 30, tzinfo=UTC).timestamp()))
    m23 = str(int(datetime(2026, 3, 1, 12, 23, tzinfo=UTC).timestamp()))
    assert minute == {m30: pytest.approx(2 / 3), m23: 1.0}
    assert data["fine"][str(idle.pk)] == {} and data["minute"][str(idle.pk)] == {}


def test_overview_costs_five_queries_whatever_the_tenants(
    django_assert_num_queries: Any,
) -> None:
    deployments = [make_deployment() for _ in range(3)]
    for i in range(50):
        tenant = make_tenant(*deployments)
        for d in deployments[: 1 + i % 3]:
            record(tenant, d, **at(i))
    with django_assert_num_queries(5):
        data = selectors.overview(now=NOW)
    assert len(data["tenants"]) == 50


def test_quota_usage_against_each_limit() -> None:
    deployment = make_deployment()
    tenant = make_tenant(deployment, rpm_limit=100, tpm_limit=1000, token_budget=10_000)
    other = make_tenant(deployment)
    record(tenant, deployment, prompt_tokens=3, completion_tokens=4, **at(5))
    record(tenant, deployment, prompt_tokens=10, completion_tokens=10, **at(40))  # 12:29:40
    record(other, deployment, prompt_tokens=99, completion_tokens=99, **at(5))
    usage = {q["name"]: q for q in selectors.tenant_quota_usage(tenant, now=NOW)}
    assert usage["Requests per minute"]["used"] == 2
    # Tokens per minute: requests that ended in this clock minute (12:30): the first only.
    assert usage["Tokens per minute"]["used"] == 7
    assert usage["Token budget per day"]["used"] == 27
    assert usage["Token budget per day"]["limit"] == 10_000
    assert usage["Concurrent requests"]["used"] is None


def test_latency_samples_per_deployment_and_recent_requests(
    django_assert_num_queries: Any,
) -> None:
    # The same model on two nodes: two deployments, two histograms.
    a = make_deployment(node=make_node(name="node-a"))
    b = make_deployment(node=make_node(name="node-b"), model=a.model)
    tenant = make_tenant(a, b)
    record(tenant, a, ttft_ms=120.0, tpot_ms=12.0)
    record(tenant, b, ttft_ms=80.0, tpot_ms=8.0)
    record(tenant, b, status="error", http_status=502, ttft_ms=None, tpot_ms=None)
    # A record whose deployment is gone stays under its model name.
    record(tenant, None, model_name="retired", ttft_ms=50.0, tpot_ms=5.0)
    with django_assert_num_queries(1):
        ttft, tpot = selectors.tenant_latency_samples(tenant)
    model = a.model.name
    assert ttft == {f"{model} @ node-a": [120.0], f"{model} @ node-b": [80.0], "retired": [50.0]}
    assert tpot == {f"{model} @ node-a": [12.0], f"{model} @ node-b": [8.0], "retired": [5.0]}
    recent = selectors.tenant_recent_requests(tenant)
    assert len(recent) == 4 and recent[1]["status"] == RequestRecord.Status.ERROR
