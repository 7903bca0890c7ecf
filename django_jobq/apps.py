from django.apps import AppConfig


class JobQConfig(AppConfig):
    name = "django_jobq"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from . import checks, schedules  # noqa: F401 - register the system checks, save hooks

        # Handlers live in each app's jobs.py; importing them registers them.
        autodiscover_modules("jobs")
        # Queues served by a django.tasks JobQBackend get their handler now, before a worker
        # looks for handlers.
        from .contrib.tasks_backend import register_task_queues

        register_task_queues()
        from django.db.models.signals import post_migrate

        post_migrate.connect(recount_after_flush, sender=self)
        from .conf import jobq_settings

        if jobq_settings()["METRICS"]["ENABLED"]:  # count job signals from start-up
            from .observability.metrics import install

            install()


def recount_after_flush(sender: AppConfig, using: str = "default", **kwargs: object) -> None:
    """SQLite: count the job rows anew after ``migrate`` and ``flush`` (which ends with this
    signal). ``flush`` empties each table with a ``DELETE`` in no fixed order: when the job
    rows go after the counts, their triggers leave negative counts behind. PostgreSQL's flush
    is one ``TRUNCATE`` of every table, whose trigger empties the counts too."""
    from django.db import connections

    from .storage.database.operations import recount

    connection = connections[using]
    if connection.vendor == "sqlite":
        recount(using)
