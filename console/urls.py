"""The console's pages, mounted at ``/console/``."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from shunter.console import benchmark_views, views

app_name = "console"

urlpatterns: list[URLPattern | URLResolver] = [
    path("", views.overview, name="overview"),
    path("login/", views.login, name="login"),
    path("logout/", views.logout, name="logout"),
    path("tenants/<int:tenant_id>/", views.tenant, name="tenant"),
    path("tenants/<int:tenant_id>/keys/", views.key_create, name="key-create"),
    path("tenants/<int:tenant_id>/keys/<int:key_id>/revoke/", views.key_revoke, name="key-revoke"),
    path("nodes/<int:node_id>/", views.node, name="node"),
    path("deployments/", views.deployments, name="deployments"),
    path("deployments/<int:deployment_id>/", views.deployment_edit, name="deployment-edit"),
    path("benchmarks/", benchmark_views.benchmarks_page, name="benchmarks"),
    path("benchmarks/jobs/<int:job_id>/run/", benchmark_views.job_run, name="benchmark-run"),
    path(
        "benchmarks/jobs/<int:job_id>/schedule/",
        benchmark_views.job_schedule,
        name="benchmark-schedule",
    ),
    path(
        "benchmarks/runs/<int:run_id>/cancel/", benchmark_views.run_cancel, name="benchmark-cancel"
    ),
    # The package version in the path: a new plotly is a new URL, so caches may keep it.
    path(f"assets/plotly-{views.PLOTLY_VERSION}.min.js", views.plotly_js, name="plotly"),
]
