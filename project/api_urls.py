"""The admin REST API under /api/: one route per resource, the OpenAPI schema and its
docs UI (staff only, like the rest; assets served from the sidecar package)."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import IsAdminUser
from rest_framework.routers import DefaultRouter

from shunter.benchmarks import api as benchmark_views
from shunter.platform.api import views as platform_views
from shunter.tenants.api import views as tenant_views

router = DefaultRouter()
router.register("slo-classes", platform_views.SloClassViewSet, basename="sloclass")
router.register("nodes", platform_views.NodeViewSet, basename="node")
router.register("models", platform_views.ModelViewSet, basename="model")
router.register("deployments", platform_views.DeploymentViewSet, basename="deployment")
router.register("benchmark-jobs", benchmark_views.BenchmarkJobViewSet, basename="benchmarkjob")
router.register("benchmark-runs", benchmark_views.BenchmarkRunViewSet, basename="benchmarkrun")
router.register("tenants", tenant_views.TenantViewSet, basename="tenant")
router.register("keys", tenant_views.ApiKeyViewSet, basename="apikey")
router.register("records", tenant_views.RequestRecordViewSet, basename="requestrecord")
router.register("usage", tenant_views.UsageViewSet, basename="usage")

urlpatterns = [
    path(
        "schema/",
        SpectacularAPIView.as_view(permission_classes=[IsAdminUser]),
        name="api-schema",
    ),
    path(
        "docs/",
        SpectacularSwaggerView.as_view(url_name="api-schema", permission_classes=[IsAdminUser]),
        name="api-docs",
    ),
    path("", include(router.urls)),
]
