"""Records and rollups name the node that served them: rollups are per node too."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0006_grants_by_model"),
    ]

    operations = [
        migrations.AddField(
            model_name="requestrecord",
            name="node_name",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AddField(
            model_name="usagerollup",
            name="node_name",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.RemoveConstraint(
            model_name="usagerollup",
            name="rollup_unique_minute",
        ),
        migrations.AddConstraint(
            model_name="usagerollup",
            constraint=models.UniqueConstraint(
                fields=("minute", "tenant", "deployment", "node_name"),
                name="rollup_unique_minute_node",
            ),
        ),
    ]
