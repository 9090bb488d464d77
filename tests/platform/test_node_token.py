"""A node's engine token goes in an HTTP header (``Authorization: Bearer ...``): every
write path (service, REST API, admin form) refuses one that cannot, as a 400 or a form
error, and stores nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from shunter.platform import services
from shunter.platform.models import Node
from tests.platform.api.crud import HttpsApiClient, staff_client
from tests.tenants.factories import GIB, make_node
from tests.tenants.test_admin import admin_client  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db

# Non-Latin-1, Latin-1 but not ASCII, a space, a control character.
BAD_TOKENS = ["tökén", "tok€n", "two words", "tab\there", "new\nline"]
NODE = {"name": "gpu-a", "engine_url": "http://127.0.0.1:8100", "hbm_bytes": 80 * GIB}


@pytest.fixture
def api() -> HttpsApiClient:
    return staff_client()


@pytest.mark.parametrize("token", BAD_TOKENS)
def test_the_service_refuses_a_token_that_is_no_header_value(token: str) -> None:
    with pytest.raises(ValidationError) as refused:
        services.node_create(engine_token=token, **NODE)
    assert "engine_token" in refused.value.message_dict
    node = make_node()
    with pytest.raises(ValidationError):
        services.node_update(node=node, engine_token=token)
    node.refresh_from_db()
    assert not node.has_engine_token and Node.objects.count() == 1


@pytest.mark.parametrize("token", BAD_TOKENS)
def test_the_api_answers_400_naming_the_engine_token(api: HttpsApiClient, token: str) -> None:
    created = api.post("/api/nodes/", {**NODE, "engine_token": token}, format="json")
    assert created.status_code == 400
    assert "printable ASCII" in created.json()["engine_token"][0]
    node = make_node()
    changed = api.patch(f"/api/nodes/{node.pk}/", {"engine_token": token}, format="json")
    assert changed.status_code == 400 and "engine_token" in changed.json()
    node.refresh_from_db()
    assert not node.has_engine_token and Node.objects.count() == 1


def test_a_printable_ascii_token_is_kept(api: HttpsApiClient) -> None:
    token = "Ab0-._~+/=!#$%&'*^`|" + "x" * 40
    created = api.post("/api/nodes/", {**NODE, "engine_token": token}, format="json")
    assert created.status_code == 201
    assert Node.objects.get(pk=created.json()["id"]).engine_token() == token


def test_the_admin_form_shows_the_error(admin_client: Any) -> None:  # noqa: F811
    form = {**NODE, "engine_token": "tökén", "hardware_profile": "{}", "dram_bytes": 0}
    response = admin_client.post("/admin/platform/node/add/", form)
    assert response.status_code == 200  # the form again, with the message
    assert "printable ASCII" in response.content.decode()
    assert not Node.objects.exists()
    response = admin_client.post("/admin/platform/node/add/", {**form, "engine_token": "ok-1"})
    assert response.status_code == 302
    assert Node.objects.get().engine_token() == "ok-1"
