"""How a run ends when its target answers no request."""

from __future__ import annotations

import pytest

from shunter.platform.benchmarks import benchmark_job_create, benchmark_run_execute
from shunter.platform.benchmarks.runs import benchmark_run_start
from shunter.platform.models import BenchmarkRun
from tests.conftest import free_port

# Committed rows, as the worker sees them; serialized_rollback as every transactional
# test here, so the seeded rows come back and no later test finds them missing.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def test_a_run_whose_every_request_fails_fails_and_keeps_its_rows() -> None:
    job = benchmark_job_create(
        name="nobody-home",
        target_kind="url",
        base_url=f"http://127.0.0.1:{free_port()}/v1",  # nothing listens there
        model_name="m",
        input_len="8",
        output_len="4",
        rates=[4.0, 8.0],
        num_requests=3,
        request_timeout_s=5.0,
    )
    run = benchmark_run_start(job=job, queue="test-nobody-home")  # no worker takes it
    executed = benchmark_run_execute(key=str(run.key))
    run.refresh_from_db()
    assert executed.outcome == run.status == BenchmarkRun.Status.FAILED
    assert run.error.startswith("every request at 4 req/s failed; the first: ")
    # The failing rate's figures are kept; the next rate was not tried.
    assert [(r["request_rate"], r["completed"], r["failed"]) for r in run.results] == [(4.0, 0, 3)]
