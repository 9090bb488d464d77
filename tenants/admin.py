"""Django admin for tenants, keys and usage. A key's secret is shown once, in the
message after it is created; its digest is never shown or editable."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from shunter.common.admin import ServiceAdmin
from shunter.tenants import services
from shunter.tenants.models import ApiKey, RequestRecord, Tenant, UsageRollup


@admin.register(Tenant)
class TenantAdmin(ServiceAdmin):
    list_display = ["name", "default_slo_class", "rpm_limit", "tpm_limit", "is_active"]
    list_filter = ["is_active", "default_slo_class"]
    search_fields = ["name"]
    filter_horizontal = ["models", "deployments"]

    def save_via_service(self, obj: Tenant, form: forms.ModelForm, change: bool) -> Tenant:  # type: ignore[type-arg]
        fields = {n: form.cleaned_data[n] for n in services.TENANT_FIELDS if n in form.cleaned_data}
        deployments, models = form.cleaned_data.get("deployments"), form.cleaned_data.get("models")
        if change:
            return services.tenant_update(
                tenant=Tenant.objects.get(pk=obj.pk),
                deployments=deployments,
                models=models,
                **fields,
            )
        return services.tenant_create(deployments=deployments or (), models=models or (), **fields)


class ApiKeyForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = ApiKey
        fields = ["tenant", "name", "all_deployments", "model_scopes", "scopes", "expires_at"]


@admin.register(ApiKey)
class ApiKeyAdmin(ServiceAdmin):
    form = ApiKeyForm
    list_display = [
        "name",
        "tenant",
        "prefix",
        "all_deployments",
        "expires_at",
        "revoked_at",
        "last_used_at",
    ]
    list_filter = ["tenant"]
    search_fields = ["name", "prefix", "tenant__name"]
    readonly_fields = ["prefix", "revoked_at", "last_used_at", "created_at"]
    list_select_related = ["tenant"]
    filter_horizontal = ["model_scopes", "scopes"]
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # A key never moves to another tenant.
        return [*self.readonly_fields, "tenant"] if obj is not None else self.readonly_fields

    def save_via_service(self, obj: ApiKey, form: forms.ModelForm, change: bool) -> ApiKey:  # type: ignore[type-arg]
        data = form.cleaned_data
        if change:
            return services.api_key_update(
                api_key=ApiKey.objects.get(pk=obj.pk),
                name=data["name"],
                scopes=data.get("scopes") or (),
                model_scopes=data.get("model_scopes") or (),
                all_deployments=data["all_deployments"],
                expires_at=data.get("expires_at"),
                clear_expiry=data.get("expires_at") is None,
            )
        key, secret = services.api_key_create(
            tenant=data["tenant"],
            name=data["name"],
            scopes=data.get("scopes") or (),
            model_scopes=data.get("model_scopes") or (),
            all_deployments=data["all_deployments"],
            expires_at=data.get("expires_at"),
        )
        # On the instance, not the admin (shared by every request): response_add gets
        # this very object.
        key.shown_secret = secret  # type: ignore[attr-defined]
        return key

    def response_add(self, request: HttpRequest, obj: ApiKey, post_url_continue: Any = None) -> Any:
        secret = getattr(obj, "shown_secret", None)
        if secret:
            self.message_user(
                request,
                f"The secret of key {obj.name!r} is {secret} . Copy it now: it is not stored "
                "and cannot be shown again.",
                messages.WARNING,
            )
        return super().response_add(request, obj, post_url_continue)

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for key in queryset:
            services.api_key_revoke(api_key=key)
        self.message_user(request, f"Revoked {queryset.count()} key(s).")


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Rows the gateway writes: browsable, never edited by hand."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(RequestRecord)
class RequestRecordAdmin(ReadOnlyAdmin):
    list_display = [
        "request_id",
        "tenant",
        "model_name",
        "status",
        "t_arrival",
        "ttft_ms",
        "tpot_ms",
        "ttft_met",
        "tbt_met",
    ]
    list_filter = ["status", "endpoint", "ttft_met", "tbt_met", "tenant"]
    search_fields = ["request_id", "model_name"]
    list_select_related = ["tenant"]
    date_hierarchy = "t_arrival"


@admin.register(UsageRollup)
class UsageRollupAdmin(ReadOnlyAdmin):
    list_display = ["minute", "tenant", "deployment", "requests", "errors", "both_met"]
    list_filter = ["tenant"]
    list_select_related = ["tenant", "deployment__model", "deployment__node"]
    date_hierarchy = "minute"
