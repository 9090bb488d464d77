"""The node poll: is a node's engine up, did it restart, does it serve what it should?

A restarted engine is reconciled at once; one serving another set than desired is
changed drain first (``changes``), now or by a queued task.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from shunter.platform import selectors
from shunter.platform.engine_client import DEFAULT_TIMEOUT_S, EngineClient, EngineError
from shunter.platform.models import Node
from shunter.platform.services.changes import change_later, node_change
from shunter.platform.services.reconcile import (
    Reconciled,
    desired_set,
    drifted,
    engine_client,
    node_reconcile,
    node_set,
    served_set,
)

log = logging.getLogger("shunter.platform")


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
        node_set(node, **seen)
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
    node_set(node, **fields)
    reconciled = None
    if restarted:  # it serves its start-up set: the desired one goes back at once
        reconciled = _reconcile_once(node)
    elif drift and on_drift == "change":
        changed = node_change(node=node)
        reconciled = changed.reconciled if changed is not None else None
    elif drift and on_drift == "queue":
        change_later(node)
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
        node_set(node, status=Node.Status.UNHEALTHY, last_error=f"poll: {error}")
    else:
        node_set(node, last_error=f"poll: {error} (missed {missed} of {limit} in a row)")
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
