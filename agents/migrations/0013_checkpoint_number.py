"""Checkpoints get a number within their run (1, 2, 3 ...), given in the order they were taken."""

from django.db import migrations, models


def number_existing(apps, schema_editor):
    Checkpoint = apps.get_model("agents", "Checkpoint")
    numbers: dict[int, int] = {}
    changed = []
    for c in Checkpoint.objects.order_by("run_id", "seq", "pk").only("pk", "run_id"):
        numbers[c.run_id] = numbers.get(c.run_id, 0) + 1
        c.number = numbers[c.run_id]
        changed.append(c)
    Checkpoint.objects.bulk_update(changed, ["number"], batch_size=500)


class Migration(migrations.Migration):
    dependencies = [("agents", "0012_run_cost_estimated")]

    operations = [
        migrations.AddField(
            model_name="checkpoint",
            name="number",
            field=models.PositiveIntegerField(null=True),
        ),
        migrations.RunPython(number_existing, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="checkpoint",
            name="number",
            field=models.PositiveIntegerField(),
        ),
        migrations.AddConstraint(
            model_name="checkpoint",
            constraint=models.UniqueConstraint(
                fields=("run", "number"), name="checkpoint_number_per_run"
            ),
        ),
    ]
