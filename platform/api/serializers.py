"""Serializers of the platform API: they translate; writes go through services."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from shunter.common.api import ServiceSerializer
from shunter.platform import services
from shunter.platform.models import (
    Deployment,
    Model,
    Node,
    SloClass,
    engine_token_validator,
)


class SloClassSerializer(ServiceSerializer):
    class Meta:
        model = SloClass
        fields = [
            "id",
            "name",
            "ttft_ms",
            "tbt_ms",
            "alpha",
            "beta_b",
            "beta_f",
            "attainment_target",
        ]

    def create_service(self, **fields: Any) -> SloClass:
        return services.slo_class_create(**fields)

    def update_service(self, instance: SloClass, **fields: Any) -> SloClass:
        return services.slo_class_update(slo_class=instance, **fields)


class NodeSerializer(ServiceSerializer):
    """A node. ``engine_token`` is write-only (stored encrypted; omit it to keep the
    stored one, send '' to clear it); ``has_engine_token`` says whether one is set;
    ``cordon`` is '' in rotation, ``operator`` or ``rollout`` when cordoned (changed
    through the ``cordon`` and ``uncordon`` actions)."""

    engine_token = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        max_length=4096,
        validators=[engine_token_validator],
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "engine_url",
            "engine_token",
            "has_engine_token",
            "hardware_profile",
            "hbm_bytes",
            "dram_bytes",
            "status",
            "cordon",
            "last_seen",
            "state_at",
            "engine_started",
            "last_error",
        ]
        read_only_fields = [
            "has_engine_token",
            "status",
            "cordon",
            "last_seen",
            "state_at",
            "engine_started",
            "last_error",
        ]

    def create_service(self, **fields: Any) -> Node:
        return services.node_create(**fields)

    def update_service(self, instance: Node, **fields: Any) -> Node:
        return services.node_update(node=instance, **fields)


class NodeStateSerializer(serializers.Serializer[Any]):
    """The engine's last ``/admin/state`` as the poll cached it."""

    state = serializers.JSONField()
    state_at = serializers.DateTimeField(allow_null=True)


class ReconcileSerializer(serializers.Serializer[Any]):
    ok = serializers.BooleanField()
    changes = serializers.JSONField(allow_null=True)
    error = serializers.CharField(allow_blank=True)


class PollSerializer(serializers.Serializer[Any]):
    healthy = serializers.BooleanField()
    restarted = serializers.BooleanField()
    drifted = serializers.BooleanField()
    status = serializers.CharField()


class ModelSerializer(ServiceSerializer):
    """A served model. Only ``name`` and ``source_dir`` are written; the architecture
    facts are read from ``source_dir/config.json``."""

    class Meta:
        model = Model
        fields = [
            "id",
            "name",
            "source_dir",
            "architecture",
            "num_layers",
            "param_bytes",
            "kv_bytes_per_token",
            "context_length",
            "config",
        ]
        read_only_fields = [
            "architecture",
            "num_layers",
            "param_bytes",
            "kv_bytes_per_token",
            "context_length",
            "config",
        ]

    def create_service(self, **fields: Any) -> Model:
        return services.model_create(**fields)

    def update_service(self, instance: Model, **fields: Any) -> Model:
        return services.model_update(model=instance, **fields)


class DeploymentSerializer(ServiceSerializer):
    served_name = serializers.CharField(read_only=True)

    class Meta:
        model = Deployment
        fields = [
            "id",
            "node",
            "model",
            "served_name",
            "sharing",
            "slo_class",
            "priority",
            "kv_floor_bytes",
            "kv_ceiling_bytes",
            "max_context",
            "share_prefixes",
            "enabled",
        ]
        extra_kwargs = {"priority": {"min_value": -(2**31), "max_value": 2**31 - 1}}

    def create_service(self, **fields: Any) -> Deployment:
        return services.deployment_create(**fields)

    def update_service(self, instance: Deployment, **fields: Any) -> Deployment:
        return services.deployment_update(deployment=instance, **fields)
