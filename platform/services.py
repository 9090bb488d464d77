"""Write operations of the platform app (services: keyword-only, typed, atomic).

Invalid input raises ``django.core.exceptions.ValidationError`` with messages per field;
the admin and the REST API show them as form errors and 400 responses. A change to what a
node should serve enqueues its reconcile after the transaction commits.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from shunter.common.db import InUse
from shunter.engine.config import ModelSpec, RemapConfig
from shunter.engine.exec.hf_config import ArchConfig, read_config
from shunter.engine.exec.hf_config import model_spec_from_config as spec_of_config
from shunter.platform import selectors
from shunter.platform.engine_client import DEFAULT_TIMEOUT_S, EngineClient, EngineError
from shunter.platform.models import ROUTES_CACHE_S, Deployment, Model, Node, SloClass

log = logging.getLogger("shunter.platform")


@dataclass(frozen=True)
class AdminEnsured:
    user: AbstractBaseUser
    created: bool
    # The password in clear text when this call set it (shown once), else None.
    password: str | None


@transaction.atomic
def admin_user_ensure(*, username: str, password: str | None = None) -> AdminEnsured:
    """Make sure a superuser named ``username`` exists.

    A new user gets ``password``, or a generated one that is returned once. An existing
    user keeps its password unless ``password`` is given, which then replaces it.
    """
    user_model = get_user_model()
    user = user_model._default_manager.filter(**{user_model.USERNAME_FIELD: username}).first()
    created = user is None
    if user is None:
        user = user_model(**{user_model.USERNAME_FIELD: username})
    elif password is None:
        return AdminEnsured(user=user, created=False, password=None)
    new_password = password if password is not None else secrets.token_urlsafe(12)
    user.set_password(new_password)
    user.is_staff = True
    user.is_superuser = True
    user.is_active = True
    user.save()
    return AdminEnsured(user=user, created=created, password=new_password)


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
        _check_node_fit(node, selectors.node_desired_deployments(node=node))
    _roll_out_on_commit(node.pk for node in nodes)
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
    _roll_out_on_commit(slo_class.deployments.values_list("node_id", flat=True))
    return slo_class


# -- nodes ---------------------------------------------------------------------------------
NODE_FIELDS = {"name", "engine_url", "hardware_profile", "hbm_bytes", "dram_bytes"}


@transaction.atomic
def node_create(*, engine_token: str = "", **fields: Any) -> Node:
    """Register a node (Node fields: ``name``, ``engine_url``, ``hbm_bytes``, ...) and
    its engine's token, stored encrypted."""
    unknown = set(fields) - NODE_FIELDS
    if unknown:
        raise TypeError(f"node_create() got unexpected fields {sorted(unknown)}")
    node = Node(**fields)
    node.set_engine_token(engine_token)
    node.full_clean()
    node.save()
    return node


@transaction.atomic
def node_update(*, node: Node, engine_token: str | None = None, **fields: Any) -> Node:
    """Change a node; ``engine_token`` None keeps the stored token, '' clears it. Its
    deployments must still fit (a smaller HBM may not), and it is reconciled when its
    engine's address or token changed."""
    unknown = set(fields) - NODE_FIELDS
    if unknown:
        raise TypeError(f"node_update() got unexpected fields {sorted(unknown)}")
    node = Node.objects.select_for_update().get(pk=node.pk)
    reach_changed = engine_token is not None or fields.get("engine_url", node.engine_url) != (
        node.engine_url
    )
    for field, value in fields.items():
        setattr(node, field, value)
    if engine_token is not None:
        node.set_engine_token(engine_token)
    node.full_clean()
    _check_node_fit(node, selectors.node_desired_deployments(node=node))
    node.save()
    if reach_changed:
        _roll_out_on_commit([node.pk])
    return node


# -- fit: do a node's deployments fit its HBM? -----------------------------------------------
def remappable_layers(spec: ModelSpec) -> int:
    """Decoder layers of ``spec`` that remapping may take at most: the engine's default
    cap (``RemapConfig.cap_layers``), and never so many that fewer than two stay resident
    (``remap.layers.max_alpha``: a slot and a layer)."""
    return max(0, min(RemapConfig().cap_layers(spec.num_layers), spec.num_layers - 2))


def kv_reserve_bytes(deployment: Deployment) -> int:
    """The KV a deployment keeps at least: its floor, and never less than one full
    context (``max_context`` or the model's), which the engine needs to admit one."""
    context = deployment.context_tokens() * deployment.model.kv_bytes_per_token
    return max(deployment.kv_floor_bytes or 0, context)


@dataclass(frozen=True)
class Fit:
    """The HBM a node's enabled deployments need, by part.

    - spatial models run whenever they have work: all their weights stay resident;
    - temporal models take turns: the largest one's weights resident (whoever holds the
      turn), every other one only its non-remappable share (embeddings, the head and the
      layers beyond the remapping cap), the rest lent to the KV cache while it waits;
    - a KV reserve per deployment (``kv_reserve_bytes``).
    """

    hbm_bytes: int
    spatial_weight_bytes: int
    temporal_weight_bytes: int
    kv_reserve_bytes: int

    @property
    def need_bytes(self) -> int:
        return self.spatial_weight_bytes + self.temporal_weight_bytes + self.kv_reserve_bytes

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.hbm_bytes

    def describe(self) -> str:
        gib = 1024**3
        return (
            f"needs {self.need_bytes} bytes ({self.need_bytes / gib:.2f} GiB: spatial weights "
            f"{self.spatial_weight_bytes}, temporal weights {self.temporal_weight_bytes}, "
            f"KV reserve {self.kv_reserve_bytes}) of {self.hbm_bytes} bytes of HBM "
            f"({self.hbm_bytes / gib:.2f} GiB)"
        )


def node_fit(*, hbm_bytes: int, deployments: Sequence[Deployment]) -> Fit:
    """The fit of ``deployments`` (the enabled ones of one node) in ``hbm_bytes``."""
    spatial = [d for d in deployments if d.sharing == Deployment.Sharing.SPATIAL]
    temporal = [d.model.spec() for d in deployments if d.sharing == Deployment.Sharing.TEMPORAL]
    spatial_bytes = sum(d.model.param_bytes for d in spatial)
    temporal_bytes = 0
    if temporal:
        largest = max(temporal, key=lambda s: (s.param_bytes, s.name))
        temporal_bytes = largest.param_bytes + sum(
            s.param_bytes - remappable_layers(s) * s.layer_bytes
            for s in temporal
            if s is not largest
        )
    return Fit(
        hbm_bytes=hbm_bytes,
        spatial_weight_bytes=spatial_bytes,
        temporal_weight_bytes=temporal_bytes,
        kv_reserve_bytes=sum(kv_reserve_bytes(d) for d in deployments),
    )


def _check_node_fit(node: Node, deployments: Sequence[Deployment]) -> Fit:
    fit = node_fit(hbm_bytes=node.hbm_bytes, deployments=deployments)
    if not fit.fits:
        names = ", ".join(f"{d.model.name} ({d.sharing})" for d in deployments)
        raise ValidationError(
            f"The enabled deployments of node {node.name!r} do not fit its HBM: {names} "
            f"{fit.describe()}."
        )
    return fit


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
        _check_node_fit(node, desired)
    deployment.save()
    _roll_out_on_commit(node.pk for node in locked)
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
    _roll_out_on_commit([node_id])


# -- engine reconcile and poll ----------------------------------------------------------------
def _roll_out_on_commit(node_ids: Iterable[int]) -> None:
    """After the transaction commits, change the engines of ``node_ids`` to serve their
    desired deployments, drain first and one node at a time (``node_roll_out``)."""
    ids = sorted(set(node_ids))
    if not ids:
        return

    def enqueue() -> None:
        from shunter.platform.tasks import nodes_roll_out_task  # tasks import services

        nodes_roll_out_task.delay(ids)

    transaction.on_commit(enqueue)


def engine_client(node: Node, *, timeout_s: float | None = None) -> EngineClient:
    """A client of ``node``'s engine with its token."""
    if timeout_s is None:
        return EngineClient(node.engine_url, node.engine_token())
    return EngineClient(node.engine_url, node.engine_token(), timeout_s)


def desired_body(deployments: Sequence[Deployment]) -> dict[str, Any]:
    """The ``PUT /admin/deployments`` body serving ``deployments``: models with their
    sharing mode, priority and SLO class, and the SLO classes they name."""
    return {
        "models": [d.engine_entry() for d in deployments],
        "slo_classes": {d.slo_class.name: d.slo_class.engine_table() for d in deployments},
    }


@dataclass(frozen=True)
class Reconciled:
    """What a reconcile did: ``changes`` as the engine reports them, or ``error``."""

    ok: bool
    changes: dict[str, Any] | None = None
    error: str = ""


def node_reconcile(*, node: Node) -> Reconciled:
    """Make ``node``'s engine serve its enabled deployments (``PUT /admin/deployments``).

    Not one transaction: the engine call may take long (loading weights) and no row lock
    is held over it. An unreachable engine marks the node unhealthy; a refusal (the
    engine cannot serve the set, e.g. a directory it lacks) is kept in ``last_error``.
    A node without enabled deployments is left serving what it serves (an engine
    needs at least one model).
    """
    desired = selectors.node_desired_deployments(node=node)
    if not desired:
        error = "No enabled deployments: the engine keeps serving its current models."
        _node_set(node, last_error=error)
        return Reconciled(ok=False, error=error)
    try:
        changes = engine_client(node).put_deployments(desired_body(desired))
    except EngineError as e:
        fields: dict[str, Any] = {"last_error": f"reconcile: {e}"}
        if e.status is None:
            fields["status"] = Node.Status.UNHEALTHY
        _node_set(node, **fields)
        log.warning("node %s: reconcile failed: %s", node.name, e)
        return Reconciled(ok=False, error=str(e))
    _node_set(node, last_error="")
    log.info("node %s reconciled: %s", node.name, changes)
    return Reconciled(ok=True, changes=changes)


@dataclass(frozen=True)
class Polled:
    """A poll's outcome: whether the engine answered and serves (or is loading) models,
    whether it had restarted or served another set than desired, whether it was
    ``reconciling`` (changing its models), and the reconcile that followed (if any).
    ``missed`` counts the consecutive polls the engine has not answered, this one
    included (0 when it answered)."""

    healthy: bool
    missed: int = 0
    restarted: bool = False
    drifted: bool = False
    reconciling: bool = False
    reconciled: Reconciled | None = None


# The longest one poll of a node may take, its calls together: one call's timeout and a
# second more (an engine that answers at all answers its three calls in milliseconds).
POLL_BUDGET_S = DEFAULT_TIMEOUT_S + 1.0
MIN_CALL_S = 0.1
# What a poll does with an engine that serves another set than desired.
OnDrift = Literal["change", "queue", "keep"]
# The deployment limits an engine reports per model (Deployment.engine_limits' keys).
LIMIT_KEYS = ("kv_floor", "kv_ceiling", "max_context")


def served_set(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Model name -> what an engine's ``/admin/state`` reports of it: ``sharing``,
    ``priority``, and those of ``kv_floor``, ``kv_ceiling``, ``max_context`` it reports
    (null when unset; a key it does not report is left out)."""
    models = state.get("models")
    if not isinstance(models, dict):
        return {}
    served: dict[str, dict[str, Any]] = {}
    for name, info in models.items():
        if not isinstance(info, dict):
            continue
        entry = {"sharing": str(info.get("sharing")), "priority": _as_int(info.get("priority", 0))}
        for key in LIMIT_KEYS:
            if key in info:
                entry[key] = _as_int(info[key])
        served[str(name)] = entry
    return served


def _as_int(value: Any) -> Any:
    """An integer as reported (JSON may give 5.0); anything else as is, so it differs."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def desired_set(deployments: Sequence[Deployment]) -> dict[str, dict[str, Any]]:
    """Model name -> what the engine should report of it (``served_set``'s shape, with
    every limit key)."""
    return {
        d.model.name: {"sharing": d.sharing, "priority": d.priority, **d.engine_limits()}
        for d in deployments
    }


def drifted(served: dict[str, dict[str, Any]], desired: dict[str, dict[str, Any]]) -> bool:
    """Whether an engine serves another set than desired: other names, or a model whose
    reported values differ (a key the engine does not report is no drift)."""
    if served.keys() != desired.keys():
        return True
    return any(
        value != desired[name].get(key)
        for name, reported in served.items()
        for key, value in reported.items()
    )


def node_poll(*, node: Node, on_drift: OnDrift = "change") -> Polled:
    """Probe ``node``'s engine: ``/health``, ``/admin/state`` and ``/v1/models``.

    Updates status, last_seen, the cached state and the engine's start time. When the
    engine restarted (its start time changed) it is reconciled at once; one reconcile
    per node runs at a time. When it serves another set than the desired one (names,
    sharing modes, priorities, and the KV bounds and longest context it reports), it
    is changed drain first (``node_change``): here (``on_drift`` "change"), by a task
    queued for it ("queue"), or not at all ("keep").

    The poll's three calls take at most ``POLL_BUDGET_S`` together. An engine that
    does not answer in that time (a timeout, a connection cut) is a miss: the node
    keeps its status until ``settings.NODE_POLL_MISSES`` consecutive misses, so one
    slow answer does not take it out of routing. A refused connection (nothing
    listens) or an error status (draining, stalled, a wrong token) marks it unhealthy
    at once.

    An engine changing its models (``reconciling`` in its state) keeps the node's
    status; only its state is recorded.
    """
    deadline = time.monotonic() + POLL_BUDGET_S

    def client() -> EngineClient:  # what is left of the budget, for each call
        return engine_client(node, timeout_s=max(deadline - time.monotonic(), MIN_CALL_S))

    try:
        client().health()
        state = client().state()
        reconciling = state.get("reconciling") is True
        listed = {} if reconciling else client().models()
    except EngineError as e:
        return _poll_missed(node, e)
    cache.delete(_misses_key(node))
    now = timezone.now()
    seen = {"last_seen": now, "state": state, "state_at": now}
    if reconciling:
        _node_set(node, **seen)
        return Polled(healthy=True, reconciling=True)
    data = listed.get("data") or []
    started = data[0].get("created") if data and isinstance(data[0], dict) else None
    started = int(started) if isinstance(started, int | float) else None
    desired = desired_set(selectors.node_desired_deployments(node=node))
    restarted = node.engine_started is not None and started != node.engine_started
    served = served_set(state)
    drift = bool(desired) and drifted(served, desired)
    if drift:
        log.info("node %s serves %s, not the desired %s", node.name, served, desired)
    fields: dict[str, Any] = {"status": Node.Status.HEALTHY, "engine_started": started, **seen}
    if node.last_error.startswith("poll:"):
        fields["last_error"] = ""
    _node_set(node, **fields)
    reconciled = None
    if restarted:  # it serves its start-up set: the desired one goes back at once
        reconciled = _reconcile_once(node)
    elif drift and on_drift == "change":
        changed = node_change(node=node)
        reconciled = changed.reconciled if changed is not None else None
    elif drift and on_drift == "queue":
        _change_later(node)
    return Polled(healthy=True, restarted=restarted, drifted=drift, reconciled=reconciled)


# A miss older than this is forgotten: misses count only while polls keep coming.
POLL_MISSES_TTL_S = 600


def _misses_key(node: Node) -> str:
    """Misses count per node and engine address: a node moved to another engine starts
    over."""
    return f"shunter:node-poll-misses:{node.pk}:{node.engine_url}"


def _poll_missed(node: Node, error: EngineError) -> Polled:
    """Count a poll ``error`` against ``node``; mark it unhealthy on a real failure."""
    key = _misses_key(node)
    if cache.add(key, 1, timeout=POLL_MISSES_TTL_S):
        missed = 1
    else:
        try:
            missed = cache.incr(key)
        except ValueError:  # it expired in between
            cache.set(key, 1, timeout=POLL_MISSES_TTL_S)
            missed = 1
    limit = settings.NODE_POLL_MISSES
    if error.status is not None or error.refused or missed >= limit:
        _node_set(node, status=Node.Status.UNHEALTHY, last_error=f"poll: {error}")
    else:
        _node_set(node, last_error=f"poll: {error} (missed {missed} of {limit} in a row)")
    return Polled(healthy=False, missed=missed)


def _reconcile_once(node: Node) -> Reconciled | None:
    """Reconcile ``node`` unless a reconcile of it is running already (then None)."""
    lock = f"shunter:node-reconcile:{node.pk}"
    if not cache.add(lock, 1, timeout=180):
        return None
    try:
        return node_reconcile(node=node)
    finally:
        cache.delete(lock)


def _node_set(node: Node, **fields: Any) -> None:
    """Update ``fields`` of ``node`` in the database and on the instance."""
    Node.objects.filter(pk=node.pk).update(**fields)
    for field, value in fields.items():
        setattr(node, field, value)


# -- cordon and drain-first changes ---------------------------------------------------------
# The longest a change may hold its models: the drain, the reconcile and the polls after.
CHANGE_LOCK_TTL_S = 300
# How long a change waits, once the node is cordoned, for every gateway to have read the
# route table again (a table read just before the cordon serves ``ROUTES_CACHE_S``).
ROUTES_SETTLE_S = 1.5 * ROUTES_CACHE_S
# The engine's requests in flight are polled this often while the node drains.
DRAIN_POLL_S = 0.2
# How often a change asks again for the change locks another change holds.
LOCK_RETRY_S = 1.0
# Polls after a reconcile until the engine answers healthy with its new set.
HEALTH_POLLS = 30
HEALTH_POLL_S = 1.0


@transaction.atomic
def node_cordon(*, node: Node) -> Node:
    """Take ``node`` out of rotation for maintenance: the gateways route it no new
    request once they read their route table again (within ``ROUTES_CACHE_S``); the
    requests in flight finish. It stays cordoned until ``node_uncordon``."""
    _node_set(node, cordon=Node.Cordon.OPERATOR)
    log.info("node %s cordoned", node.name)
    return node


@transaction.atomic
def node_uncordon(*, node: Node) -> Node:
    """Put ``node`` back in rotation (whoever cordoned it)."""
    _node_set(node, cordon=Node.Cordon.NONE)
    log.info("node %s uncordoned", node.name)
    return node


@dataclass(frozen=True)
class Changed:
    """A drain-first change of one node: whether it was cordoned for it (not when it
    holds the only routable replica of a model it serves), whether its requests in
    flight had finished before the reconcile, the reconcile, and whether the engine
    answered healthy with the desired set after it."""

    cordoned: bool
    drained: bool
    reconciled: Reconciled
    healthy: bool


def node_roll_out(*, node_ids: Sequence[int]) -> list[Changed | None]:
    """Change each node of ``node_ids`` in turn (``node_change``), each waiting for the
    models it shares with a change still running: a change of deployments over N nodes
    takes one replica of a model at a time out of rotation, and the model is served
    throughout. None for a node that is gone or whose models stayed busy."""
    results: list[Changed | None] = []
    for node_id in node_ids:
        node = Node.objects.filter(pk=node_id).first()
        changed = None
        if node is not None:
            changed = node_change(node=node, wait_s=CHANGE_LOCK_TTL_S)
        results.append(changed)
    return results


def node_change(*, node: Node, wait_s: float = 0.0) -> Changed | None:
    """Make ``node``'s engine serve its desired deployments, drain first.

    1. Take the change lock of every model the node serves or will serve, so that one
       replica of a model changes at a time (waiting up to ``wait_s`` for them; None
       when they stayed taken).
    2. Cordon the node when every model it serves has another routable replica (a
       model's only replica is changed in place: a drain would take it away), wait for
       the gateways to see it, then for its requests in flight to finish (at most
       ``settings.NODE_DRAIN_TIMEOUT_S``).
    3. Reconcile, poll until the engine answers healthy with the desired set.
    4. Lift the change's cordon (an operator's stays).
    """
    served = set(served_set(node.state))
    desired = selectors.node_desired_deployments(node=node)
    locks = _take_change_locks(node, served | {d.model.name for d in desired}, wait_s)
    if locks is None:
        log.info("node %s: a change of its models is running; this one waits", node.name)
        return None
    cordoned = drained = False
    try:
        alone = selectors.models_without_other_replica(node=node, model_names=served)
        if served and not alone:
            cordoned = _cordon_for_change(node)
        elif alone:
            log.info("node %s changes in place: the only replica of %s", node.name, alone)
        if cordoned:
            drained = _drain(node)
        reconciled = node_reconcile(node=node)
        healthy = _healthy_after_change(node)
    finally:
        if cordoned:
            Node.objects.filter(pk=node.pk, cordon=Node.Cordon.ROLLOUT).update(
                cordon=Node.Cordon.NONE
            )
            node.refresh_from_db(fields=["cordon"])
        cache.delete_many(locks)
    log.info(
        "node %s changed: cordoned %s, drained %s, reconciled %s, healthy %s",
        node.name,
        cordoned,
        drained,
        reconciled.ok,
        healthy,
    )
    return Changed(cordoned=cordoned, drained=drained, reconciled=reconciled, healthy=healthy)


def _take_change_locks(node: Node, model_names: set[str], wait_s: float) -> list[str] | None:
    """The change locks of ``model_names`` (all or none, retried until ``wait_s``)."""
    keys = [f"shunter:node-change:model:{name}" for name in sorted(model_names)]
    deadline = time.monotonic() + wait_s
    while True:
        taken = []
        for key in keys:
            if not cache.add(key, node.pk, timeout=CHANGE_LOCK_TTL_S):
                break
            taken.append(key)
        else:
            return keys
        cache.delete_many(taken)
        if time.monotonic() >= deadline:
            return None
        time.sleep(LOCK_RETRY_S)


def _cordon_for_change(node: Node) -> bool:
    """Cordon ``node`` for a change unless it is cordoned already (an operator's
    cordon is kept, and lifted by the operator); True when this change cordoned it."""
    cordoned = Node.objects.filter(pk=node.pk, cordon=Node.Cordon.NONE).update(
        cordon=Node.Cordon.ROLLOUT
    )
    node.refresh_from_db(fields=["cordon"])
    return cordoned == 1


def _drain(node: Node) -> bool:
    """Wait for the gateways to stop routing to cordoned ``node`` and for its engine's
    requests in flight to finish; False when some were still running at the timeout."""
    time.sleep(ROUTES_SETTLE_S)
    client = engine_client(node)
    deadline = time.monotonic() + settings.NODE_DRAIN_TIMEOUT_S
    while True:
        try:
            live = client.state().get("requests", {}).get("live")
        except EngineError:
            return False  # it does not answer: nothing to wait for
        if live == 0:
            return True
        if time.monotonic() >= deadline:
            log.warning("node %s: %s requests still in flight after the drain", node.name, live)
            return False
        time.sleep(DRAIN_POLL_S)


def _healthy_after_change(node: Node) -> bool:
    """Poll ``node`` (changing nothing) until its engine answers healthy, serving the
    desired set, at most ``HEALTH_POLLS`` times."""
    for _ in range(HEALTH_POLLS):
        polled = node_poll(node=node, on_drift="keep")
        if polled.healthy and not polled.reconciling and not polled.drifted:
            return True
        time.sleep(HEALTH_POLL_S)
    return False


def change_queued_key(node_id: int) -> str:
    """Set while a drain-first change of node ``node_id`` waits in the queue (its task
    deletes it when it starts)."""
    return f"shunter:node-change:queued:{node_id}"


def _change_later(node: Node) -> None:
    """Queue a drain-first change of ``node`` unless one is queued already."""
    if not cache.add(change_queued_key(node.pk), 1, timeout=CHANGE_LOCK_TTL_S):
        return
    from shunter.platform.tasks import node_change_task  # tasks import services

    node_change_task.delay(node.pk)
