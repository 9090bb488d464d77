"""Executing a queued run: take its target's lock, drive the load generator or the
simulator rate by rate, record how it ended, release the lock."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from shunter.benchmarks.lock import LOCK_MARGIN_S, LOCK_WAIT_S, lock_acquire, lock_release
from shunter.benchmarks.progress import Progress
from shunter.benchmarks.simulated import simulate_job
from shunter.benchmarks.stopwatch import Stopped, StopWatch
from shunter.benchmarks.targets import job_slo, job_workload, run_target
from shunter.engine.loadgen.arrivals import ArrivalProcess
from shunter.engine.loadgen.runner import RateResult, run_async, run_rate_async
from shunter.engine.workload.requests import WorkloadError
from shunter.platform.models import BenchmarkJob, BenchmarkRun

log = logging.getLogger("shunter.benchmarks")
Kind = BenchmarkJob.TargetKind
Status = BenchmarkRun.Status


@dataclass(frozen=True)
class Executed:
    """What ``benchmark_run_execute`` did: ``waiting`` (the target is busy: try again),
    ``missing`` (no such run), or the run's status when it returned."""

    outcome: str
    run_id: int | None = None


def benchmark_run_execute(*, key: str) -> Executed:
    """Execute the queued run ``key`` if its target is free (see the module docstring).

    Returns ``waiting`` without changing anything while another run holds the target,
    until the run has waited ``LOCK_WAIT_S``; then it fails. A run that is no longer
    queued (cancelled, or delivered twice) is left alone.
    """
    run = BenchmarkRun.objects.select_related("job").filter(key=key).first()
    if run is None:
        return Executed("missing")
    if run.status != Status.QUEUED:
        return Executed(run.status, run.pk)
    token = str(run.key)  # the lock names its holder (see ``runs.benchmark_runs_reap``)
    if not lock_acquire(run.lock_key, token, run.job.timeout_s + LOCK_MARGIN_S):
        waited = (timezone.now() - run.created_at).total_seconds()
        if waited < LOCK_WAIT_S:
            return Executed("waiting", run.pk)
        finish_run(run.pk, Status.FAILED, error=f"The target stayed busy for {waited:.0f} s.")
        return Executed(Status.FAILED, run.pk)
    try:
        claimed = BenchmarkRun.objects.filter(pk=run.pk, status=Status.QUEUED).update(
            status=Status.RUNNING, started_at=timezone.now()
        )
        if not claimed:  # cancelled meanwhile
            return Executed(BenchmarkRun.objects.get(pk=run.pk).status, run.pk)
        status = _execute(run.pk)
    finally:
        lock_release(run.lock_key, token)
    return Executed(status, run.pk)


def finish_run(run_id: int, status: str, **fields: Any) -> None:
    BenchmarkRun.objects.filter(pk=run_id).update(
        status=status, finished_at=timezone.now(), **fields
    )


def _execute(run_id: int) -> str:
    """Run the claimed run ``run_id`` to its end and record how it ended."""
    run = BenchmarkRun.objects.select_related(
        "job__deployment__node", "job__deployment__model", "job__node", "job__slo_class"
    ).get(pk=run_id)
    job = run.job
    deadline = time.monotonic() + job.timeout_s
    progress = Progress(run)
    fields: dict[str, Any] = {"requests_csv": str(progress.path)}
    status: str = Status.SUCCEEDED
    try:
        with StopWatch(run_id, deadline) as watch:
            if job.target_kind == Kind.SIMULATOR:
                simulate_job(job, progress, watch)
            else:
                measure(job, run, progress, watch)
    except Stopped as stop:
        status = Status.CANCELLED if stop.reason == "cancelled" else Status.FAILED
        fields["error"] = (
            "Cancelled."
            if stop.reason == "cancelled"
            else f"Timed out after {job.timeout_s:g} s (the job's timeout_s)."
        )
    except (WorkloadError, ValueError, OSError) as e:
        status, fields["error"] = Status.FAILED, str(e)[:2000]
    except Exception as e:  # a worker must record any failure on the run
        log.exception("benchmark run %s failed", run_id)
        status, fields["error"] = Status.FAILED, f"{type(e).__name__}: {e}"[:2000]
    finally:
        progress.close()
    finish_run(run_id, status, results=progress.results, **fields)
    return status


def measure(job: BenchmarkJob, run: BenchmarkRun, progress: Progress, watch: StopWatch) -> None:
    """Drive a real server with the load generator, one rate after the other."""
    workload = job_workload(job)
    arrival = ArrivalProcess(job.burstiness)
    slo = job_slo(job)
    with run_target(job, run) as target:
        for rate in job.rates:
            watch.check()
            coro = run_rate_async(
                target,
                workload,
                float(rate),
                arrival=arrival,
                num_requests=job.num_requests,
                duration_s=job.duration_s,
                max_concurrency=job.max_concurrency,
                seed=job.seed,
                slo=slo,
                request_timeout_s=job.request_timeout_s,
            )
            result = run_async(watch.watch(coro))
            progress.add(run.target_label, result)
            _fail_if_nothing_completed(result)


def _fail_if_nothing_completed(result: RateResult) -> None:
    """A rate at which every request failed measured nothing but the failure (a wrong
    URL, key or model): the run fails with the first request's error, after its rows
    were kept."""
    failures = [r for r in result.requests if r.error_type is not None]
    if result.requests and len(failures) == len(result.requests):
        first = failures[0]
        raise ValueError(
            f"every request at {result.report.request_rate:g} req/s failed; the first: "
            f"{first.error_type}: {first.error}"
        )
