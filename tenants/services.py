"""Write operations of the tenants app (services: keyword-only, typed, atomic).

Invalid input raises ``django.core.exceptions.ValidationError`` with messages per field;
the admin and the REST API show them as form errors and 400 responses.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from shunter.engine import latency
from shunter.platform.models import Deployment, Model, SloClass
from shunter.tenants.keys import new_secret, secret_digest, secret_prefix
from shunter.tenants.models import ApiKey, RequestRecord, Tenant, UsageRollup
from shunter.tenants.selectors import request_slo_class

log = logging.getLogger("shunter.tenants")

TENANT_FIELDS = {
    "name",
    "default_slo_class",
    "rpm_limit",
    "tpm_limit",
    "concurrency_limit",
    "token_budget",
    "budget_period",
    "is_active",
}


# -- tenants -------------------------------------------------------------------------------
@transaction.atomic
def tenant_create(
    *,
    name: str,
    default_slo_class: SloClass | None = None,
    deployments: Iterable[Deployment] = (),
    models: Iterable[Model] = (),
    **quotas: Any,
) -> Tenant:
    """A new tenant allowed every deployment of ``models`` (now and later) and
    ``deployments``, its requests of ``default_slo_class`` (None: of each deployment's
    class); ``quotas`` are the remaining Tenant fields (``rpm_limit``, ``tpm_limit``,
    ``concurrency_limit``, ``token_budget``, ``budget_period``, ``is_active``)."""
    unknown = set(quotas) - TENANT_FIELDS
    if unknown:
        raise TypeError(f"tenant_create() got unexpected fields {sorted(unknown)}")
    tenant = Tenant(name=name, default_slo_class=default_slo_class, **quotas)
    tenant.full_clean()
    tenant.save()
    tenant.deployments.set(list(deployments))
    tenant.models.set(list(models))
    return tenant


@transaction.atomic
def tenant_update(
    *,
    tenant: Tenant,
    deployments: Iterable[Deployment] | None = None,
    models: Iterable[Model] | None = None,
    **fields: Any,
) -> Tenant:
    """Change the given fields; ``deployments`` and ``models`` (when given) replace the
    granted ones, and the scopes of the tenant's keys that fall outside what it may then
    use are dropped. A key left without scopes reaches nothing (never everything): it is
    logged, and reaches again what its scopes are changed to."""
    unknown = set(fields) - TENANT_FIELDS
    if unknown:
        raise TypeError(f"tenant_update() got unexpected fields {sorted(unknown)}")
    for field, value in fields.items():
        setattr(tenant, field, value)
    tenant.full_clean()
    tenant.save()
    if deployments is not None:
        tenant.deployments.set(list(deployments))
    if models is not None:
        tenant.models.set(list(models))
    if deployments is not None or models is not None:
        _narrow_key_scopes(tenant)
    return tenant


def _narrow_key_scopes(tenant: Tenant) -> None:
    """Drop the scopes of ``tenant``'s keys that it may no longer use: a key's scopes
    stay within its tenant's grants."""
    usable = set(Deployment.objects.restrict(tenant).values_list("pk", flat=True))
    granted = set(tenant.models.values_list("pk", flat=True))
    for key in tenant.api_keys.prefetch_related("scopes", "model_scopes"):
        scopes, model_scopes = list(key.scopes.all()), list(key.model_scopes.all())
        outside = [d for d in scopes if d.pk not in usable]
        models_outside = [m for m in model_scopes if m.pk not in granted]
        if not outside and not models_outside:
            continue
        key.scopes.remove(*outside)
        key.model_scopes.remove(*models_outside)
        lost = len(outside) + len(models_outside)
        if lost == len(scopes) + len(model_scopes) and key.revoked_at is None:
            log.warning(
                "key %s… of tenant %r lost its last scope (%s): it reaches no deployment",
                key.prefix,
                tenant.name,
                ", ".join(str(scope) for scope in [*models_outside, *outside]),
            )


# -- API keys ------------------------------------------------------------------------------
def _check_scopes(
    tenant: Tenant, scopes: list[Deployment], model_scopes: list[Model], all_deployments: bool
) -> None:
    """A key reaches everything its tenant may use or some of it, never nothing (at
    creation or by an edit; a tenant that loses grants can leave a key with none): its
    ``scopes`` among the deployments the tenant may use, its ``model_scopes`` among the
    tenant's granted models."""
    if all_deployments and (scopes or model_scopes):
        raise ValidationError(
            {"scopes": "A key that reaches all deployments has no scopes; give one or the other."}
        )
    if not all_deployments and not scopes and not model_scopes:
        raise ValidationError(
            {"scopes": "Give the deployments or models this key may use, or set all_deployments."}
        )
    errors: dict[str, str] = {}
    if scopes:
        usable = set(Deployment.objects.restrict(tenant).values_list("pk", flat=True))
        outside = sorted(str(d) for d in scopes if d.pk not in usable)
        if outside:
            errors["scopes"] = (
                f"Not among tenant {tenant.name!r}'s deployments: {', '.join(outside)}."
            )
    if model_scopes:
        granted = set(tenant.models.values_list("pk", flat=True))
        outside = sorted(m.name for m in model_scopes if m.pk not in granted)
        if outside:
            errors["model_scopes"] = (
                f"Not among tenant {tenant.name!r}'s models: {', '.join(outside)}. "
                "Grant the tenant the model first."
            )
    if errors:
        raise ValidationError(errors)


@transaction.atomic
def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    scopes: Iterable[Deployment] = (),
    model_scopes: Iterable[Model] = (),
    all_deployments: bool = False,
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """A new key of ``tenant`` and its secret. The secret is returned here once and never
    stored: the database keeps its first characters and its SHA-256 digest.

    The key reaches either every deployment the tenant may use (``all_deployments``, no
    scopes) or its ``scopes`` (deployments the tenant may use) and every deployment of
    its ``model_scopes`` (models granted to the tenant).
    """
    scopes, model_scopes = list(scopes), list(model_scopes)
    _check_scopes(tenant, scopes, model_scopes, all_deployments)
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "The expiry must be in the future."})
    # The displayed prefix has 30 random bits: collisions are rare but possible, so a
    # taken prefix means drawing again.
    for _ in range(16):
        secret = new_secret()
        key = ApiKey(
            tenant=tenant,
            name=name,
            prefix=secret_prefix(secret),
            digest=secret_digest(secret),
            all_deployments=all_deployments,
            expires_at=expires_at,
        )
        key.full_clean(exclude=["prefix", "digest"])
        try:
            with transaction.atomic():
                key.save()
        except IntegrityError:
            continue
        key.scopes.set(scopes)
        key.model_scopes.set(model_scopes)
        return key, secret
    raise RuntimeError("could not draw an unused key prefix")


@transaction.atomic
def api_key_update(
    *,
    api_key: ApiKey,
    name: str | None = None,
    scopes: Iterable[Deployment] | None = None,
    model_scopes: Iterable[Model] | None = None,
    all_deployments: bool | None = None,
    expires_at: datetime | None = None,
    clear_expiry: bool = False,
) -> ApiKey:
    """Rename a key, replace its scopes, its model scopes or its ``all_deployments`` flag
    (the result must reach all deployments or some, as at creation), or change its
    expiry (``clear_expiry``: none)."""
    if name is not None:
        api_key.name = name
    if clear_expiry:
        api_key.expires_at = None
    elif expires_at is not None:
        api_key.expires_at = expires_at
    if all_deployments is not None:
        api_key.all_deployments = all_deployments
    if scopes is not None or model_scopes is not None or all_deployments is not None:
        scopes = list(api_key.scopes.all() if scopes is None else scopes)
        model_scopes = list(api_key.model_scopes.all() if model_scopes is None else model_scopes)
        _check_scopes(api_key.tenant, scopes, model_scopes, api_key.all_deployments)
        api_key.scopes.set(scopes)
        api_key.model_scopes.set(model_scopes)
    api_key.full_clean(exclude=["prefix", "digest"])
    api_key.save()
    return api_key


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    """Revoke the key from now on (idempotent: the first revocation time stays)."""
    updated = ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    if updated or api_key.revoked_at is None:
        api_key.refresh_from_db(fields=["revoked_at"])
    return api_key


def api_key_mark_used(*, api_key_id: int, when: datetime | None = None) -> None:
    """Record that the key was used at ``when`` (now); never moves the time backwards."""
    when = when or timezone.now()
    ApiKey.objects.filter(pk=api_key_id).exclude(last_used_at__gte=when).update(last_used_at=when)


# -- request records and rollups -------------------------------------------------------------
def slo_flags(
    *,
    slo: SloClass | None,
    status: str,
    ttft_ms: float | None,
    tpot_ms: float | None,
    completion_tokens: int,
) -> tuple[bool, bool | None]:
    """(TTFT met, TBT met) of one request under ``slo``. Failed and aborted requests miss
    both, as does a request without a class; a response of at most one token has no gaps
    and meets TBT; one of more tokens without a TPOT (a non-streamed response from an
    engine that does not send ``X-Shunter-Timing``, so the gateway cannot see its gaps)
    has an unknown TBT: None, which no count takes as met."""
    if status != RequestRecord.Status.OK or slo is None:
        return False, False
    ttft = latency.ttft_met(success=True, ttft_s=ttft_ms, target_s=slo.ttft_ms)
    tbt = latency.tbt_met(
        success=True, tokens=completion_tokens, tpot_s=tpot_ms, target_s=slo.tbt_ms
    )
    return ttft, tbt


def request_record_create(**fields: Any) -> RequestRecord:
    """Record one request (``request_record_build``'s arguments) and add it to its
    minute's rollup (of its arrival).

    The SLO flags are judged against the request's class (``request_slo_class``: the
    tenant's when set, else the deployment's). Requests that reached no deployment are
    recorded but not rolled up (rollups are per deployment).

    ``record_key`` (the idempotency key; a new one when not given): a record whose key
    is written already fails on the key's unique constraint (IntegrityError), and the
    caller's transaction, which holds the rollup too, adds nothing
    (``gateway.records.write_records`` takes that as written).
    """
    record = request_record_build(**fields)
    request_records_create([record])
    return record


def request_record_build(
    *,
    request_id: str,
    tenant: Tenant,
    api_key: ApiKey | None,
    deployment: Deployment | None,
    model_name: str,
    endpoint: str,
    node_name: str = "",
    stream: bool,
    t_arrival: datetime,
    t_first_token: datetime | None,
    t_end: datetime,
    prompt_tokens: int,
    completion_tokens: int,
    ttft_ms: float | None,
    tpot_ms: float | None,
    max_itl_ms: float | None,
    status: str,
    error_type: str = "",
    http_status: int = 200,
    record_key: uuid.UUID | None = None,
) -> RequestRecord:
    """The unsaved, validated RequestRecord of one request, with its SLO flags
    (``request_record_create``'s arguments; ``request_records_create`` saves many)."""
    ttft_met, tbt_met = slo_flags(
        slo=request_slo_class(tenant, deployment),
        status=status,
        ttft_ms=ttft_ms,
        tpot_ms=tpot_ms,
        completion_tokens=completion_tokens,
    )
    record = RequestRecord(
        request_id=request_id,
        record_key=record_key or uuid.uuid4(),
        tenant=tenant,
        api_key=api_key,
        deployment=deployment,
        model_name=model_name,
        node_name=node_name,
        endpoint=endpoint,
        stream=stream,
        t_arrival=t_arrival,
        t_first_token=t_first_token,
        t_end=t_end,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        ttft_ms=ttft_ms,
        tpot_ms=tpot_ms,
        max_itl_ms=max_itl_ms,
        ttft_met=ttft_met,
        tbt_met=tbt_met,
        status=status,
        error_type=error_type,
        http_status=http_status,
    )
    # The key's uniqueness is the constraint's to enforce, at the insert.
    record.full_clean(exclude=["tenant", "api_key", "deployment", "record_key"])
    return record


@transaction.atomic
def request_records_create(records: list[RequestRecord]) -> None:
    """Save ``records`` (``request_record_build``'s) in one insert and add them to their
    rollups, one update per rollup row: all or none. A key already written fails the
    whole call on the key's unique constraint (IntegrityError); a caller that wants the
    others kept writes each on its own (``request_record_create``)."""
    RequestRecord.objects.bulk_create(records)
    _rollups_add(records)


def _rollups_add(records: Iterable[RequestRecord]) -> None:
    """Add ``records`` to their rollup rows (per minute of arrival, tenant, deployment
    and node; records without a deployment are not rolled up), one update of F()
    increments per row; a row is created on first use (a concurrent creator wins the
    insert and this call increments its row)."""
    sums: dict[tuple[datetime, int, int, str], dict[str, float]] = {}
    for record in records:
        if record.deployment_id is None:
            continue
        key = (
            record.t_arrival.replace(second=0, microsecond=0),
            record.tenant_id,
            record.deployment_id,
            record.node_name,
        )
        row = sums.setdefault(key, {name: 0 for name in UsageRollup.SUMMED})
        for name, value in _rollup_terms(record).items():
            row[name] += value
    for (minute, tenant_id, deployment_id, node_name), totals in sums.items():
        rows = UsageRollup.objects.filter(
            minute=minute, tenant_id=tenant_id, deployment_id=deployment_id, node_name=node_name
        )
        increments = {name: F(name) + value for name, value in totals.items()}
        if rows.update(**increments):
            continue
        try:
            with transaction.atomic():
                UsageRollup.objects.create(
                    minute=minute,
                    tenant_id=tenant_id,
                    deployment_id=deployment_id,
                    node_name=node_name,
                    **totals,
                )
        except IntegrityError:
            rows.update(**increments)


def _rollup_terms(record: RequestRecord) -> dict[str, float]:
    """What ``record`` adds to each of ``UsageRollup.SUMMED``."""
    tbt_met = record.tbt_met is True  # unknown is not met
    return {
        "requests": 1,
        "errors": int(record.status != RequestRecord.Status.OK),
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "ttft_met": int(record.ttft_met),
        "tbt_met": int(tbt_met),
        "both_met": int(record.ttft_met and tbt_met),
        "sum_ttft_ms": record.ttft_ms or 0.0,
        "sum_tpot_ms": record.tpot_ms or 0.0,
        "tpot_requests": int(record.tpot_ms is not None),
    }
