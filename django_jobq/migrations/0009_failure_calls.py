from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobq", "0008_spark_metrics"),
    ]

    operations = [
        migrations.AddField(
            model_name="queueconfig",
            name="failure_hook",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.CreateModel(
            name="FailureCall",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("queue", models.CharField(max_length=64)),
                ("job_id", models.CharField(max_length=160)),
                ("payload", models.BinaryField(default=b"")),
                ("content_type", models.CharField(default="json", max_length=16)),
                ("error", models.JSONField(blank=True, null=True)),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("failed_at", models.DateTimeField()),
                ("due_at", models.DateTimeField()),
                ("tries", models.PositiveIntegerField(default=0)),
                ("last_error", models.JSONField(blank=True, null=True)),
                ("worker", models.CharField(blank=True, default="", max_length=128)),
            ],
            options={
                "indexes": [models.Index(fields=["queue", "due_at"], name="jobq_failcall_due")],
            },
        ),
    ]
