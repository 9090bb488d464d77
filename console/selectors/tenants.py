"""The tenant page: the tenant, its keys, its quotas beside their use, its latency
samples and its latest requests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from django.db.models import Count, Prefetch, Q, Sum
from django.utils import timezone

from shunter.console.selectors.buckets import LONGEST_REQUEST_S, floor_minute
from shunter.platform.models import Deployment
from shunter.tenants.models import ApiKey, RequestRecord, Tenant, UsageRollup

HISTOGRAM_SPAN = timedelta(hours=1)
HISTOGRAM_MAX_SAMPLES = 5000
RECENT_REQUESTS = 50


class QuotaUsage(TypedDict):
    name: str
    limit: int | None
    used: int | None
    unit: str
    note: str


def tenant_detail(tenant_id: int) -> Tenant | None:
    """The tenant with its SLO class and granted models loaded."""
    return (
        Tenant.objects.select_related("default_slo_class")
        .prefetch_related("models")
        .filter(pk=tenant_id)
        .first()
    )


def tenant_keys(tenant: Tenant) -> list[ApiKey]:
    """The tenant's keys, newest first, with their model scopes and their scopes' models
    and nodes."""
    return list(
        ApiKey.objects.restrict(tenant)
        .prefetch_related(
            "model_scopes",
            Prefetch("scopes", queryset=Deployment.objects.select_related("model", "node")),
        )
        .order_by("-created_at", "-id")
    )


def budget_period_start(now: datetime, period: str) -> datetime:
    """The UTC start of the day or month holding ``now``."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day if period == Tenant.BudgetPeriod.DAY else day.replace(day=1)


def tenant_quota_usage(tenant: Tenant, now: datetime | None = None) -> list[QuotaUsage]:
    """Each quota beside what the records and rollups say was used against it. Two
    queries. Requests per minute count arrivals of the last 60 s; tokens per minute the
    tokens of requests that ended in the current clock minute (the limiter's window);
    the budget sums the rollups of the current UTC day or month (by arrival)."""
    now = now or timezone.now()
    minute = floor_minute(now)
    recent = (
        RequestRecord.objects.restrict(tenant)
        # Arrivals of the last 60 s, and requests that ended this minute (within the
        # arrival index: they arrived at most LONGEST_REQUEST_S before it).
        .filter(t_arrival__gte=minute - timedelta(seconds=LONGEST_REQUEST_S))
        .order_by()
        .aggregate(
            requests=Count("id", filter=Q(t_arrival__gte=now - timedelta(seconds=60))),
            prompt=Sum("prompt_tokens", filter=Q(t_end__gte=minute)),
            completion=Sum("completion_tokens", filter=Q(t_end__gte=minute)),
        )
    )
    start = budget_period_start(now, tenant.budget_period)
    period = (
        UsageRollup.objects.restrict(tenant)
        .filter(minute__gte=start)
        .order_by()
        .aggregate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    )
    return [
        {
            "name": "Requests per minute",
            "limit": tenant.rpm_limit,
            "used": recent["requests"] or 0,
            "unit": "requests in the last 60 s",
            "note": "",
        },
        {
            "name": "Tokens per minute",
            "limit": tenant.tpm_limit,
            "used": (recent["prompt"] or 0) + (recent["completion"] or 0),
            "unit": "tokens this minute",
            "note": "",
        },
        {
            "name": "Concurrent requests",
            "limit": tenant.concurrency_limit,
            "used": None,
            "unit": "requests in flight",
            "note": "held by the gateway's limiter, not recorded in the database",
        },
        {
            "name": f"Token budget per {tenant.budget_period}",
            "limit": tenant.token_budget,
            "used": (period["prompt"] or 0) + (period["completion"] or 0),
            "unit": f"tokens since {start:%Y-%m-%d} UTC",
            "note": "",
        },
    ]


def tenant_latency_samples(
    tenant: Tenant, now: datetime | None = None
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """TTFT and TPOT samples (ms) of the tenant's successful requests of the last hour,
    per deployment (labelled ``model @ node``; a record whose deployment is gone, under
    its model name), newest first up to ``HISTOGRAM_MAX_SAMPLES``. One query."""
    now = now or timezone.now()
    ttft: dict[str, list[float]] = {}
    tpot: dict[str, list[float]] = {}
    rows = (
        RequestRecord.objects.restrict(tenant)
        .filter(t_arrival__gte=now - HISTOGRAM_SPAN, status=RequestRecord.Status.OK)
        .values_list(
            "model_name", "deployment__model__name", "deployment__node__name", "ttft_ms", "tpot_ms"
        )[:HISTOGRAM_MAX_SAMPLES]
    )
    for model_name, deployment_model, node_name, ttft_ms, tpot_ms in rows:
        label = f"{deployment_model} @ {node_name}" if deployment_model else model_name
        if ttft_ms is not None:
            ttft.setdefault(label, []).append(round(ttft_ms, 3))
        if tpot_ms is not None:
            tpot.setdefault(label, []).append(round(tpot_ms, 3))
    return ttft, tpot


def tenant_recent_requests(tenant: Tenant) -> list[dict[str, Any]]:
    """The tenant's latest requests, newest first. One query."""
    return list(
        RequestRecord.objects.restrict(tenant).values(
            "request_id",
            "model_name",
            "endpoint",
            "stream",
            "t_arrival",
            "status",
            "http_status",
            "error_type",
            "prompt_tokens",
            "completion_tokens",
            "ttft_ms",
            "tpot_ms",
            "ttft_met",
            "tbt_met",
        )[:RECENT_REQUESTS]
    )
