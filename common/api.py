"""What every control-plane API view shares: service errors as 400/409 responses,
tenant scoping from ``?tenant=``, and viewsets whose writes go through services."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from django import forms
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from django.db.models import Model, ProtectedError, QuerySet
from django_filters import rest_framework as filters
from django_filters.fields import IsoDateTimeField
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.response import Response
from rest_framework.schemas.inspectors import ViewInspector

from shunter.common.db import InUse

TENANT_PARAMETER = OpenApiParameter(
    "tenant",
    OpenApiTypes.INT,
    description="Only what this tenant (id) owns or may use.",
    required=False,
)


ERROR_BODY = {
    "type": "object",
    "description": "Field name (or 'detail', 'non_field_errors') -> message(s).",
    "additionalProperties": True,
}
ERRORS = {
    "400": "Invalid input: messages per field.",
    "401": "Not authenticated.",
    "403": "Not staff.",
    "404": "No such object (or not the given tenant's).",
    "409": "Conflicts with the current state (still referenced, a duplicate).",
}


class ApiSchema(AutoSchema):
    """The generated schema with the error responses every endpoint may give."""

    def _get_response_bodies(
        self, direction: Literal["request", "response"] = "response"
    ) -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        for code, description in ERRORS.items():
            responses.setdefault(
                code,
                {
                    "content": {"application/json": {"schema": ERROR_BODY}},
                    "description": description,
                },
            )
        return responses


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state."
    default_code = "conflict"


def as_api_error(exc: Exception) -> Exception:
    """A Django or database error of a service as the DRF error clients should get."""
    if isinstance(exc, DjangoValidationError):
        detail: Any = exc.message_dict if hasattr(exc, "error_dict") else exc.messages
        if isinstance(detail, list):
            detail = {"non_field_errors": detail}
        return exceptions.ValidationError(detail)
    if isinstance(exc, InUse):
        return Conflict(exc.args[0])
    if isinstance(exc, ProtectedError):
        names = sorted({str(obj) for obj in exc.protected_objects})[:5]
        return Conflict(f"Still in use by: {', '.join(names)}.")
    if isinstance(exc, IntegrityError):
        return Conflict("The change conflicts with existing rows (a duplicate or a reference).")
    return exc


class UtcDateTimeField(IsoDateTimeField):  # type: ignore[misc]
    """An ISO 8601 time in UTC. PostgreSQL takes offsets up to 15:59 only, Python up to
    23:59: normalising here keeps any valid input a valid query."""

    def to_python(self, value: Any) -> datetime | None:
        parsed: datetime | None = super().to_python(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(UTC)
        except OverflowError:
            raise forms.ValidationError("The time is out of range.") from None


class UtcDateTimeFilter(filters.IsoDateTimeFilter):  # type: ignore[misc]
    field_class = UtcDateTimeField


class ServiceErrorsMixin:
    """Service ValidationErrors are 400s with field messages, references still in use
    are 409s; never a 500 for input a client can fix."""

    schema: ViewInspector | None = ApiSchema()

    def handle_exception(self, exc: Exception) -> Response:
        response: Response = super().handle_exception(as_api_error(exc))  # type: ignore[misc]
        return response


def tenant_param(request: Any) -> int | None:
    """The ``?tenant=`` id of a request, or None; 400 unless a positive integer."""
    raw = request.query_params.get("tenant")
    if raw in (None, ""):
        return None
    if not str(raw).isdigit() or int(raw) <= 0 or int(raw) > 2**63 - 1:
        raise exceptions.ValidationError({"tenant": "A tenant id (a positive integer)."})
    return int(raw)


class TenantScopedMixin:
    """``get_queryset`` scoped by ``?tenant=`` through the manager's ``restrict``."""

    request: Any

    def base_queryset(self) -> QuerySet[Any]:
        raise NotImplementedError

    def get_queryset(self) -> QuerySet[Any]:
        return self.base_queryset().restrict(tenant_param(self.request))  # type: ignore[attr-defined,no-any-return]


class ServiceSerializer(serializers.ModelSerializer[Any]):
    """A ModelSerializer that writes through ``create_service`` / ``update_service``
    (keyword-only functions taking the validated fields)."""

    def create_service(self, **fields: Any) -> Any:
        raise NotImplementedError

    def update_service(self, instance: Any, **fields: Any) -> Any:
        raise NotImplementedError

    def create(self, validated_data: dict[str, Any]) -> Any:
        try:
            return self.create_service(**validated_data)
        except (DjangoValidationError, IntegrityError) as e:
            raise as_api_error(e) from None

    def update(self, instance: Any, validated_data: dict[str, Any]) -> Any:
        try:
            return self.update_service(instance, **validated_data)
        except (DjangoValidationError, IntegrityError) as e:
            raise as_api_error(e) from None


class ServiceModelViewSet(ServiceErrorsMixin, viewsets.ModelViewSet[Any]):
    """CRUD over a resource; deletes go through ``delete_service`` (default: delete,
    409 while other rows still reference it)."""

    http_method_names = ["get", "post", "put", "patch", "delete", "head", "options"]

    def delete_service(self, instance: Model) -> None:
        instance.delete()

    def perform_destroy(self, instance: Model) -> None:
        self.delete_service(instance)
