"""Drop Event.run's own index: the unique (run, seq) index already serves every run_id lookup.

Done as a plain DROP INDEX: an AlterField would make SQLite rebuild agents_event, and the
rebuild silently drops the append-only trigger of 0002 (tests/test_eventlog.py guards it).
"""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

INDEX = "agents_event_run_id_574f336b"


class Migration(migrations.Migration):
    dependencies = [("agents", "0004_runscript")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="event",
                    name="run",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="events",
                        to="agents.run",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{INDEX}"',
                    reverse_sql=f'CREATE INDEX "{INDEX}" ON "agents_event" ("run_id")',
                ),
            ],
        ),
    ]
