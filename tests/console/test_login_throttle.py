"""Login throttling through the real login forms (console and admin): after
``LOGIN_FAILURE_LIMIT`` failures for a user name or from an address, even the right
password is refused (429 on the console, the form's error on the admin) until the
cool-down ends; a successful login forgets the failures. The counts are in the cache
(Redis when the suite has it), which every web process shares."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from shunter.platform.login_throttle import forget
from tests.conftest import HttpsClient

pytestmark = pytest.mark.django_db

PASSWORD = "operator-pass-123"  # the console conftest's staff_user
REFUSED = "Too many failed logins"
ADDRESSES = ["198.51.100.7", "198.51.100.8"]


@pytest.fixture
def fast_passwords(settings: Any) -> None:
    """A fast hasher (before the staff user is made): this module checks many passwords."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def no_failures(fast_passwords: None, staff_user: Any) -> Iterator[None]:
    """This module's names and addresses start and end without failures (the cache
    outlives the test database)."""

    def clear() -> None:
        for name in ("operator", *(f"nobody-{i}" for i in range(10))):
            for ip in ADDRESSES:
                forget(name, ip)

    clear()
    yield
    clear()


def log_in(
    client: Client, password: str, *, username: str = "operator", ip: str = ADDRESSES[0]
) -> Any:
    return client.post(
        "/console/login/", {"username": username, "password": password}, REMOTE_ADDR=ip
    )


def logged_in(client: Client) -> bool:
    return bool(client.get("/console/").status_code == 200)


def test_after_the_limit_even_the_right_password_is_refused() -> None:
    client = HttpsClient()
    for _ in range(settings.LOGIN_FAILURE_LIMIT):
        response = log_in(client, "wrong")
        assert response.status_code == 200
        assert "correct username and password" in response.content.decode()
    refused = log_in(client, PASSWORD)
    assert refused.status_code == 429
    assert REFUSED in refused.content.decode()
    assert not logged_in(client)


def test_the_admin_login_shares_the_count() -> None:
    client = HttpsClient()
    for _ in range(settings.LOGIN_FAILURE_LIMIT):
        log_in(client, "wrong")
    refused = client.post(
        "/admin/login/?next=/admin/",
        {"username": "operator", "password": PASSWORD, "next": "/admin/"},
        REMOTE_ADDR=ADDRESSES[1],  # another address: the user name is locked
    )
    assert refused.status_code == 200 and REFUSED in refused.content.decode()
    assert client.get("/admin/").status_code == 302  # to the login page


def test_failures_from_one_address_lock_that_address_only() -> None:
    for i in range(settings.LOGIN_FAILURE_LIMIT):
        log_in(HttpsClient(), "wrong", username=f"nobody-{i}")
    assert log_in(HttpsClient(), PASSWORD).status_code == 429
    client = HttpsClient()
    admitted = log_in(client, PASSWORD, ip=ADDRESSES[1])
    assert admitted.status_code == 302 and logged_in(client)


def test_a_successful_login_forgets_the_failures() -> None:
    client = HttpsClient()
    for _ in range(2):
        for _ in range(settings.LOGIN_FAILURE_LIMIT - 1):
            assert log_in(client, "wrong").status_code == 200
        assert log_in(client, PASSWORD).status_code == 302
        client.post("/console/logout/")
    assert log_in(client, PASSWORD).status_code == 302 and logged_in(client)


def test_the_lock_ends_after_the_cool_down(settings: Any) -> None:
    settings.LOGIN_COOLDOWN_S = 1
    client = HttpsClient()
    for _ in range(settings.LOGIN_FAILURE_LIMIT):
        log_in(client, "wrong")
    assert log_in(client, PASSWORD).status_code == 429
    deadline = time.monotonic() + 30
    while (response := log_in(client, PASSWORD)).status_code == 429:
        assert time.monotonic() < deadline, "the lock outlived its cool-down"
        time.sleep(0.2)
    assert response.status_code == 302 and logged_in(client)


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="the suite runs without Redis")
def test_the_counts_are_in_redis_for_every_process() -> None:
    import redis

    assert settings.CACHES["default"]["BACKEND"].endswith("RedisCache")
    for _ in range(settings.LOGIN_FAILURE_LIMIT):
        log_in(HttpsClient(), "wrong")
    other_process = redis.Redis.from_url(os.environ["REDIS_URL"])
    try:
        locks = other_process.keys("*login-throttle*:locked")
    finally:
        other_process.close()
    assert len(locks) == 2  # the user name's and the address's
