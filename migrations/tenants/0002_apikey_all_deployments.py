"""Keys store "every deployment of the tenant" as a flag instead of as empty scopes."""

from typing import Any

from django.db import migrations, models


def flag_unscoped_keys(apps: Any, schema_editor: Any) -> None:
    # Until now a key without scopes reached all of its tenant's deployments: keep that.
    ApiKey = apps.get_model("tenants", "ApiKey")
    ApiKey.objects.filter(scopes__isnull=True).update(all_deployments=True)


def unflag_keys(apps: Any, schema_editor: Any) -> None:
    # Back to empty = all: a key that reaches nothing is revoked rather than widened.
    from django.utils import timezone

    ApiKey = apps.get_model("tenants", "ApiKey")
    ApiKey.objects.filter(
        all_deployments=False, scopes__isnull=True, revoked_at__isnull=True
    ).update(revoked_at=timezone.now())


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="all_deployments",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(flag_unscoped_keys, unflag_keys),
    ]
