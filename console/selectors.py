"""The console's numbers (selectors: reads only), as JSON-ready values.

Each selector costs a fixed number of queries whatever the number of tenants, nodes or
requests: aggregates are grouped in the database, never computed per tenant in a loop.

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

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from django.db.models import BigIntegerField, Count, Func, OuterRef, Prefetch, Q, Subquery, Sum
from django.utils import timezone

from shunter.console import figures
from shunter.console.memory_map import as_dict, memory_map, state_models
from shunter.platform.models import Deployment, Node, SloClass
from shunter.tenants.models import ApiKey, RequestRecord, Tenant, UsageRollup

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models.sql.compiler import SQLCompiler, _AsSqlType

WINDOWS_MIN = (1, 5, 15, 60)
STATUS_WINDOW_MIN = 5  # the window that colours a tenant's row
WARN_MARGIN = 0.05  # within this of the target: "warn", below it: "miss"
RATE_WINDOW_S = 60
FINE_BUCKET_S = 5
FINE_SPAN_S = 300
MINUTE_SPAN = 60
PER_DEPLOYMENT = "per deployment"  # the class label of a tenant without its own class
# Request records are filtered by end time within the arrival index: requests longer than
# this are left out of the rates.
LONGEST_REQUEST_S = 600
HISTOGRAM_SPAN = timedelta(hours=1)
HISTOGRAM_MAX_SAMPLES = 5000
RECENT_REQUESTS = 50
RECENT_STEPS = 64


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


def floor_minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


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


class EpochBucket(Func):
    """The start of the ``seconds``-long bucket holding a datetime, in Unix seconds
    (PostgreSQL and SQLite: the two databases the settings accept)."""

    output_field = BigIntegerField()

    def __init__(self, expression: Any, seconds: int):
        super().__init__(expression)
        self.seconds = int(seconds)

    def as_postgresql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> _AsSqlType:
        template = "(FLOOR(EXTRACT(EPOCH FROM %(expressions)s) / %(n)s) * %(n)s)::bigint"
        return self.as_sql(compiler, connection, template=template, n=self.seconds, **extra)

    def as_sqlite(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> _AsSqlType:
        template = "((CAST(strftime('%%%%s', %(expressions)s) AS INTEGER) / %(n)s) * %(n)s)"
        return self.as_sql(compiler, connection, template=template, n=self.seconds, **extra)


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
        ),
        "fine": figures.attainment_figure(
            "Joint SLO attainment per 5 s (last 5 minutes)",
            data["fine"],
            names,
            (data["fine_since"], data["at"]),
        ),
    }


# -- tenant page ---------------------------------------------------------------------------
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


# -- nodes ---------------------------------------------------------------------------------
class NodeView(TypedDict):
    id: int
    name: str
    status: str
    rotation: str  # "in rotation", or why it is cordoned
    last_seen: str | None
    state_at: float | None
    error: str
    has_state: bool
    turn_holder: str | None
    turn_switches: int
    models: list[dict[str, Any]]
    counters: dict[str, int]
    steps: list[list[float]]
    memory_figure: figures.Figure
    requests_figure: figures.Figure
    rates: dict[str, float] | None


def _host_weight_bytes(node: Node) -> dict[str, int]:
    return {d.model.name: d.model.param_bytes for d in node.deployments.all()}


def node_view(node: Node) -> NodeView:
    """What the node page shows, from the node's cached engine state (no query when its
    deployments and their models are prefetched). ``rates`` stays None here: they need
    two states (``deltas.with_rates``)."""
    state = as_dict(node.state)
    models_state = as_dict(state.get("models"))
    names = state_models(state)
    mem = memory_map(state, _host_weight_bytes(node))
    models = []
    requests: dict[str, dict[str, int]] = {}
    for name in names:
        info = as_dict(models_state.get(name))
        req = as_dict(info.get("requests"))
        requests[name] = {k: int(req.get(k, 0)) for k in ("running", "waiting", "rotary")}
        models.append(
            {
                "name": name,
                "sharing": info.get("sharing"),
                "priority": info.get("priority"),
                "active": bool(info.get("active")),
                "kv_blocks_used": info.get("kv_blocks_used"),
                "kv_blocks_total": info.get("kv_blocks_total"),
                "remapped_layers": len(info.get("remapped_layers") or []),
                "weight_bytes_remapped": info.get("weight_bytes_remapped", 0),
                "host_swap_blocks_used": info.get("host_swap_blocks_used", 0),
                **requests[name],
            }
        )
    tenancy = as_dict(state.get("tenancy"))
    transfers = as_dict(state.get("transfers"))
    steps_raw = as_dict(state.get("steps"))
    total = int(steps_raw.get("total") or 0)
    durations = list(steps_raw.get("recent_duration_s") or [])[-RECENT_STEPS:]
    first = total - len(durations) + 1
    steps = [[first + i, round(1000 * float(d), 4)] for i, d in enumerate(durations)]
    return {
        "id": node.pk,
        "name": node.name,
        "status": node.status,
        "rotation": node.get_cordon_display(),
        "last_seen": node.last_seen.isoformat() if node.last_seen else None,
        "state_at": node.state_at.timestamp() if node.state_at else None,
        "error": node.last_error,
        "has_state": bool(models_state),
        "turn_holder": tenancy.get("turn_holder"),
        "turn_switches": int(tenancy.get("turn_switches") or 0),
        "models": models,
        "counters": {
            "rotations": int(transfers.get("rotations") or 0),
            "bytes_d2h": int(transfers.get("bytes_d2h") or 0),
            "bytes_h2d": int(transfers.get("bytes_h2d") or 0),
            "steps": total,
        },
        "steps": steps,
        "memory_figure": figures.memory_figure(mem, names),
        "requests_figure": figures.requests_figure(requests),
        "rates": None,
    }


def node_list() -> list[Node]:
    """Every node (name, status, last contact). One query."""
    return list(Node.objects.defer("state").order_by("name"))


def node_views(node_ids: Iterable[int] | None = None) -> dict[str, NodeView]:
    nodes = Node.objects.prefetch_related("deployments__model").order_by("name")
    if node_ids is not None:
        nodes = nodes.filter(pk__in=list(node_ids))
    return {str(node.pk): node_view(node) for node in nodes}


def deployment_list() -> list[Deployment]:
    """Every deployment with its node, model and SLO class. One query."""
    return list(Deployment.objects.select_related("node", "model", "slo_class"))
