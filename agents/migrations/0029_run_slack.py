from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0028_trace_exports"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="slack_channel",
            field=models.CharField(blank=True, max_length=80),
        ),
        migrations.AddField(
            model_name="run",
            name="slack_news",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
