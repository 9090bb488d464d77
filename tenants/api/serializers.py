"""Serializers of the tenants API: they translate; writes go through services."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from shunter.common.api import ServiceSerializer
from shunter.platform.models import Deployment, Model
from shunter.tenants import services
from shunter.tenants.models import ApiKey, RequestRecord, Tenant


def model_names() -> serializers.SlugRelatedField[Model]:
    """Models written and shown by name."""
    return serializers.SlugRelatedField(
        many=True, slug_field="name", queryset=Model.objects.all(), required=False
    )


class TenantSerializer(ServiceSerializer):
    """A tenant: it may use every deployment of its ``models`` (by name, now and later)
    and its ``deployments`` (by id, pinned to their nodes)."""

    deployments = serializers.PrimaryKeyRelatedField(
        many=True, queryset=Deployment.objects.all(), required=False
    )
    models = model_names()

    class Meta:
        model = Tenant
        fields = [
            "id",
            "name",
            "default_slo_class",
            "models",
            "deployments",
            "rpm_limit",
            "tpm_limit",
            "concurrency_limit",
            "token_budget",
            "budget_period",
            "is_active",
            "created_at",
        ]
        read_only_fields = ["created_at"]

    def create_service(self, **fields: Any) -> Tenant:
        return services.tenant_create(**fields)

    def update_service(self, instance: Tenant, **fields: Any) -> Tenant:
        return services.tenant_update(tenant=instance, **fields)


class ApiKeySerializer(ServiceSerializer):
    """A key as lists show it: its prefix, never its secret. It reaches every deployment
    its tenant may use (``all_deployments``, no scopes) or its ``scopes`` (deployment
    ids) and every deployment of its ``model_scopes`` (model names); a key whose scopes
    were all taken from its tenant has none and reaches nothing. ``expires_at`` null
    means it never expires."""

    scopes = serializers.PrimaryKeyRelatedField(
        many=True, queryset=Deployment.objects.all(), required=False
    )
    model_scopes = model_names()
    is_usable = serializers.SerializerMethodField()

    class Meta:
        model = ApiKey
        fields = [
            "id",
            "tenant",
            "name",
            "prefix",
            "scopes",
            "model_scopes",
            "all_deployments",
            "expires_at",
            "revoked_at",
            "last_used_at",
            "created_at",
            "is_usable",
        ]
        read_only_fields = ["prefix", "revoked_at", "last_used_at", "created_at"]

    def get_is_usable(self, key: ApiKey) -> bool:
        return key.is_usable()

    def validate_tenant(self, tenant: Tenant) -> Tenant:
        if self.instance is not None and tenant.pk != self.instance.tenant_id:
            raise serializers.ValidationError("A key cannot move to another tenant.")
        return tenant

    def create_service(self, **fields: Any) -> ApiKey:
        key, secret = services.api_key_create(**fields)
        # Shown in this one response only (ApiKeyCreatedSerializer); never stored.
        key.secret = secret  # type: ignore[attr-defined]
        return key

    def update_service(self, instance: ApiKey, **fields: Any) -> ApiKey:
        fields.pop("tenant", None)
        if "expires_at" in fields and fields["expires_at"] is None:
            fields.pop("expires_at")
            fields["clear_expiry"] = True
        return services.api_key_update(api_key=instance, **fields)


class ApiKeyCreatedSerializer(ApiKeySerializer):
    """A key just created, with its secret: the only time the secret is shown."""

    secret = serializers.CharField(read_only=True)

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "secret"]


class RequestRecordSerializer(serializers.ModelSerializer[RequestRecord]):
    class Meta:
        model = RequestRecord
        fields = [
            "id",
            "request_id",
            "tenant",
            "api_key",
            "deployment",
            "model_name",
            "node_name",
            "endpoint",
            "stream",
            "t_arrival",
            "t_first_token",
            "t_end",
            "prompt_tokens",
            "completion_tokens",
            "ttft_ms",
            "tpot_ms",
            "max_itl_ms",
            "ttft_met",
            "tbt_met",
            "status",
            "error_type",
            "http_status",
        ]
        read_only_fields = fields


class TimeRangeSerializer(serializers.Serializer[Any]):
    """A range of minutes: ``since`` (rounded down to its minute) to ``until``
    (exclusive); either may be left out."""

    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        since, until = attrs.get("since"), attrs.get("until")
        if since is not None and until is not None and until <= since:
            raise serializers.ValidationError({"until": "Must be after since."})
        return attrs


class UsageQuerySerializer(TimeRangeSerializer):
    tenant = serializers.IntegerField(required=False, min_value=1, max_value=2**63 - 1)
    deployment = serializers.IntegerField(required=False, min_value=1, max_value=2**63 - 1)
    node = serializers.CharField(required=False, max_length=64)


class NodeSloQuerySerializer(TimeRangeSerializer):
    node = serializers.CharField(required=False, max_length=64)


class SloRowSerializer(serializers.Serializer[Any]):
    """One node over the range, over all its tenants (each request judged against its own
    SLO class): its total (``deployment_id`` null) or one of its deployments."""

    node = serializers.CharField()
    deployment_id = serializers.IntegerField(allow_null=True)
    model_name = serializers.CharField(allow_blank=True)
    requests = serializers.IntegerField()
    errors = serializers.IntegerField()  # type: ignore[assignment]  # a field, not .errors
    ttft_attainment = serializers.FloatField()
    tbt_attainment = serializers.FloatField()
    both_attainment = serializers.FloatField()
    mean_ttft_ms = serializers.FloatField(allow_null=True)


class UsageRowSerializer(serializers.Serializer[Any]):
    """One tenant on one deployment over the range: counts, tokens, SLO attainment
    (shares of all requests) and whether both-SLO attainment meets the class target."""

    tenant_id = serializers.IntegerField()
    tenant = serializers.CharField()
    deployment_id = serializers.IntegerField()
    model_name = serializers.CharField()
    node = serializers.CharField(allow_blank=True)
    slo_class = serializers.CharField()
    attainment_target = serializers.FloatField()
    requests = serializers.IntegerField()
    errors = serializers.IntegerField()  # type: ignore[assignment]  # a field, not .errors
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    ttft_attainment = serializers.FloatField()
    tbt_attainment = serializers.FloatField()
    both_attainment = serializers.FloatField()
    mean_ttft_ms = serializers.FloatField(allow_null=True)
    mean_tpot_ms = serializers.FloatField(allow_null=True)
    meets_target = serializers.BooleanField()
