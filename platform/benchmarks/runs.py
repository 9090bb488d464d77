"""Run services: start a run (enqueued after commit), fire a scheduled one, cancel."""

from __future__ import annotations

import uuid

from django.db import transaction
from django.utils import timezone

from shunter.platform.benchmarks.targets import job_config, target_label, target_lock_key
from shunter.platform.models import BenchmarkJob, BenchmarkRun

Kind = BenchmarkJob.TargetKind
Status = BenchmarkRun.Status


def _enqueue_on_commit(run: BenchmarkRun, queue: str | None) -> None:
    key = str(run.key)

    def enqueue() -> None:
        from shunter.platform.tasks import benchmark_run_task  # tasks import services

        benchmark_run_task.apply_async(args=[key], queue=queue)

    transaction.on_commit(enqueue)


@transaction.atomic
def benchmark_run_start(
    *,
    job: BenchmarkJob,
    trigger: str = BenchmarkRun.Trigger.MANUAL,
    queue: str | None = None,
) -> BenchmarkRun:
    """A queued run of ``job``, enqueued on ``queue`` (default: the default queue)
    once the transaction commits."""
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
    run is still queued or running (runs do not pile up behind a slow one)."""
    with transaction.atomic():
        job = BenchmarkJob.objects.select_for_update().filter(pk=job_id, enabled=True).first()
        if job is None:
            return None
        if job.runs.filter(status__in=[Status.QUEUED, Status.RUNNING]).exists():
            return None
        return benchmark_run_start(job=job, trigger=BenchmarkRun.Trigger.SCHEDULE, queue=queue)


@transaction.atomic
def benchmark_run_cancel(*, run: BenchmarkRun) -> BenchmarkRun:
    """Cancel ``run``: a queued run ends now; a running one is asked to stop and ends
    within ``STOP_POLL_S`` (a finished run is left as it is)."""
    now = timezone.now()
    BenchmarkRun.objects.filter(pk=run.pk, status=Status.QUEUED).update(
        status=Status.CANCELLED, cancel_requested=True, finished_at=now, error="Cancelled."
    )
    BenchmarkRun.objects.filter(pk=run.pk, status=Status.RUNNING).update(cancel_requested=True)
    run.refresh_from_db()
    return run
