"""Settings of the mirror-lag benchmark: Redis for the queue, SQLite or PostgreSQL for the rows.

The run's key prefix and database come from the environment so that the producer, the worker
and the mirror (three processes) share them.
"""

import os
import tempfile

SECRET_KEY = "bench-only-not-secret"  # noqa: S105
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_jobq",
    "bench.mirrorapp",
]
_DB = os.environ.get("JOBQ_BENCH_DB", "sqlite")
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get(
            "JOBQ_BENCH_SQLITE", os.path.join(tempfile.gettempdir(), "jobq-mirror-bench.sqlite3")
        ),
        "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
    }
    if _DB == "sqlite"
    else {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("JOBQ_BENCH_PG_DB", "test"),
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
JOBQ = {
    "BACKEND": "redis",
    "REDIS_URL": os.environ.get("JOBQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "PREFIX": os.environ.get("JOBQ_BENCH_PREFIX", "jobqbench-mirror"),
    "RETENTION_DAYS": None,
}
LOGGING = {"version": 1, "disable_existing_loggers": False}
