"""Benchmark jobs and runs in the admin API: CRUD, validation per target kind as 400s,
the url target's key write-only, run now (202, enqueued after commit), cancel, export,
the comparison of two runs, staff only."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from shunter.platform.models import BenchmarkJob, BenchmarkRun
from tests.platform.api.crud import CrudTests, HttpsApiClient
from tests.tenants.factories import make_deployment, make_node

pytestmark = pytest.mark.django_db


def sim_payload(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "sim",
        "target_kind": "simulator",
        "simulator": {"model": "qwen2.5-7b", "hardware": "h100", "policies": ["lvf"]},
        "rates": [1, 2, 4],
        "duration_s": 30,
    }
    body.update(fields)
    return body


class TestBenchmarkJobs(CrudTests):
    route = "benchmark-jobs"
    change = ("rates", [8.0, 16.0])

    def payload(self) -> dict[str, Any]:
        return sim_payload()

    def make(self, n: int) -> None:
        start = BenchmarkJob.objects.count()
        for i in range(n):
            BenchmarkJob.objects.create(name=f"j{start + i}", target_kind="url", rates=[1])

    @pytest.mark.parametrize(
        ("fields", "field"),
        [
            ({"target_kind": "engine"}, "node"),
            ({"target_kind": "url", "model_name": "m"}, "base_url"),
            ({"target_kind": "deployment", "base_url": "http://gw"}, "deployment"),
            ({"simulator": {"model": "gpt-9"}}, "simulator"),
            ({"simulator": {"model": "qwen2.5-7b", "policies": ["best"]}}, "simulator"),
            ({"simulator": {"scenario": "c9"}}, "simulator"),
            ({"simulator": {"model": "qwen2.5-7b", "hardware": ["h100"]}}, "simulator"),
            ({"rates": []}, "rates"),
            ({"rates": [0]}, "rates"),
            ({"duration_s": None}, "duration_s"),
            ({"num_requests": 10}, "num_requests"),
            ({"input_len": "lots"}, "input_len"),
            ({"output_len": "9..3"}, "output_len"),
            ({"workload_kind": "trace"}, "workload_kind"),
            ({"ttft_slo_ms": 100}, "tpot_slo_ms"),
            ({"schedule_every_s": 60, "schedule_crontab": "* * * * *"}, "schedule_crontab"),
            ({"schedule_crontab": "61 * * * *"}, "schedule_crontab"),
            ({"dataset_path": "a\x00b"}, "dataset_path"),
        ],
    )
    def test_invalid_jobs_are_400s_naming_the_field(
        self, api: HttpsApiClient, fields: dict[str, Any], field: str
    ) -> None:
        response = api.post(self.url(), sim_payload(**fields), format="json")
        assert response.status_code == 400, response.json()
        assert field in response.json(), response.json()

    def test_every_target_kind_is_accepted(self, api: HttpsApiClient) -> None:
        node = make_node()
        deployment = make_deployment(node=node)
        bodies = [
            {"target_kind": "engine", "node": node.pk, "model_name": "llama"},
            {"target_kind": "url", "base_url": "http://vllm:8000/v1", "model_name": "m"},
            {"target_kind": "deployment", "deployment": deployment.pk, "base_url": "https://gw"},
        ]
        for i, extra in enumerate(bodies):
            body = {**sim_payload(name=f"job-{i}", simulator={}), **extra}
            response = api.post(self.url(), body, format="json")
            assert response.status_code == 201, response.json()

    def test_the_url_key_is_write_only_and_stored_encrypted(self, api: HttpsApiClient) -> None:
        body = sim_payload(
            target_kind="url", base_url="http://vllm:8000", model_name="m", api_key="sk-vllm-1"
        )
        created = api.post(self.url(), body, format="json").json()
        assert "api_key" not in created and created["has_api_key"] is True
        job = BenchmarkJob.objects.get(pk=created["id"])
        assert job.api_key() == "sk-vllm-1" and "sk-vllm-1" not in job.api_key_encrypted
        assert "sk-vllm-1" not in json.dumps(api.get(self.url(job.pk)).json())
        api.patch(self.url(job.pk), {"api_key": ""}, format="json")
        job.refresh_from_db()
        assert not job.has_api_key

    def test_a_schedule_is_a_periodic_task_removed_with_the_job(self, api: HttpsApiClient) -> None:
        from django_celery_beat.models import PeriodicTask

        created = api.post(self.url(), sim_payload(schedule_every_s=300), format="json").json()
        task = PeriodicTask.objects.get(pk=created["periodic_task"])
        assert json.loads(task.kwargs) == {"job_id": created["id"]}
        api.patch(self.url(created["id"]), {"enabled": False}, format="json")
        task.refresh_from_db()
        assert not task.enabled
        assert api.delete(self.url(created["id"])).status_code == 204
        assert not PeriodicTask.objects.filter(pk=task.pk).exists()

    def test_run_now_is_202_and_enqueued_after_commit(
        self, api: HttpsApiClient, django_capture_on_commit_callbacks: Any
    ) -> None:
        job_id = api.post(self.url(), sim_payload(), format="json").json()["id"]
        with django_capture_on_commit_callbacks() as callbacks:
            response = api.post(self.url(job_id) + "run/")
        assert response.status_code == 202
        body = response.json()
        assert body["status"] == "queued" and body["simulated"] is True
        assert body["config"]["rates"] == [1.0, 2.0, 4.0]
        assert body["config"]["ttft_slo_ms"] == 5000.0  # the engine's default SLOs
        assert len(callbacks) == 1
        assert api.post(self.url(999999) + "run/").status_code == 404


def make_run(job: BenchmarkJob, results: list[dict[str, Any]], **fields: Any) -> BenchmarkRun:
    return BenchmarkRun.objects.create(key=uuid.uuid4(), job=job, results=results, **fields)


def row(series: str, rate: Any, ttft: float | None, attainment: float) -> dict[str, Any]:
    return {
        "series": series,
        "request_rate": rate,
        "p99_ttft_ms": ttft,
        "slo_attainment": attainment,
    }


@pytest.fixture
def api() -> HttpsApiClient:
    from tests.platform.api.crud import staff_client

    return staff_client()


@pytest.fixture
def job() -> BenchmarkJob:
    return BenchmarkJob.objects.create(name="j", target_kind="url", rates=[1])


def test_runs_list_detail_cancel_and_delete(api: HttpsApiClient, job: BenchmarkJob) -> None:
    queued = make_run(job, [])
    done = make_run(job, [row("t", 1.0, 10.0, 1.0)], status="succeeded")
    listed = api.get("/api/benchmark-runs/", {"job": job.pk, "status": "queued"}).json()
    assert [r["id"] for r in listed["results"]] == [queued.pk]
    cancelled = api.post(f"/api/benchmark-runs/{queued.pk}/cancel/").json()
    assert cancelled["status"] == "cancelled" and cancelled["error"] == "Cancelled."
    # A finished run stays as it ended.
    assert api.post(f"/api/benchmark-runs/{done.pk}/cancel/").json()["status"] == "succeeded"
    assert api.post("/api/benchmark-runs/", {}, format="json").status_code == 405
    assert api.get(f"/api/benchmark-runs/{done.pk}/requests/").status_code == 404
    assert api.delete(f"/api/benchmark-runs/{done.pk}/").status_code == 204


def test_export_is_one_json_document(api: HttpsApiClient, job: BenchmarkJob) -> None:
    run = make_run(job, [row("t", 1.0, 10.0, 1.0)], status="succeeded", config={"rates": [1]})
    response = api.get(f"/api/benchmark-runs/{run.pk}/export/")
    assert "attachment" in response["Content-Disposition"]
    body = response.json()
    assert body["label"] == "MEASURED" and body["config"] == {"rates": [1]}
    assert body["run"]["id"] == run.pk and body["results"] == run.results
    assert body["requests"]["csv"] is None  # no per-request rows yet


def test_export_points_to_the_csv_for_per_request_detail(
    api: HttpsApiClient, job: BenchmarkJob
) -> None:
    # A run stored with its per-request errors (as runs once were): the export leaves them out.
    stored = {**row("t", 1.0, 10.0, 0.5), "errors": ["", "timeout"], "error_counts": {"timeout": 1}}
    run = make_run(job, [stored], status="succeeded", requests_csv="/nonexistent/run.csv")
    body = api.get(f"/api/benchmark-runs/{run.pk}/export/").json()
    assert body["results"] == [{k: v for k, v in stored.items() if k != "errors"}]
    assert body["requests"]["csv"].endswith(f"/api/benchmark-runs/{run.pk}/requests/")
    assert body["requests"]["left_out"] == ["errors"]


def test_compare_pairs_series_and_rates(api: HttpsApiClient, job: BenchmarkJob) -> None:
    a = make_run(job, [row("vllm", 1.0, 100.0, 0.8), row("vllm", "inf", 900.0, 0.1)])
    b = make_run(job, [row("shunter", 1.0, 50.0, 0.9), row("shunter", 2.0, 80.0, 0.7)])
    body = api.get("/api/benchmark-runs/compare/", {"a": a.pk, "b": b.pk}).json()
    assert body["a"] == a.pk and body["b"] == b.pk
    (only,) = body["rows"]  # rate 1 is the one both runs have
    assert (only["series_a"], only["series_b"], only["request_rate"]) == ("vllm", "shunter", 1.0)
    assert only["p99_ttft_ms"] == {"a": 100.0, "b": 50.0, "delta": -50.0, "ratio": 0.5}
    assert only["mean_tpot_ms"] == {"a": None, "b": None, "delta": None, "ratio": None}
    assert api.get("/api/benchmark-runs/compare/", {"a": a.pk}).status_code == 400
    assert api.get("/api/benchmark-runs/compare/", {"a": a.pk, "b": 999999}).status_code == 404


def test_non_staff_are_refused(job: BenchmarkJob) -> None:
    run = make_run(job, [])
    user = get_user_model().objects.create_user("plain", password="p" * 20)
    plain = HttpsApiClient()
    plain.force_authenticate(user)
    anonymous = HttpsApiClient()
    for client in (plain, anonymous):
        assert client.get("/api/benchmark-runs/").status_code in (401, 403)
        assert client.post(f"/api/benchmark-jobs/{job.pk}/run/").status_code in (401, 403)
        assert client.post(f"/api/benchmark-runs/{run.pk}/cancel/").status_code in (401, 403)
    run.refresh_from_db()
    assert run.status == "queued" and not BenchmarkRun.objects.exclude(pk=run.pk).exists()
