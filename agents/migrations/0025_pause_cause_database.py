from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0024_external_agents"),
    ]

    operations = [
        migrations.AlterField(
            model_name="run",
            name="pause_cause",
            field=models.CharField(
                blank=True,
                choices=[
                    ("person", "Person"),
                    ("budget", "Budget"),
                    ("fleet", "Fleet"),
                    ("rewind", "Rewind"),
                    ("store_down", "Store Down"),
                    ("database", "Database"),
                    ("disk_full", "Disk Full"),
                    ("approval_expired", "Approval Expired"),
                    ("provider", "Provider"),
                    ("unisolated", "Unisolated"),
                    ("limit", "Limit"),
                    ("harness", "Harness"),
                ],
                max_length=20,
            ),
        ),
    ]
