"""Celery tasks of benchmark runs: thin, ids in, a job service call, a small summary out.
Their names are those the broker's queued messages and beat's schedule already carry."""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task

from shunter.benchmarks import services as benchmarks


@shared_task(name="shunter.platform.benchmark_run", bind=True, max_retries=None)  # type: ignore[untyped-decorator]
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


@shared_task(name=benchmarks.FIRE_TASK, bind=True)  # type: ignore[untyped-decorator]
def benchmark_job_fire_task(self: Any, job_id: int) -> dict[str, Any]:
    """Beat's entry for a scheduled job: start a run on the benchmark queue, or on the
    queue this came from if an operator gave the schedule one."""
    queue = (self.request.delivery_info or {}).get("routing_key") or None
    if queue == self.app.conf.task_default_queue:
        queue = None  # the run's own route
    run = benchmarks.benchmark_job_fire(job_id=job_id, queue=queue)
    return {"job": job_id, "run": run.pk if run is not None else None}


@shared_task(name="shunter.platform.benchmark_runs_reap")  # type: ignore[untyped-decorator]
def benchmark_runs_reap_task() -> list[int]:
    """Fail the benchmark runs that no worker executes any longer (beat runs this)."""
    return benchmarks.benchmark_runs_reap()
