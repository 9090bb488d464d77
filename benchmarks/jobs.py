"""Benchmark job services: create, change and delete a job; its schedule is a
django-celery-beat ``PeriodicTask`` (``benchmark-job:<id>``) kept in step with it."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import transaction
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from shunter.benchmarks.validation import check_fields, clean_job
from shunter.platform.models import BenchmarkJob

FIRE_TASK = "shunter.platform.benchmark_job_fire"


def _sync_schedule(job: BenchmarkJob) -> None:
    """Make the job's PeriodicTask match its schedule (none when it has no schedule).
    A queue an operator set on the PeriodicTask is kept."""
    task = job.periodic_task
    if not job.is_scheduled:
        if task is not None:
            job.periodic_task = None
            job.save(update_fields=["periodic_task"])
            task.delete()
        return
    if task is None:
        task = PeriodicTask(name=f"benchmark-job:{job.pk}", task=FIRE_TASK)
    task.kwargs = json.dumps({"job_id": job.pk})
    task.enabled = job.enabled
    task.description = f"Benchmark job {job.name}"
    if job.schedule_every_s is not None:
        task.interval, _ = IntervalSchedule.objects.get_or_create(
            every=job.schedule_every_s, period=IntervalSchedule.SECONDS
        )
        task.crontab = None
    else:
        minute, hour, day, month, weekday = job.schedule_crontab.split()
        task.crontab, _ = CrontabSchedule.objects.get_or_create(
            minute=minute,
            hour=hour,
            day_of_month=day,
            month_of_year=month,
            day_of_week=weekday,
            timezone=settings.TIME_ZONE,
        )
        task.interval = None
    task.save()
    if job.periodic_task_id != task.pk:
        job.periodic_task = task
        job.save(update_fields=["periodic_task"])


@transaction.atomic
def benchmark_job_create(*, api_key: str = "", **fields: Any) -> BenchmarkJob:
    """A new job from BenchmarkJob fields (keyword-only); ``api_key`` is the ``url``
    target's key, stored encrypted. Its schedule, if any, becomes a PeriodicTask."""
    check_fields(fields, "benchmark_job_create")
    return _save(BenchmarkJob(**fields), api_key)


@transaction.atomic
def benchmark_job_update(
    *, job: BenchmarkJob, api_key: str | None = None, **fields: Any
) -> BenchmarkJob:
    """Change a job; ``api_key`` None keeps the stored key, '' clears it. The
    PeriodicTask follows the schedule and ``enabled``."""
    check_fields(fields, "benchmark_job_update")
    for field, value in fields.items():
        setattr(job, field, value)
    return _save(job, api_key)


def _save(job: BenchmarkJob, api_key: str | None) -> BenchmarkJob:
    """Validate and save ``job`` with ``api_key`` (None: the stored one) and make its
    PeriodicTask follow."""
    if api_key is not None:
        job.set_api_key(api_key)
    clean_job(job)
    job.save()
    _sync_schedule(job)
    return job


@transaction.atomic
def benchmark_job_delete(*, job: BenchmarkJob) -> None:
    """Delete a job, its runs and its PeriodicTask (CSV files stay on disk)."""
    task = job.periodic_task
    job.delete()
    if task is not None:
        task.delete()
