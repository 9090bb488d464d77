"""The tenants' admin API: tenants and keys (CRUD), the secret shown once, revocation,
records and usage, each scoped to a tenant by ?tenant= through restrict()."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shunter.gateway.auth import load_grant
from shunter.tenants.keys import secret_digest
from shunter.tenants.models import ApiKey
from shunter.tenants.services import api_key_create, request_record_create
from tests.platform.api.crud import CrudTests, HttpsApiClient, staff_client
from tests.tenants.factories import make_deployment, make_model, make_tenant, slo

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)


class TestTenants(CrudTests):
    route = "tenants"
    change = ("rpm_limit", 10)
    max_list_queries = 5  # a prefetch each for the granted deployments and models

    def payload(self) -> dict[str, Any]:
        return {
            "name": "acme",
            "default_slo_class": slo("interactive").pk,
            "deployments": [make_deployment().pk],
            "tpm_limit": 1000,
            "budget_period": "month",
        }

    def make(self, n: int) -> None:
        for _ in range(n):
            make_tenant(make_deployment(), models=[make_model()])

    def test_models_are_granted_and_shown_by_name(self, api: HttpsApiClient) -> None:
        for name in ("llama", "qwen"):
            make_model(name=name)
        body = {"name": "acme", "default_slo_class": slo().pk, "models": ["llama"]}
        created = api.post(self.url(), body, format="json")
        assert created.status_code == 201, created.json()
        pk = created.json()["id"]
        assert created.json()["models"] == ["llama"] and created.json()["deployments"] == []
        patched = api.patch(self.url(pk), {"models": ["qwen", "llama"]}, format="json")
        assert patched.status_code == 200, patched.json()
        assert sorted(api.get(self.url(pk)).json()["models"]) == ["llama", "qwen"]
        unknown = api.patch(self.url(pk), {"models": ["mistral"]}, format="json")
        assert unknown.status_code == 400 and "models" in unknown.json()
        assert api.patch(self.url(pk), {"models": []}, format="json").json()["models"] == []


class TestKeys(CrudTests):
    route = "keys"
    change = ("name", "renamed")
    max_list_queries = 5  # a prefetch each for the scopes and model scopes

    def payload(self) -> dict[str, Any]:
        d = make_deployment()
        return {"tenant": make_tenant(d).pk, "name": "ci", "scopes": [d.pk]}

    def make(self, n: int) -> None:
        for _ in range(n):
            d = make_deployment()
            tenant = make_tenant(d, models=[d.model])
            api_key_create(tenant=tenant, name="k", scopes=[d], model_scopes=[d.model])

    def test_secret_is_in_the_create_response_only(self, api: HttpsApiClient) -> None:
        body = api.post(self.url(), self.payload(), format="json").json()
        secret = body["secret"]
        assert ApiKey.objects.get(pk=body["id"]).digest == secret_digest(secret)
        assert body["prefix"] == secret[:16]
        assert secret not in json.dumps(api.get(self.url(body["id"])).json())
        assert secret not in json.dumps(api.get(self.url()).json())

    def test_the_response_with_the_secret_may_not_be_cached(self, api: HttpsApiClient) -> None:
        created = api.post(self.url(), self.payload(), format="json")
        assert created.status_code == 201 and "secret" in created.json()
        assert created["Cache-Control"] == "no-store" and created["Pragma"] == "no-cache"

    def test_revoke(self, api: HttpsApiClient) -> None:
        pk = api.post(self.url(), self.payload(), format="json").json()["id"]
        revoked = api.post(self.url(pk) + "revoke/")
        assert revoked.status_code == 200
        assert revoked.json()["revoked_at"] and revoked.json()["is_usable"] is False
        assert api.get(self.url(), {"revoked": "false"}).json()["count"] == 0

    def test_scopes_outside_the_tenant_are_a_400(self, api: HttpsApiClient) -> None:
        body = {**self.payload(), "scopes": [make_deployment().pk]}
        response = api.post(self.url(), body, format="json")
        assert response.status_code == 400 and "scopes" in response.json()

    def test_a_key_that_loses_its_only_deployment_reaches_nothing(
        self, api: HttpsApiClient
    ) -> None:
        a, b = make_deployment(), make_deployment()
        tenant = api.post(
            "/api/tenants/",
            {"name": "t", "default_slo_class": slo().pk, "deployments": [a.pk, b.pk]},
            format="json",
        ).json()
        scoped = api.post(
            self.url(), {"tenant": tenant["id"], "name": "b", "scopes": [b.pk]}, format="json"
        ).json()
        wide = api.post(
            self.url(),
            {"tenant": tenant["id"], "name": "w", "all_deployments": True},
            format="json",
        ).json()
        assert scoped["all_deployments"] is False and wide["scopes"] == []
        changed = api.patch(f"/api/tenants/{tenant['id']}/", {"deployments": [a.pk]}, format="json")
        assert changed.status_code == 200
        shown = api.get(self.url(scoped["id"])).json()
        assert shown["scopes"] == [] and shown["all_deployments"] is False
        # The gateway's view of the same keys: nothing for the one, the tenant's for the other.
        grant = load_grant(scoped["secret"])
        assert grant is not None and grant.deployment_ids == frozenset()
        assert not grant.may_use(a.pk, a.model.name) and not grant.may_use(b.pk, b.model.name)
        grant = load_grant(wide["secret"])
        assert grant is not None and grant.deployment_ids == {a.pk}

    def test_model_scopes_are_given_by_name_among_the_tenants_models(
        self, api: HttpsApiClient
    ) -> None:
        llama, qwen = make_model(name="llama"), make_model(name="qwen")
        tenant = make_tenant(make_deployment(model=qwen), models=[llama]).pk
        body = {"tenant": tenant, "name": "k", "model_scopes": ["llama"]}
        created = api.post(self.url(), body, format="json")
        assert created.status_code == 201, created.json()
        assert created.json()["model_scopes"] == ["llama"] and created.json()["scopes"] == []
        grant = load_grant(created.json()["secret"])
        assert grant is not None and grant.model_names == {"llama"}
        # qwen's deployment is the tenant's, the model is not: no key reaches qwen by name.
        refused = api.post(self.url(), {**body, "model_scopes": ["qwen"]}, format="json")
        assert refused.status_code == 400
        assert "models: qwen." in refused.json()["model_scopes"][0]
        changed = api.patch(
            self.url(created.json()["id"]), {"model_scopes": ["qwen"]}, format="json"
        )
        assert changed.status_code == 400 and "model_scopes" in changed.json()

    def test_a_key_needs_scopes_or_all_deployments(self, api: HttpsApiClient) -> None:
        d = make_deployment()
        tenant = make_tenant(d).pk
        neither = api.post(self.url(), {"tenant": tenant, "name": "k"}, format="json")
        assert neither.status_code == 400 and "scopes" in neither.json()
        body = {"tenant": tenant, "name": "k", "scopes": [d.pk], "all_deployments": True}
        assert api.post(self.url(), body, format="json").status_code == 400

    def test_a_key_cannot_move_tenants(self, api: HttpsApiClient) -> None:
        pk = api.post(self.url(), self.payload(), format="json").json()["id"]
        other = make_tenant().pk
        assert api.patch(self.url(pk), {"tenant": other}, format="json").status_code == 400


def add_record(tenant: Any, deployment: Any, request_id: str, **overrides: Any) -> None:
    fields: dict[str, Any] = {
        "request_id": request_id,
        "tenant": tenant,
        "api_key": None,
        "deployment": deployment,
        "model_name": deployment.model.name,
        "endpoint": "chat",
        "stream": False,
        "t_arrival": T0,
        "t_first_token": T0 + timedelta(milliseconds=100),
        "t_end": T0 + timedelta(seconds=1),
        "prompt_tokens": 4,
        "completion_tokens": 5,
        "ttft_ms": 100.0,
        "tpot_ms": 40.0,
        "max_itl_ms": 60.0,
        "status": "ok",
    }
    fields.update(overrides)
    request_record_create(**fields)


@pytest.fixture
def two_tenants() -> dict[str, Any]:
    da, db = make_deployment(slo_class=slo("interactive")), make_deployment()
    # a's requests take its deployment's class (interactive), b's its own (batch).
    a, b = make_tenant(da, name="a", slo_name=None), make_tenant(db, name="b", slo_name="batch")
    add_record(a, da, "a1")
    add_record(a, da, "a2", t_arrival=T0 + timedelta(minutes=5), tpot_ms=70.0)
    add_record(b, db, "b1")
    api_key_create(all_deployments=True, tenant=a, name="ka")
    api_key_create(all_deployments=True, tenant=b, name="kb")
    return {"a": a, "b": b, "da": da, "db": db}


def listed(route: str, rows: list[dict[str, Any]]) -> set[Any]:
    """What identifies each row of a list: ids, request ids, (tenant, deployment)."""
    if route == "records":
        return {r["request_id"] for r in rows}
    if route == "usage":
        return {(r["tenant_id"], r["deployment_id"]) for r in rows}
    return {r["id"] for r in rows}


@pytest.mark.parametrize("route", ["keys", "records", "usage", "deployments"])
def test_every_tenant_owned_list_is_scoped(route: str, two_tenants: dict[str, Any]) -> None:
    api = staff_client()
    a, b, da, db = (two_tenants[k] for k in ("a", "b", "da", "db"))
    owned = {
        "keys": {
            t: set(ApiKey.objects.filter(tenant=t).values_list("pk", flat=True)) for t in (a, b)
        },
        "records": {a: {"a1", "a2"}, b: {"b1"}},
        "usage": {a: {(a.pk, da.pk)}, b: {(b.pk, db.pk)}},
        "deployments": {a: {da.pk}, b: {db.pk}},
    }[route]
    assert all(owned.values()) and owned[a].isdisjoint(owned[b])

    def rows(query: dict[str, Any]) -> list[dict[str, Any]]:
        body = api.get(f"/api/{route}/", query).json()
        return list(body if isinstance(body, list) else body["results"])

    # Unscoped, a staff user sees both tenants' rows; scoped, exactly the tenant's own.
    assert listed(route, rows({})) >= owned[a] | owned[b]
    for tenant in (a, b):
        assert listed(route, rows({"tenant": tenant.pk})) == owned[tenant]


def test_records_filter_by_deployment_and_time(two_tenants: dict[str, Any]) -> None:
    api = staff_client()
    a, da = two_tenants["a"], two_tenants["da"]
    url = "/api/records/"
    ids = lambda q: [r["request_id"] for r in api.get(url, q).json()["results"]]  # noqa: E731
    assert ids({"tenant": a.pk}) == ["a2", "a1"]
    assert ids({"deployment": da.pk, "since": (T0 + timedelta(minutes=1)).isoformat()}) == ["a2"]
    assert ids({"until": (T0 + timedelta(minutes=1)).isoformat(), "tenant": a.pk}) == ["a1"]
    assert api.get(url, {"since": "yesterday"}).status_code == 400


def test_usage_reports_attainment_from_the_rollups(two_tenants: dict[str, Any]) -> None:
    api = staff_client()
    a = two_tenants["a"]
    rows = api.get("/api/usage/", {"tenant": a.pk}).json()
    assert len(rows) == 1
    row = rows[0]
    # interactive: 1000 ms / 50 ms; a2's TPOT of 70 ms misses TBT.
    assert (row["slo_class"], row["attainment_target"]) == ("interactive", 0.9)
    assert (row["requests"], row["errors"]) == (2, 0)
    assert row["ttft_attainment"] == 1.0 and row["tbt_attainment"] == 0.5
    assert row["both_attainment"] == 0.5 and row["meets_target"] is False
    assert row["mean_tpot_ms"] == pytest.approx(55.0)
    late = api.get(
        "/api/usage/", {"tenant": a.pk, "since": (T0 + timedelta(minutes=3)).isoformat()}
    )
    assert late.json()[0]["requests"] == 1
    (row,) = api.get("/api/usage/", {"tenant": two_tenants["b"].pk}).json()
    assert row["slo_class"] == "batch" and row["both_attainment"] == 1.0
    bad = api.get("/api/usage/", {"since": T0.isoformat(), "until": T0.isoformat()})
    assert bad.status_code == 400 and "until" in bad.json()


def test_usage_and_records_name_the_node_and_slo_is_reported_per_node(
    two_tenants: dict[str, Any],
) -> None:
    api = staff_client()
    a, da = two_tenants["a"], two_tenants["da"]
    add_record(a, da, "a3", node_name="gpu-a", ttft_ms=5000.0)  # misses interactive's TTFT
    rows = api.get("/api/usage/", {"tenant": a.pk}).json()
    assert [(r["node"], r["requests"]) for r in rows] == [("", 2), ("gpu-a", 1)]
    assert [
        r["request_id"] for r in api.get("/api/records/", {"node_name": "gpu-a"}).json()["results"]
    ] == ["a3"]
    nodes = api.get("/api/usage/nodes/", {"node": "gpu-a"}).json()
    assert nodes == [
        {
            "node": "gpu-a",
            "deployment_id": None,
            "model_name": "",
            "requests": 1,
            "errors": 0,
            "ttft_attainment": 0.0,
            "tbt_attainment": 1.0,
            "both_attainment": 0.0,
            "mean_ttft_ms": 5000.0,
        },
        {**nodes[0], "deployment_id": da.pk, "model_name": da.model.name},
    ]
    # Unnamed (older records): its total and two deployments; gpu-a: total and one.
    assert len(api.get("/api/usage/nodes/").json()) == 5
    bad = api.get("/api/usage/nodes/", {"since": T0.isoformat(), "until": T0.isoformat()})
    assert bad.status_code == 400


def test_times_with_any_valid_offset_are_valid_filters(two_tenants: dict[str, Any]) -> None:
    # Python takes offsets up to 23:59, PostgreSQL up to 15:59: the API normalises.
    api = staff_client()
    response = api.get("/api/records/", {"since": "2460-10-21T03:19:49-19:35"})
    assert response.status_code == 200 and response.json()["count"] == 0
    assert api.get("/api/records/", {"until": "0001-01-01T00:00:00+23:00"}).status_code == 400
