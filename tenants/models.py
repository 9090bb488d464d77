"""Tenants, their API keys, and what their requests did (records and per-minute rollups).

Every tenant-owned row is reached through ``restrict(tenant)`` of its manager
(``common.db.TenantScopedQuerySet``): the one place that scopes a query to a
tenant, so no view or selector can forget it.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import ClassVar

from django.db import models
from django.utils import timezone

from shunter.common.db import TenantScopedQuerySet
from shunter.platform.models import Deployment, Model, SloClass

KEY_PREFIX = "sk-shunter-"
KEY_DISPLAY_CHARS = 16  # the prefix shown in lists: "sk-shunter-" and five more


class TenantQuerySet(TenantScopedQuerySet):
    """Rows with a ``tenant`` foreign key."""


class Tenant(models.Model):
    """A customer: its SLO class, what it may use, and its quotas (None: unlimited).
    ``token_budget`` counts prompt plus completion tokens per ``budget_period``.

    It may use every deployment of its ``models`` (granted by name: a deployment added
    later is covered at once) and its ``deployments`` (granted one by one: pinned to a
    node); ``Deployment.objects.restrict(tenant)`` is that rule.

    ``default_slo_class``, when set, is the class of all the tenant's requests (the
    targets the engine schedules them by and the records judge them against); when
    unset, each request takes the class of the deployment it reached."""

    class BudgetPeriod(models.TextChoices):
        DAY = "day"
        MONTH = "month"

    name = models.CharField(max_length=128, unique=True)
    default_slo_class = models.ForeignKey(
        SloClass, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    rpm_limit = models.PositiveIntegerField(null=True, blank=True)
    tpm_limit = models.PositiveIntegerField(null=True, blank=True)
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)
    token_budget = models.PositiveBigIntegerField(null=True, blank=True)
    budget_period = models.CharField(
        max_length=8, choices=BudgetPeriod.choices, default=BudgetPeriod.DAY
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    deployments = models.ManyToManyField(Deployment, blank=True, related_name="tenants")
    # Last: from here on the class body's ``models`` is this field, not django.db.models.
    models = models.ManyToManyField(Model, blank=True, related_name="tenants")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ApiKeyQuerySet(TenantQuerySet):
    def usable(self, now: datetime | None = None) -> ApiKeyQuerySet:
        """Keys neither revoked nor expired at ``now``, of active tenants."""
        now = now or timezone.now()
        return self.filter(revoked_at__isnull=True, tenant__is_active=True).exclude(
            expires_at__lte=now
        )


class ApiKey(models.Model):
    """A tenant's key. Only ``prefix`` (shown in lists) and the SHA-256 ``digest`` of the
    whole secret are stored; the secret is shown once, at creation.

    A key reaches every deployment its tenant may use when ``all_deployments`` is set (it
    then has no scopes), else those of them that are in its ``scopes`` or of a model in
    its ``model_scopes`` (every deployment of it, now and later). Scopes stay within
    what the tenant may use; a key without scopes reaches nothing, so a key never gains
    access by losing a scope."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=128)
    prefix = models.CharField(max_length=KEY_DISPLAY_CHARS, unique=True, editable=False)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    scopes = models.ManyToManyField(Deployment, blank=True, related_name="+")
    model_scopes = models.ManyToManyField(Model, blank=True, related_name="+")
    all_deployments = models.BooleanField(default=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        ordering = ["tenant__name", "name", "id"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def is_usable(self, now: datetime | None = None) -> bool:
        now = now or timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


class RequestRecord(models.Model):
    """One request through the gateway: who, what, when, how many tokens, its latency
    (milliseconds) and whether it met its SLO class's TTFT and TBT targets.

    ``tpot_ms`` and ``tbt_met`` are None when the gateway cannot see the gaps between
    tokens: a non-streamed response shows all of them at once, and only Shunter's
    engine reports them (``X-Shunter-Timing``). Unknown is not met.

    ``record_key`` is the record's idempotency key, given when it is made: a record
    written again (replayed from the gateway's spool after an outage) is not counted
    twice. Records from before the key existed have none.

    ``node_name`` is the node that served it, as named then (a deployment may move to
    another node, and a node may be renamed or removed; the record keeps where it ran).
    Empty for a request that reached no node, and for records from before it was kept."""

    class Endpoint(models.TextChoices):
        CHAT = "chat"
        COMPLETIONS = "completions"

    class Status(models.TextChoices):
        OK = "ok"
        ERROR = "error"
        ABORTED = "aborted"

    request_id = models.CharField(max_length=128, db_index=True)
    record_key = models.UUIDField(
        unique=True, null=True, blank=True, default=uuid.uuid4, editable=False
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="requests")
    api_key = models.ForeignKey(
        ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="requests"
    )
    deployment = models.ForeignKey(
        Deployment, on_delete=models.SET_NULL, null=True, blank=True, related_name="requests"
    )
    model_name = models.CharField(max_length=128)
    node_name = models.CharField(max_length=64, blank=True, default="")
    endpoint = models.CharField(max_length=16, choices=Endpoint.choices)
    stream = models.BooleanField(default=False)
    t_arrival = models.DateTimeField(db_index=True)
    t_first_token = models.DateTimeField(null=True, blank=True)
    t_end = models.DateTimeField()
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    ttft_ms = models.FloatField(null=True, blank=True)
    tpot_ms = models.FloatField(null=True, blank=True)
    max_itl_ms = models.FloatField(null=True, blank=True)
    ttft_met = models.BooleanField(default=False)
    tbt_met = models.BooleanField(null=True, blank=True, default=False)
    status = models.CharField(max_length=16, choices=Status.choices)
    error_type = models.CharField(max_length=64, blank=True, default="")
    http_status = models.PositiveSmallIntegerField(default=200)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["-t_arrival", "-id"]
        indexes = [models.Index(fields=["tenant", "t_arrival"], name="record_tenant_arrival")]

    def __str__(self) -> str:
        return f"{self.request_id} ({self.model_name}, {self.status})"


class UsageRollup(models.Model):
    """Per minute (of arrival), tenant and deployment: request and error counts, tokens,
    SLO hits (a TBT that is unknown is no hit), sums of TTFT and TPOT in milliseconds
    (over requests that had one) and the number of requests with a TPOT.

    A deployment with rollups cannot be deleted (its usage history would go with it, and
    rows of one tenant and minute on several deployments would become indistinct):
    disable it instead. Rows are per node too (``node_name``, as the records name it): a
    deployment moved to another node starts new rows there."""

    minute = models.DateTimeField()
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="rollups")
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="rollups")
    node_name = models.CharField(max_length=64, blank=True, default="")
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    ttft_met = models.PositiveIntegerField(default=0)
    tbt_met = models.PositiveIntegerField(default=0)
    both_met = models.PositiveIntegerField(default=0)
    sum_ttft_ms = models.FloatField(default=0.0)
    sum_tpot_ms = models.FloatField(default=0.0)
    tpot_requests = models.PositiveIntegerField(default=0)

    # The columns that add up over records (and over rows, for longer periods).
    SUMMED: ClassVar[tuple[str, ...]] = (
        "requests",
        "errors",
        "prompt_tokens",
        "completion_tokens",
        "ttft_met",
        "tbt_met",
        "both_met",
        "sum_ttft_ms",
        "sum_tpot_ms",
        "tpot_requests",
    )

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["-minute", "tenant_id", "deployment_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "tenant", "deployment", "node_name"],
                name="rollup_unique_minute_node",
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.deployment_id} @ {self.minute:%Y-%m-%d %H:%M}"
