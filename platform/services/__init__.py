"""Write operations of the platform app (services: keyword-only, typed, atomic).

The app, one concept per module: ``catalog`` (models, SLO classes, deployments),
``nodes`` (nodes and their engine's token), ``fit`` (do a node's deployments fit its
HBM?), ``reconcile`` (the set an engine should serve, the set it reports, and making it
serve the former), ``poll`` (health, restarts and drift), ``changes`` (cordons and
drain-first changes, one replica of a model at a time), ``admin_users`` (the console's
superuser). Import from here.

Invalid input raises ``django.core.exceptions.ValidationError`` with messages per field;
the admin and the REST API show them as form errors and 400 responses. A change to what a
node should serve enqueues its reconcile after the transaction commits.
"""

from shunter.engine.api.deployments import LIMIT_KEYS
from shunter.platform.services.admin_users import AdminEnsured, admin_user_ensure
from shunter.platform.services.catalog import (
    DEPLOYMENT_FIELDS,
    SLO_FIELDS,
    DeploymentInUse,
    ModelFacts,
    deployment_create,
    deployment_delete,
    deployment_update,
    model_create,
    model_facts,
    model_update,
    slo_class_create,
    slo_class_update,
)
from shunter.platform.services.changes import (
    CHANGE_LOCK_TTL_S,
    DRAIN_POLL_S,
    HEALTH_POLL_S,
    HEALTH_POLLS,
    LOCK_RETRY_S,
    ROUTES_SETTLE_S,
    Changed,
    change_queued_key,
    node_change,
    node_cordon,
    node_roll_out,
    node_uncordon,
)
from shunter.platform.services.fit import Fit, kv_reserve_bytes, node_fit, remappable_layers
from shunter.platform.services.nodes import NODE_FIELDS, node_create, node_update
from shunter.platform.services.poll import (
    MIN_CALL_S,
    POLL_BUDGET_S,
    POLL_MISSES_TTL_S,
    OnDrift,
    Polled,
    node_poll,
)
from shunter.platform.services.reconcile import (
    Reconciled,
    desired_body,
    desired_set,
    drifted,
    engine_client,
    node_reconcile,
    served_set,
)

__all__ = [
    "CHANGE_LOCK_TTL_S",
    "DEPLOYMENT_FIELDS",
    "DRAIN_POLL_S",
    "HEALTH_POLLS",
    "HEALTH_POLL_S",
    "LIMIT_KEYS",
    "LOCK_RETRY_S",
    "MIN_CALL_S",
    "NODE_FIELDS",
    "POLL_BUDGET_S",
    "POLL_MISSES_TTL_S",
    "ROUTES_SETTLE_S",
    "SLO_FIELDS",
    "AdminEnsured",
    "Changed",
    "DeploymentInUse",
    "Fit",
    "ModelFacts",
    "OnDrift",
    "Polled",
    "Reconciled",
    "admin_user_ensure",
    "change_queued_key",
    "deployment_create",
    "deployment_delete",
    "deployment_update",
    "desired_body",
    "desired_set",
    "drifted",
    "engine_client",
    "kv_reserve_bytes",
    "model_create",
    "model_facts",
    "model_update",
    "node_change",
    "node_cordon",
    "node_create",
    "node_fit",
    "node_poll",
    "node_reconcile",
    "node_roll_out",
    "node_uncordon",
    "node_update",
    "remappable_layers",
    "served_set",
    "slo_class_create",
    "slo_class_update",
]
