"""A node's engine: the set it should serve, the set it reports, and the reconcile that
makes it serve the former (``PUT /admin/deployments``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shunter.engine.api.deployments import LIMIT_KEYS, DeploymentsBody
from shunter.platform import selectors
from shunter.platform.engine_client import EngineClient, EngineError
from shunter.platform.models import Deployment, Node

log = logging.getLogger("shunter.platform")

# The deployment limits an engine reports per model (Deployment.engine_limits' keys).


def engine_client(node: Node, *, timeout_s: float | None = None) -> EngineClient:
    """A client of ``node``'s engine with its token."""
    if timeout_s is None:
        return EngineClient(node.engine_url, node.engine_token())
    return EngineClient(node.engine_url, node.engine_token(), timeout_s)


def node_set(node: Node, **fields: Any) -> None:
    """Update ``fields`` of ``node`` in the database and on the instance."""
    Node.objects.filter(pk=node.pk).update(**fields)
    for field, value in fields.items():
        setattr(node, field, value)


def desired_body(deployments: Sequence[Deployment]) -> dict[str, Any]:
    """The ``PUT /admin/deployments`` body serving ``deployments``: models with their
    sharing mode, priority and SLO class, and the SLO classes they name."""
    return DeploymentsBody(
        models=[d.model_entry() for d in deployments],
        slo_classes={d.slo_class.name: d.slo_class.engine_table() for d in deployments},
    ).to_json()


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
        node_set(node, last_error=error)
        return Reconciled(ok=False, error=error)
    try:
        changes = engine_client(node).put_deployments(desired_body(desired))
    except EngineError as e:
        fields: dict[str, Any] = {"last_error": f"reconcile: {e}"}
        if e.status is None:
            fields["status"] = Node.Status.UNHEALTHY
        node_set(node, **fields)
        log.warning("node %s: reconcile failed: %s", node.name, e)
        return Reconciled(ok=False, error=str(e))
    node_set(node, last_error="")
    log.info("node %s reconciled: %s", node.name, changes)
    return Reconciled(ok=True, changes=changes)


def served_set(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Model name -> what an engine's ``/admin/state`` reports of it: ``sharing``,
    ``priority``, ``share_prefixes`` (false unless reported true), and those of
    ``kv_floor``, ``kv_ceiling``, ``max_context`` it reports (null when unset; a key it
    does not report is left out)."""
    models = state.get("models")
    if not isinstance(models, dict):
        return {}
    served: dict[str, dict[str, Any]] = {}
    for name, info in models.items():
        if not isinstance(info, dict):
            continue
        entry = {
            "sharing": str(info.get("sharing")),
            "priority": _as_int(info.get("priority", 0)),
            "share_prefixes": info.get("share_prefixes") is True,
        }
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
        d.model.name: {
            "sharing": d.sharing,
            "priority": d.priority,
            "share_prefixes": d.share_prefixes,
            **d.engine_limits(),
        }
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
