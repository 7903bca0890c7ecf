"""Settings of the Spark benchmarks: ``bench.spark_analytics`` writes QueueMetric rows into a
SQLite file of its own; ``bench.spark_export`` reads a PostgreSQL database of its own
(``JOBQ_BENCH_PG_DB``, created, filled and dropped by that benchmark)."""

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
if os.environ.get("JOBQ_BENCH_PG_DB"):
    DATABASES["default"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["JOBQ_BENCH_PG_DB"],
        "USER": os.environ.get("JOBQ_BENCH_PG_USER", "postgres"),
        "HOST": "127.0.0.1",
        "PORT": "5432",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
JOBQ = {"BACKEND": "database"}
LOGGING = {"version": 1, "disable_existing_loggers": False}
