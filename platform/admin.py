"""Django admin for the platform's models. Saves go through the services, so the admin
validates (HBM fit, model facts) and reconciles exactly as the API does."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from shunter.common.admin import ServiceAdmin, form_fields, form_secret
from shunter.platform import services
from shunter.platform.login_throttle import ThrottledAuthenticationForm
from shunter.platform.models import (
    Deployment,
    Model,
    Node,
    SloClass,
    engine_token_validator,
)

# The admin's login counts failures with the console's (one throttle for both).
admin.site.login_form = ThrottledAuthenticationForm


@admin.register(SloClass)
class SloClassAdmin(ServiceAdmin):
    list_display = ["name", "ttft_ms", "tbt_ms", "alpha", "beta_b", "beta_f", "attainment_target"]
    search_fields = ["name"]

    def save_via_service(self, obj: SloClass, form: forms.ModelForm, change: bool) -> SloClass:  # type: ignore[type-arg]
        fields = form_fields(form, sorted(services.SLO_FIELDS))
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
        fields = form_fields(form, sorted(services.NODE_FIELDS))
        token = form_secret(form, "engine_token")
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
        fields = form_fields(form, ["name", "source_dir"])
        if change:
            return services.model_update(model=Model.objects.get(pk=obj.pk), **fields)
        return services.model_create(**fields)


@admin.register(Deployment)
class DeploymentAdmin(ServiceAdmin):
    list_display = ["model", "node", "sharing", "slo_class", "priority", "enabled"]
    list_filter = ["node", "sharing", "slo_class", "enabled"]
    list_select_related = ["model", "node", "slo_class"]

    def save_via_service(self, obj: Deployment, form: forms.ModelForm, change: bool) -> Deployment:  # type: ignore[type-arg]
        fields = form_fields(form, sorted(services.DEPLOYMENT_FIELDS))
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
