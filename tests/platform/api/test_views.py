"""The platform's admin API: CRUD per resource, validation as 400s, the schema and docs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from shunter.engine.checkpoint.random_weights import preset_config
from shunter.platform.models import Node
from shunter.tenants.models import UsageRollup
from tests.platform.api.crud import CrudTests, HttpsApiClient, staff_client
from tests.tenants.factories import GIB, make_deployment, make_model, make_node, make_tenant, slo

pytestmark = pytest.mark.django_db


class TestSloClasses(CrudTests):
    route = "slo-classes"
    change = ("tbt_ms", 80)

    def payload(self) -> dict[str, Any]:
        return {"name": "premium", "ttft_ms": 500, "tbt_ms": 40, "attainment_target": 0.99}

    def make(self, n: int) -> None:
        from shunter.platform.models import SloClass

        start = SloClass.objects.count()
        for i in range(n):
            SloClass.objects.create(name=f"c{start + i}", ttft_ms=100 + i, tbt_ms=10)


class TestNodes(CrudTests):
    route = "nodes"
    change = ("hbm_bytes", 40 * GIB)

    def payload(self) -> dict[str, Any]:
        return {
            "name": "gpu-a",
            "engine_url": "http://127.0.0.1:8100",
            "engine_token": "tok-123",
            "hbm_bytes": 96 * GIB,
            "hardware_profile": {"gpu": "gh200"},
        }

    def make(self, n: int) -> None:
        for _ in range(n):
            make_node()

    def test_engine_token_is_write_only(self, api: HttpsApiClient) -> None:
        body = api.post(self.url(), self.payload(), format="json").json()
        assert "engine_token" not in body and body["has_engine_token"] is True
        node = Node.objects.get(pk=body["id"])
        assert node.engine_token() == "tok-123"
        assert "tok-123" not in json.dumps(api.get(self.url(body["id"])).json())

    def test_state_returns_the_cached_snapshot(self, api: HttpsApiClient) -> None:
        node = make_node(state={"models": {"m": {"sharing": "spatial"}}})
        body = api.get(self.url(node.pk) + "state/").json()
        assert body["state"] == {"models": {"m": {"sharing": "spatial"}}}

    def test_shrinking_below_the_deployments_is_a_400_naming_the_bytes(
        self, api: HttpsApiClient
    ) -> None:
        d = make_deployment(node=make_node(hbm_bytes=GIB))
        response = api.patch(self.url(d.node.pk), {"hbm_bytes": 1000}, format="json")
        assert response.status_code == 400
        assert "of 1000 bytes of HBM" in json.dumps(response.json())

    def test_nul_in_the_hardware_profile_is_refused(self, api: HttpsApiClient) -> None:
        body = {**self.payload(), "hardware_profile": {"gpu": "a\x00b"}}
        assert api.post(self.url(), body, format="json").status_code == 400

    def test_cordon_and_uncordon(self, api: HttpsApiClient) -> None:
        node = make_node()
        assert api.get(self.url(node.pk)).json()["cordon"] == ""
        body = api.post(self.url(node.pk) + "cordon/").json()
        assert body["cordon"] == "operator" and Node.objects.get(pk=node.pk).cordoned
        assert [n["id"] for n in api.get(self.url() + "?cordon=operator").json()["results"]] == [
            node.pk
        ]
        # Read-only in writes: only the actions change it.
        api.patch(self.url(node.pk), {"cordon": ""}, format="json")
        assert Node.objects.get(pk=node.pk).cordoned
        assert api.post(self.url(node.pk) + "uncordon/").json()["cordon"] == ""
        assert not Node.objects.get(pk=node.pk).cordoned


class TestModels(CrudTests):
    route = "models"
    change = ("name", "renamed")

    @pytest.fixture(autouse=True)
    def model_dir(self, tmp_path: Path) -> None:
        self.dir = tmp_path / "tiny"
        self.dir.mkdir()
        (self.dir / "config.json").write_text(json.dumps(preset_config("tiny-llama")))

    def payload(self) -> dict[str, Any]:
        return {"name": "tiny", "source_dir": str(self.dir)}

    def make(self, n: int) -> None:
        for _ in range(n):
            make_model()

    def test_facts_come_from_the_config(self, api: HttpsApiClient) -> None:
        body = api.post(self.url(), self.payload(), format="json").json()
        config = preset_config("tiny-llama")
        assert body["num_layers"] == config["num_hidden_layers"]
        assert body["context_length"] == config["max_position_embeddings"]
        assert body["param_bytes"] > 0 and body["kv_bytes_per_token"] > 0

    def test_a_deployed_model_cannot_be_deleted(self, api: HttpsApiClient) -> None:
        d = make_deployment()
        response = api.delete(self.url(d.model.pk))
        assert response.status_code == 409
        assert str(d) in response.json()["detail"]


class TestDeployments(CrudTests):
    route = "deployments"
    change = ("priority", 7)
    max_list_queries = 3

    def payload(self) -> dict[str, Any]:
        return {
            "node": make_node().pk,
            "model": make_model().pk,
            "slo_class": slo("interactive").pk,
            "sharing": "temporal",
        }

    def make(self, n: int) -> None:
        for _ in range(n):
            make_deployment()

    def test_a_node_that_cannot_hold_it_is_a_400(self, api: HttpsApiClient) -> None:
        body = {**self.payload(), "node": make_node(hbm_bytes=1024).pk}
        response = api.post(self.url(), body, format="json")
        assert response.status_code == 400
        assert "do not fit its HBM" in json.dumps(response.json())

    def test_one_with_usage_history_is_a_409_not_deleted(self, api: HttpsApiClient) -> None:
        d = make_deployment()
        tenant = make_tenant(d)
        UsageRollup.objects.create(minute=timezone.now(), tenant=tenant, deployment=d)
        response = api.delete(self.url(d.pk))
        assert response.status_code == 409
        assert "has usage history; disable it" in response.json()["detail"]
        assert api.delete(f"/api/nodes/{d.node_id}/").status_code == 409
        assert api.patch(self.url(d.pk), {"enabled": False}, format="json").status_code == 200
        assert UsageRollup.objects.filter(deployment=d).exists()

    def test_tenant_filter_lists_only_what_the_tenant_may_use(self, api: HttpsApiClient) -> None:
        a, b = make_deployment(), make_deployment()
        ta, tb = make_tenant(a), make_tenant(b)
        ids = [r["id"] for r in api.get(self.url(), {"tenant": ta.pk}).json()["results"]]
        assert ids == [a.pk]
        assert api.get(self.url(a.pk), {"tenant": tb.pk}).status_code == 404
        assert api.get(self.url(), {"tenant": "x"}).status_code == 400

    def test_tenant_filter_lists_the_deployments_of_its_models_once(
        self, api: HttpsApiClient
    ) -> None:
        llama = make_model(name="llama")
        first, pinned = make_deployment(model=llama), make_deployment()
        make_deployment()  # another model's, not granted
        # Granted the model and one of its deployments too, as is another tenant: rows
        # that a join would repeat.
        tenant = make_tenant(first, pinned, models=[llama])
        make_tenant(first, models=[llama])
        second = make_deployment(model=llama)  # added after the grants
        body = api.get(self.url(), {"tenant": tenant.pk}).json()
        ids = [r["id"] for r in body["results"]]
        assert sorted(ids) == sorted([first.pk, second.pk, pinned.pk]) and body["count"] == 3
        assert api.get(self.url(second.pk), {"tenant": tenant.pk}).status_code == 200


def test_schema_and_docs_are_served_to_staff_only(client: Any) -> None:
    assert client.get("/api/schema/").status_code in (401, 403)
    api = staff_client()
    schema = api.get("/api/schema/", {"format": "json"})
    assert schema.status_code == 200
    paths = json.loads(schema.content)["paths"]
    assert "/api/keys/{id}/revoke/" in paths and "/api/usage/" in paths
    docs = api.get("/api/docs/")
    assert docs.status_code == 200
    # Swagger UI comes from the sidecar package, not a CDN.
    assert "cdn" not in docs.content.decode().lower()
