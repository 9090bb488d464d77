"""Benchmark jobs (services): define a job, start, execute and cancel its runs.

The app, one concept per module: ``validation`` (what a job needs), ``jobs`` (job
services and their schedule), ``targets`` (what a run drives), ``lock`` (one run per
target), ``runs`` (start, fire, cancel), ``execution`` (running one), ``stopwatch``
(cancel and timeout), ``progress`` (results as they come), ``simulated`` (the
simulator's runs), ``results`` (export and comparison). Import from here.

A run goes queued -> running -> succeeded | failed | cancelled. ``benchmark_run_start``
creates it and enqueues ``benchmark_run_task`` after the transaction commits; the task
calls ``benchmark_run_execute``, which takes the run's target lock (one run per target
at a time: a node's engine, an external URL, a simulator job), drives the load
generator (``shunter.engine.loadgen``) or the simulator rate by rate, saves each rate's
results as it finishes, writes the per-request CSV under the var directory, and
releases the lock. A run whose target is busy stays queued: the task retries it later.
``benchmark_run_cancel`` stops a queued run at once and a running one within
``STOP_POLL_S`` (the load generator is cancelled; the simulator between simulations);
``BenchmarkJob.timeout_s`` bounds a run the same way. A run holds its target lock under
its own key, so a running run without it has no worker (it stopped): cancel ends it at
once, and ``benchmark_runs_reap`` (beat, every minute, and each time its job fires)
fails the runs running past ``timeout_s`` plus ``LOCK_MARGIN_S`` whose lock is gone,
and those still queued after ``QUEUED_REAP_S`` (a queued run may wait in the broker
behind other long runs far past its own timeout). Runs go to the ``benchmarks`` queue;
without a broker (eager mode) a run executes on a thread of the process that started
it.

A job's schedule is a django-celery-beat ``PeriodicTask`` (``benchmark-job:<id>``) that
the job services create, change and delete with the job; beat fires
``benchmark_job_fire_task``, which starts a run unless one is still queued or running.
"""

from shunter.benchmarks.execution import Executed, benchmark_run_execute
from shunter.benchmarks.jobs import (
    FIRE_TASK,
    benchmark_job_create,
    benchmark_job_delete,
    benchmark_job_update,
)
from shunter.benchmarks.lock import LOCK_MARGIN_S, LOCK_RETRY_S, LOCK_WAIT_S, target_busy
from shunter.benchmarks.progress import csv_path
from shunter.benchmarks.results import COMPARED_METRICS, run_comparison, run_export
from shunter.benchmarks.runs import (
    QUEUED_REAP_S,
    benchmark_job_fire,
    benchmark_run_cancel,
    benchmark_run_start,
    benchmark_runs_reap,
)
from shunter.benchmarks.stopwatch import STOP_POLL_S, Stopped
from shunter.benchmarks.targets import (
    BENCHMARK_TENANT,
    benchmark_key_create,
    job_config,
    job_slo,
    job_workload,
    target_label,
    target_lock_key,
)
from shunter.benchmarks.validation import JOB_FIELDS

__all__ = [
    "BENCHMARK_TENANT",
    "COMPARED_METRICS",
    "FIRE_TASK",
    "JOB_FIELDS",
    "LOCK_MARGIN_S",
    "LOCK_RETRY_S",
    "LOCK_WAIT_S",
    "QUEUED_REAP_S",
    "STOP_POLL_S",
    "Executed",
    "Stopped",
    "benchmark_job_create",
    "benchmark_job_delete",
    "benchmark_job_fire",
    "benchmark_job_update",
    "benchmark_key_create",
    "benchmark_run_cancel",
    "benchmark_run_execute",
    "benchmark_run_start",
    "benchmark_runs_reap",
    "csv_path",
    "job_config",
    "job_slo",
    "job_workload",
    "run_comparison",
    "run_export",
    "target_busy",
    "target_label",
    "target_lock_key",
]
