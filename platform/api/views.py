"""Platform API views: one viewset per resource, writes through services."""

from __future__ import annotations

from typing import Any

from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from shunter.common.api import (
    TENANT_PARAMETER,
    ServiceModelViewSet,
    TenantScopedMixin,
)
from shunter.platform import selectors, services
from shunter.platform.api import serializers as s
from shunter.platform.models import Deployment, Node


class SloClassViewSet(ServiceModelViewSet):
    """SLO classes: TTFT/TBT targets, VLT weights, attainment target."""

    serializer_class = s.SloClassSerializer
    queryset = selectors.slo_class_list()
    filterset_fields = ["name"]


class NodeFilter(filters.FilterSet):  # type: ignore[misc]
    class Meta:
        model = Node
        fields = ["name", "status", "cordon"]


class NodeViewSet(ServiceModelViewSet):
    """GPU nodes and their engines; ``state`` is the engine's cached memory map."""

    serializer_class = s.NodeSerializer
    queryset = selectors.node_list()
    filterset_class = NodeFilter

    @extend_schema(responses=s.NodeStateSerializer)
    @action(detail=True, methods=["get"])
    def state(self, request: Request, pk: Any = None) -> Response:
        node = self.get_object()
        return Response(s.NodeStateSerializer(node).data)

    @extend_schema(request=None, responses=s.ReconcileSerializer)
    @action(detail=True, methods=["post"])
    def reconcile(self, request: Request, pk: Any = None) -> Response:
        """Push the node's enabled deployments to its engine now."""
        result = services.node_reconcile(node=self.get_object())
        return Response(s.ReconcileSerializer(result).data)

    @extend_schema(request=None, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"])
    def cordon(self, request: Request, pk: Any = None) -> Response:
        """Route no new request to the node (those in flight finish) until uncordoned."""
        node = services.node_cordon(node=self.get_object())
        return Response(s.NodeSerializer(node).data)

    @extend_schema(request=None, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"])
    def uncordon(self, request: Request, pk: Any = None) -> Response:
        """Put the node back in rotation."""
        node = services.node_uncordon(node=self.get_object())
        return Response(s.NodeSerializer(node).data)

    @extend_schema(request=None, responses=s.PollSerializer)
    @action(detail=True, methods=["post"])
    def poll(self, request: Request, pk: Any = None) -> Response:
        """Probe the node's engine now (and reconcile it if it restarted or drifted)."""
        node = self.get_object()
        polled = services.node_poll(node=node)
        data = {
            "healthy": polled.healthy,
            "restarted": polled.restarted,
            "drifted": polled.drifted,
            "status": node.status,
        }
        return Response(s.PollSerializer(data).data)


class ModelViewSet(ServiceModelViewSet):
    """Models: a directory with config.json, served under a name."""

    serializer_class = s.ModelSerializer
    queryset = selectors.model_list()
    filterset_fields = ["name", "architecture"]


class DeploymentFilter(filters.FilterSet):  # type: ignore[misc]
    class Meta:
        model = Deployment
        fields = ["node", "model", "sharing", "slo_class", "enabled"]


@extend_schema_view(list=extend_schema(parameters=[TENANT_PARAMETER]))
class DeploymentViewSet(TenantScopedMixin, ServiceModelViewSet):
    """Deployments (a model on a node); ``?tenant=`` lists those a tenant may use."""

    serializer_class = s.DeploymentSerializer
    filterset_class = DeploymentFilter

    def base_queryset(self) -> Any:
        return selectors.deployment_list()

    def delete_service(self, instance: Any) -> None:
        services.deployment_delete(deployment=instance)
