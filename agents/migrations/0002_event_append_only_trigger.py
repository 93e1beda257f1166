"""The database itself refuses to update an event row, whatever code path tries."""

from __future__ import annotations

from django.db import migrations

SQLITE = """
CREATE TRIGGER agents_event_no_update BEFORE UPDATE ON agents_event
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
"""
POSTGRES = """
CREATE OR REPLACE FUNCTION agents_event_no_update() RETURNS trigger AS $$
BEGIN RAISE EXCEPTION 'events are append-only'; END; $$ LANGUAGE plpgsql;
CREATE TRIGGER agents_event_no_update BEFORE UPDATE ON agents_event
FOR EACH ROW EXECUTE FUNCTION agents_event_no_update();
"""


def forwards(apps, schema_editor):
    sql = {"sqlite": SQLITE, "postgresql": POSTGRES}.get(schema_editor.connection.vendor)
    if sql:
        schema_editor.execute(sql)


def backwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        schema_editor.execute("DROP TRIGGER IF EXISTS agents_event_no_update")
    elif vendor == "postgresql":
        schema_editor.execute("DROP TRIGGER IF EXISTS agents_event_no_update ON agents_event")
        schema_editor.execute("DROP FUNCTION IF EXISTS agents_event_no_update()")


class Migration(migrations.Migration):
    dependencies = [("agents", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
