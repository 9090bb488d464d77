"""Cordons and drain-first changes: a node out of rotation, and a node's engine made to
serve its desired deployments one replica of a model at a time.

A change of what nodes serve rolls out after its transaction commits
(``roll_out_on_commit``): a task changes the nodes in turn (``node_roll_out``), each
under the change locks of its models, so every model keeps a replica in rotation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from shunter.platform import selectors
from shunter.platform.engine_client import EngineError
from shunter.platform.models import ROUTES_CACHE_S, Node
from shunter.platform.services.reconcile import (
    Reconciled,
    engine_client,
    node_reconcile,
    node_set,
    served_set,
)

log = logging.getLogger("shunter.platform")

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
    node_set(node, cordon=Node.Cordon.OPERATOR)
    log.info("node %s cordoned", node.name)
    return node


@transaction.atomic
def node_uncordon(*, node: Node) -> Node:
    """Put ``node`` back in rotation (whoever cordoned it)."""
    node_set(node, cordon=Node.Cordon.NONE)
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


def roll_out_on_commit(node_ids: Iterable[int]) -> None:
    """After the transaction commits, change the engines of ``node_ids`` to serve their
    desired deployments, drain first and one node at a time (``node_roll_out``)."""
    ids = sorted(set(node_ids))
    if not ids:
        return

    def enqueue() -> None:
        from shunter.platform.tasks import nodes_roll_out_task  # tasks import services

        nodes_roll_out_task.delay(ids)

    transaction.on_commit(enqueue)


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
    from shunter.platform.services.poll import node_poll  # a poll may start a change

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


def change_later(node: Node) -> None:
    """Queue a drain-first change of ``node`` unless one is queued already."""
    if not cache.add(change_queued_key(node.pk), 1, timeout=CHANGE_LOCK_TTL_S):
        return
    from shunter.platform.tasks import node_change_task  # tasks import services

    node_change_task.delay(node.pk)
