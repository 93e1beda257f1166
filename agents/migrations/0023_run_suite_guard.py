from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("agents", "0022_pause_cause_and_approval_subject")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="suite_guard",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="run",
            name="held_out",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
