"""The landing page, the health probe and the admin, through Django's test client."""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from shunter.platform.services import admin_user_ensure
from tests.conftest import database_down, free_port

pytestmark = pytest.mark.django_db


def test_home_names_the_platform_and_its_wiring(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "<h1>Shunter</h1>" in body
    assert "postgresql" in body  # the suite runs on PostgreSQL
    assert 'href="/admin/"' in body


def test_home_refuses_post(client: Client) -> None:
    assert client.post("/").status_code == 405


def test_healthz_reports_database(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    assert response.json()["database"] == "postgresql"


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_healthz_names_the_database_when_it_is_down(client: Client, settings: Any) -> None:
    settings.REDIS_URL = os.environ.get("REDIS_URL", "")
    with database_down():
        response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["down"] == ["database"]
    assert response.json()["database"] == "unreachable"
    assert client.get("/healthz").status_code == 200  # reconnects once it is back


def test_healthz_names_redis_when_it_is_down(client: Client, settings: Any) -> None:
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["down"] == ["redis"]
    assert response.json()["database"] == "postgresql"


def test_admin_requires_login(client: Client) -> None:
    response = client.get("/admin/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_admin_login_with_ensured_user(client: Client) -> None:
    ensured = admin_user_ensure(username="ops")
    assert ensured.created and ensured.password
    page = client.get("/admin/login/")
    assert page.status_code == 200
    response = client.post(
        "/admin/login/?next=/admin/",
        {"username": "ops", "password": ensured.password, "next": "/admin/"},
    )
    assert response.status_code == 302 and response["Location"] == "/admin/"
    assert "Site administration" in client.get("/admin/").content.decode()


def test_admin_login_with_wrong_password_fails(client: Client) -> None:
    admin_user_ensure(username="ops", password="correct horse battery")
    response = client.post("/admin/login/", {"username": "ops", "password": "wrong"})
    assert response.status_code == 200
    assert "correct username and password" in response.content.decode()


def test_admin_user_ensure_keeps_or_resets_password() -> None:
    first = admin_user_ensure(username="ops", password="first password 1")
    again = admin_user_ensure(username="ops")
    assert not again.created and again.password is None
    user = get_user_model().objects.get(username="ops")
    assert user.check_password("first password 1") and user.is_superuser and user.is_staff
    reset = admin_user_ensure(username="ops", password="second password 2")
    assert not reset.created and reset.password == "second password 2"
    user.refresh_from_db()
    assert user.check_password("second password 2")
    assert first.user.pk == user.pk
    assert get_user_model().objects.count() == 1
