from django.db import migrations, models


class Migration(migrations.Migration):
    """Schedules declared in JOBQ["SCHEDULES"]: which rows the settings sync owns, and the
    digest it wrote them with (drift detection). Existing rows are "admin" rows."""

    dependencies = [
        ("django_jobq", "0019_rollup"),
    ]

    operations = [
        migrations.AddField(
            model_name="schedule",
            name="source",
            field=models.CharField(
                choices=[("admin", "Admin or code"), ("settings", "JOBQ['SCHEDULES']")],
                default="admin",
                editable=False,
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="schedule",
            name="settings_digest",
            field=models.CharField(blank=True, default="", editable=False, max_length=64),
        ),
    ]
