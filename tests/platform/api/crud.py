"""A generic CRUD test mixin for the admin API, and the staff clients it uses."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient


class HttpsApiClient(APIClient):
    """DRF's test client over HTTPS (the suite runs with production settings)."""

    def request(self, **request: Any) -> Any:
        request.update({"wsgi.url_scheme": "https", "SERVER_PORT": "443"})
        return super().request(**request)


def staff_client() -> HttpsApiClient:
    user = get_user_model().objects.create_user("ops", password="x" * 20, is_staff=True)
    client = HttpsApiClient()
    token = Token.objects.create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


class CrudTests:
    """Create, list, retrieve, update, delete one resource through /api/<route>/.

    Subclasses give the route, a ``payload`` factory (valid create body), a field to
    ``change`` with its new value, and ``make`` (n rows for list query-count checks).
    """

    route: ClassVar[str]
    change: ClassVar[tuple[str, Any]]
    max_list_queries: ClassVar[int] = 4

    def payload(self) -> dict[str, Any]:
        raise NotImplementedError

    def make(self, n: int) -> None:
        raise NotImplementedError

    @pytest.fixture
    def api(self, db: None) -> HttpsApiClient:
        return staff_client()

    def url(self, pk: Any = None) -> str:
        return f"/api/{self.route}/" + (f"{pk}/" if pk is not None else "")

    def test_crud_round_trip(self, api: HttpsApiClient) -> None:
        created = api.post(self.url(), self.payload(), format="json")
        assert created.status_code == 201, created.json()
        pk = created.json()["id"]
        listed = api.get(self.url())
        assert listed.status_code == 200
        assert pk in [row["id"] for row in listed.json()["results"]]
        assert api.get(self.url(pk)).json()["id"] == pk
        field, value = self.change
        patched = api.patch(self.url(pk), {field: value}, format="json")
        assert patched.status_code == 200, patched.json()
        assert api.get(self.url(pk)).json()[field] == value
        assert api.delete(self.url(pk)).status_code == 204
        assert api.get(self.url(pk)).status_code == 404

    def test_bad_input_is_a_400_with_field_messages(self, api: HttpsApiClient) -> None:
        response = api.post(self.url(), {"name": ["not", "a", "string"]}, format="json")
        assert response.status_code == 400
        assert isinstance(response.json(), dict) and response.json()

    def test_non_staff_and_anonymous_are_refused(self, api: HttpsApiClient) -> None:
        anonymous = HttpsApiClient()
        assert anonymous.get(self.url()).status_code in (401, 403)
        assert anonymous.post(self.url(), self.payload(), format="json").status_code in (401, 403)
        user = get_user_model().objects.create_user("user", password="y" * 20)
        plain = HttpsApiClient()
        plain.force_authenticate(user)
        assert plain.get(self.url()).status_code == 403
        assert plain.post(self.url(), self.payload(), format="json").status_code == 403

    def test_list_costs_a_fixed_number_of_queries(self, api: HttpsApiClient) -> None:
        self.make(2)
        with CaptureQueriesContext(connection) as few:
            assert api.get(self.url()).status_code == 200
        self.make(10)
        with CaptureQueriesContext(connection) as many:
            assert api.get(self.url()).status_code == 200
        assert len(many) == len(few) <= self.max_list_queries, [q["sql"] for q in many]
