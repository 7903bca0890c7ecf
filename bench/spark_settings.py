"""Settings of the Spark analytics benchmark (``python -m bench.spark_analytics``): a SQLite file
of its own that receives the QueueMetric rows, created and migrated by the benchmark."""

import os
import tempfile

SECRET_KEY = "bench-only-not-secret"  # noqa: S105
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_jobq"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get(
            "JOBQ_BENCH_SPARK_SQLITE",
            os.path.join(tempfile.gettempdir(), f"jobq-bench-spark-{os.getpid()}.sqlite3"),
        ),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
JOBQ = {"BACKEND": "database"}
LOGGING = {"version": 1, "disable_existing_loggers": False}
