"""Platform services: model facts from config.json, the HBM fit of a node's deployments,
deployment validation, and the reconcile enqueued after commit."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.test import TestCase

from shunter.engine.checkpoint.random_weights import preset_config
from shunter.engine.config import RemapConfig
from shunter.engine.exec.hf_config import model_spec_from_config
from shunter.platform import selectors, services
from shunter.platform.models import Deployment, Model, Node, SloClass
from shunter.platform.services import (
    deployment_create,
    deployment_update,
    model_create,
    model_facts,
    node_create,
    node_update,
    remappable_layers,
)
from tests.tenants.factories import GIB, make_deployment, make_model, make_node, slo

pytestmark = pytest.mark.django_db


def model_dir(tmp_path: Path, name: str, config: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_slo_classes_are_seeded() -> None:
    seeded = {s.name: (s.ttft_ms, s.tbt_ms) for s in SloClass.objects.all()}
    assert seeded == {"interactive": (1000, 50), "standard": (5000, 100), "batch": (60000, 500)}
    standard = slo("standard")
    assert (standard.alpha, standard.beta_b, standard.beta_f) == (3.0, 0.0, 0.5)
    assert standard.attainment_target == 0.9


def test_model_facts_match_the_engines_spec(tmp_path: Path) -> None:
    config = preset_config("tiny-qwen2")
    facts = model_facts(model_dir(tmp_path, "q", config))
    spec = model_spec_from_config(config, "q")
    assert facts.num_layers == spec.num_layers == config["num_hidden_layers"]
    assert facts.param_bytes == spec.param_bytes
    assert facts.kv_bytes_per_token == spec.kv_bytes_per_token
    assert facts.context_length == config["max_position_embeddings"]
    assert facts.architecture == config["architectures"][0]


def test_model_create_refuses_missing_and_unservable_configs(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as e:
        model_create(name="ghost", source_dir=str(tmp_path / "nowhere"))
    assert "no config.json" in str(e.value.message_dict["source_dir"])
    bad = model_dir(tmp_path, "bad", {"model_type": "gpt2"})
    with pytest.raises(ValidationError) as e:
        model_create(name="bad", source_dir=str(bad))
    assert "gpt2" in str(e.value.message_dict["source_dir"])
    good = model_dir(tmp_path, "good", preset_config("tiny-llama"))
    with pytest.raises(ValidationError) as e:
        model_create(name="has/slash", source_dir=str(good))
    assert "name" in e.value.message_dict


def test_engine_token_is_stored_encrypted() -> None:
    node = node_create(
        name="gpu-1", engine_url="http://127.0.0.1:8100", hbm_bytes=GIB, engine_token="s3cret-t0ken"
    )
    node.refresh_from_db()
    assert "s3cret-t0ken" not in node.engine_token_encrypted
    assert node.engine_token() == "s3cret-t0ken"
    node_update(node=node, hbm_bytes=2 * GIB)
    node.refresh_from_db()
    assert node.engine_token() == "s3cret-t0ken"  # None keeps it
    node_update(node=node, engine_token="")
    node.refresh_from_db()
    assert node.engine_token() == "" and not node.has_engine_token


def test_remappable_layers_follow_the_engines_cap() -> None:
    spec = make_model(num_hidden_layers=8).spec()
    assert remappable_layers(spec) == math.floor(RemapConfig().cap_fraction * 8)
    assert remappable_layers(make_model(num_hidden_layers=2).spec()) == 0


def reserve(model_context: int, kv_per_token: int) -> int:
    return model_context * kv_per_token


class FitTests(TestCase):
    """Exact byte arithmetic of the fit rule on a node sized to the byte."""

    def setUp(self) -> None:
        self.big = make_model(name="big", num_hidden_layers=8, hidden_size=128)
        self.small = make_model(name="small", num_hidden_layers=4)
        self.std = slo("standard")

    def temporal_need(self) -> int:
        big, small = self.big.spec(), self.small.spec()
        assert big.param_bytes > small.param_bytes
        lent = remappable_layers(small) * small.layer_bytes
        return (
            big.param_bytes
            + small.param_bytes
            - lent
            + reserve(big.max_context, big.kv_bytes_per_token)
            + reserve(small.max_context, small.kv_bytes_per_token)
        )

    def test_temporal_models_fit_within_what_remapping_lends(self) -> None:
        need = self.temporal_need()
        node = make_node(hbm_bytes=need)
        for model in (self.big, self.small):
            deployment_create(node=node, model=model, slo_class=self.std, sharing="temporal")
        assert Deployment.objects.filter(node=node).count() == 2

    def test_one_byte_short_is_refused_with_the_numbers(self) -> None:
        need = self.temporal_need()
        node = make_node(hbm_bytes=need - 1)
        deployment_create(node=node, model=self.big, slo_class=self.std, sharing="temporal")
        with self.assertRaises(ValidationError) as e:
            deployment_create(node=node, model=self.small, slo_class=self.std, sharing="temporal")
        message = str(e.exception)
        assert f"needs {need} bytes" in message and f"of {need - 1} bytes of HBM" in message
        assert Deployment.objects.filter(node=node).count() == 1

    def test_spatial_models_keep_all_their_weights(self) -> None:
        need = self.temporal_need()
        node = make_node(hbm_bytes=need)
        deployment_create(node=node, model=self.big, slo_class=self.std, sharing="temporal")
        # The same pair fits temporally, but not with the small one spatial.
        with self.assertRaises(ValidationError):
            deployment_create(node=node, model=self.small, slo_class=self.std, sharing="spatial")
        # Disabled deployments are not served, so they need nothing.
        deployment_create(
            node=node, model=self.small, slo_class=self.std, sharing="spatial", enabled=False
        )
        d = Deployment.objects.get(node=node, model=self.small)
        with self.assertRaises(ValidationError):
            deployment_update(deployment=d, enabled=True)
        deployment_update(deployment=d, enabled=True, sharing="temporal")

    def test_shrinking_a_node_below_its_deployments_is_refused(self) -> None:
        node = make_node(hbm_bytes=self.temporal_need())
        deployment_create(node=node, model=self.big, slo_class=self.std, sharing="spatial")
        with self.assertRaises(ValidationError) as e:
            node_update(node=node, hbm_bytes=self.big.param_bytes)
        assert "do not fit its HBM" in str(e.exception)
        node.refresh_from_db()
        assert node.hbm_bytes == self.temporal_need()

    def test_kv_floors_must_fit_beside_every_models_weights(self) -> None:
        # Floors of one context each leave the reserves, and so the need, unchanged, but
        # the engine keeps floors out of the pages no weights hold, lent layers included.
        need = self.temporal_need()
        node = make_node(hbm_bytes=need)
        big, small = self.big.spec(), self.small.spec()
        floors = {
            self.big: reserve(big.max_context, big.kv_bytes_per_token),
            self.small: reserve(small.max_context, small.kv_bytes_per_token),
        }

        def create(model: Model, floor: int | None) -> None:
            deployment_create(
                node=node, model=model, slo_class=self.std, sharing="temporal", kv_floor_bytes=floor
            )

        create(self.big, floors[self.big])
        with self.assertRaises(ValidationError) as e:
            create(self.small, floors[self.small])
        message = str(e.exception)
        assert f"needs {need} bytes" in message
        assert f"its KV floors ({sum(floors.values())} bytes) must fit" in message
        weights = big.param_bytes + small.param_bytes
        assert f"every model's weights resident ({weights} bytes)" in message
        create(self.small, None)

    def test_kv_floor_counts_when_above_one_context(self) -> None:
        spec = self.small.spec()
        context = reserve(spec.max_context, spec.kv_bytes_per_token)
        node = make_node(hbm_bytes=spec.param_bytes + context + GIB)
        with self.assertRaises(ValidationError):
            deployment_create(
                node=node, model=self.small, slo_class=self.std, kv_floor_bytes=context + 2 * GIB
            )
        deployment_create(
            node=node, model=self.small, slo_class=self.std, kv_floor_bytes=context + GIB
        )


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_context": 10**6}, "max_context"),
        ({"kv_floor_bytes": 10**9, "kv_ceiling_bytes": 10**8}, "kv_ceiling_bytes"),
        ({"kv_ceiling_bytes": 1}, "kv_ceiling_bytes"),
        ({"sharing": "sometimes"}, "sharing"),
    ],
)
def test_bad_deployment_fields_name_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as e:
        deployment_create(node=make_node(), model=make_model(), slo_class=slo(), **fields)
    assert field in e.value.message_dict


def test_one_model_once_per_node() -> None:
    d = make_deployment()
    with pytest.raises(ValidationError):
        deployment_create(node=d.node, model=d.model, slo_class=slo())


def test_changes_enqueue_one_roll_out_of_the_nodes_after_commit(
    django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[list[int]] = []
    from shunter.platform import tasks

    monkeypatch.setattr(tasks.nodes_roll_out_task, "delay", sent.append)
    a, b = make_node(), make_node()
    with django_capture_on_commit_callbacks(execute=True):
        d = deployment_create(node=a, model=make_model(), slo_class=slo())
    assert sent == [[a.pk]]
    with django_capture_on_commit_callbacks(execute=True):
        deployment_update(deployment=d, node=b)
    assert sent[-1] == sorted([a.pk, b.pk])
    with django_capture_on_commit_callbacks(execute=True):
        services.slo_class_update(slo_class=slo(), tbt_ms=120)
    assert sent[-1] == [b.pk]
    # A class served on two nodes: one roll-out takes them in turn.
    with django_capture_on_commit_callbacks(execute=True):
        deployment_create(node=a, model=d.model, slo_class=slo())
    with django_capture_on_commit_callbacks(execute=True):
        services.slo_class_update(slo_class=slo(), tbt_ms=130)
    assert sent[-1] == sorted([a.pk, b.pk])
    with django_capture_on_commit_callbacks(execute=True):
        services.deployment_delete(deployment=d)
    assert sent[-1] == [b.pk]


def test_cordon_and_uncordon() -> None:
    node = make_node()
    assert not node.cordoned
    services.node_cordon(node=node)
    assert Node.objects.get(pk=node.pk).cordon == Node.Cordon.OPERATOR and node.cordoned
    services.node_uncordon(node=node)
    assert Node.objects.get(pk=node.pk).cordon == Node.Cordon.NONE and not node.cordoned


def test_a_model_is_alone_on_a_node_unless_another_routable_uncordoned_node_serves_it() -> None:
    model = make_model()
    a, b = make_node(status=Node.Status.HEALTHY), make_node(status=Node.Status.HEALTHY)
    deployment_create(node=a, model=model, slo_class=slo())
    other = deployment_create(node=b, model=model, slo_class=slo())
    names = [model.name, "gone"]
    assert selectors.models_without_other_replica(node=a, model_names=names) == ["gone"]
    for change in (
        lambda: services.node_cordon(node=b),
        lambda: Node.objects.filter(pk=b.pk).update(status=Node.Status.UNHEALTHY),
        lambda: deployment_update(deployment=other, enabled=False),
    ):
        with transaction.atomic():
            change()
            alone = selectors.models_without_other_replica(node=a, model_names=names)
            assert alone == sorted(names)
            transaction.set_rollback(True)
    assert Node.objects.count() == 2
