"""Settings of ``python -m bench.broadcast``: the benchmark's settings plus a PostgreSQL alias
("pg", database ``JOBQ_BENCH_PG_DB``, created by the benchmark when missing)."""

import os

from bench.settings import *  # noqa: F403

DATABASES = {
    **DATABASES,  # noqa: F405
    "pg": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("JOBQ_BENCH_PG_DB", "bench_jobq_broadcast"),
        "USER": os.environ.get("JOBQ_BENCH_PG_USER", "postgres"),
        "HOST": os.environ.get("JOBQ_BENCH_PG_HOST", "127.0.0.1"),
        "PORT": "5432",
    },
}
