"""Database-layer bases: the tenant-scoped queryset and the refusal to delete a row in use."""

from __future__ import annotations

from typing import Any, Self

from django.db import models
from django.db.models import ProtectedError


class TenantScopedQuerySet(models.QuerySet[Any]):
    """Rows that belong to a tenant through ``tenant_path`` (a lookup path to Tenant).

    ``restrict`` is the one place that scopes a query to a tenant: every tenant-owned
    model's manager is one of these, and every selector and API view goes through it.
    """

    tenant_path = "tenant"

    def restrict(self, tenant: Any) -> Self:
        """Only the rows of ``tenant`` (a Tenant or its id); None leaves them all."""
        if tenant is None:
            return self
        return self.filter(**{self.tenant_path: tenant})


class InUse(ProtectedError):
    """A row that a service refuses to delete while something still needs it; the message
    says what and what to do instead (the API answers 409 with it)."""
