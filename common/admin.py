"""The admin's base: a ModelAdmin whose saves and deletes go through the services."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.http import HttpRequest


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


def form_fields(form: forms.ModelForm, names: list[str]) -> dict[str, Any]:  # type: ignore[type-arg]
    """The cleaned values of the fields ``names`` that ``form`` has."""
    return {n: form.cleaned_data[n] for n in names if n in form.cleaned_data}


def form_secret(form: forms.ModelForm, name: str) -> str | None:  # type: ignore[type-arg]
    """The secret field ``name`` of a form beside its ``clear_<name>`` box: None keeps the
    stored secret (left empty), '' clears it, else the new one."""
    if form.cleaned_data.get(f"clear_{name}"):
        return ""
    return form.cleaned_data.get(name) or None
