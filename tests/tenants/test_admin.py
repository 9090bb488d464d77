"""The admin for keys and deployments: a key's secret appears once, in the message after
creation; revocation is an action; service validation shows on the form."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model

from shunter.platform.models import Deployment
from shunter.tenants.keys import secret_digest
from shunter.tenants.models import ApiKey
from shunter.tenants.services import api_key_create
from tests.tenants.factories import make_model, make_node, make_tenant, slo

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client: Any) -> Any:
    user = get_user_model().objects.create_superuser("root", password="z" * 20)
    client.force_login(user)
    return client


def test_creating_a_key_shows_its_secret_once(admin_client: Any) -> None:
    tenant = make_tenant()
    form = admin_client.get("/admin/tenants/apikey/add/").content.decode()
    assert 'name="digest"' not in form and 'name="prefix"' not in form
    response = admin_client.post(
        "/admin/tenants/apikey/add/",
        {"tenant": tenant.pk, "name": "web", "all_deployments": "on"},
        follow=True,
    )
    assert response.status_code == 200
    texts = [str(m) for m in response.context["messages"]]
    shown = [t for t in texts if "The secret of key" in t]
    assert len(shown) == 1
    secret = shown[0].split("is ", 1)[1].split(" ", 1)[0]
    assert sum(secret in t for t in texts) == 1
    key = ApiKey.objects.get()
    assert key.digest == secret_digest(secret)
    page = admin_client.get(f"/admin/tenants/apikey/{key.pk}/change/").content.decode()
    assert secret not in page and key.digest not in page


def test_a_key_without_scopes_or_all_deployments_is_a_form_error(admin_client: Any) -> None:
    response = admin_client.post(
        "/admin/tenants/apikey/add/", {"tenant": make_tenant().pk, "name": "web"}
    )
    assert response.status_code == 200  # the form again, with the service's message
    assert "or set all_deployments" in response.content.decode()
    assert not ApiKey.objects.exists()


def test_revoke_action(admin_client: Any) -> None:
    key, _ = api_key_create(all_deployments=True, tenant=make_tenant(), name="k")
    response = admin_client.post(
        "/admin/tenants/apikey/",
        {"action": "revoke", "_selected_action": [key.pk]},
        follow=True,
    )
    assert response.status_code == 200
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_a_deployment_that_does_not_fit_is_a_form_error(admin_client: Any) -> None:
    node, model = make_node(hbm_bytes=1024), make_model()
    response = admin_client.post(
        "/admin/platform/deployment/add/",
        {
            "node": node.pk,
            "model": model.pk,
            "sharing": "spatial",
            "slo_class": slo().pk,
            "priority": 0,
            "enabled": "on",
        },
    )
    assert response.status_code == 200
    assert "do not fit its HBM" in response.content.decode()
    assert not Deployment.objects.exists()


def test_node_token_is_write_only_in_the_admin(admin_client: Any) -> None:
    response = admin_client.post(
        "/admin/platform/node/add/",
        {
            "name": "gpu-9",
            "engine_url": "http://10.0.0.9:8100",
            "hardware_profile": "{}",
            "hbm_bytes": 10**10,
            "dram_bytes": 0,
            "engine_token": "hunter2-token",
        },
        follow=True,
    )
    assert response.status_code == 200
    from shunter.platform.models import Node

    node = Node.objects.get(name="gpu-9")
    assert node.engine_token() == "hunter2-token"
    page = admin_client.get(f"/admin/platform/node/{node.pk}/change/").content.decode()
    assert "hunter2-token" not in page
