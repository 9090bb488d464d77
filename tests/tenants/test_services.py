"""Tenant services: API keys (digest only, shown once), records and their rollups."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection
from django.db.models import ProtectedError
from django.utils import timezone

from shunter.platform.models import Deployment
from shunter.platform.services import DeploymentInUse, deployment_delete
from shunter.tenants.keys import looks_like_secret, secret_digest
from shunter.tenants.models import ApiKey, RequestRecord, UsageRollup
from shunter.tenants.selectors import slo_by_node, usage_summary
from shunter.tenants.services import (
    api_key_create,
    api_key_revoke,
    api_key_update,
    request_record_build,
    request_record_create,
    request_records_create,
    tenant_update,
)
from tests.tenants.factories import make_deployment, make_model, make_tenant, slo

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 12, 30, 5, tzinfo=UTC)


def all_text_in_database() -> str:
    """Every text-like column of every table, concatenated (to search for secrets)."""
    chunks: list[str] = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' AND data_type IN "
            "('text', 'character varying', 'jsonb', 'json')"
        )
        for table, column in cursor.fetchall():
            cursor.execute(f'SELECT "{column}"::text FROM "{table}"')
            chunks.extend(str(v) for (v,) in cursor.fetchall() if v is not None)
    return "\n".join(chunks)


def test_key_secret_is_returned_once_and_only_its_digest_is_stored() -> None:
    tenant = make_tenant()
    key, secret = api_key_create(all_deployments=True, tenant=tenant, name="ci")
    assert looks_like_secret(secret)
    assert key.prefix == secret[:16] and secret.startswith("sk-shunter-")
    assert key.digest == hashlib.sha256(secret.encode()).hexdigest()
    stored = all_text_in_database()
    assert secret not in stored
    assert secret[16:] not in stored  # not even the part after the displayed prefix
    assert ApiKey.objects.get(digest=secret_digest(secret)) == key


def test_two_keys_have_distinct_secrets_and_prefixes() -> None:
    tenant = make_tenant()
    (a, sa), (b, sb) = (
        api_key_create(all_deployments=True, tenant=tenant, name="a"),
        api_key_create(all_deployments=True, tenant=tenant, name="b"),
    )
    assert sa != sb and a.prefix != b.prefix and a.digest != b.digest


def test_key_scopes_must_be_the_tenants_deployments() -> None:
    mine, other = make_deployment(), make_deployment()
    tenant = make_tenant(mine)
    key, _ = api_key_create(tenant=tenant, name="scoped", scopes=[mine])
    assert list(key.scopes.all()) == [mine]
    with pytest.raises(ValidationError) as e:
        api_key_create(tenant=tenant, name="bad", scopes=[other])
    assert "scopes" in e.value.message_dict
    with pytest.raises(ValidationError):
        api_key_update(api_key=key, scopes=[other])


def test_narrowing_a_tenant_drops_key_scopes_outside_it() -> None:
    a, b = make_deployment(), make_deployment()
    tenant = make_tenant(a, b)
    key, _ = api_key_create(tenant=tenant, name="k", scopes=[a, b])
    tenant_update(tenant=tenant, deployments=[a])
    assert list(key.scopes.all()) == [a]


def test_a_key_that_loses_its_last_scope_reaches_nothing_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b = make_deployment(), make_deployment()
    tenant = make_tenant(a, b)
    only_b, _ = api_key_create(tenant=tenant, name="b only", scopes=[b])
    everything, _ = api_key_create(tenant=tenant, name="all", all_deployments=True)
    with caplog.at_level("WARNING", logger="shunter.tenants"):
        tenant_update(tenant=tenant, deployments=[a])
    only_b.refresh_from_db()
    assert list(only_b.scopes.all()) == [] and not only_b.all_deployments
    assert [r.getMessage() for r in caplog.records] == [
        f"key {only_b.prefix}… of tenant {tenant.name!r} lost its last scope ({b}): "
        "it reaches no deployment"
    ]
    everything.refresh_from_db()
    assert everything.all_deployments and list(everything.scopes.all()) == []


def test_a_key_reaches_all_deployments_or_some_never_none_by_choice() -> None:
    a = make_deployment()
    tenant = make_tenant(a)
    with pytest.raises(ValidationError) as e:
        api_key_create(tenant=tenant, name="nothing")
    assert "all_deployments" in e.value.message_dict["scopes"][0]
    with pytest.raises(ValidationError) as e:
        api_key_create(tenant=tenant, name="both", scopes=[a], all_deployments=True)
    assert "one or the other" in e.value.message_dict["scopes"][0]
    key, _ = api_key_create(tenant=tenant, name="k", scopes=[a])
    with pytest.raises(ValidationError):
        api_key_update(api_key=key, scopes=[])
    with pytest.raises(ValidationError):
        api_key_update(api_key=key, all_deployments=True)
    api_key_update(api_key=key, all_deployments=True, scopes=[])
    key.refresh_from_db()
    assert key.all_deployments and list(key.scopes.all()) == []


def test_key_model_scopes_must_be_the_tenants_models() -> None:
    llama, qwen = make_model(name="llama"), make_model(name="qwen")
    # Granted qwen's one deployment, not the model: a key may not reach qwen by name.
    tenant = make_tenant(make_deployment(model=qwen), models=[llama])
    key, _ = api_key_create(tenant=tenant, name="llama", model_scopes=[llama])
    assert list(key.model_scopes.all()) == [llama] and list(key.scopes.all()) == []
    with pytest.raises(ValidationError) as e:
        api_key_create(tenant=tenant, name="qwen", model_scopes=[qwen])
    assert e.value.message_dict == {
        "model_scopes": [
            f"Not among tenant {tenant.name!r}'s models: qwen. Grant the tenant the model first."
        ]
    }
    with pytest.raises(ValidationError) as e:
        api_key_update(api_key=key, model_scopes=[llama, qwen])
    assert "model_scopes" in e.value.message_dict
    assert list(key.model_scopes.all()) == [llama]
    with pytest.raises(ValidationError) as e:  # all deployments, or scopes: not both
        api_key_create(tenant=tenant, name="both", model_scopes=[llama], all_deployments=True)
    assert "one or the other" in e.value.message_dict["scopes"][0]
    with pytest.raises(ValidationError):  # scoped to nothing
        api_key_update(api_key=key, model_scopes=[])


def test_a_key_may_be_pinned_to_a_deployment_its_tenant_reaches_by_model() -> None:
    llama = make_model(name="llama")
    first, second = make_deployment(model=llama), make_deployment(model=llama)
    tenant = make_tenant(models=[llama])
    key, _ = api_key_create(tenant=tenant, name="first node", scopes=[first])
    assert list(key.scopes.all()) == [first]
    api_key_update(api_key=key, scopes=[second])
    assert list(key.scopes.all()) == [second]


def test_taking_a_model_from_a_tenant_drops_the_key_scopes_it_covered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    llama, qwen = make_model(name="llama"), make_model(name="qwen")
    on_llama, on_qwen = make_deployment(model=llama), make_deployment(model=qwen)
    tenant = make_tenant(models=[llama, qwen])
    mixed, _ = api_key_create(
        tenant=tenant, name="mixed", scopes=[on_llama, on_qwen], model_scopes=[llama, qwen]
    )
    only_llama, _ = api_key_create(tenant=tenant, name="llama", model_scopes=[llama])
    with caplog.at_level("WARNING", logger="shunter.tenants"):
        tenant_update(tenant=tenant, models=[qwen])
    assert list(mixed.model_scopes.all()) == [qwen] and list(mixed.scopes.all()) == [on_qwen]
    assert list(only_llama.model_scopes.all()) == []
    assert [r.getMessage() for r in caplog.records] == [
        f"key {only_llama.prefix}… of tenant {tenant.name!r} lost its last scope (llama): "
        "it reaches no deployment"
    ]
    # Pinned to the deployment instead, the tenant keeps it and its key scope.
    tenant_update(tenant=tenant, deployments=[on_qwen], models=[])
    assert list(mixed.scopes.all()) == [on_qwen] and list(mixed.model_scopes.all()) == []


def test_expiry_in_the_past_is_refused() -> None:
    with pytest.raises(ValidationError) as e:
        api_key_create(
            all_deployments=True,
            tenant=make_tenant(),
            name="old",
            expires_at=timezone.now() - timedelta(seconds=1),
        )
    assert "expires_at" in e.value.message_dict


def test_revoke_is_idempotent_and_makes_the_key_unusable() -> None:
    key, _ = api_key_create(all_deployments=True, tenant=make_tenant(), name="k")
    assert key.is_usable() and ApiKey.objects.usable().filter(pk=key.pk).exists()
    api_key_revoke(api_key=key)
    first = key.revoked_at
    assert first is not None and not key.is_usable()
    api_key_revoke(api_key=key)
    assert key.revoked_at == first
    assert not ApiKey.objects.usable().filter(pk=key.pk).exists()


def record_fields(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "request_id": "r1",
        "api_key": None,
        "model_name": "m",
        "endpoint": "chat",
        "stream": True,
        "t_arrival": T0,
        "t_first_token": T0 + timedelta(milliseconds=200),
        "t_end": T0 + timedelta(seconds=1),
        "prompt_tokens": 10,
        "completion_tokens": 9,
        "ttft_ms": 200.0,
        "tpot_ms": 100.0,
        "max_itl_ms": 150.0,
        "status": "ok",
    }
    fields.update(overrides)
    return fields


def record(**overrides: object) -> RequestRecord:
    return request_record_create(**record_fields(**overrides))


@pytest.mark.parametrize(
    ("overrides", "flags"),
    [
        ({}, (True, True)),  # standard: 5000 ms / 100 ms, both on the limit
        ({"ttft_ms": 5000.5}, (False, True)),
        ({"tpot_ms": 100.01}, (True, False)),
        ({"completion_tokens": 1, "tpot_ms": None}, (True, True)),
        (
            {"status": "error", "http_status": 503, "error_type": "engine_unavailable"},
            (False, False),
        ),
        ({"status": "aborted"}, (False, False)),
        ({"ttft_ms": None, "completion_tokens": 0, "tpot_ms": None}, (False, True)),
        # Non-streamed: the gateway sees no gaps between tokens, so TBT is unknown.
        ({"stream": False, "tpot_ms": None, "max_itl_ms": None}, (True, None)),
    ],
)
def test_slo_flags_follow_the_deployments_class_for_a_tenant_without_one(
    overrides: dict[str, object], flags: tuple[bool, bool | None]
) -> None:
    deployment = make_deployment(slo_class=slo("standard"))
    tenant = make_tenant(deployment, slo_name=None)
    rec = record(tenant=tenant, deployment=deployment, **overrides)
    assert (rec.ttft_met, rec.tbt_met) == flags


def test_the_tenants_class_judges_its_requests_on_any_deployment() -> None:
    # standard: 5000 ms / 100 ms; interactive: 1000 ms / 50 ms; batch: 60 s / 500 ms
    deployment = make_deployment(slo_class=slo("standard"))
    strict = make_tenant(deployment, slo_name="interactive")
    lenient = make_tenant(deployment, slo_name="batch")
    rec = record(tenant=strict, deployment=deployment, ttft_ms=2000.0, tpot_ms=80.0)
    assert (rec.ttft_met, rec.tbt_met) == (False, False)
    rec = record(tenant=lenient, deployment=deployment, ttft_ms=9000.0, tpot_ms=300.0)
    assert (rec.ttft_met, rec.tbt_met) == (True, True)


def test_without_a_deployment_the_tenants_class_judges_and_nothing_is_rolled_up() -> None:
    tenant = make_tenant(slo_name="interactive")  # 1000 ms TTFT
    rec = record(tenant=tenant, deployment=None, ttft_ms=1500.0)
    assert not rec.ttft_met
    # Without a class of its own and without a deployment there is nothing to meet.
    rec = record(tenant=make_tenant(slo_name=None), deployment=None, ttft_ms=1.0)
    assert (rec.ttft_met, rec.tbt_met) == (False, False)
    assert UsageRollup.objects.count() == 0


@pytest.mark.parametrize("together", [False, True], ids=["one by one", "in one batch"])
def test_rollup_adds_each_record_of_the_minute(together: bool) -> None:
    deployment = make_deployment()
    tenant = make_tenant(deployment)
    common = {"tenant": tenant, "deployment": deployment}
    records = [
        record_fields(**common),
        record_fields(
            **common,
            request_id="r2",
            t_arrival=T0 + timedelta(seconds=50),
            ttft_ms=6000.0,
            tpot_ms=50.0,
            prompt_tokens=5,
            completion_tokens=3,
        ),
        record_fields(
            **common,
            request_id="r3",
            status="error",
            http_status=503,
            prompt_tokens=0,
            completion_tokens=0,
            ttft_ms=None,
            tpot_ms=None,
        ),
        record_fields(**common, request_id="r4", t_arrival=T0 + timedelta(minutes=1)),
        # No deployment: recorded, not rolled up.
        record_fields(tenant=tenant, deployment=None, request_id="r5"),
    ]
    if together:
        request_records_create([request_record_build(**fields) for fields in records])
    else:
        for fields in records:
            request_record_create(**fields)
    assert RequestRecord.objects.count() == 5
    rows = list(UsageRollup.objects.order_by("minute"))
    assert [r.minute for r in rows] == [
        T0.replace(second=0),
        T0.replace(second=0) + timedelta(minutes=1),
    ]
    first = rows[0]
    assert (first.requests, first.errors) == (3, 1)
    assert (first.prompt_tokens, first.completion_tokens) == (15, 12)
    assert (first.ttft_met, first.tbt_met, first.both_met) == (1, 2, 1)
    assert first.sum_ttft_ms == pytest.approx(6200.0)
    assert first.sum_tpot_ms == pytest.approx(150.0) and first.tpot_requests == 2
    assert rows[1].requests == 1


def test_a_batch_with_a_key_written_already_writes_nothing() -> None:
    deployment = make_deployment()
    tenant = make_tenant(deployment)
    written = record(tenant=tenant, deployment=deployment)
    again = request_record_build(
        **record_fields(tenant=tenant, deployment=deployment, request_id="r2"),
        record_key=written.record_key,
    )
    fresh = request_record_build(
        **record_fields(tenant=tenant, deployment=deployment, request_id="r3")
    )
    with pytest.raises(IntegrityError):
        request_records_create([fresh, again])
    assert list(RequestRecord.objects.values_list("request_id", flat=True)) == ["r1"]
    assert UsageRollup.objects.get().requests == 1


def test_an_unknown_tbt_counts_as_no_hit_and_no_tpot() -> None:
    deployment = make_deployment()
    tenant = make_tenant(deployment)
    record(tenant=tenant, deployment=deployment, tpot_ms=60.0)  # both met
    unknown = record(tenant=tenant, deployment=deployment, request_id="r2", tpot_ms=None)
    assert (unknown.ttft_met, unknown.tbt_met) == (True, None)
    rollup = UsageRollup.objects.get()
    assert (rollup.requests, rollup.ttft_met, rollup.tbt_met, rollup.both_met) == (2, 2, 1, 1)
    (row,) = usage_summary(tenant=tenant)
    assert (row.ttft_attainment, row.tbt_attainment, row.both_attainment) == (1.0, 0.5, 0.5)
    # The mean TPOT is over the request that had one, not diluted by the unknown one.
    assert row.mean_tpot_ms == pytest.approx(60.0) and row.mean_ttft_ms == pytest.approx(200.0)


def test_records_carry_the_node_and_roll_up_per_node() -> None:
    deployment = make_deployment()
    tenant = make_tenant(deployment)
    record(tenant=tenant, deployment=deployment, node_name="gpu-a")
    record(tenant=tenant, deployment=deployment, request_id="r2", node_name="gpu-a")
    # The deployment moved to another node within the minute: a row of its own there.
    record(tenant=tenant, deployment=deployment, request_id="r3", node_name="gpu-b", ttft_ms=9e3)
    rows = {r.node_name: r.requests for r in UsageRollup.objects.all()}
    assert rows == {"gpu-a": 2, "gpu-b": 1}
    assert [(r.node, r.requests) for r in usage_summary(tenant=tenant)] == [
        ("gpu-a", 2),
        ("gpu-b", 1),
    ]
    (only_b,) = usage_summary(tenant=tenant, node="gpu-b")
    assert only_b.ttft_attainment == 0.0

    other = make_deployment(node=deployment.node)
    record(tenant=make_tenant(other), deployment=other, request_id="r4", node_name="gpu-a")
    by_node = [(r.node, r.model_name, r.requests, r.ttft_attainment) for r in slo_by_node(since=T0)]
    assert by_node == [
        ("gpu-a", "", 3, 1.0),
        ("gpu-a", deployment.model.name, 2, 1.0),
        ("gpu-a", other.model.name, 1, 1.0),
        ("gpu-b", "", 1, 0.0),
        ("gpu-b", deployment.model.name, 1, 0.0),
    ]
    assert [r.node for r in slo_by_node(node="gpu-b")] == ["gpu-b", "gpu-b"]
    assert slo_by_node(since=T0 + timedelta(minutes=1)) == []


def test_a_deployment_with_usage_history_cannot_be_deleted() -> None:
    used, unused = make_deployment(), make_deployment()
    tenant = make_tenant(used, unused)
    rec = record(tenant=tenant, deployment=used)
    with pytest.raises(DeploymentInUse, match="has usage history; disable it"):
        deployment_delete(deployment=used)
    # Nor can its node be, which would take the deployment with it.
    with pytest.raises(ProtectedError):
        used.node.delete()
    assert UsageRollup.objects.filter(deployment=used).count() == 1
    deployment_delete(deployment=unused)
    assert not Deployment.objects.filter(pk=unused.pk).exists()
    rec.refresh_from_db()
    assert rec.deployment_id == used.pk


def test_bad_record_fields_are_refused_and_nothing_is_written() -> None:
    deployment = make_deployment()
    tenant = make_tenant(deployment)
    with pytest.raises(ValidationError):
        record(tenant=tenant, deployment=deployment, endpoint="embeddings")
    assert RequestRecord.objects.count() == 0 and UsageRollup.objects.count() == 0
