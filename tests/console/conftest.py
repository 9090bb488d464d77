"""Console fixtures: a staff client, a plain user's client, and a node whose state is the
shape a real engine reports."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AbstractBaseUser
from django.test import Client

from tests.conftest import HttpsClient


@pytest.fixture
def staff_user(django_user_model: Any) -> AbstractBaseUser:
    return django_user_model.objects.create_user(  # type: ignore[no-any-return]
        username="operator", password="operator-pass-123", is_staff=True
    )


@pytest.fixture
def staff_client(staff_user: AbstractBaseUser) -> Client:
    client = HttpsClient()
    client.force_login(staff_user)
    return client


@pytest.fixture
def user_client(django_user_model: Any) -> Client:
    user = django_user_model.objects.create_user(username="customer", password="customer-pass")
    client = HttpsClient()
    client.force_login(user)
    return client
