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
        from .conf import jobq_settings

        if jobq_settings()["METRICS"]["ENABLED"]:  # count job signals from start-up
            from .observability.metrics import install

            install()
