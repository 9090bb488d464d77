"""Tenants and keys granted models by name (every deployment of the model)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("platform", "0004_benchmark_jobs"),
        ("tenants", "0005_requestrecord_record_key"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="model_scopes",
            field=models.ManyToManyField(blank=True, related_name="+", to="platform.model"),
        ),
        migrations.AddField(
            model_name="tenant",
            name="models",
            field=models.ManyToManyField(blank=True, related_name="tenants", to="platform.model"),
        ),
    ]
