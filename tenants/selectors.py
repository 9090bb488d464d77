"""Read operations of the tenants app (selectors). Each tenant-owned query starts from its
manager's ``restrict(tenant)``: pass None only for staff-wide views."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.db.models import Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from shunter.platform.models import Deployment, Model, SloClass
from shunter.tenants.models import ApiKey, RequestRecord, Tenant, UsageRollup

T = TypeVar("T")


def tenant_list() -> QuerySet[Tenant]:
    return Tenant.objects.select_related("default_slo_class").prefetch_related(
        "deployments", "models"
    )


def tenant_deployments(*, tenant: Tenant | int | None) -> QuerySet[Deployment]:
    """The deployments ``tenant`` may use: those granted and those of its granted models
    (all, for None)."""
    return Deployment.objects.restrict(tenant).select_related("node", "model", "slo_class")


def api_key_deployments(*, api_key: ApiKey) -> QuerySet[Deployment]:
    """The deployments ``api_key`` reaches now: every one its tenant may use for an
    ``all_deployments`` key, else those of them in its ``scopes`` or of a model in its
    ``model_scopes``."""
    usable = Deployment.objects.restrict(api_key.tenant_id)
    if api_key.all_deployments:
        return usable
    return usable.filter(
        Q(pk__in=api_key.scopes.values("pk")) | Q(model__in=api_key.model_scopes.values("pk"))
    )


def api_key_models(*, api_key: ApiKey) -> QuerySet[Model]:
    """The models whose every deployment, now and later, ``api_key`` reaches: its
    tenant's granted models, all of them for an ``all_deployments`` key, else those in
    its ``model_scopes``."""
    granted = Model.objects.filter(tenants=api_key.tenant_id)
    if api_key.all_deployments:
        return granted
    return granted.filter(pk__in=api_key.model_scopes.values("pk"))


def request_class(tenant_class: T | None, deployment_class: T | None) -> T | None:
    """The rule of a request's SLO class, in whatever form the caller holds the classes
    (rows, their ``X-Shunter-Slo`` values): its tenant's when the tenant has one, else its
    deployment's. ``request_slo_field`` is the same rule in SQL."""
    return tenant_class if tenant_class is not None else deployment_class


def request_slo_field(field: str) -> Coalesce:
    """``request_class`` over a usage row's ``tenant`` and ``deployment``: the SLO class
    ``field`` of the class its requests were judged against."""
    return Coalesce(f"tenant__default_slo_class__{field}", f"deployment__slo_class__{field}")


def request_slo_class(tenant: Tenant, deployment: Deployment | None) -> SloClass | None:
    """The SLO class of ``tenant``'s request on ``deployment`` (``request_class``; None:
    neither, a request that reached no deployment)."""
    return request_class(
        tenant.default_slo_class, None if deployment is None else deployment.slo_class
    )


def api_key_list(*, tenant: Tenant | int | None = None) -> QuerySet[ApiKey]:
    return ApiKey.objects.restrict(tenant).prefetch_related("scopes", "model_scopes")


def request_record_list(
    *,
    tenant: Tenant | int | None = None,
    deployment: Deployment | int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[RequestRecord]:
    """Records by arrival time in ``[since, until)``, newest first."""
    records = RequestRecord.objects.restrict(tenant)
    if deployment is not None:
        records = records.filter(deployment=deployment)
    if since is not None:
        records = records.filter(t_arrival__gte=since)
    if until is not None:
        records = records.filter(t_arrival__lt=until)
    return records


@dataclass(frozen=True)
class UsageRow:
    """Totals of one tenant on one deployment on one node over a time range, from the
    rollups.

    Attainments are shares of all requests (errors and unknown TBTs count as misses); mean
    TTFT is per successful request, mean TPOT per request that had one (None without)."""

    tenant_id: int
    tenant: str
    deployment_id: int
    model_name: str
    node: str
    slo_class: str
    attainment_target: float
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    ttft_attainment: float
    tbt_attainment: float
    both_attainment: float
    mean_ttft_ms: float | None
    mean_tpot_ms: float | None

    @property
    def meets_target(self) -> bool:
        return self.requests > 0 and self.both_attainment >= self.attainment_target


def usage_summary(
    *,
    tenant: Tenant | int | None = None,
    deployment: Deployment | int | None = None,
    node: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[UsageRow]:
    """Usage and SLO attainment per (tenant, deployment, node) over the minutes that
    start in ``[since, until)`` (``since`` rounds down to its minute), in one query."""
    rollups = _rollups(tenant=tenant, deployment=deployment, node=node, since=since, until=until)
    grouped = (
        rollups.values(
            "tenant_id",
            "tenant__name",
            "deployment_id",
            "deployment__model__name",
            "node_name",
            # The class the records were judged against.
            slo_name=request_slo_field("name"),
            slo_target=request_slo_field("attainment_target"),
        )
        .annotate(**_SUMS)
        .order_by("tenant__name", "deployment__model__name", "deployment_id", "node_name")
    )
    return [_usage_row(g) for g in grouped]


_SUMS = {f"total_{name}": Sum(name) for name in UsageRollup.SUMMED}


def _rollups(
    *,
    tenant: Tenant | int | None = None,
    deployment: Deployment | int | None = None,
    node: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[UsageRollup]:
    """The rollup rows of ``tenant``, ``deployment`` and ``node`` (None: all) whose
    minute starts in ``[since, until)``."""
    rollups = UsageRollup.objects.restrict(tenant)
    if deployment is not None:
        rollups = rollups.filter(deployment=deployment)
    if node is not None:
        rollups = rollups.filter(node_name=node)
    if since is not None:
        rollups = rollups.filter(minute__gte=since.replace(second=0, microsecond=0))
    if until is not None:
        rollups = rollups.filter(minute__lt=until)
    return rollups


@dataclass(frozen=True)
class SloRow:
    """SLO attainment of one node over a time range, over all its tenants (each request
    judged against its own class), in total (``deployment_id`` None) or of one of its
    deployments."""

    node: str
    deployment_id: int | None
    model_name: str  # '' for the node's total
    requests: int
    errors: int
    ttft_attainment: float
    tbt_attainment: float
    both_attainment: float
    mean_ttft_ms: float | None


def slo_by_node(
    *,
    node: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[SloRow]:
    """Per node (``node``: that one), its total and then each of its deployments, by
    node name then model name; two queries."""
    rollups = _rollups(node=node, since=since, until=until)
    totals = rollups.values("node_name").annotate(**_SUMS)
    per_deployment = rollups.values(
        "node_name", "deployment_id", "deployment__model__name"
    ).annotate(**_SUMS)
    rows = [_slo_row(g, None, "") for g in totals]
    rows += [_slo_row(g, g["deployment_id"], g["deployment__model__name"]) for g in per_deployment]
    return sorted(rows, key=lambda r: (r.node, r.deployment_id is not None, r.model_name))


def _slo_figures(g: Mapping[str, Any]) -> dict[str, Any]:
    """The figures every row of summed rollups gives: requests, errors, the three
    attainments (shares of all requests) and the mean TTFT of the successful ones."""
    n = int(g["total_requests"] or 0)
    errors = int(g["total_errors"] or 0)

    def share(name: str) -> float:
        return int(g[f"total_{name}"] or 0) / n if n else 0.0

    return {
        "requests": n,
        "errors": errors,
        "ttft_attainment": share("ttft_met"),
        "tbt_attainment": share("tbt_met"),
        "both_attainment": share("both_met"),
        "mean_ttft_ms": float(g["total_sum_ttft_ms"]) / (n - errors) if n > errors else None,
    }


def _slo_row(g: Mapping[str, Any], deployment_id: int | None, model_name: str) -> SloRow:
    return SloRow(
        node=g["node_name"],
        deployment_id=deployment_id,
        model_name=model_name,
        **_slo_figures(g),
    )


def _usage_row(g: Mapping[str, Any]) -> UsageRow:
    timed = int(g["total_tpot_requests"] or 0)
    return UsageRow(
        tenant_id=g["tenant_id"],
        tenant=g["tenant__name"],
        deployment_id=g["deployment_id"],
        model_name=g["deployment__model__name"],
        node=g["node_name"],
        slo_class=g["slo_name"],
        attainment_target=g["slo_target"],
        prompt_tokens=int(g["total_prompt_tokens"] or 0),
        completion_tokens=int(g["total_completion_tokens"] or 0),
        mean_tpot_ms=float(g["total_sum_tpot_ms"]) / timed if timed else None,
        **_slo_figures(g),
    )
