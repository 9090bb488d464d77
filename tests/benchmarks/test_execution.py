"""How a run ends: every request failing, its timeout, a target that stays busy, a
simulator scenario run to its end; and without a broker a run does not hold up the
request that started it."""

from __future__ import annotations

import csv
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shunter.benchmarks import services as benchmarks
from shunter.benchmarks.lock import lock_acquire, lock_release
from shunter.benchmarks.runs import benchmark_run_start
from shunter.benchmarks.services import (
    benchmark_job_create,
    benchmark_run_execute,
    run_export,
)
from shunter.benchmarks.tasks import benchmark_run_task
from shunter.platform.models import BenchmarkJob, BenchmarkRun
from shunter.project.celery import app
from tests.conftest import free_port
from tests.platform.api.crud import staff_client
from tests.waiting import wait_for

# Committed rows, as the worker sees them; serialized_rollback as every transactional
# test here, so the seeded rows come back and no later test finds them missing.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)
NO_WORKER = "test-no-worker"  # a queue no worker consumes: these tests execute runs


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A server that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def url_job(name: str, base_url: str, **fields: Any) -> BenchmarkJob:
    values: dict[str, Any] = {
        "target_kind": "url",
        "base_url": base_url,
        "model_name": "m",
        "input_len": "8",
        "output_len": "4",
        "rates": [4.0],
        "num_requests": 3,
        **fields,
    }
    return benchmark_job_create(name=name, **values)


def test_a_run_whose_every_request_fails_fails_and_keeps_its_rows() -> None:
    job = url_job(
        "nobody-home",
        f"http://127.0.0.1:{free_port()}/v1",  # nothing listens there
        rates=[4.0, 8.0],
        request_timeout_s=5.0,
    )
    run = benchmark_run_start(job=job, queue=NO_WORKER)
    executed = benchmark_run_execute(key=str(run.key))
    run.refresh_from_db()
    assert executed.outcome == run.status == BenchmarkRun.Status.FAILED
    assert run.error.startswith("every request at 4 req/s failed; the first: ")
    # The failing rate's figures are kept; the next rate was not tried.
    assert [(r["request_rate"], r["completed"], r["failed"]) for r in run.results] == [(4.0, 0, 3)]
    # Counts of errors by kind are stored; each request's error is in the CSV only.
    (stored,) = run.results
    assert "errors" not in stored and sum(stored["error_counts"].values()) == 3
    with Path(run.requests_csv).open() as f:
        rows = list(csv.DictReader(f))
    assert [r["index"] for r in rows] == ["0", "1", "2"]
    assert all(r["success"] == "False" and r["error_type"] and r["error"] for r in rows)
    assert {r["error_type"] for r in rows} == set(stored["error_counts"])


def test_a_run_past_its_timeout_fails_and_frees_its_target(silent_url: str) -> None:
    job = url_job("too-slow", silent_url, timeout_s=1.0, request_timeout_s=600.0)
    run = benchmark_run_start(job=job, queue=NO_WORKER)
    started = time.monotonic()
    executed = benchmark_run_execute(key=str(run.key))
    run.refresh_from_db()
    assert executed.outcome == run.status == "failed"
    assert run.error == "Timed out after 1 s (the job's timeout_s)."
    assert 1.0 <= time.monotonic() - started < 30  # not the requests' 600 s
    assert not benchmarks.target_busy(run.lock_key)


def test_a_run_whose_target_stays_busy_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shunter.benchmarks.execution.LOCK_WAIT_S", 0.5)
    monkeypatch.setattr(benchmarks, "LOCK_RETRY_S", 0.05)
    job = url_job("busy", f"http://127.0.0.1:{free_port()}/v1")
    run = benchmark_run_start(job=job, queue=NO_WORKER)
    assert lock_acquire(run.lock_key, "another run", 60)
    try:
        assert benchmark_run_execute(key=str(run.key)).outcome == "waiting"
        # The task waits and retries (in-process: here) until the wait is over.
        done = benchmark_run_task.apply(args=[str(run.key)]).get()
    finally:
        lock_release(run.lock_key, "another run")
    run.refresh_from_db()
    assert done == {"run": run.pk, "status": "failed"} and run.status == "failed"
    assert "target stayed busy" in run.error and run.started_at is None


def test_a_simulator_scenario_runs_to_its_end_and_stores_its_results() -> None:
    job = benchmark_job_create(
        name="scenario",
        target_kind="simulator",
        simulator={"scenario": "c2", "variants": ["none", "combined"], "window_s": 5.0},
        rates=[2.0],
        duration_s=3.0,
        input_len="64..256",
        output_len="16..64",
    )
    run = benchmark_run_start(job=job, queue=NO_WORKER)
    assert benchmark_run_execute(key=str(run.key)).outcome == "succeeded"
    run.refresh_from_db()
    assert run.status == "succeeded" and run.simulated and run.error == ""
    assert run.target_label == "scenario c2 (simulated)"
    assert [r["series"] for r in run.results] == ["none (temporal)", "combined (temporal)"]
    for row in run.results:
        assert row["request_rate"] == 2.0 and row["num_prompts"] > 0
        assert row["completed"] + row["failed"] == row["num_prompts"]
        assert "errors" not in row  # one per request: in the CSV
        assert 0.0 <= row["slo_attainment"] <= 1.0
    with Path(run.requests_csv).open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == sum(r["num_prompts"] for r in run.results)
    assert {r["series"] for r in rows} == {"none (temporal)", "combined (temporal)"}
    export = run_export(run)
    assert export["label"] == "SIMULATED" and export["results"] == run.results
    assert export["requests"]["left_out"] == ["errors"]


def test_without_a_broker_run_now_returns_while_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch, silent_url: str
) -> None:
    monkeypatch.setitem(app.conf, "task_always_eager", True)  # the embedded default
    # Ran inside the request, the run would end there, by its timeout, and fail.
    job = url_job("embedded", silent_url, request_timeout_s=600.0, timeout_s=30.0)
    api = staff_client()
    response = api.post(f"/api/benchmark-jobs/{job.pk}/run/")
    assert response.status_code == 202
    run = BenchmarkRun.objects.get(pk=response.json()["id"])
    assert run.status in {"queued", "running"}  # it cannot end: nothing answers
    thread_name = f"benchmark-run-{run.key}"
    assert thread_name in {t.name for t in threading.enumerate()}
    wait_for(lambda: benchmarks.target_busy(run.lock_key), 30, "the run to take its target")
    assert api.post(f"/api/benchmark-runs/{run.pk}/cancel/").status_code == 200
    wait_for(
        lambda: thread_name not in {t.name for t in threading.enumerate()}, 30, "the run to end"
    )
    run.refresh_from_db()
    assert run.status == "cancelled" and run.error == "Cancelled."
