"""Admin page times on 1,000,000 job rows in PostgreSQL or SQLite (database backend).

    python -m bench.admin_list [--db postgres|sqlite] [--rows 1000000] [--repeat 5] [--fresh]
                               [--only TEXT]

Fills ``django_jobq_job`` of the PostgreSQL database ``$JOBQ_BENCH_PG_DB`` (default
``jobq_admin_bench``) or the SQLite file ``$JOBQ_BENCH_SQLITE`` (default
``/tmp/jobq_admin_bench.sqlite3``) with ``--rows`` rows by one ``INSERT … SELECT`` (kept
between runs; ``--fresh`` rebuilds it), runs ``VACUUM ANALYZE`` / ``ANALYZE``, folds the
finished jobs into the charts' per-minute rows (``django_jobq.rollup``; timed and reported as
``fold_backlog_s``: what the first page views after an upgrade pay, spread over views), then
loads every admin page (lists, job page, queue pages, their live polls, the confirmation
pages of the bulk actions, workers, schedules; and every view of the job list: each sort both
ways, the sort by finish time within a queue and a state, page 500 of a filtered list, the
search by id, handler, payload and error, see ``list_views``) once per round for
``--repeat`` rounds through Django's test client (a full request: middleware, session, admin
view, template). Per page it reports the medians of the server's wall time, its CPU time
(``time.process_time`` of the request: less sensitive to other load than the wall time) and
the time spent in SQL, the slowest query, the number of queries, whether any counted the
whole table, and whether the median wall time is within the page's target (``target_ms``:
200 ms on PostgreSQL, 500 ms on SQLite and for the search in payloads and errors), with
``uptime`` before and after and each page's ratio to Django's own admin index page in the
same rounds. ``--only TEXT`` measures only the pages whose key contains TEXT (and the index
page). Before each load a few jobs finish "now", so every queue page folds fresh rows
as it would in use. Prints one JSON object on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import django
from django.conf import settings

DB = os.environ.get("JOBQ_BENCH_PG_DB", "jobq_admin_bench")
SQLITE_FILE = os.environ.get(
    "JOBQ_BENCH_SQLITE", os.path.join(tempfile.gettempdir(), "jobq_admin_bench.sqlite3")
)
TARGET_MS = {"postgres": 200, "sqlite": 500}
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


def configure(db: str) -> None:
    if db == "sqlite":
        SETTINGS["DATABASES"] = {
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": SQLITE_FILE,
                "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
            }
        }
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
    s.state, convert_to('{"order": ' || g || ', "email": "user' || g || '@example.com"}',
                        'UTF8'), 'json', 1, 3, 0, 1, g %% 3, 1000, 3600000, 86400000,
    now() - (%(rows)s - g) * interval '50 milliseconds',
    CASE WHEN s.state IN ('completed','failed','active')
         THEN now() - (%(rows)s - g) * interval '50 milliseconds' + interval '20 ms' END,
    CASE WHEN s.state IN ('completed','failed')
         THEN now() - (%(rows)s - g) * interval '50 milliseconds' + interval '120 ms' END,
    now() + interval '1 day', 'worker-' || (g %% 16), 1, 0, false, '', '', 0, false,
    CASE WHEN s.state = 'failed'
         THEN jsonb_build_object('type', 'ValueError', 'message', 'bad input for order ' || g,
                                 'traceback', 'Traceback (most recent call last): ...') END
FROM generate_series(1, %(rows)s) AS g,
LATERAL (SELECT CASE
    WHEN g %% 100 < 78 THEN 'completed' WHEN g %% 100 < 86 THEN 'failed'
    WHEN g %% 100 < 94 THEN 'queued' WHEN g %% 100 < 97 THEN 'scheduled'
    WHEN g %% 100 < 99 THEN 'cancelled' ELSE 'active' END AS state) AS s
"""


# The same rows for SQLite: a recursive CTE instead of generate_series, times as Django
# stores them there (UTC text).
FILL_SQLITE = """
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %(rows)s),
s(n, state, at) AS (SELECT n, CASE
    WHEN n %% 100 < 78 THEN 'completed' WHEN n %% 100 < 86 THEN 'failed'
    WHEN n %% 100 < 94 THEN 'queued' WHEN n %% 100 < 97 THEN 'scheduled'
    WHEN n %% 100 < 99 THEN 'cancelled' ELSE 'active' END,
    julianday('now') - (%(rows)s - n) * 0.05 / 86400.0 FROM g)
INSERT INTO django_jobq_job (
    queue, job_id, handler, state, payload, content_type, attempts, max_attempts, stalls,
    max_stalls, priority, min_backoff, max_backoff, result_ttl, created_at, started_at,
    finished_at, expires_at, worker, token, waiters, lifo, job_group, dedup_key, order_key,
    has_successor, error)
SELECT
    CASE n %% 4 WHEN 0 THEN 'emails' WHEN 1 THEN 'reports' WHEN 2 THEN 'webhooks'
         ELSE 'thumbnails' END,
    'job-' || n,
    'app.tasks.' || CASE n %% 5 WHEN 0 THEN 'send' WHEN 1 THEN 'render' WHEN 2 THEN 'notify'
                                WHEN 3 THEN 'resize' ELSE 'sync' END,
    state, CAST('{"order": ' || n || ', "email": "user' || n || '@example.com"}' AS BLOB),
    'json', 1, 3, 0, 1, n %% 3, 1000, 3600000, 86400000,
    strftime('%%Y-%%m-%%d %%H:%%M:%%f', at),
    CASE WHEN state IN ('completed','failed','active')
         THEN strftime('%%Y-%%m-%%d %%H:%%M:%%f', at + 0.020 / 86400.0) END,
    CASE WHEN state IN ('completed','failed')
         THEN strftime('%%Y-%%m-%%d %%H:%%M:%%f', at + 0.120 / 86400.0) END,
    strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+1 day'), 'worker-' || (n %% 16), 1, 0, 0,
    '', '', 0, 0,
    CASE WHEN state = 'failed'
         THEN json_object('type', 'ValueError', 'message', 'bad input for order ' || n,
                          'traceback', 'Traceback (most recent call last): ...') END
FROM s
"""


def fill(rows: int, fresh: bool) -> None:
    from django.db import connection

    from django_jobq.models import Job, JobMinute, RollupMark

    sqlite = connection.vendor == "sqlite"
    with connection.cursor() as cursor:
        if sqlite:
            cursor.execute("SELECT max(id) FROM django_jobq_job")
        else:
            cursor.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE relname = 'django_jobq_job'"
            )
        estimate = cursor.fetchone()[0] or 0
    if not fresh and estimate >= rows * 0.95 and Job.objects.filter(job_id="job-1").exists():
        log(f"keeping the {estimate} rows already there")
        return
    log(f"inserting {rows} rows")
    started = time.monotonic()
    with connection.cursor() as cursor:
        if sqlite:
            cursor.execute("DELETE FROM django_jobq_jobevent")
            cursor.execute("DELETE FROM django_jobq_job")
            cursor.execute(FILL_SQLITE, {"rows": rows})
        else:
            cursor.execute("TRUNCATE django_jobq_job CASCADE")
            cursor.execute(FILL, {"rows": rows})
    JobMinute.objects.all().delete()
    RollupMark.objects.all().delete()
    log(f"inserted in {time.monotonic() - started:.0f} s; ANALYZE")
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE" if sqlite else "VACUUM ANALYZE django_jobq_job")


def fold_backlog() -> float:
    """Fold every finished row of the last day into minute rows, as the first page views
    after an upgrade would (``rollup.BUDGET`` rows per view); seconds taken."""
    from django.utils import timezone

    from django_jobq.mirror import rollup

    started = time.perf_counter()
    folds = 1
    while rollup.fold("default", timezone.now()).behind:
        folds += 1
    took = time.perf_counter() - started
    log(f"folded the backlog in {folds} folds, {took:.1f} s")
    return took


def finish_a_few(seq: list[int]) -> None:
    """Two jobs per queue finish now (as workers would), so a page's fold has rows to read."""
    from django.utils import timezone

    from django_jobq.models import Job

    now = timezone.now()
    rows = []
    for queue in QUEUES:
        for _ in range(2):
            seq[0] += 1
            rows.append(Job(queue=queue, job_id=f"live-{seq[0]}", handler="app.tasks.send",
                            state="completed", created_at=now, started_at=now,
                            finished_at=now))  # fmt: skip
    Job.objects.bulk_create(rows)


def pages(rows: int) -> dict[str, str]:
    from django.urls import reverse

    from django_jobq.models import Job

    jobs = reverse("admin:django_jobq_job_changelist")
    middle = Job.objects.filter(job_id=f"job-{rows // 2}").values_list("pk", flat=True).first()
    overview = reverse("admin:django_jobq_queueconfig_changelist")
    queue = reverse("admin:django_jobq_queue_detail", args=["emails"])
    over_a_filter = reverse("admin:django_jobq_job_filter_action", args=["retry"])
    return {
        "admin_index": reverse("admin:index"),  # the reference: no job rows read
        "job_list": jobs,
        "job_list_poll": f"{jobs}?live=1",
        "job_list_page_50": f"{jobs}?p=50",
        "job_list_failed": f"{jobs}?state__exact=failed",
        "job_list_queue_queued": f"{jobs}?queue=emails&state__exact=queued",
        "job_list_handler": f"{jobs}?handler=app.tasks.render",
        "job_list_last_hour": f"{jobs}?created=1h",
        "job_list_search_id": f"{jobs}?q=job-{rows // 3}",
        "job_list_search_id_prefix": f"{jobs}?q=job-{rows // 3 // 100}",
        "job_link_by_queue_and_id": reverse(
            "admin:django_jobq_job_by_id", args=[QUEUES[(rows // 2) % 4], f"job-{rows // 2}"]
        ),
        "job_list_sort_queue": f"{jobs}?o=2",
        **list_views(jobs, rows),
        "job_detail": reverse("admin:django_jobq_job_change", args=[middle]),
        "job_detail_poll": reverse("admin:django_jobq_job_live", args=[middle]),
        "queues_overview": overview,
        "queues_overview_poll": f"{overview}?live=1",
        "queue_charts": queue,
        "queue_charts_poll": f"{queue}?live=1",
        "queue_dead_letters_confirm": reverse(
            "admin:django_jobq_queue_dead", args=["emails", "retry"]
        ),
        "retry_over_a_filter_confirm": f"{over_a_filter}?queue=emails&state__exact=failed",
        "cancel_over_everything_confirm": reverse(
            "admin:django_jobq_job_filter_action", args=["cancel"]
        ),
        "workers": reverse("admin:django_jobq_workerinfo_changelist"),
        "schedules": reverse("admin:django_jobq_schedule_changelist"),
    }


# The job list's sortable columns, by their position in JobAdmin.list_display (0 is the tick
# box): job id, queue, state, handler, priority, worker, created, finished.
SORTS = {"id": 1, "queue": 2, "state": 3, "handler": 5, "priority": 7, "worker": 8,
         "created": 9, "finished": 10}  # fmt: skip
#: Search in payloads and errors: PostgreSQL's target with its trigram index (docs/admin.md).
SEARCH_TARGET_MS = 500


def list_views(jobs: str, rows: int) -> dict[str, str]:
    """Every sort both ways; finished time also within a queue, a state, and both; a deep
    page of a filtered list; each kind of search (issue 37)."""
    failed = next(g for g in range(rows // 3, rows) if 78 <= g % 100 < 86)  # FILL's states
    views = {}
    for name, column in SORTS.items():
        views[f"job_list_sort_{name}_asc"] = f"{jobs}?o={column}"
        views[f"job_list_sort_{name}_desc"] = f"{jobs}?o=-{column}"
    for label, query in (("queue", "queue=emails"), ("failed", "state__exact=failed"),
                         ("queue_failed", "queue=emails&state__exact=failed"),
                         ("queued", "state__exact=queued")):  # fmt: skip
        views[f"job_list_{label}_sort_finished_asc"] = f"{jobs}?{query}&o=10"
        views[f"job_list_{label}_sort_finished_desc"] = f"{jobs}?{query}&o=-10"
    views |= {
        "job_list_failed_page_500": f"{jobs}?state__exact=failed&p=500",
        "job_list_queue_page_500": f"{jobs}?queue=emails&p=500",
        "job_list_search_handler": f"{jobs}?q=app.tasks.ren",
        "job_list_search_handler_none": f"{jobs}?q=app.other.thing",
        "job_list_search_payload": f"{jobs}?in=payload&q=user{rows // 3}%40example.com",
        "job_list_search_payload_common": f"{jobs}?in=payload&q=example.com",
        "job_list_search_payload_none": f"{jobs}?in=payload&q=no-such-text",
        "job_list_search_error": f"{jobs}?in=error&q=for+order+{failed}",
        "job_list_search_error_common": f"{jobs}?in=error&q=ValueError",
    }
    return views


def target_of(name: str, target: int) -> int:
    """Searches in payloads and errors have their own target on PostgreSQL; every other
    page the database's."""
    searching = name.startswith(("job_list_search_payload", "job_list_search_error"))
    return max(target, SEARCH_TARGET_MS) if searching else target


def measure(repeat: int, rows: int, target: int, only: str = "") -> dict[str, Any]:
    """Every page once per round, ``repeat`` rounds (interleaved, so a burst of load from
    elsewhere falls on several pages rather than on all the requests of one). Per request:
    wall time, this process's CPU time (the view, ORM and templates; the database server's
    own CPU is not in it, its time is in the SQL figure) and the time spent in SQL."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    user, _ = User.objects.get_or_create(username="bench", defaults={"is_superuser": True,
                                                                     "is_staff": True})  # fmt: skip
    client = Client()
    client.force_login(user)
    urls = {k: v for k, v in pages(rows).items() if only in k or k == "admin_index"}
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
    seq = [int(time.time() * 1000)]  # ids unique across runs on a kept table
    for round_ in range(repeat):
        for name, url in urls.items():
            finish_a_few(seq)
            with CaptureQueriesContext(connection) as queries:
                cpu = time.process_time()
                started = time.perf_counter()
                response = client.get(url)
                wall = (time.perf_counter() - started) * 1000
                cpu = (time.process_time() - cpu) * 1000
            assert response.status_code in (200, 302), (name, response.status_code)
            captured = queries.captured_queries
            slowest = max(captured, key=lambda q: float(q["time"]), default=None)
            samples[name].append({
                "wall": wall, "cpu": cpu, "sql": sum(float(q["time"]) for q in captured) * 1000,
                "queries": len(captured),
                "slowest": None if slowest is None else (
                    round(float(slowest["time"]) * 1000, 1), slowest["sql"][:300]),
                "unbounded": sum(
                    1 for q in captured
                    if "COUNT(" in q["sql"].upper() and "LIMIT" not in q["sql"].upper()
                    and "GROUP BY" not in q["sql"].upper()
                ),
            })  # fmt: skip
        log(f"round {round_ + 1}/{repeat} done, load {os.getloadavg()[0]:.1f}")
    out: dict[str, Any] = {}
    for name, runs in samples.items():
        wall = statistics.median(r["wall"] for r in runs)
        out[name] = {
            "wall_ms": round(wall, 1),
            "wall_max_ms": round(max(r["wall"] for r in runs), 1),
            "cpu_ms": round(statistics.median(r["cpu"] for r in runs), 1),
            "sql_ms": round(statistics.median(r["sql"] for r in runs), 1),
            "queries": runs[-1]["queries"],
            "slowest_query": max((r["slowest"] for r in runs if r["slowest"]), default=None),
            "unbounded_counts": runs[-1]["unbounded"],
            "target_ms": target_of(name, target),
            "within_target": wall <= target_of(name, target),
        }
        log(f"{name}: { ({k: v for k, v in out[name].items() if k != 'slowest_query'}) }")
    return out


def uptime() -> str:
    """The machine's load as ``uptime`` prints it: recorded beside the figures."""
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--db", choices=sorted(TARGET_MS), default="postgres")
    parser.add_argument("--only", default="", help="measure only pages whose key has this")
    args = parser.parse_args()
    if args.db == "postgres":
        ensure_database()
    configure(args.db)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    fill(args.rows, args.fresh)
    if args.db == "postgres":  # payload search over every job: the operator's opt-in index
        call_command("jobq_search_index", verbosity=0, stdout=sys.stderr)  # stdout: the JSON
    from django_jobq.backend import get_storage

    for name in QUEUES:  # what enqueue does on first use; the raw INSERT did not
        get_storage().register_queue(name)
    fold_s = fold_backlog()
    target = TARGET_MS[args.db]
    load_before = uptime()
    pages_ms = measure(args.repeat, args.rows, target, args.only)
    index = max(0.1, pages_ms["admin_index"]["wall_ms"])
    result = {
        "db": args.db, "rows": args.rows, "repeat": args.repeat, "target_ms": target,
        "fold_backlog_s": round(fold_s, 1),
        "all_within_target": all(p["within_target"] for p in pages_ms.values()),
        # How loaded the machine was: `uptime` before and after, and every page's wall time
        # over Django's own admin index page (no job rows) measured in the same rounds.
        "uptime_before": load_before,
        "uptime_after": uptime(),
        "ratio_to_admin_index": {
            name: round(p["wall_ms"] / index, 1) for name, p in pages_ms.items()
        },
        "pages": pages_ms,
    }  # fmt: skip
    print(json.dumps(result, indent=2))


urlpatterns: list[Any] = []
if __name__ != "__main__" and settings.configured:  # imported as this run's ROOT_URLCONF
    from django.contrib import admin
    from django.urls import path

    urlpatterns = [path("admin/", admin.site.urls)]

if __name__ == "__main__":
    main()
