"""The console's pages through Django's test client: staff only, keys shown once,
deployment edits through the services with fit errors inline, bounded query counts."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from shunter.platform import services
from shunter.platform.models import Deployment
from shunter.tenants.models import ApiKey, RequestRecord
from shunter.tenants.services import api_key_create, request_record_create, tenant_update
from tests.tenants.factories import GIB, make_deployment, make_model, make_node, make_tenant, slo

pytestmark = pytest.mark.django_db


def record(tenant: Any, deployment: Deployment | None, **fields: Any) -> RequestRecord:
    """A finished request through the tenants service (rollup included)."""
    now = timezone.now()
    values: dict[str, Any] = {
        "request_id": f"req-{now.timestamp()}",
        "tenant": tenant,
        "api_key": None,
        "deployment": deployment,
        "model_name": deployment.model.name if deployment else "none",
        "endpoint": "chat",
        "stream": True,
        "t_arrival": now - timedelta(seconds=2),
        "t_first_token": now - timedelta(seconds=1),
        "t_end": now,
        "prompt_tokens": 10,
        "completion_tokens": 20,
        "ttft_ms": 100.0,
        "tpot_ms": 10.0,
        "max_itl_ms": 20.0,
        "status": "ok",
    }
    values.update(fields)
    return request_record_create(**values)


def pages(tenant_id: int, node_id: int) -> list[str]:
    return [
        "/console/",
        f"/console/tenants/{tenant_id}/",
        f"/console/nodes/{node_id}/",
        "/console/deployments/",
        "/console/benchmarks/",
    ]


@pytest.fixture
def world() -> dict[str, Any]:
    deployment = make_deployment()
    tenant = make_tenant(deployment, name="acme")
    return {"deployment": deployment, "tenant": tenant, "node": deployment.node}


def test_every_page_renders_for_staff(staff_client: Client, world: dict[str, Any]) -> None:
    record(world["tenant"], world["deployment"])
    for url in pages(world["tenant"].pk, world["node"].pk):
        response = staff_client.get(url)
        assert response.status_code == 200, url
        assert "Shunter console" in response.content.decode()


def test_anonymous_users_are_sent_to_the_login_page(world: dict[str, Any]) -> None:
    client = Client()
    for url in pages(world["tenant"].pk, world["node"].pk):
        response = client.get(url, secure=True)
        assert response.status_code == 302, url
        assert response["Location"] == f"/console/login/?next={url}"


def test_non_staff_users_are_sent_to_the_login_page(
    user_client: Client, world: dict[str, Any]
) -> None:
    for url in pages(world["tenant"].pk, world["node"].pk):
        response = user_client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/console/login/")


def test_posts_need_staff_too(user_client: Client, world: dict[str, Any]) -> None:
    tenant, deployment = world["tenant"], world["deployment"]
    assert user_client.post(f"/console/tenants/{tenant.pk}/keys/", {"name": "x"}).status_code == 302
    assert not ApiKey.objects.filter(tenant=tenant).exists()
    response = user_client.post(f"/console/deployments/{deployment.pk}/", {})
    assert response.status_code == 302


def test_login_page_admits_staff_and_refuses_others(
    staff_user: Any, django_user_model: Any, world: dict[str, Any]
) -> None:
    django_user_model.objects.create_user(username="plain", password="plain-pass-123")
    client = Client()
    page = client.get("/console/login/", secure=True)
    assert page.status_code == 200 and 'name="password"' in page.content.decode()
    refused = client.post(
        "/console/login/", {"username": "plain", "password": "plain-pass-123"}, secure=True
    )
    assert refused.status_code == 200
    assert "staff account" in refused.content.decode()
    admitted = client.post(
        "/console/login/?next=/console/deployments/",
        {"username": "operator", "password": "operator-pass-123", "next": "/console/deployments/"},
        secure=True,
    )
    assert admitted.status_code == 302 and admitted["Location"] == "/console/deployments/"
    assert client.get("/console/", secure=True).status_code == 200
    client.post("/console/logout/", secure=True)
    assert client.get("/console/", secure=True).status_code == 302


def test_overview_shows_each_tenants_attainment(
    staff_client: Client, world: dict[str, Any]
) -> None:
    tenant, deployment = world["tenant"], world["deployment"]
    record(tenant, deployment)  # 100 ms TTFT, 10 ms TPOT: meets standard (5 s, 100 ms)
    record(tenant, deployment, status="error", http_status=502, ttft_ms=None, tpot_ms=None)
    body = staff_client.get("/console/").content.decode()
    row = re.search(rf'<tr data-tenant="{tenant.pk}".*?</tr>', body, re.S)
    assert row is not None
    joint = re.search(r'data-field="w5-joint" class="num status-(\w+)">([^<]*)<', row.group(0))
    assert joint is not None
    # One of two requests met both SLOs (the failed one misses): 50%.
    assert joint.group(2) == "50.0%"
    assert joint.group(1) == "miss"  # far below the class's target
    assert re.search(r'data-field="errors" class="num ">1<', row.group(0))
    assert 'id="fig-minute"' in body and 'id="fig-fine"' in body


def test_key_creation_shows_the_secret_once(staff_client: Client, world: dict[str, Any]) -> None:
    tenant, deployment = world["tenant"], world["deployment"]
    response = staff_client.post(
        f"/console/tenants/{tenant.pk}/keys/", {"name": "ci", "scopes": [str(deployment.pk)]}
    )
    assert response.status_code == 201
    assert "no-store" in response["Cache-Control"]
    secret = re.search(r"<code>(sk-shunter-[A-Za-z0-9_-]{43})</code>", response.content.decode())
    assert secret is not None
    key = ApiKey.objects.get(tenant=tenant, name="ci")
    assert key.digest == hashlib.sha256(secret.group(1).encode()).hexdigest()
    assert list(key.scopes.all()) == [deployment]
    # The next view of the page lists the key by prefix only.
    page = staff_client.get(f"/console/tenants/{tenant.pk}/").content.decode()
    assert key.prefix in page and secret.group(1) not in page


def test_key_creation_errors_show_on_the_form(staff_client: Client, world: dict[str, Any]) -> None:
    tenant = world["tenant"]
    past = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    response = staff_client.post(
        f"/console/tenants/{tenant.pk}/keys/",
        {"name": "late", "all_deployments": "on", "expires_at": past},
    )
    assert response.status_code == 400
    assert "The expiry must be in the future." in response.content.decode()
    response = staff_client.post(f"/console/tenants/{tenant.pk}/keys/", {"name": "nothing"})
    assert response.status_code == 400 and "or set all_deployments" in response.content.decode()
    assert not ApiKey.objects.filter(tenant=tenant).exists()
    outside = make_deployment()
    response = staff_client.post(
        f"/console/tenants/{tenant.pk}/keys/", {"name": "x", "scopes": [str(outside.pk)]}
    )
    assert response.status_code == 400 and "is not one of the available choices" in (
        response.content.decode()
    )


def test_a_key_scoped_to_a_granted_model_covers_its_deployments_on_the_page(
    staff_client: Client, world: dict[str, Any]
) -> None:
    tenant = world["tenant"]
    llama = make_model(name="llama")
    tenant_update(tenant=tenant, models=[llama])
    on_llama = make_deployment(model=llama)  # reached through the model grant
    page = staff_client.get(f"/console/tenants/{tenant.pk}/").content.decode()
    assert "Models (every deployment, now and later): llama." in page
    assert f'value="{on_llama.pk}"' in page  # a key may be pinned to it
    response = staff_client.post(
        f"/console/tenants/{tenant.pk}/keys/", {"name": "llama", "model_scopes": ["llama"]}
    )
    assert response.status_code == 201
    key = ApiKey.objects.get(tenant=tenant, name="llama")
    assert list(key.model_scopes.all()) == [llama] and list(key.scopes.all()) == []
    cell = re.search(rf"{key.prefix}…</code></td>\s*<td>(.*?)</td>", response.content.decode())
    assert cell is not None and cell.group(1) == "llama"


def test_key_scopes_show_all_some_or_none(staff_client: Client, world: dict[str, Any]) -> None:
    tenant, deployment = world["tenant"], world["deployment"]
    wide, _ = api_key_create(tenant=tenant, name="wide", all_deployments=True)
    lost, _ = api_key_create(tenant=tenant, name="lost", scopes=[deployment])
    tenant_update(tenant=tenant, deployments=[])
    page = staff_client.get(f"/console/tenants/{tenant.pk}/").content.decode()
    cells = {
        key.name: re.search(rf"{key.prefix}…</code></td>\s*<td>(.*?)</td>", page)
        for key in (wide, lost)
    }
    assert cells["wide"] is not None and cells["wide"].group(1) == "all"
    assert cells["lost"] is not None and cells["lost"].group(1) == '<span class="tag">none</span>'


def test_key_revocation(staff_client: Client, world: dict[str, Any]) -> None:
    tenant = world["tenant"]
    key, _ = api_key_create(all_deployments=True, tenant=tenant, name="old")
    response = staff_client.post(f"/console/tenants/{tenant.pk}/keys/{key.pk}/revoke/")
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None
    page = staff_client.get(f"/console/tenants/{tenant.pk}/").content.decode()
    assert "revoked" in page and "revoked" in page.split(key.prefix)[1]
    # Another tenant's key id under this tenant's URL is not found.
    other, _ = api_key_create(all_deployments=True, tenant=make_tenant(), name="theirs")
    assert (
        staff_client.post(f"/console/tenants/{tenant.pk}/keys/{other.pk}/revoke/").status_code
        == 404
    )
    other.refresh_from_db()
    assert other.revoked_at is None


def test_tenant_page_shows_quota_usage(staff_client: Client) -> None:
    deployment = make_deployment()
    tenant = make_tenant(deployment, rpm_limit=60, token_budget=1000)
    for _ in range(3):
        record(tenant, deployment, prompt_tokens=5, completion_tokens=7)
    body = staff_client.get(f"/console/tenants/{tenant.pk}/").content.decode()
    rpm = re.search(r"Requests per minute</td><td[^>]*>(\d+)</td>\s*<td[^>]*>(\d+)</td>", body)
    assert rpm is not None and rpm.groups() == ("60", "3")
    budget = re.search(r"Token budget per day</td><td[^>]*>(\d+)</td>\s*<td[^>]*>(\d+)</td>", body)
    assert budget is not None and budget.groups() == ("1000", "36")
    assert 'id="fig-ttft"' in body


def test_deployment_edit_goes_through_the_service(
    staff_client: Client, world: dict[str, Any]
) -> None:
    deployment = world["deployment"]
    batch = slo("batch")
    response = staff_client.post(
        f"/console/deployments/{deployment.pk}/",
        {
            f"d{deployment.pk}-sharing": "temporal",
            f"d{deployment.pk}-slo_class": str(batch.pk),
            f"d{deployment.pk}-priority": "5",
        },
    )
    assert response.status_code == 302
    deployment.refresh_from_db()
    assert (deployment.sharing, deployment.slo_class, deployment.priority) == (
        "temporal",
        batch,
        5,
    )


def test_deployment_fit_errors_show_inline(staff_client: Client) -> None:
    # Two spatial models whose weights alone fill the node: making the second one spatial
    # as well would need more HBM than the node has.
    big = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 8}
    first, second = make_model(**big), make_model(**big)
    node = make_node(hbm_bytes=first.param_bytes + second.param_bytes // 2 + 64 * 1024**2)
    make_deployment(node=node, model=first, sharing="spatial")
    target = make_deployment(node=node, model=second, sharing="temporal", enabled=False)
    Deployment.objects.filter(pk=target.pk).update(enabled=True)
    response = staff_client.post(
        f"/console/deployments/{target.pk}/",
        {
            f"d{target.pk}-sharing": "spatial",
            f"d{target.pk}-slo_class": str(target.slo_class_id),
            f"d{target.pk}-priority": "0",
        },
    )
    body = response.content.decode()
    assert response.status_code == 400
    assert "do not fit its HBM" in body
    # The message is on the edited deployment's row.
    assert body.index("do not fit its HBM") > body.index(f'id="deployment-{target.pk}"')
    target.refresh_from_db()
    assert target.sharing == "temporal"


def test_benchmarks_page_says_no_jobs_are_defined(staff_client: Client) -> None:
    body = staff_client.get("/console/benchmarks/").content.decode()
    assert "No benchmark jobs are defined." in body


def test_plotly_is_served_from_the_installed_package(client: Client) -> None:
    import plotly

    from shunter.console.views import PLOTLY_VERSION

    response = client.get(f"/console/assets/plotly-{PLOTLY_VERSION}.min.js")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/javascript"
    assert "max-age=31536000" in response["Cache-Control"]
    body = b"".join(response.streaming_content)  # type: ignore[attr-defined]
    assert body.startswith(b"/**") and b"plotly.js" in body[:400]
    assert len(body) > 1_000_000
    assert plotly.__version__ == PLOTLY_VERSION
    assert client.get("/console/assets/plotly-0.0.1.min.js").status_code == 404


def test_the_node_page_shows_its_slo_attainment_and_rotation(staff_client: Client) -> None:
    deployment = make_deployment()
    node, tenant = deployment.node, make_tenant(deployment)
    url = f"/console/nodes/{node.pk}/"
    assert "No requests served in the last 15 minutes" in staff_client.get(url).content.decode()
    record(tenant, deployment, node_name=node.name)
    record(tenant, deployment, node_name=node.name, request_id="slow", ttft_ms=60_000.0)
    record(tenant, deployment, node_name="elsewhere", request_id="other")
    page = staff_client.get(url).content.decode()
    table = page[page.index('id="node-slo"') : page.index("</table>", page.index('id="node-slo"'))]
    assert "all deployments" in table and deployment.model.name in table
    assert table.count("50.0%") == 4  # TTFT and both, in the total and the deployment's row
    assert ">in rotation<" in page
    services.node_cordon(node=node)
    assert ">cordoned by an operator<" in staff_client.get(url).content.decode()


def test_unknown_objects_are_404(staff_client: Client) -> None:
    assert staff_client.get("/console/tenants/999999/").status_code == 404
    assert staff_client.get("/console/nodes/999999/").status_code == 404


@pytest.fixture
def fifty_tenants() -> dict[str, Any]:
    node = make_node(hbm_bytes=400 * GIB)
    deployments = [make_deployment(node=node) for _ in range(5)]
    tenants = [make_tenant(*deployments) for _ in range(50)]
    for tenant in tenants:
        api_key_create(tenant=tenant, name="k", scopes=deployments[:2])
        for d in deployments[:2]:
            record(tenant, d)
    return {"node": node, "tenant": tenants[0]}


def test_query_counts_are_bounded_with_fifty_tenants(
    staff_client: Client, fifty_tenants: dict[str, Any], django_assert_max_num_queries: Any
) -> None:
    # Session and user: 2 queries; each page's own reads are a fixed handful.
    budgets = {
        "/console/": 8,
        # Its grants (models, usable deployments) and its keys' scopes and model scopes.
        f"/console/tenants/{fifty_tenants['tenant'].pk}/": 12,
        # Its deployments, and its SLO attainment in total and per deployment.
        f"/console/nodes/{fifty_tenants['node'].pk}/": 7,
        "/console/deployments/": 5,
        "/console/benchmarks/": 4,
    }
    for url, budget in budgets.items():
        with django_assert_max_num_queries(budget):
            assert staff_client.get(url).status_code == 200, url


def test_recent_requests_are_coloured_by_their_slo_and_sizes_say_mib(
    staff_client: Client, world: dict[str, Any]
) -> None:
    tenant, deployment = world["tenant"], world["deployment"]
    record(tenant, deployment, request_id="req-fast")
    record(tenant, deployment, request_id="req-slow", ttft_ms=600_000.0)  # an ok status, missed
    record(tenant, deployment, request_id="req-failed", status="error", http_status=500)
    page = staff_client.get(f"/console/tenants/{tenant.pk}/").content.decode()
    rows = {
        rid: tr
        for tr in re.findall(r"<tr class=\"[^\"]*\">.*?</tr>", page, re.S)
        if (rid := next(iter(re.findall(r"req-(?:fast|slow|failed)", tr)), None))
    }
    assert 'class="row-ok"' in rows["req-fast"]
    assert (
        'class="row-warn"' in rows["req-slow"]
        and 'class="status-miss">TTFT missed' in rows["req-slow"]
    )
    assert 'class="row-miss"' in rows["req-failed"]
    assert "status-ok" not in rows["req-slow"].split("</td>")[0]  # the row itself is not green
    fit = staff_client.get("/console/deployments/").content.decode()
    assert " MB<" not in fit and re.search(r"\d iB<|\d (K|M|G)iB<", fit)
    assert '<th class="num">Needed</th>' in fit


def test_the_overview_shows_each_classs_targets_beside_attainment(
    staff_client: Client, world: dict[str, Any]
) -> None:
    tenant = world["tenant"]
    cls = tenant.default_slo_class
    page = staff_client.get("/console/").content.decode()
    targets = f"TTFT ≤ {cls.ttft_ms:g} ms, TBT ≤ {cls.tbt_ms:g} ms"
    shown = f"{cls.name}: {targets} ({cls.attainment_target:g} both)"
    assert shown in page
