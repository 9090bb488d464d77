"""Django admin for benchmark jobs and runs. Saves go through the job services."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from shunter.benchmarks import services as benchmarks
from shunter.common.admin import ServiceAdmin, form_fields, form_secret
from shunter.platform.models import BenchmarkJob, BenchmarkRun


class BenchmarkJobForm(forms.ModelForm):  # type: ignore[type-arg]
    api_key = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="The url target's key: stored encrypted and never shown. Leave empty to "
        "keep the stored key.",
    )
    clear_api_key = forms.BooleanField(required=False, help_text="Remove the stored key.")

    class Meta:
        model = BenchmarkJob
        fields = sorted(benchmarks.JOB_FIELDS)
        help_texts = {"base_url": "deployment: the gateway's base URL; url: the server's."}


@admin.register(BenchmarkJob)
class BenchmarkJobAdmin(ServiceAdmin):
    """Jobs; the schedule fields drive the job's PeriodicTask (shown read-only here,
    also listed under Periodic tasks)."""

    form = BenchmarkJobForm
    list_display = ["name", "target_kind", "rates", "schedule", "enabled", "has_api_key"]
    list_filter = ["target_kind", "enabled"]
    search_fields = ["name", "description", "model_name"]
    readonly_fields = ["periodic_task", "created_at", "updated_at"]
    actions = ["run_now"]

    @admin.display(description="schedule")
    def schedule(self, job: BenchmarkJob) -> str:
        if job.schedule_every_s is not None:
            return f"every {job.schedule_every_s} s"
        return job.schedule_crontab or "-"

    def save_via_service(
        self,
        obj: BenchmarkJob,
        form: forms.ModelForm,  # type: ignore[type-arg]
        change: bool,
    ) -> BenchmarkJob:
        fields = form_fields(form, sorted(benchmarks.JOB_FIELDS))
        key = form_secret(form, "api_key")
        if change:
            return benchmarks.benchmark_job_update(
                job=BenchmarkJob.objects.get(pk=obj.pk), api_key=key, **fields
            )
        return benchmarks.benchmark_job_create(api_key=key or "", **fields)

    def delete_model(self, request: HttpRequest, obj: BenchmarkJob) -> None:
        benchmarks.benchmark_job_delete(job=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[BenchmarkJob]) -> None:
        for job in queryset:
            benchmarks.benchmark_job_delete(job=job)

    @admin.action(description="Run now")
    def run_now(self, request: HttpRequest, queryset: QuerySet[BenchmarkJob]) -> None:
        for job in queryset:
            run = benchmarks.benchmark_run_start(job=job)
            self.message_user(request, f"{job.name}: run {run.pk} queued.")


@admin.register(BenchmarkRun)
class BenchmarkRunAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Runs are made by jobs; here they are read, cancelled or deleted."""

    list_display = ["id", "job", "status", "trigger", "target_label", "simulated", "created_at"]
    list_filter = ["status", "trigger", "simulated", "job"]
    list_select_related = ["job"]
    readonly_fields = (
        "key",
        "job",
        "status",
        "trigger",
        "target_label",
        "lock_key",
        "simulated",
        "config",
        "results",
        "requests_csv",
        "error",
        "cancel_requested",
        "created_at",
        "started_at",
        "finished_at",
    )
    fields = readonly_fields
    actions = ["cancel"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Cancel")
    def cancel(self, request: HttpRequest, queryset: QuerySet[BenchmarkRun]) -> None:
        for run in queryset:
            benchmarks.benchmark_run_cancel(run=run)
            self.message_user(request, f"run {run.pk}: {run.status}")
