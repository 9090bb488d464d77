"""Pagination parameters never reach the database as values it refuses."""

from __future__ import annotations

import pytest

from tests.platform.api.crud import staff_client

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("limit", ["100000", "99999999999999999999999"])
def test_a_huge_limit_is_capped(limit: str) -> None:
    # PostgreSQL refuses a LIMIT beyond a bigint ("bigint out of range").
    r = staff_client().get("/api/slo-classes/", {"limit": limit})
    assert r.status_code == 200, r.content
    assert len(r.json()["results"]) == 3


@pytest.mark.parametrize("offset", ["9223372036854775807", "99999999999999999999999"])
def test_an_offset_past_any_table_gives_an_empty_page(offset: str) -> None:
    r = staff_client().get("/api/slo-classes/", {"offset": offset})
    assert r.status_code == 200, r.content
    assert r.json()["results"] == [] and r.json()["count"] == 3
