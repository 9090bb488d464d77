"""Runs whose worker stopped: cancel ends them at once, and past their timeout they are
failed (by beat's reaper, or when their job fires) instead of blocking their job; a run
that waits in the broker behind long runs is not one of them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from shunter.benchmarks.lock import lock_acquire, lock_release
from shunter.benchmarks.services import (
    LOCK_MARGIN_S,
    LOCK_WAIT_S,
    QUEUED_REAP_S,
    benchmark_job_create,
    benchmark_job_fire,
    benchmark_run_cancel,
    benchmark_run_start,
    benchmark_runs_reap,
)
from shunter.platform.models import BenchmarkJob, BenchmarkRun
from shunter.project.celery import app

# Runs are never enqueued here: on_commit callbacks do not run inside a test's transaction.
pytestmark = pytest.mark.django_db
TIMEOUT_S = 60.0
PAST_TIMEOUT = timedelta(seconds=TIMEOUT_S + LOCK_MARGIN_S + 5)


@pytest.fixture
def job() -> BenchmarkJob:
    return benchmark_job_create(
        name="sim",
        target_kind="simulator",
        simulator={"model": "qwen2.5-7b", "hardware": "h100", "policies": ["lvf"]},
        rates=[1.0],
        duration_s=5.0,
        timeout_s=TIMEOUT_S,
    )


@pytest.fixture
def held() -> Iterator[list[tuple[str, str]]]:
    """Locks a test takes (``(lock_key, token)``), released at its end."""
    locks: list[tuple[str, str]] = []
    yield locks
    for lock_key, token in locks:
        lock_release(lock_key, token)


def hold(held: list[tuple[str, str]], lock_key: str, token: str) -> None:
    assert lock_acquire(lock_key, token, 60)
    held.append((lock_key, token))


def a_run(job: BenchmarkJob, status: str, age: timedelta = timedelta(0)) -> BenchmarkRun:
    """A run of ``job`` in ``status``, queued (and started, if running) ``age`` ago."""
    run = benchmark_run_start(job=job)
    since = timezone.now() - age
    started = since if status == BenchmarkRun.Status.RUNNING else None
    BenchmarkRun.objects.filter(pk=run.pk).update(
        status=status, created_at=since, started_at=started
    )
    run.refresh_from_db()
    return run


def test_cancelling_a_running_run_that_no_worker_holds_ends_it_at_once(
    job: BenchmarkJob,
) -> None:
    run = benchmark_run_cancel(run=a_run(job, "running"))
    assert run.status == "cancelled" and run.cancel_requested
    assert run.finished_at is not None and run.error.startswith("Cancelled")


def test_cancelling_a_run_its_worker_executes_asks_the_worker_to_stop(
    job: BenchmarkJob, held: list[tuple[str, str]]
) -> None:
    run = a_run(job, "running")
    hold(held, run.lock_key, str(run.key))
    run = benchmark_run_cancel(run=run)
    assert run.status == "running" and run.cancel_requested and run.finished_at is None


def test_cancelling_a_queued_run_ends_it_at_once(job: BenchmarkJob) -> None:
    run = benchmark_run_cancel(run=a_run(job, "queued"))
    assert run.status == "cancelled" and run.cancel_requested
    assert run.finished_at is not None and run.error == "Cancelled."


def test_running_runs_past_their_timeout_without_their_lock_are_failed(
    job: BenchmarkJob, held: list[tuple[str, str]]
) -> None:
    dead = a_run(job, "running", PAST_TIMEOUT)
    young = a_run(job, "running", timedelta(seconds=TIMEOUT_S))
    alive = a_run(job, "running", PAST_TIMEOUT)
    hold(held, alive.lock_key, str(alive.key))  # its worker holds the target
    assert benchmark_runs_reap() == [dead.pk]
    dead.refresh_from_db()
    assert dead.status == "failed" and dead.finished_at is not None
    assert dead.error.startswith("The worker stopped: the run was still running")
    assert {r.status for r in BenchmarkRun.objects.filter(pk__in=[young.pk, alive.pk])} == {
        "running"
    }


def test_a_run_waiting_in_the_broker_past_its_timeout_is_not_reaped(job: BenchmarkJob) -> None:
    # Two long runs hold the benchmark workers; this one waits behind them, its target
    # free, for far longer than its own timeout.
    waiting = a_run(job, "queued", timedelta(seconds=10 * (TIMEOUT_S + LOCK_MARGIN_S)))
    behind_busy_target = a_run(job, "queued", timedelta(seconds=LOCK_WAIT_S))
    assert benchmark_runs_reap() == []
    assert {
        r.status for r in BenchmarkRun.objects.filter(pk__in=[waiting.pk, behind_busy_target.pk])
    } == {"queued"}


def test_a_run_queued_longer_than_any_wait_is_failed(job: BenchmarkJob) -> None:
    assert QUEUED_REAP_S > LOCK_WAIT_S + LOCK_MARGIN_S  # past the worker's own give-up
    lost = a_run(job, "queued", timedelta(seconds=QUEUED_REAP_S + 5))
    assert benchmark_runs_reap(job_id=job.pk) == [lost.pk]
    lost.refresh_from_db()
    assert lost.status == "failed" and lost.finished_at is not None
    assert lost.error.startswith("The worker stopped: the run was still queued")


def test_a_dead_workers_run_no_longer_blocks_its_schedule(job: BenchmarkJob) -> None:
    busy = a_run(job, "running")
    assert benchmark_job_fire(job_id=job.pk) is None  # the previous run may still be going
    BenchmarkRun.objects.filter(pk=busy.pk).update(started_at=timezone.now() - PAST_TIMEOUT)
    fired = benchmark_job_fire(job_id=job.pk)
    assert fired is not None and fired.status == "queued" and fired.trigger == "schedule"
    busy.refresh_from_db()
    assert busy.status == "failed" and "worker stopped" in busy.error


def test_beat_reaps_runs_every_minute_on_the_default_queue() -> None:
    (entry,) = [e for e in app.conf.beat_schedule.values() if e["task"].endswith("_reap")]
    assert entry["task"] == "shunter.platform.benchmark_runs_reap" and entry["schedule"] == 60.0
    route = app.amqp.router.route({}, entry["task"])
    assert route["queue"].name == app.conf.task_default_queue
