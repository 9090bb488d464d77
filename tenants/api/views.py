"""Tenants API views: tenants, keys (secret shown once, revocation), request records
(read-only) and usage from the rollups. Tenant-owned lists are scoped by ``?tenant=``
through the managers' ``restrict``."""

from __future__ import annotations

from typing import Any

from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from shunter.common.api import (
    TENANT_PARAMETER,
    ServiceErrorsMixin,
    ServiceModelViewSet,
    TenantScopedMixin,
    UtcDateTimeFilter,
)
from shunter.tenants import selectors, services
from shunter.tenants.api import serializers as s
from shunter.tenants.models import ApiKey, RequestRecord


class TenantViewSet(ServiceModelViewSet):
    """Tenants: default SLO class, allowed deployments, quotas."""

    serializer_class = s.TenantSerializer
    queryset = selectors.tenant_list()
    filterset_fields = ["name", "is_active", "default_slo_class"]


class ApiKeyFilter(filters.FilterSet):  # type: ignore[misc]
    revoked = filters.BooleanFilter(field_name="revoked_at", lookup_expr="isnull", exclude=True)

    class Meta:
        model = ApiKey
        fields = ["name", "revoked"]


@extend_schema_view(
    list=extend_schema(parameters=[TENANT_PARAMETER]),
    create=extend_schema(responses={201: s.ApiKeyCreatedSerializer}),
)
class ApiKeyViewSet(TenantScopedMixin, ServiceModelViewSet):
    """API keys. Creating one returns its secret in that response only."""

    serializer_class = s.ApiKeySerializer
    filterset_class = ApiKeyFilter
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def base_queryset(self) -> Any:
        return selectors.api_key_list()

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        key = serializer.save()
        shown = s.ApiKeyCreatedSerializer(key, context=self.get_serializer_context())
        # The secret is in this response only: no cache (browser, proxy) may keep it.
        return Response(
            shown.data,
            status=status.HTTP_201_CREATED,
            headers={"Cache-Control": "no-store", "Pragma": "no-cache"},
        )

    @extend_schema(request=None, responses=s.ApiKeySerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: Any = None) -> Response:
        """Revoke the key (idempotent); the gateway refuses it within seconds."""
        key = services.api_key_revoke(api_key=self.get_object())
        return Response(s.ApiKeySerializer(key, context=self.get_serializer_context()).data)


class RequestRecordFilter(filters.FilterSet):  # type: ignore[misc]
    since = UtcDateTimeFilter(field_name="t_arrival", lookup_expr="gte")
    until = UtcDateTimeFilter(field_name="t_arrival", lookup_expr="lt")

    class Meta:
        model = RequestRecord
        fields = [
            "deployment",
            "api_key",
            "status",
            "endpoint",
            "model_name",
            "node_name",
            "since",
            "until",
        ]


@extend_schema_view(list=extend_schema(parameters=[TENANT_PARAMETER]))
class RequestRecordViewSet(
    TenantScopedMixin, ServiceErrorsMixin, viewsets.ReadOnlyModelViewSet[Any]
):
    """What each request did (read-only), newest first; ``since``/``until`` bound the
    arrival time."""

    serializer_class = s.RequestRecordSerializer
    filterset_class = RequestRecordFilter

    def base_queryset(self) -> Any:
        return selectors.request_record_list()


class UsageViewSet(ServiceErrorsMixin, mixins.ListModelMixin, viewsets.GenericViewSet[Any]):
    """Usage and SLO attainment per tenant, deployment and node over a time range, from
    the per-minute rollups (``since`` rounds down to its minute; ``until`` is
    exclusive); ``nodes/``: SLO attainment per node and per deployment on it."""

    serializer_class = s.UsageRowSerializer
    pagination_class = None
    filter_backends: list[Any] = []

    @extend_schema(parameters=[s.UsageQuerySerializer], responses=s.UsageRowSerializer(many=True))
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        query = s.UsageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        rows = selectors.usage_summary(**query.validated_data)
        return Response(s.UsageRowSerializer(rows, many=True).data)

    @extend_schema(parameters=[s.NodeSloQuerySerializer], responses=s.SloRowSerializer(many=True))
    @action(detail=False, methods=["get"])
    def nodes(self, request: Request) -> Response:
        """Per node, over all tenants: its total, then each of its deployments."""
        query = s.NodeSloQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        rows = selectors.slo_by_node(**query.validated_data)
        return Response(s.SloRowSerializer(rows, many=True).data)
