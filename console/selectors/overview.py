"""The overview: every tenant's SLO attainment and rates, and the joint attainment series.

- Attainment over the last 1, 5, 15 and 60 minutes comes from the per-minute rollups:
  a window of ``w`` minutes is every minute bucket overlapping the last ``w`` minutes
  (so between ``w`` and ``w + 1`` minutes of arrivals; never empty at a minute's start).
- Rates (requests/s, tokens/s, errors) are over requests that ended in the last 60 s.
- The 5-second view is computed from the request records of the last 5 minutes, by
  arrival (the bucket of a request fills in when it finishes).

Attainment is a share of all requests; failed and aborted ones count as misses. Whether
a request met its SLO is the record's flags, judged when it was recorded against its
class (the tenant's when set, else the deployment's); a tenant's row compares them with
its class's target, or, for a tenant without a class, with the strictest target among
its deployments' classes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from django.db.models import Count, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from shunter.console import figures
from shunter.console.selectors.buckets import LONGEST_REQUEST_S, EpochBucket, floor_minute
from shunter.platform.models import Deployment, SloClass
from shunter.tenants.models import RequestRecord, Tenant, UsageRollup

WINDOWS_MIN = (1, 5, 15, 60)
STATUS_WINDOW_MIN = 5  # the window that colours a tenant's row
WARN_MARGIN = 0.05  # within this of the target: "warn", below it: "miss"
RATE_WINDOW_S = 60
FINE_BUCKET_S = 5
FINE_SPAN_S = 300
MINUTE_SPAN = 60
PER_DEPLOYMENT = "per deployment"  # the class label of a tenant without its own class


class Attainment(TypedDict):
    requests: int
    errors: int
    ttft: float | None
    tbt: float | None
    joint: float | None
    status: str


class TenantRow(TypedDict):
    id: int
    name: str
    slo_class: str
    target: float
    ttft_ms: float | None  # the class's targets (None: each deployment's class)
    tbt_ms: float | None
    active: bool
    windows: dict[str, Attainment]
    status: str
    requests_per_s: float
    tokens_per_s: float
    errors: int


class Overview(TypedDict):
    """``tenants`` by id; ``order`` their ids in the table's order (by name: a JSON
    object keyed by ids does not keep it in the browser)."""

    at: float
    tenants: dict[str, TenantRow]
    order: list[str]
    minute: dict[str, dict[str, float | None]]
    fine: dict[str, dict[str, float | None]]
    minute_since: int
    fine_since: int


def attainment_status(joint: float | None, target: float) -> str:
    """``idle`` without requests, ``ok`` at or above the target, ``warn`` within
    ``WARN_MARGIN`` below it, ``miss`` further below."""
    if joint is None:
        return "idle"
    if joint >= target:
        return "ok"
    return "warn" if joint >= target - WARN_MARGIN else "miss"


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _window_aggregates(now: datetime) -> dict[str, Any]:
    aggregates: dict[str, Any] = {}
    for w in WINDOWS_MIN:
        inside = Q(minute__gte=floor_minute(now - timedelta(minutes=w)))
        for field in ("requests", "errors", "ttft_met", "tbt_met", "both_met"):
            aggregates[f"{field}_{w}"] = Sum(field, filter=inside)
    return aggregates


def overview(now: datetime | None = None) -> Overview:
    """Every tenant's row (attainment per window, rates, status) and the per-minute and
    5-second joint attainment series. Five queries."""
    now = now or timezone.now()
    # The strictest target among the deployments each tenant may use.
    strictest = (
        Deployment.objects.restrict(OuterRef("pk"))
        .order_by("-slo_class__attainment_target")
        .values("slo_class__attainment_target")[:1]
    )
    tenants = list(
        Tenant.objects.select_related("default_slo_class")
        .only(
            "id",
            "name",
            "is_active",
            "default_slo_class__name",
            "default_slo_class__attainment_target",
            "default_slo_class__ttft_ms",
            "default_slo_class__tbt_ms",
        )
        .annotate(deployments_target=Subquery(strictest))
        .order_by("name")
    )
    since = floor_minute(now - timedelta(minutes=max(WINDOWS_MIN)))
    windows = {
        row["tenant_id"]: row
        for row in UsageRollup.objects.filter(minute__gte=since)
        .order_by()
        .values("tenant_id")
        .annotate(**_window_aggregates(now))
    }
    ended_since = now - timedelta(seconds=RATE_WINDOW_S)
    rates = {
        row["tenant_id"]: row
        for row in RequestRecord.objects.filter(
            t_arrival__gte=ended_since - timedelta(seconds=LONGEST_REQUEST_S),
            t_end__gte=ended_since,
            t_end__lte=now,
        )
        .order_by()
        .values("tenant_id")
        .annotate(
            n=Count("id"),
            tokens=Sum("completion_tokens"),
            errors=Count("id", filter=~Q(status=RequestRecord.Status.OK)),
        )
    }
    rows: dict[str, TenantRow] = {}
    for tenant in tenants:
        slo = tenant.default_slo_class
        target = slo.attainment_target if slo is not None else _classless_target(tenant)
        agg = windows.get(tenant.pk, {})
        per_window: dict[str, Attainment] = {}
        for w in WINDOWS_MIN:
            n = agg.get(f"requests_{w}") or 0
            joint = _share(agg.get(f"both_met_{w}") or 0, n)
            per_window[str(w)] = {
                "requests": n,
                "errors": agg.get(f"errors_{w}") or 0,
                "ttft": _share(agg.get(f"ttft_met_{w}") or 0, n),
                "tbt": _share(agg.get(f"tbt_met_{w}") or 0, n),
                "joint": joint,
                "status": attainment_status(joint, target),
            }
        rate = rates.get(tenant.pk, {})
        rows[str(tenant.pk)] = {
            "id": tenant.pk,
            "name": tenant.name,
            "slo_class": slo.name if slo is not None else PER_DEPLOYMENT,
            "target": target,
            "ttft_ms": slo.ttft_ms if slo is not None else None,
            "tbt_ms": slo.tbt_ms if slo is not None else None,
            "active": tenant.is_active,
            "windows": per_window,
            "status": per_window[str(STATUS_WINDOW_MIN)]["status"],
            "requests_per_s": round((rate.get("n") or 0) / RATE_WINDOW_S, 3),
            "tokens_per_s": round((rate.get("tokens") or 0) / RATE_WINDOW_S, 2),
            "errors": rate.get("errors") or 0,
        }
    minute_since = floor_minute(now) - timedelta(minutes=MINUTE_SPAN - 1)
    fine_since = int(now.timestamp()) // FINE_BUCKET_S * FINE_BUCKET_S - FINE_SPAN_S + FINE_BUCKET_S
    return {
        "at": now.timestamp(),
        "tenants": rows,
        "order": list(rows),
        "minute": _minute_series(minute_since, rows),
        "fine": _fine_series(datetime.fromtimestamp(fine_since, UTC), rows),
        "minute_since": int(minute_since.timestamp()),
        "fine_since": fine_since,
    }


def _classless_target(tenant: Any) -> float:
    """The target of a tenant without a class: the strictest of its deployments' classes
    (annotated ``deployments_target``), the field's default when it has none."""
    if tenant.deployments_target is not None:
        return float(tenant.deployments_target)
    return float(SloClass._meta.get_field("attainment_target").get_default())


def _minute_series(
    since: datetime, rows: dict[str, TenantRow]
) -> dict[str, dict[str, float | None]]:
    series: dict[str, dict[str, float | None]] = {tenant_id: {} for tenant_id in rows}
    for row in (
        UsageRollup.objects.filter(minute__gte=since)
        .order_by()
        .values("tenant_id", "minute")
        .annotate(n=Sum("requests"), both=Sum("both_met"))
    ):
        points = series.get(str(row["tenant_id"]))
        if points is not None:
            points[str(int(row["minute"].timestamp()))] = _share(row["both"] or 0, row["n"] or 0)
    return series


def _fine_series(since: datetime, rows: dict[str, TenantRow]) -> dict[str, dict[str, float | None]]:
    series: dict[str, dict[str, float | None]] = {tenant_id: {} for tenant_id in rows}
    for row in (
        RequestRecord.objects.filter(t_arrival__gte=since)
        .order_by()
        .values("tenant_id", bucket=EpochBucket("t_arrival", FINE_BUCKET_S))
        .annotate(n=Count("id"), both=Count("id", filter=Q(ttft_met=True, tbt_met=True)))
    ):
        points = series.get(str(row["tenant_id"]))
        if points is not None:
            points[str(int(row["bucket"]))] = _share(row["both"], row["n"])
    return series


def overview_figures(data: Overview) -> dict[str, figures.Figure]:
    names = {tenant_id: row["name"] for tenant_id, row in data["tenants"].items()}
    return {
        "minute": figures.attainment_figure(
            "Joint SLO attainment per minute (last hour)",
            data["minute"],
            names,
            (data["minute_since"], data["at"]),
            60,
        ),
        "fine": figures.attainment_figure(
            "Joint SLO attainment per 5 s (last 5 minutes)",
            data["fine"],
            names,
            (data["fine_since"], data["at"]),
            FINE_BUCKET_S,
        ),
    }
