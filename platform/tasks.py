"""Celery tasks of the platform (node changes and polls): thin, ids in, a service call,
a small summary out."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from celery import shared_task
from django.core.cache import cache
from django.db import connection

from shunter.platform import services
from shunter.platform.models import Node

log = logging.getLogger("shunter.platform")
# The most nodes one poll round probes at once.
POLL_THREADS = 32


@shared_task(name="shunter.platform.nodes_roll_out")  # type: ignore[untyped-decorator]
def nodes_roll_out_task(node_ids: list[int]) -> list[dict[str, Any]]:
    """Change nodes ``node_ids`` to serve their desired deployments, drain first and
    one replica of a model at a time."""
    results = services.node_roll_out(node_ids=node_ids)
    return [_changed(node_id, c) for node_id, c in zip(node_ids, results, strict=True)]


@shared_task(name="shunter.platform.node_change")  # type: ignore[untyped-decorator]
def node_change_task(node_id: int) -> dict[str, Any]:
    """Change node ``node_id`` (a poll found it serving another set than desired)."""
    cache.delete(services.change_queued_key(node_id))
    node = Node.objects.filter(pk=node_id).first()
    changed = None
    if node is not None:
        changed = services.node_change(node=node, wait_s=services.CHANGE_LOCK_TTL_S)
    return _changed(node_id, changed)


def _changed(node_id: int, changed: services.Changed | None) -> dict[str, Any]:
    if changed is None:
        return {"node": node_id, "ok": False, "error": "not changed"}
    return {
        "node": node_id,
        "ok": changed.reconciled.ok,
        "error": changed.reconciled.error,
        "cordoned": changed.cordoned,
        "healthy": changed.healthy,
    }


@shared_task(name="shunter.platform.node_poll")  # type: ignore[untyped-decorator]
def node_poll_task(node_id: int) -> dict[str, Any]:
    """Poll node ``node_id``'s engine (and reconcile it if it restarted or drifted)."""
    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        return {"node": node_id, "healthy": False}
    polled = services.node_poll(node=node)
    return {
        "node": node_id,
        "healthy": polled.healthy,
        "restarted": polled.restarted,
        "drifted": polled.drifted,
    }


@shared_task(name="shunter.platform.nodes_poll")  # type: ignore[untyped-decorator]
def nodes_poll_task() -> int:
    """Poll every registered node at once (beat runs this every few seconds), each on a
    thread of this task within ``services.POLL_BUDGET_S``: an engine that does not
    answer holds a thread that long, never a worker, and the round takes about as long
    as one poll. An engine found serving another set than desired is changed by a task
    of its own (``node_change``)."""
    ids = list(Node.objects.values_list("pk", flat=True))
    if ids:
        threads = min(POLL_THREADS, len(ids))
        with ThreadPoolExecutor(threads, thread_name_prefix="shunter-node-poll") as pool:
            list(pool.map(_poll_on_a_thread, ids))
    return len(ids)


def _poll_on_a_thread(node_id: int) -> None:
    try:
        node = Node.objects.filter(pk=node_id).first()
        if node is not None:
            services.node_poll(node=node, on_drift="queue")
    except Exception:  # a database hiccup: the next round polls it again
        log.exception("poll of node %s failed", node_id)
    finally:
        connection.close()
