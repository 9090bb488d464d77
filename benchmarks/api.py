"""Benchmark jobs and runs in the admin API: job CRUD and "run now", runs with their
per-rate results, cancel, a JSON export, the per-request CSV, and the comparison of two
runs. Writes go through ``shunter.benchmarks.services``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.http import FileResponse
from django.urls import reverse
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from shunter.benchmarks import services as benchmarks
from shunter.common.api import ServiceErrorsMixin, ServiceModelViewSet, ServiceSerializer
from shunter.platform.models import BenchmarkJob, BenchmarkRun


class BenchmarkJobSerializer(ServiceSerializer):
    """A job. ``api_key`` (the ``url`` target's) is write-only: omit it to keep the
    stored one, send '' to clear it. ``periodic_task`` is the beat entry of its schedule."""

    api_key = serializers.CharField(
        write_only=True, required=False, allow_blank=True, max_length=4096
    )
    rates = serializers.ListField(
        child=serializers.FloatField(min_value=1e-6, max_value=1e6), min_length=1, max_length=64
    )
    simulator = serializers.JSONField(required=False)

    class Meta:
        model = BenchmarkJob
        fields = [
            "id",
            *benchmarks.JOB_FIELDS,
            "api_key",
            "has_api_key",
            "periodic_task",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["has_api_key", "periodic_task", "created_at", "updated_at"]
        extra_kwargs = {
            "burstiness": {"min_value": 1e-3, "max_value": 1e3},
            "ttft_slo_ms": {"max_value": 1e9},
            "tpot_slo_ms": {"max_value": 1e9},
        }

    def create_service(self, **fields: Any) -> BenchmarkJob:
        return benchmarks.benchmark_job_create(**fields)

    def update_service(self, instance: BenchmarkJob, **fields: Any) -> BenchmarkJob:
        return benchmarks.benchmark_job_update(job=instance, **fields)


class BenchmarkRunSerializer(serializers.ModelSerializer[BenchmarkRun]):
    """A run. ``results``: one object per series (the target, or a simulated policy or
    variant) and rate, with the load generator's vLLM-named fields."""

    job_name = serializers.CharField(source="job.name", read_only=True)
    has_requests_csv = serializers.SerializerMethodField()

    class Meta:
        model = BenchmarkRun
        fields = [
            "id",
            "job",
            "job_name",
            "status",
            "trigger",
            "target_label",
            "simulated",
            "config",
            "results",
            "error",
            "cancel_requested",
            "has_requests_csv",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_has_requests_csv(self, run: BenchmarkRun) -> bool:
        return bool(run.requests_csv)


class ComparisonSerializer(serializers.Serializer[Any]):
    a = serializers.IntegerField()
    b = serializers.IntegerField()
    metrics = serializers.ListField(child=serializers.CharField())
    rows = serializers.ListField(child=serializers.DictField())


class BenchmarkJobFilter(filters.FilterSet):  # type: ignore[misc]
    class Meta:
        model = BenchmarkJob
        fields = ["name", "target_kind", "enabled", "deployment", "node"]


class BenchmarkJobViewSet(ServiceModelViewSet):
    """Benchmark jobs: a target, a workload, rates, SLOs and an optional schedule."""

    serializer_class = BenchmarkJobSerializer
    queryset = BenchmarkJob.objects.all()
    filterset_class = BenchmarkJobFilter

    def delete_service(self, instance: Any) -> None:
        benchmarks.benchmark_job_delete(job=instance)

    @extend_schema(request=None, responses={202: BenchmarkRunSerializer})
    @action(detail=True, methods=["post"])
    def run(self, request: Request, pk: Any = None) -> Response:
        """Start a run now (queued; a worker executes it when its target is free)."""
        run = benchmarks.benchmark_run_start(job=self.get_object())
        return Response(BenchmarkRunSerializer(run).data, status=status.HTTP_202_ACCEPTED)


class BenchmarkRunFilter(filters.FilterSet):  # type: ignore[misc]
    class Meta:
        model = BenchmarkRun
        fields = ["job", "status", "trigger", "simulated"]


RUN_ID = OpenApiParameter("a", OpenApiTypes.INT, required=True, description="The baseline run.")
OTHER_RUN_ID = OpenApiParameter("b", OpenApiTypes.INT, required=True, description="The other run.")


class BenchmarkRunViewSet(
    ServiceErrorsMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet[BenchmarkRun],
):
    """Runs of benchmark jobs (read-only but for cancel and delete)."""

    serializer_class = BenchmarkRunSerializer
    queryset = BenchmarkRun.objects.select_related("job")
    filterset_class = BenchmarkRunFilter

    @extend_schema(request=None, responses=BenchmarkRunSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: Any = None) -> Response:
        """Cancel the run: a queued one at once, a running one within a second."""
        run = benchmarks.benchmark_run_cancel(run=self.get_object())
        return Response(BenchmarkRunSerializer(run).data)

    @extend_schema(responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["get"])
    def export(self, request: Request, pk: Any = None) -> Response:
        """The run as one JSON document (a download): its job, settings and results."""
        run = self.get_object()
        requests_url = request.build_absolute_uri(
            reverse("benchmarkrun-requests-csv", args=[run.pk])
        )
        response = Response(benchmarks.run_export(run, requests_url=requests_url))
        response["Content-Disposition"] = (
            f'attachment; filename="benchmark-{run.job.name}-{run.pk}.json"'
        )
        return response

    @extend_schema(responses={(200, "text/csv"): OpenApiTypes.STR})
    @action(detail=True, methods=["get"], url_path="requests")
    def requests_csv(self, request: Request, pk: Any = None) -> FileResponse:
        """One CSV row per request of the run (404 until its first rate finished)."""
        run = self.get_object()
        path = Path(run.requests_csv) if run.requests_csv else None
        if path is None or not path.is_file():
            raise exceptions.NotFound("This run has no per-request rows (yet).")
        return FileResponse(
            path.open("rb"),
            content_type="text/csv",
            as_attachment=True,
            filename=f"benchmark-{run.job.name}-{run.pk}.csv",
        )

    @extend_schema(parameters=[RUN_ID, OTHER_RUN_ID], responses=ComparisonSerializer)
    @action(detail=False, methods=["get"])
    def compare(self, request: Request) -> Response:
        """Run ``b`` against run ``a``: per series and rate, each metric's two values,
        their difference and ratio."""
        runs = []
        for name in ("a", "b"):
            raw = request.query_params.get(name, "")
            if not raw.isdigit() or not 0 < int(raw) < 2**63:
                raise exceptions.ValidationError({name: "A run id (a positive integer)."})
            run = self.get_queryset().filter(pk=int(raw)).first()
            if run is None:
                raise exceptions.NotFound(f"No run {raw}.")
            runs.append(run)
        return Response(benchmarks.run_comparison(runs[0], runs[1]))
