"""Django admin for the platform's models. Saves go through the services, so the admin
validates (HBM fit, model facts) and reconciles exactly as the API does."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from shunter.platform import benchmarks, services
from shunter.platform.login_throttle import ThrottledAuthenticationForm
from shunter.platform.models import (
    BenchmarkJob,
    BenchmarkRun,
    Deployment,
    Model,
    Node,
    SloClass,
    engine_token_validator,
)

# The admin's login counts failures with the console's (one throttle for both).
admin.site.login_form = ThrottledAuthenticationForm


class ServiceAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A ModelAdmin whose form validation runs the service (``save_via_service``), so
    its ValidationErrors show on the form instead of a 500."""

    def save_via_service(self, obj: Any, form: forms.ModelForm, change: bool) -> Any:  # type: ignore[type-arg]
        raise NotImplementedError

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        base = super().get_form(request, obj, change=change, **kwargs)
        admin_self = self

        class ServiceForm(base):  # type: ignore[valid-type,misc]
            instance: Any

            def _post_clean(self) -> None:
                super()._post_clean()
                if self.errors:
                    return
                try:
                    self.instance = admin_self.save_via_service(self.instance, self, change)
                except ValidationError as e:
                    self.add_error(None, e)

            def save(self, commit: bool = True) -> Any:
                return self.instance

            def save_m2m(self) -> None:
                """Many-to-many fields are set by the service."""

        return ServiceForm

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Saved in the form's validation (the service call)."""

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """The service sets related rows."""


def _fields(form: forms.ModelForm, names: list[str]) -> dict[str, Any]:  # type: ignore[type-arg]
    return {n: form.cleaned_data[n] for n in names if n in form.cleaned_data}


def _secret(form: forms.ModelForm, name: str) -> str | None:  # type: ignore[type-arg]
    """The secret field ``name`` of a form beside its ``clear_<name>`` box: None keeps the
    stored secret (left empty), '' clears it, else the new one."""
    if form.cleaned_data.get(f"clear_{name}"):
        return ""
    return form.cleaned_data.get(name) or None


@admin.register(SloClass)
class SloClassAdmin(ServiceAdmin):
    list_display = ["name", "ttft_ms", "tbt_ms", "alpha", "beta_b", "beta_f", "attainment_target"]
    search_fields = ["name"]

    def save_via_service(self, obj: SloClass, form: forms.ModelForm, change: bool) -> SloClass:  # type: ignore[type-arg]
        fields = _fields(form, sorted(services.SLO_FIELDS))
        if change:
            return services.slo_class_update(slo_class=SloClass.objects.get(pk=obj.pk), **fields)
        return services.slo_class_create(**fields)


class NodeForm(forms.ModelForm):  # type: ignore[type-arg]
    # Engines on a private network usually speak plain HTTP.
    engine_url = forms.URLField(max_length=500, assume_scheme="http")
    engine_token = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        validators=[engine_token_validator],
        help_text="Stored encrypted and never shown. Leave empty to keep the stored token.",
    )
    clear_engine_token = forms.BooleanField(required=False, help_text="Remove the stored token.")

    class Meta:
        model = Node
        fields = ["name", "engine_url", "hardware_profile", "hbm_bytes", "dram_bytes"]


@admin.register(Node)
class NodeAdmin(ServiceAdmin):
    form = NodeForm
    list_display = ["name", "engine_url", "status", "last_seen", "hbm_bytes", "has_engine_token"]
    list_filter = ["status"]
    search_fields = ["name", "engine_url"]
    readonly_fields = ["status", "last_seen", "state_at", "engine_started", "last_error", "state"]
    actions = ["reconcile", "poll"]

    def save_via_service(self, obj: Node, form: forms.ModelForm, change: bool) -> Node:  # type: ignore[type-arg]
        fields = _fields(form, sorted(services.NODE_FIELDS))
        token = _secret(form, "engine_token")
        if change:
            return services.node_update(
                node=Node.objects.get(pk=obj.pk), engine_token=token, **fields
            )
        return services.node_create(engine_token=token or "", **fields)

    @admin.action(description="Push the desired deployments to the engine now")
    def reconcile(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        for node in queryset:
            result = services.node_reconcile(node=node)
            level = messages.SUCCESS if result.ok else messages.ERROR
            self.message_user(request, f"{node.name}: {result.changes or result.error}", level)

    @admin.action(description="Poll the engine now")
    def poll(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        for node in queryset:
            polled = services.node_poll(node=node)
            self.message_user(
                request, f"{node.name}: {'healthy' if polled.healthy else node.last_error}"
            )


@admin.register(Model)
class ModelAdmin(ServiceAdmin):
    list_display = ["name", "architecture", "num_layers", "param_bytes", "context_length"]
    search_fields = ["name", "source_dir"]
    readonly_fields = [
        "architecture",
        "num_layers",
        "param_bytes",
        "kv_bytes_per_token",
        "context_length",
        "config",
    ]

    def save_via_service(self, obj: Model, form: forms.ModelForm, change: bool) -> Model:  # type: ignore[type-arg]
        fields = _fields(form, ["name", "source_dir"])
        if change:
            return services.model_update(model=Model.objects.get(pk=obj.pk), **fields)
        return services.model_create(**fields)


@admin.register(Deployment)
class DeploymentAdmin(ServiceAdmin):
    list_display = ["model", "node", "sharing", "slo_class", "priority", "enabled"]
    list_filter = ["node", "sharing", "slo_class", "enabled"]
    list_select_related = ["model", "node", "slo_class"]

    def save_via_service(self, obj: Deployment, form: forms.ModelForm, change: bool) -> Deployment:  # type: ignore[type-arg]
        fields = _fields(form, sorted(services.DEPLOYMENT_FIELDS))
        if change:
            return services.deployment_update(
                deployment=Deployment.objects.get(pk=obj.pk), **fields
            )
        return services.deployment_create(**fields)

    def delete_model(self, request: HttpRequest, obj: Deployment) -> None:
        services.deployment_delete(deployment=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        for deployment in queryset:
            services.deployment_delete(deployment=deployment)


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
        fields = _fields(form, sorted(benchmarks.JOB_FIELDS))
        key = _secret(form, "api_key")
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
