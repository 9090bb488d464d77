"""Schemathesis against the API's own OpenAPI schema, in-process over WSGI as a staff
token: no input gives a 5xx, every response matches the schema."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error
from schemathesis.core import NotSet
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from werkzeug.test import Client

from tests.platform.api.crud import staff_client
from tests.tenants.factories import make_deployment, make_tenant

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

# Node reconcile and poll call out to the engine at the node's URL (tested against a
# real engine in tests/platform/test_engine_reconcile.py).
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
SKIP = {("POST", "/api/nodes/{id}/reconcile/"), ("POST", "/api/nodes/{id}/poll/")}


@contextmanager
def keep_connection() -> Iterator[None]:
    """As Django's test client does: the test's transaction must survive each request
    (Django closes old connections when a request starts and ends)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def test_api_conforms_to_its_schema() -> None:
    api = staff_client()
    token = Token.objects.get().key
    d = make_deployment()
    make_tenant(d)
    raw = api.get("/api/schema/", {"format": "json"})
    assert raw.status_code == 200
    schema = schemathesis.openapi.from_dict(raw.json())
    app = Client(WSGIHandler())
    headers = {"Authorization": f"Token {token}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    tested = 0
    for operation in operations:
        if (operation.method.upper(), operation.path) in SKIP:
            continue

        @settings(
            max_examples=25,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            # The same examples every run: a failure is reproducible, never a flake.
            derandomize=True,
        )
        @given(case=operation.as_strategy())
        def check(case: Any) -> None:
            # Through werkzeug's client in this thread, so the test's transaction is
            # the one every request sees.
            body = {} if isinstance(case.body, NotSet) else {"json": case.body}
            response = app.open(
                case.formatted_path,
                method=case.method,
                query_string=case.query or None,
                headers={**(case.headers or {}), **headers},
                base_url="https://localhost",
                **body,
            )
            text = response.get_data(as_text=True)
            assert response.status_code < 500, (
                case.method,
                case.formatted_path,
                case.query,
                case.body,
                text,
            )
            # The conformance of each response. (Not "schema-valid data is accepted":
            # a filter on the id of a row that does not exist is a 400.)
            case.validate_response(response, headers=headers, checks=CHECKS)

        with keep_connection():
            check()
        tested += 1
    assert tested >= 35
