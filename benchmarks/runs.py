"""Run services: start a run (enqueued after commit), fire a scheduled one, cancel, and
fail the runs that no worker executes any longer."""

from __future__ import annotations

import threading
import uuid

from django.db import connections, transaction
from django.utils import timezone

from shunter.benchmarks.lock import LOCK_MARGIN_S, lock_held_by
from shunter.benchmarks.targets import job_config, target_label, target_lock_key
from shunter.platform.models import BenchmarkJob, BenchmarkRun

Kind = BenchmarkJob.TargetKind
Status = BenchmarkRun.Status

# A queued run may wait in the broker behind other long runs (the ``benchmarks`` queue
# executes a few at a time) for much longer than its own timeout, and then for its
# target up to ``LOCK_WAIT_S`` (6 h): only a run queued this long was lost (its message
# or its worker), and the reaper fails it.
QUEUED_REAP_S = 24 * 3600.0


def _enqueue_on_commit(run: BenchmarkRun, queue: str | None) -> None:
    key = str(run.key)

    def enqueue() -> None:
        from shunter.benchmarks.tasks import benchmark_run_task  # tasks import services

        if benchmark_run_task.app.conf.task_always_eager:
            # No broker (the embedded default): a run lasts minutes, so it runs on a
            # thread of its own and the request that started it returns at once.
            name = f"benchmark-run-{key}"
            threading.Thread(target=_run_in_process, args=(key,), name=name, daemon=True).start()
        else:
            benchmark_run_task.apply_async(args=[key], queue=queue)

    transaction.on_commit(enqueue)


def _run_in_process(key: str) -> None:
    from shunter.benchmarks.tasks import benchmark_run_task

    try:
        benchmark_run_task.apply(args=[key])
    finally:
        connections.close_all()  # this thread's own


@transaction.atomic
def benchmark_run_start(
    *,
    job: BenchmarkJob,
    trigger: str = BenchmarkRun.Trigger.MANUAL,
    queue: str | None = None,
) -> BenchmarkRun:
    """A queued run of ``job``, enqueued once the transaction commits on ``queue``
    (default: the route of ``benchmark_run_task``, the ``benchmarks`` queue). Without a
    broker it runs in this process, on a thread of its own."""
    job = BenchmarkJob.objects.select_related("deployment__node", "deployment__model").get(
        pk=job.pk
    )
    run = BenchmarkRun.objects.create(
        key=uuid.uuid4(),
        job=job,
        trigger=trigger,
        target_label=target_label(job),
        lock_key=target_lock_key(job),
        simulated=job.target_kind == Kind.SIMULATOR,
        config=job_config(job),
    )
    _enqueue_on_commit(run, queue)
    return run


def benchmark_job_fire(*, job_id: int, queue: str | None = None) -> BenchmarkRun | None:
    """A scheduled start: none when the job is gone or disabled, or when its previous
    run is still queued or running (runs do not pile up behind a slow one). Runs of the
    job that no worker executes any longer are failed first (``benchmark_runs_reap``),
    so a dead worker's run does not block the schedule."""
    with transaction.atomic():
        job = BenchmarkJob.objects.select_for_update().filter(pk=job_id, enabled=True).first()
        if job is None:
            return None
        benchmark_runs_reap(job_id=job.pk)
        if job.runs.filter(status__in=[Status.QUEUED, Status.RUNNING]).exists():
            return None
        return benchmark_run_start(job=job, trigger=BenchmarkRun.Trigger.SCHEDULE, queue=queue)


@transaction.atomic
def benchmark_run_cancel(*, run: BenchmarkRun) -> BenchmarkRun:
    """Cancel ``run``: a queued run ends now, and so does a running one whose target
    lock it does not hold (no worker executes it: its worker stopped); a running one
    is asked to stop and ends within ``STOP_POLL_S`` (a finished run is left as it is)."""
    now = timezone.now()
    BenchmarkRun.objects.filter(pk=run.pk, status=Status.QUEUED).update(
        status=Status.CANCELLED, cancel_requested=True, finished_at=now, error="Cancelled."
    )
    running = BenchmarkRun.objects.filter(pk=run.pk, status=Status.RUNNING)
    # A worker holds the lock from before it marks the run running until after it
    # records the end, so a running run without it has no worker.
    if lock_held_by(run.lock_key, str(run.key)):
        running.update(cancel_requested=True)
    else:
        running.update(
            status=Status.CANCELLED,
            cancel_requested=True,
            finished_at=now,
            error="Cancelled (no worker was executing it).",
        )
    run.refresh_from_db()
    return run


def benchmark_runs_reap(*, job_id: int | None = None) -> list[int]:
    """Fail the runs (of ``job_id``, or all) that no worker executes any longer, and
    return their ids: a running run past its job's ``timeout_s`` plus ``LOCK_MARGIN_S``
    that no longer holds its target lock (a live worker stops a run at ``timeout_s``
    and holds the lock until then), and a run still queued ``QUEUED_REAP_S`` after it
    was queued (one waiting in the broker behind other runs, however long, is not one
    a worker dropped; the worker itself fails a run that waited ``LOCK_WAIT_S`` for
    its target)."""
    now = timezone.now()
    runs = BenchmarkRun.objects.select_related("job").filter(
        status__in=[Status.QUEUED, Status.RUNNING]
    )
    if job_id is not None:
        runs = runs.filter(job_id=job_id)
    reaped = []
    for run in runs:
        running = run.status == Status.RUNNING
        since = (run.started_at if running else None) or run.created_at
        age = (now - since).total_seconds()
        if running:
            if age <= run.job.timeout_s + LOCK_MARGIN_S or lock_held_by(run.lock_key, str(run.key)):
                continue
            error = (
                f"The worker stopped: the run was still running {age:.0f} s after it "
                f"started (its timeout is {run.job.timeout_s:g} s) and no longer held its "
                "target."
            )
        else:
            if age <= QUEUED_REAP_S:
                continue
            error = (
                f"The worker stopped: the run was still queued {age:.0f} s after it was "
                "queued; no worker took it."
            )
        if BenchmarkRun.objects.filter(pk=run.pk, status=run.status).update(
            status=Status.FAILED, finished_at=now, error=error
        ):
            reaped.append(run.pk)
    return reaped
