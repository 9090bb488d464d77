"""Celery tasks of the platform: thin, ids in, a service call, a small summary out."""

from __future__ import annotations

import time
from typing import Any

from shunter.platform import benchmarks, services
from shunter.platform.celery import app
from shunter.platform.models import Node


@app.task(name="shunter.platform.node_reconcile")  # type: ignore[untyped-decorator]
def node_reconcile_task(node_id: int) -> dict[str, Any]:
    """Push node ``node_id``'s desired deployments to its engine."""
    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        return {"node": node_id, "ok": False, "error": "no such node"}
    result = services.node_reconcile(node=node)
    return {"node": node_id, "ok": result.ok, "error": result.error}


@app.task(name="shunter.platform.node_poll")  # type: ignore[untyped-decorator]
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


@app.task(name="shunter.platform.nodes_poll")  # type: ignore[untyped-decorator]
def nodes_poll_task() -> int:
    """Fan out one poll per registered node (beat runs this every few seconds)."""
    ids = list(Node.objects.values_list("pk", flat=True))
    for node_id in ids:
        node_poll_task.delay(node_id)
    return len(ids)


@app.task(name="shunter.platform.benchmark_run", bind=True, max_retries=None)  # type: ignore[untyped-decorator]
def benchmark_run_task(self: Any, run_key: str) -> dict[str, Any]:
    """Execute benchmark run ``run_key``; while its target is busy, retry later on the
    same queue (run in-process, without a broker, wait here instead)."""
    while True:
        done = benchmarks.benchmark_run_execute(key=run_key)
        if done.outcome != "waiting":
            return {"run": done.run_id, "status": done.outcome}
        if not self.request.is_eager:
            raise self.retry(countdown=benchmarks.LOCK_RETRY_S)
        time.sleep(benchmarks.LOCK_RETRY_S)


@app.task(name=benchmarks.FIRE_TASK, bind=True)  # type: ignore[untyped-decorator]
def benchmark_job_fire_task(self: Any, job_id: int) -> dict[str, Any]:
    """Beat's entry for a scheduled job: start a run on the benchmark queue, or on the
    queue this came from if an operator gave the schedule one."""
    queue = (self.request.delivery_info or {}).get("routing_key") or None
    if queue == app.conf.task_default_queue:
        queue = None  # the run's own route
    run = benchmarks.benchmark_job_fire(job_id=job_id, queue=queue)
    return {"job": job_id, "run": run.pk if run is not None else None}


@app.task(name="shunter.platform.benchmark_runs_reap")  # type: ignore[untyped-decorator]
def benchmark_runs_reap_task() -> list[int]:
    """Fail the benchmark runs that no worker executes any longer (beat runs this)."""
    return benchmarks.benchmark_runs_reap()
