"""The console's Benchmarks page: jobs and runs, run now, schedule edits through the
services (the PeriodicTask follows), cancel, charts of one run or two compared."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.test import Client
from django_celery_beat.models import PeriodicTask

from shunter.benchmarks.services import benchmark_job_create
from shunter.platform.models import BenchmarkJob, BenchmarkRun

pytestmark = pytest.mark.django_db


def sim_job(name: str = "sim", **fields: Any) -> BenchmarkJob:
    values: dict[str, Any] = {
        "name": name,
        "target_kind": "simulator",
        "simulator": {"model": "qwen2.5-7b", "hardware": "h100", "policies": ["lvf", "fcfs"]},
        "rates": [1.0, 2.0],
        "duration_s": 10.0,
    }
    values.update(fields)
    return benchmark_job_create(**values)


def result(series: str, rate: float, attainment: float, ttft: float) -> dict[str, Any]:
    return {
        "series": series,
        "request_rate": rate,
        "completed": 10,
        "failed": 0,
        "slo_attainment": attainment,
        "ttft_attainment": attainment,
        "tbt_attainment": 1.0,
        "median_ttft_ms": ttft,
        "p90_ttft_ms": ttft * 2,
        "p99_ttft_ms": ttft * 3,
        "median_tpot_ms": 10.0,
        "p90_tpot_ms": 12.0,
        "p99_tpot_ms": 15.0,
        "request_throughput": rate,
    }


def finished_run(job: BenchmarkJob, results: list[dict[str, Any]]) -> BenchmarkRun:
    return BenchmarkRun.objects.create(
        key=uuid.uuid4(),
        job=job,
        status="succeeded",
        target_label="qwen2.5-7b on h100 (simulated)",
        simulated=True,
        results=results,
    )


def figure(body: str, name: str) -> dict[str, Any]:
    start = body.index(f'id="{name}"')
    text = body[body.index(">", start) + 1 : body.index("</script>", start)]
    return dict(json.loads(text))


def test_a_run_is_charted_one_line_per_series(staff_client: Client) -> None:
    job = sim_job()
    run = finished_run(
        job,
        [
            result("lvf", 1.0, 1.0, 100.0),
            result("lvf", 2.0, 0.9, 200.0),
            result("fcfs", 1.0, 1.0, 100.0),
            result("fcfs", 2.0, 0.5, 900.0),
        ],
    )
    body = staff_client.get("/console/benchmarks/").content.decode()
    assert 'id="no-benchmarks"' not in body
    assert f'id="job-{job.pk}"' in body and f'id="run-{run.pk}"' in body
    assert "is SIMULATED" in body
    attainment = figure(body, "fig-attainment")
    joint = [t for t in attainment["data"] if t["name"].endswith("· both")]
    assert [t["name"] for t in joint] == ["lvf · both", "fcfs · both"]
    assert joint[1]["x"] == [1.0, 2.0] and joint[1]["y"] == [1.0, 0.5]
    ttft = figure(body, "fig-ttft")
    p99 = [t for t in ttft["data"] if t["name"] == "fcfs · TTFT P99"]
    assert p99[0]["y"] == [300.0, 2700.0]
    assert f"/api/benchmark-runs/{run.pk}/export/" in body


def test_two_runs_are_compared(staff_client: Client) -> None:
    job = sim_job()
    a = finished_run(job, [result("lvf", 1.0, 0.8, 100.0)])
    b = finished_run(job, [result("lvf", 1.0, 0.9, 50.0)])
    body = staff_client.get(f"/console/benchmarks/?a={a.pk}&b={b.pk}").content.decode()
    assert f"Run #{b.pk} against run #{a.pk}" in body
    names = {t["name"] for t in figure(body, "fig-attainment")["data"]}
    assert {f"#{a.pk} lvf · both", f"#{b.pk} lvf · both"} <= names
    table = body[body.index('id="comparison"') :]
    row = table[table.index("<td>p99_ttft_ms</td>") :].split("</tr>")[0]
    assert "300.000" in row and "150.000" in row and "-150.000" in row and "0.500" in row


def test_run_now_queues_a_run(
    staff_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    job = sim_job()
    with django_capture_on_commit_callbacks() as callbacks:
        response = staff_client.post(f"/console/benchmarks/jobs/{job.pk}/run/")
    run = BenchmarkRun.objects.get(job=job)
    assert response.status_code == 302 and response["Location"].endswith(f"?run={run.pk}")
    assert run.status == "queued" and run.trigger == "manual" and run.simulated
    assert len(callbacks) == 1  # the enqueue, after the commit


def test_the_schedule_is_edited_and_the_periodic_task_follows(staff_client: Client) -> None:
    job = sim_job()
    assert job.periodic_task is None
    url = f"/console/benchmarks/jobs/{job.pk}/schedule/"
    staff_client.post(url, {"schedule_every_s": "60", "enabled": "on"})
    job.refresh_from_db()
    task = PeriodicTask.objects.get(pk=job.periodic_task_id)
    assert task.interval.every == 60 and task.enabled and task.crontab is None
    staff_client.post(url, {"schedule_crontab": "30 2 * * 1"})
    task.refresh_from_db()
    assert task.interval is None and task.crontab.hour == "2" and not task.enabled
    page = staff_client.post(url, {"schedule_crontab": "every day"}, follow=True)
    assert "schedule not changed" in page.content.decode()
    task.refresh_from_db()
    assert task.crontab.hour == "2"
    staff_client.post(url, {"schedule_every_s": "", "schedule_crontab": ""})
    job.refresh_from_db()
    assert job.periodic_task is None and not PeriodicTask.objects.filter(pk=task.pk).exists()


def test_cancel_ends_a_queued_run(staff_client: Client) -> None:
    run = BenchmarkRun.objects.create(key=uuid.uuid4(), job=sim_job())
    assert f'action="/console/benchmarks/runs/{run.pk}/cancel/"' in (
        staff_client.get("/console/benchmarks/").content.decode()
    )
    staff_client.post(f"/console/benchmarks/runs/{run.pk}/cancel/")
    run.refresh_from_db()
    assert run.status == "cancelled" and run.finished_at is not None


def test_non_staff_are_sent_to_the_login(user_client: Client) -> None:
    job = sim_job()
    for response in (
        user_client.get("/console/benchmarks/"),
        user_client.post(f"/console/benchmarks/jobs/{job.pk}/run/"),
    ):
        assert response.status_code == 302 and "/console/login/" in response["Location"]
    assert not BenchmarkRun.objects.exists()


def test_the_page_costs_a_fixed_number_of_queries(
    staff_client: Client, django_assert_max_num_queries: Any
) -> None:
    for i in range(12):
        job = sim_job(f"job-{i}")
        finished_run(job, [result("lvf", 1.0, 1.0, 100.0)])
    with django_assert_max_num_queries(4):
        assert staff_client.get("/console/benchmarks/").status_code == 200
