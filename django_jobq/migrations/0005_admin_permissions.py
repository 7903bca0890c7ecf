from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobq", "0004_progress_logs"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="job",
            options={
                "ordering": ["-created_at"],
                "permissions": [
                    ("cancel_job", "Can cancel jobs"),
                    ("retry_job", "Can retry and requeue jobs"),
                ],
            },
        ),
    ]
