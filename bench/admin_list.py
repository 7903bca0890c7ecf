"""Admin page times on 1,000,000 job rows in PostgreSQL (database backend).

    python -m bench.admin_list [--rows 1000000] [--repeat 5] [--fresh]

Fills ``django_jobq_job`` of the database ``jobq_admin_bench`` with ``--rows`` rows by one
``INSERT … SELECT generate_series`` (kept between runs; ``--fresh`` rebuilds it), runs
``VACUUM ANALYZE``, then loads each admin page ``--repeat`` times through Django's test client
(a full request: middleware, session, admin view, template) and reports the median and the
slowest time per page, the number of SQL queries, and whether any of them counted the whole
table. Prints one JSON object on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import django
from django.conf import settings

DB = "jobq_admin_bench"
QUEUES = ("emails", "reports", "webhooks", "thumbnails")


SETTINGS: dict[str, Any] = {
    "SECRET_KEY": "bench-only-not-secret",  # noqa: S106
    "DEBUG": False,
    "USE_TZ": True,
    "ALLOWED_HOSTS": ["testserver"],
    "ROOT_URLCONF": "bench.admin_list",
    "INSTALLED_APPS": [
        "django.contrib.admin",
        "django.contrib.contenttypes",
        "django.contrib.auth",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django_jobq",
    ],
    "MIDDLEWARE": [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ],
    "TEMPLATES": [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                    "django.contrib.messages.context_processors.messages",
                ]
            },
        }
    ],
    "DATABASES": {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": DB,
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": "5432",
        }
    },
    "DEFAULT_AUTO_FIELD": "django.db.models.BigAutoField",
    "STATIC_URL": "/static/",
    "JOBQ": {"BACKEND": "database", "DATABASE_ALIAS": "default", "RETENTION_DAYS": None},
}


def configure() -> None:
    settings.configure(**SETTINGS)
    django.setup()


def log(message: str) -> None:
    print(f"[bench.admin_list] {message}", file=sys.stderr, flush=True)


def ensure_database() -> None:
    import psycopg

    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB]).fetchone():
            c.execute(f"CREATE DATABASE {DB}")


# One statement: ~78% completed, ~8% failed, the rest waiting, scheduled, active, cancelled;
# created 50 ms apart ending now, so time filters have something to find.
FILL = """
INSERT INTO django_jobq_job (
    queue, job_id, handler, state, payload, content_type, attempts, max_attempts, stalls,
    max_stalls, priority, min_backoff, max_backoff, result_ttl, created_at, started_at,
    finished_at, expires_at, worker, token, waiters, lifo, job_group, dedup_key, order_key,
    has_successor, error)
SELECT
    (ARRAY['emails','reports','webhooks','thumbnails'])[1 + g %% 4],
    'job-' || g,
    'app.tasks.' || (ARRAY['send','render','notify','resize','sync'])[1 + g %% 5],
    s.state, '\\x7b7d'::bytea, 'json', 1, 3, 0, 1, g %% 3, 1000, 3600000, 86400000,
    now() - (%(rows)s - g) * interval '50 milliseconds',
    CASE WHEN s.state IN ('completed','failed','active')
         THEN now() - (%(rows)s - g) * interval '50 milliseconds' + interval '20 ms' END,
    CASE WHEN s.state IN ('completed','failed')
         THEN now() - (%(rows)s - g) * interval '50 milliseconds' + interval '120 ms' END,
    now() + interval '1 day', 'worker-' || (g %% 16), 1, 0, false, '', '', 0, false,
    CASE WHEN s.state = 'failed'
         THEN '{"type": "ValueError", "message": "bad", "traceback": ""}'::jsonb END
FROM generate_series(1, %(rows)s) AS g,
LATERAL (SELECT CASE
    WHEN g %% 100 < 78 THEN 'completed' WHEN g %% 100 < 86 THEN 'failed'
    WHEN g %% 100 < 94 THEN 'queued' WHEN g %% 100 < 97 THEN 'scheduled'
    WHEN g %% 100 < 99 THEN 'cancelled' ELSE 'active' END AS state) AS s
"""


def fill(rows: int, fresh: bool) -> None:
    from django.db import connection

    from django_jobq.models import Job

    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = 'django_jobq_job'")
        estimate = cursor.fetchone()[0]
    if not fresh and estimate >= rows * 0.95 and Job.objects.filter(job_id="job-1").exists():
        log(f"keeping the {estimate} rows already there")
        return
    log(f"inserting {rows} rows")
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_jobq_job CASCADE")
        cursor.execute(FILL, {"rows": rows})
    log(f"inserted in {time.monotonic() - started:.0f} s; VACUUM ANALYZE")
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE django_jobq_job")


def pages(rows: int) -> dict[str, str]:
    from django.urls import reverse

    from django_jobq.models import Job

    jobs = reverse("admin:django_jobq_job_changelist")
    middle = Job.objects.filter(job_id=f"job-{rows // 2}").values_list("pk", flat=True).first()
    return {
        "job_list": jobs,
        "job_list_page_50": f"{jobs}?p=50",
        "job_list_failed": f"{jobs}?state__exact=failed",
        "job_list_queue_queued": f"{jobs}?queue=emails&state__exact=queued",
        "job_list_handler": f"{jobs}?handler=app.tasks.render",
        "job_list_last_hour": f"{jobs}?created=1h",
        "job_list_search_id": f"{jobs}?q=job-{rows // 3}",
        "job_list_sort_queue": f"{jobs}?o=2",
        "job_detail": reverse("admin:django_jobq_job_change", args=[middle]),
        "queues_overview": reverse("admin:django_jobq_queueconfig_changelist"),
        "queue_charts": reverse("admin:django_jobq_queue_detail", args=["emails"]),
    }


def measure(repeat: int, rows: int) -> dict[str, Any]:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    user, _ = User.objects.get_or_create(username="bench", defaults={"is_superuser": True,
                                                                     "is_staff": True})  # fmt: skip
    client = Client()
    client.force_login(user)
    out: dict[str, Any] = {}
    for name, url in pages(rows).items():
        times = []
        for _ in range(repeat):
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                response = client.get(url)
                times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (name, response.status_code)
        full_counts = [
            q["sql"] for q in queries.captured_queries
            if "COUNT(" in q["sql"].upper() and "LIMIT" not in q["sql"].upper()
            and "GROUP BY" not in q["sql"].upper()
        ]  # fmt: skip
        out[name] = {
            "median_ms": round(statistics.median(times), 1),
            "max_ms": round(max(times), 1),
            "queries": len(queries.captured_queries),
            "unbounded_counts": len(full_counts),
        }
        log(f"{name}: {out[name]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    ensure_database()
    configure()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    fill(args.rows, args.fresh)
    from django_jobq.conf import get_storage

    for name in QUEUES:  # what enqueue does on first use; the raw INSERT did not
        get_storage().register_queue(name)
    result = {"rows": args.rows, "repeat": args.repeat, "pages": measure(args.repeat, args.rows)}
    print(json.dumps(result, indent=2))


urlpatterns: list[Any] = []
if __name__ != "__main__" and settings.configured:  # imported as this run's ROOT_URLCONF
    from django.contrib import admin
    from django.urls import path

    urlpatterns = [path("admin/", admin.site.urls)]

if __name__ == "__main__":
    main()
