"""Forms of the console's writes; each view hands the cleaned values to a service."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError

from shunter.platform.models import Deployment, Model, SloClass


class ApiKeyCreateForm(forms.Form):
    """A key's name, what it reaches (every deployment the tenant may use, or the models
    and deployments checked among the tenant's), optional expiry."""

    name = forms.CharField(max_length=128)
    all_deployments = forms.BooleanField(
        required=False,
        label="Every deployment",
        help_text="Every deployment the tenant may use, now or later.",
    )
    model_scopes = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Or every deployment of the models checked, now or later.",
    )
    scopes = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Or only the deployments checked.",
    )
    expires_at = forms.DateTimeField(
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="UTC; empty: never.",
    )

    def __init__(
        self,
        *args: Any,
        deployments: Sequence[Deployment],
        models: Sequence[Model],
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.deployments = {str(d.pk): d for d in deployments}
        self.models = {m.name: m for m in models}
        choices = [(pk, str(d)) for pk, d in self.deployments.items()]
        self.fields["scopes"].choices = choices  # type: ignore[attr-defined]
        self.fields["model_scopes"].choices = [(n, n) for n in self.models]  # type: ignore[attr-defined]

    def scope_deployments(self) -> list[Deployment]:
        return [self.deployments[pk] for pk in self.cleaned_data["scopes"]]

    def scope_models(self) -> list[Model]:
        return [self.models[name] for name in self.cleaned_data["model_scopes"]]


class DeploymentEditForm(forms.Form):
    """Sharing mode, SLO class and priority of one deployment. The SLO classes are given
    (one query for the whole page, not one per row)."""

    sharing = forms.ChoiceField(choices=Deployment.Sharing.choices)
    slo_class = forms.ChoiceField()
    priority = forms.IntegerField(min_value=-1000, max_value=1000)

    def __init__(
        self, *args: Any, slo_classes: Sequence[SloClass], form_id: str = "", **kwargs: Any
    ):
        super().__init__(*args, **kwargs)
        if form_id:
            # The inputs sit in table cells, outside their <form>: they name it.
            for field in self.fields.values():
                field.widget.attrs["form"] = form_id
        self.slo_classes = {str(c.pk): c for c in slo_classes}
        self.fields["slo_class"].choices = [  # type: ignore[attr-defined]
            (pk, c.name) for pk, c in self.slo_classes.items()
        ]

    def changes(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "sharing": data["sharing"],
            "slo_class": self.slo_classes[data["slo_class"]],
            "priority": data["priority"],
        }


def add_service_errors(form: forms.Form, error: ValidationError) -> None:
    """Show a service's ValidationError on ``form``: messages of fields the form has go
    beside them, the rest (the node fit check, other fields) above the form."""
    if not hasattr(error, "error_dict"):
        form.add_error(None, error.messages)
        return
    for field, errors in error.error_dict.items():
        messages = [m for e in errors for m in e.messages]
        if field in form.fields:
            form.add_error(field, messages)
        elif field == NON_FIELD_ERRORS:
            form.add_error(None, messages)
        else:
            form.add_error(None, [f"{field}: {m}" for m in messages])
