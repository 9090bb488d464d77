"""What the platform serves: models, SLO classes and deployments, created and changed.

A model's facts come from its directory's ``config.json``; a deployment is checked
against its model and against the HBM of every node it leaves or joins (``fit``). A
change to what a node serves rolls it out after the transaction commits.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from shunter.common.db import InUse
from shunter.engine.exec.hf_config import ArchConfig, read_config
from shunter.engine.exec.hf_config import model_spec_from_config as spec_of_config
from shunter.platform import selectors
from shunter.platform.models import Deployment, Model, Node, SloClass
from shunter.platform.services.changes import roll_out_on_commit
from shunter.platform.services.fit import check_node_fit


# -- models --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelFacts:
    """What a model directory's ``config.json`` says, as the engine reads it."""

    architecture: str
    num_layers: int
    param_bytes: int
    kv_bytes_per_token: int
    context_length: int
    config: dict[str, Any]


def model_facts(source_dir: str | Path, *, name: str = "model") -> ModelFacts:
    """Read ``source_dir/config.json`` with the engine's own readers (no torch).

    ValidationError (on ``source_dir``) when the file is missing, not JSON, or describes
    a model the engine cannot serve.
    """
    try:
        config = read_config(source_dir)
        arch = ArchConfig.from_hf(config)
        spec = spec_of_config(config, name)
    except FileNotFoundError:
        raise ValidationError({"source_dir": f"{source_dir} has no config.json."}) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        message = f"{source_dir}/config.json cannot be served: {e}"
        raise ValidationError({"source_dir": message}) from None
    architectures = config.get("architectures")
    architecture = (
        str(architectures[0]) if isinstance(architectures, list) and architectures else arch.family
    )
    return ModelFacts(
        architecture=architecture[:64],
        num_layers=spec.num_layers,
        param_bytes=spec.param_bytes,
        kv_bytes_per_token=spec.kv_bytes_per_token,
        context_length=spec.max_context,
        config=config,
    )


def _apply_facts(model: Model, facts: ModelFacts) -> None:
    model.architecture = facts.architecture
    model.num_layers = facts.num_layers
    model.param_bytes = facts.param_bytes
    model.kv_bytes_per_token = facts.kv_bytes_per_token
    model.context_length = facts.context_length
    model.config = facts.config


@transaction.atomic
def model_create(*, name: str, source_dir: str) -> Model:
    """Register the model directory ``source_dir`` served as ``name``."""
    model = Model(name=name, source_dir=source_dir)
    _apply_facts(model, model_facts(source_dir, name=name))
    model.full_clean()
    model.save()
    return model


@transaction.atomic
def model_update(*, model: Model, name: str | None = None, source_dir: str | None = None) -> Model:
    """Rename a model or point it at another directory (its facts are read again). Every
    node serving it must still fit, and is reconciled."""
    if name is not None:
        model.name = name
    if source_dir is not None:
        model.source_dir = source_dir
    _apply_facts(model, model_facts(model.source_dir, name=model.name))
    model.full_clean()
    model.save()
    nodes = list(Node.objects.filter(deployments__model=model).distinct())
    for node in nodes:
        check_node_fit(node, selectors.node_desired_deployments(node=node))
    roll_out_on_commit(node.pk for node in nodes)
    return model


# -- SLO classes ---------------------------------------------------------------------------
SLO_FIELDS = {"name", "ttft_ms", "tbt_ms", "alpha", "beta_b", "beta_f", "attainment_target"}


@transaction.atomic
def slo_class_create(**fields: Any) -> SloClass:
    """A new SLO class from SloClass fields (keyword-only)."""
    unknown = set(fields) - SLO_FIELDS
    if unknown:
        raise TypeError(f"slo_class_create() got unexpected fields {sorted(unknown)}")
    slo = SloClass(**fields)
    slo.full_clean()
    slo.save()
    return slo


@transaction.atomic
def slo_class_update(*, slo_class: SloClass, **fields: Any) -> SloClass:
    """Change an SLO class; the nodes serving deployments of it are reconciled."""
    unknown = set(fields) - SLO_FIELDS
    if unknown:
        raise TypeError(f"slo_class_update() got unexpected fields {sorted(unknown)}")
    for field, value in fields.items():
        setattr(slo_class, field, value)
    slo_class.full_clean()
    slo_class.save()
    roll_out_on_commit(slo_class.deployments.values_list("node_id", flat=True))
    return slo_class


# -- deployments ---------------------------------------------------------------------------
DEPLOYMENT_FIELDS = {
    "node",
    "model",
    "sharing",
    "slo_class",
    "priority",
    "kv_floor_bytes",
    "kv_ceiling_bytes",
    "max_context",
    "share_prefixes",
    "enabled",
}


def _clean_deployment(deployment: Deployment) -> None:
    deployment.full_clean()
    errors: dict[str, str] = {}
    model = deployment.model
    if deployment.max_context is not None and deployment.max_context > model.context_length:
        errors["max_context"] = (
            f"{deployment.max_context} tokens exceed {model.name}'s context length "
            f"({model.context_length})."
        )
    floor, ceiling = deployment.kv_floor_bytes, deployment.kv_ceiling_bytes
    if ceiling is not None:
        context = deployment.context_tokens() * model.kv_bytes_per_token
        if floor is not None and ceiling < floor:
            errors["kv_ceiling_bytes"] = f"{ceiling} bytes is below the KV floor ({floor})."
        elif ceiling < context:
            errors["kv_ceiling_bytes"] = (
                f"{ceiling} bytes cannot hold one full context of {deployment.context_tokens()} "
                f"tokens ({context} bytes)."
            )
    if errors:
        raise ValidationError(errors)


def _save_deployment(deployment: Deployment, nodes: Iterable[Node]) -> Deployment:
    """Validate, check the fit of every affected node (locked: two concurrent changes on
    one node cannot both pass on stale counts), save, reconcile them after commit."""
    _clean_deployment(deployment)
    locked = list(
        Node.objects.select_for_update().filter(pk__in={n.pk for n in nodes}).order_by("pk")
    )
    for node in locked:
        desired = [
            d for d in selectors.node_desired_deployments(node=node) if d.pk != deployment.pk
        ]
        if deployment.enabled and deployment.node_id == node.pk:
            desired.append(deployment)
        check_node_fit(node, desired)
    deployment.save()
    roll_out_on_commit(node.pk for node in locked)
    return deployment


@transaction.atomic
def deployment_create(
    *, node: Node, model: Model, slo_class: SloClass, **fields: Any
) -> Deployment:
    """Deploy ``model`` on ``node`` (other Deployment fields as keywords)."""
    unknown = set(fields) - DEPLOYMENT_FIELDS
    if unknown:
        raise TypeError(f"deployment_create() got unexpected fields {sorted(unknown)}")
    deployment = Deployment(node=node, model=model, slo_class=slo_class, **fields)
    return _save_deployment(deployment, [node])


@transaction.atomic
def deployment_update(*, deployment: Deployment, **fields: Any) -> Deployment:
    """Change a deployment; the nodes it leaves and joins must fit and are reconciled."""
    unknown = set(fields) - DEPLOYMENT_FIELDS
    if unknown:
        raise TypeError(f"deployment_update() got unexpected fields {sorted(unknown)}")
    before = deployment.node
    for field, value in fields.items():
        setattr(deployment, field, value)
    return _save_deployment(deployment, {before, deployment.node})


class DeploymentInUse(InUse):
    """A deployment that has usage history cannot be deleted (the API answers 409)."""


@transaction.atomic
def deployment_delete(*, deployment: Deployment) -> None:
    """Stop serving a deployment that has no usage history. One with history is refused
    (DeploymentInUse): its per-minute usage would go with it; disable it instead."""
    rollups = list(deployment.rollups.all()[:1])
    if rollups:
        raise DeploymentInUse(
            f"{deployment} has usage history; disable it (enabled=false) instead of "
            "deleting it, so that the history stays.",
            set(rollups),
        )
    node_id = deployment.node_id
    deployment.delete()
    roll_out_on_commit([node_id])
