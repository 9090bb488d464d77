"""Pages of the admin console. Staff only: every view but the login page and the plotly
bundle redirects others to ``/console/login/``. Views are thin: reads come from
``selectors``, writes go through the platform and tenants services."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth import views as auth_views
from django.core.exceptions import ValidationError
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse_lazy
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from shunter.console import display, figures, selectors
from shunter.console.forms import ApiKeyCreateForm, DeploymentEditForm, add_service_errors
from shunter.platform.login_throttle import ThrottledLoginView
from shunter.platform.models import Deployment, SloClass
from shunter.platform.selectors import deployment_list
from shunter.platform.services import deployment_update, node_fit
from shunter.tenants.models import ApiKey, Tenant
from shunter.tenants.selectors import slo_by_node, tenant_deployments
from shunter.tenants.services import api_key_create, api_key_revoke

LOGIN_URL = reverse_lazy("console:login")
YEAR_S = 365 * 24 * 3600

staff_required: Callable[[Any], Any] = staff_member_required(login_url=LOGIN_URL)

login = ThrottledLoginView.as_view(
    template_name="console/login.html",
    next_page=reverse_lazy("console:overview"),
)
logout = auth_views.LogoutView.as_view(next_page=LOGIN_URL)


def _plotly_bundle() -> Path:
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise Http404("plotly is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"


PLOTLY_VERSION = importlib.metadata.version("plotly")


@require_GET
def plotly_js(request: HttpRequest) -> FileResponse:
    """plotly.js as bundled in the installed ``plotly`` package (no internet needed).
    The URL names the package version, so the file is cached for a year."""
    response = FileResponse(_plotly_bundle().open("rb"), content_type="text/javascript")
    response["Cache-Control"] = f"public, max-age={YEAR_S}, immutable"
    return response


@staff_required
@require_GET
def overview(request: HttpRequest) -> HttpResponse:
    data = selectors.overview()
    rows = [
        (row, display.slo_text(row), display.tenant_cells(row)) for row in data["tenants"].values()
    ]
    return render(
        request,
        "console/overview.html",
        {
            "rows": rows,
            "windows": selectors.WINDOWS_MIN,
            "nodes": selectors.node_list_without_state(),
            "figures": selectors.overview_figures(data),
            "snapshot": data,
        },
    )


def _tenant_page(
    request: HttpRequest,
    tenant: Tenant,
    *,
    form: ApiKeyCreateForm | None = None,
    new_key: tuple[ApiKey, str] | None = None,
    status: int = 200,
) -> HttpResponse:
    deployments = list(tenant_deployments(tenant=tenant))
    models = list(tenant.models.all())
    ttft, tpot = selectors.tenant_latency_samples(tenant)
    return render(
        request,
        "console/tenant.html",
        {
            "tenant": tenant,
            "models": models,
            "deployments": deployments,
            "keys": selectors.tenant_keys(tenant),
            "quotas": selectors.tenant_quota_usage(tenant),
            "recent": selectors.tenant_recent_requests(tenant),
            "figures": {
                "ttft": figures.latency_histogram_figure("TTFT, last hour", ttft),
                "tpot": figures.latency_histogram_figure("TPOT, last hour", tpot),
            },
            "has_samples": bool(ttft or tpot),
            "form": form or ApiKeyCreateForm(deployments=deployments, models=models),
            "new_key": new_key,
        },
        status=status,
    )


def _tenant_or_404(tenant_id: int) -> Tenant:
    tenant = selectors.tenant_detail(tenant_id)
    if tenant is None:
        raise Http404("no such tenant")
    return tenant


@staff_required
@require_GET
def tenant(request: HttpRequest, tenant_id: int) -> HttpResponse:
    return _tenant_page(request, _tenant_or_404(tenant_id))


@staff_required
@require_POST
@never_cache  # the secret is in this response only: no cache may keep it
def key_create(request: HttpRequest, tenant_id: int) -> HttpResponse:
    """Create a key and show its secret in this response, once (never stored)."""
    tenant = _tenant_or_404(tenant_id)
    form = ApiKeyCreateForm(
        request.POST,
        deployments=list(tenant_deployments(tenant=tenant)),
        models=list(tenant.models.all()),
    )
    if form.is_valid():
        try:
            key, secret = api_key_create(
                tenant=tenant,
                name=form.cleaned_data["name"],
                scopes=form.scope_deployments(),
                model_scopes=form.scope_models(),
                all_deployments=form.cleaned_data["all_deployments"],
                expires_at=form.cleaned_data["expires_at"],
            )
        except ValidationError as e:
            add_service_errors(form, e)
        else:
            return _tenant_page(request, tenant, new_key=(key, secret), status=201)
    return _tenant_page(request, tenant, form=form, status=400)


@staff_required
@require_POST
def key_revoke(request: HttpRequest, tenant_id: int, key_id: int) -> HttpResponse:
    key = get_object_or_404(ApiKey.objects.restrict(tenant_id), pk=key_id)
    api_key_revoke(api_key=key)
    messages.success(request, f"Key {key.name} ({key.prefix}…) revoked.")
    return redirect("console:tenant", tenant_id=tenant_id)


# The node page's SLO table covers this many minutes before now.
NODE_SLO_WINDOW_MIN = 15


@staff_required
@require_GET
def node(request: HttpRequest, node_id: int) -> HttpResponse:
    view = selectors.node_views([node_id]).get(str(node_id))
    if view is None:
        raise Http404("no such node")
    since = timezone.now() - timedelta(minutes=NODE_SLO_WINDOW_MIN)
    slo = [
        {
            "what": row.model_name or "all deployments",
            "total": row.deployment_id is None,
            "requests": row.requests,
            "errors": row.errors,
            "ttft": display.percent(row.ttft_attainment),
            "tbt": display.percent(row.tbt_attainment),
            "both": display.percent(row.both_attainment),
        }
        for row in slo_by_node(node=view["name"], since=since)
    ]
    return render(
        request,
        "console/node.html",
        {
            "node": view,
            "slo": slo,
            "slo_window_min": NODE_SLO_WINDOW_MIN,
            "steps_figure": figures.step_times_figure([(int(i), ms) for i, ms in view["steps"]]),
            "display": display,
        },
    )


def _deployments_page(
    request: HttpRequest,
    *,
    failed: tuple[int, DeploymentEditForm] | None = None,
    status: int = 200,
) -> HttpResponse:
    slo_classes = list(SloClass.objects.all())
    deployments = list(deployment_list())
    by_node: dict[int, list[Deployment]] = {}
    for d in deployments:
        by_node.setdefault(d.node_id, []).append(d)
    rows = []
    for d in deployments:
        if failed is not None and failed[0] == d.pk:
            form = failed[1]
        else:
            initial = {
                "sharing": d.sharing,
                "slo_class": str(d.slo_class_id),
                "priority": d.priority,
            }
            form = DeploymentEditForm(
                initial=initial, slo_classes=slo_classes, prefix=f"d{d.pk}", form_id=f"edit-{d.pk}"
            )
        rows.append((d, form))
    fits = []
    for group in by_node.values():
        node_ = group[0].node
        fit = node_fit(hbm_bytes=node_.hbm_bytes, deployments=[d for d in group if d.enabled])
        fits.append((node_, fit))
    return render(
        request,
        "console/deployments.html",
        {"rows": rows, "fits": fits, "display": display},
        status=status,
    )


@staff_required
@require_GET
def deployments(request: HttpRequest) -> HttpResponse:
    return _deployments_page(request)


@staff_required
@require_POST
def deployment_edit(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """Change sharing, SLO class and priority through ``deployment_update`` (which
    checks that the node's deployments still fit); errors show on the row."""
    deployment = get_object_or_404(
        Deployment.objects.select_related("node", "model", "slo_class"), pk=deployment_id
    )
    form = DeploymentEditForm(
        request.POST,
        slo_classes=list(SloClass.objects.all()),
        prefix=f"d{deployment.pk}",
        form_id=f"edit-{deployment.pk}",
    )
    if form.is_valid():
        try:
            deployment_update(deployment=deployment, **form.changes())
        except ValidationError as e:
            add_service_errors(form, e)
        else:
            messages.success(request, f"Deployment {deployment} updated.")
            return redirect("console:deployments")
    return _deployments_page(request, failed=(deployment.pk, form), status=400)
