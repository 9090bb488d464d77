"""Run services: start a run (enqueued after commit), fire a scheduled one, cancel, and
fail the runs that no worker executes any longer."""

from __future__ import annotations

import threading
import uuid

from django.db import connections, transaction
from django.utils import timezone

from shunter.platform.benchmarks.lock import LOCK_MARGIN_S, lock_held_by, target_busy
from shunter.platform.benchmarks.targets import job_config, target_label, target_lock_key
from shunter.platform.models import BenchmarkJob, BenchmarkRun

Kind = BenchmarkJob.TargetKind
Status = BenchmarkRun.Status


def _enqueue_on_commit(run: BenchmarkRun, queue: str | None) -> None:
    key = str(run.key)

    def enqueue() -> None:
        from shunter.platform.tasks import benchmark_run_task  # tasks import services

        if benchmark_run_task.app.conf.task_always_eager:
            # No broker (the embedded default): a run lasts minutes, so it runs on a
            # thread of its own and the request that started it returns at once.
            name = f"benchmark-run-{key}"
            threading.Thread(target=_run_in_process, args=(key,), name=name, daemon=True).start()
        else:
            benchmark_run_task.apply_async(args=[key], queue=queue)

    transaction.on_commit(enqueue)


def _run_in_process(key: str) -> None:
    from shunter.platform.tasks import benchmark_run_task

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
    return their ids: a run queued or running for longer than its job's ``timeout_s``
    plus ``LOCK_MARGIN_S`` whose lock is gone (a running run no longer holds its
    target; a queued one's target is free, yet it was not taken). A live worker never
    leaves such a run: it stops a run at ``timeout_s`` and holds the lock until then."""
    now = timezone.now()
    runs = BenchmarkRun.objects.select_related("job").filter(
        status__in=[Status.QUEUED, Status.RUNNING]
    )
    if job_id is not None:
        runs = runs.filter(job_id=job_id)
    reaped = []
    for run in runs:
        since = run.started_at if run.status == Status.RUNNING else run.created_at
        age = (now - (since or run.created_at)).total_seconds()
        if age <= run.job.timeout_s + LOCK_MARGIN_S:
            continue
        if run.status == Status.RUNNING:
            if lock_held_by(run.lock_key, str(run.key)):
                continue
        elif target_busy(run.lock_key):  # it may be waiting for the target
            continue
        error = (
            f"The worker stopped: the run was still {run.status} {age:.0f} s after it "
            f"{'started' if run.status == Status.RUNNING else 'was queued'} (its timeout "
            f"is {run.job.timeout_s:g} s) and no worker held its target."
        )
        if BenchmarkRun.objects.filter(pk=run.pk, status=run.status).update(
            status=Status.FAILED, finished_at=now, error=error
        ):
            reaped.append(run.pk)
    return reaped
