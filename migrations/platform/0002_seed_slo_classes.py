"""Seed the three SLO classes every installation starts with."""

from django.db import migrations

SEED = [
    # name, TTFT ms, TBT ms
    ("interactive", 1000, 50),
    ("standard", 5000, 100),
    ("batch", 60000, 500),
]


def seed(apps, schema_editor):
    SloClass = apps.get_model("platform", "SloClass")
    for name, ttft_ms, tbt_ms in SEED:
        SloClass.objects.get_or_create(name=name, defaults={"ttft_ms": ttft_ms, "tbt_ms": tbt_ms})


def unseed(apps, schema_editor):
    SloClass = apps.get_model("platform", "SloClass")
    SloClass.objects.filter(name__in=[name for name, _, _ in SEED], deployments=None).delete()


class Migration(migrations.Migration):
    dependencies = [("platform", "0001_initial")]

    operations = [migrations.RunPython(seed, unseed)]
