"""What durability="journal" costs: enqueue throughput and latency, "redis" vs "journal".

    python -m bench.journal [--jobs N] [--redis-url URL] [--pg-db NAME] [--out FILE]

Side by side in one process, on the same Redis: plain Redis mode, and journal mode with the
journal on SQLite (WAL, a file in the temp directory) and on PostgreSQL (127.0.0.1:5432, its
own database, created when missing). Per mode:

1. ``one``: sequential ``Queue.enqueue`` outside any transaction (journal: one committed row
   and one Redis call per job): jobs/s, p50 and p99 latency in ms.
2. ``in_tx``: 100 ``enqueue`` calls inside one ``transaction.atomic()`` (journal: rows in the
   caller's transaction, sent on commit), the way a view that saves rows and enqueues works:
   jobs/s including the commit and the sends.
3. ``bulk``: ``enqueue_many`` of 1,000 jobs a call: jobs/s.

Then ``reconcile`` (journal on PostgreSQL): ``--reconcile-jobs`` jobs journaled, the queue's
Redis keys deleted, and ``reconcile`` timed twice: re-creating every job (``recreate_per_s``),
then with every job live in Redis (``check_per_s``: the steady cost of the reaper's pass).

One JSON object goes to stdout (progress to stderr). Isolation: a fresh key prefix
``jobqbench-journal-<random>`` whose keys are deleted at the end, journal tables emptied after
each phase, nothing else touched.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

QUEUE = "bench-journal"


def configure(redis_url: str, pg_db: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="bench-only-not-secret",  # noqa: S106
        USE_TZ=True,
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_jobq"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": os.path.join(tempfile.gettempdir(), "jobq-bench-journal.sqlite3"),
                "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL", "timeout": 20},
            },
            "pg": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": pg_db,
                "USER": os.environ.get("JOBQ_BENCH_PG_USER", "postgres"),
                "HOST": "127.0.0.1",
                "PORT": "5432",
            },
        },
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        JOBQ={
            "BACKEND": "redis",
            "REDIS_URL": redis_url,
            "PREFIX": f"jobqbench-journal-{uuid.uuid4().hex[:8]}",
            "MIRROR": {"ENABLED": False},
        },
        LOGGING={"version": 1, "disable_existing_loggers": False},
    )
    django.setup()


def ensure_pg_database(name: str) -> None:
    import psycopg

    user = os.environ.get("JOBQ_BENCH_PG_USER", "postgres")
    dsn = f"host=127.0.0.1 port=5432 user={user} dbname=postgres"
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{name}"')


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(queue: Any, alias: str | None, jobs: int) -> dict[str, float]:
    from django.db import transaction

    latencies = []
    start = time.perf_counter()
    for _ in range(jobs):
        t0 = time.perf_counter()
        queue.enqueue(payload={"n": 1})
        latencies.append((time.perf_counter() - t0) * 1000)
    one = jobs / (time.perf_counter() - start)

    start = time.perf_counter()
    done = 0
    while done < jobs:
        with transaction.atomic(using=alias or "default"):
            for _ in range(100):
                queue.enqueue(payload={"n": 1})
        done += 100
    in_tx = done / (time.perf_counter() - start)

    bulk_jobs = jobs * 5
    start = time.perf_counter()
    for _ in range(bulk_jobs // 1000):
        queue.enqueue_many([(None, {"n": i}) for i in range(1000)])
    bulk = (bulk_jobs // 1000 * 1000) / (time.perf_counter() - start)
    return {
        "one_per_s": round(one),
        "one_p50_ms": round(statistics.median(latencies), 3),
        "one_p99_ms": round(percentile(latencies, 0.99), 3),
        "in_tx_per_s": round(in_tx),
        "bulk_per_s": round(bulk),
    }


def measure_reconcile(storage: Any, jobs: int) -> dict[str, float]:
    from django.test import override_settings

    from django_jobq.conf import jobq_settings
    from django_jobq.models import JournalEntry
    from django_jobq.queue import Queue
    from django_jobq.queue.journal import reconcile

    journal = {**jobq_settings()["JOURNAL"], "DATABASE_ALIAS": "pg"}
    with override_settings(JOBQ={**jobq_settings(), "JOURNAL": journal}):
        queue = Queue(QUEUE, storage=storage, durability="journal")
        for start in range(0, jobs, 1000):
            queue.enqueue_many([(None, {"n": i}) for i in range(start, min(jobs, start + 1000))])
        storage.obliterate(QUEUE, force=True)  # Redis forgot them all
        t0 = time.perf_counter()
        lost = reconcile(storage, [QUEUE], min_age=0)[QUEUE]
        recreate_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        live = reconcile(storage, [QUEUE], min_age=0)[QUEUE]
        check_s = time.perf_counter() - t0
        JournalEntry.objects.using("pg").filter(queue=QUEUE).delete()
    assert lost.recreated == jobs and live.live == jobs, (lost, live)
    return {
        "entries": jobs,
        "recreate_s": round(recreate_s, 2),
        "recreate_per_s": round(jobs / recreate_s),
        "check_s": round(check_s, 2),
        "check_per_s": round(jobs / check_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="single enqueues per phase")
    parser.add_argument(
        "--redis-url", default=os.environ.get("JOBQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--pg-db", default="jobq_journal_bench")
    parser.add_argument("--reconcile-jobs", type=int, default=50_000)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()

    ensure_pg_database(args.pg_db)
    configure(args.redis_url, args.pg_db)
    from django.core.management import call_command
    from django.test import override_settings

    from django_jobq.backend import get_storage
    from django_jobq.conf import jobq_settings
    from django_jobq.models import JournalEntry
    from django_jobq.queue import Queue

    for alias in ("default", "pg"):
        call_command("migrate", "django_jobq", database=alias, verbosity=0)
    storage = get_storage()
    results: dict[str, Any] = {"jobs": args.jobs, "python": sys.version.split()[0]}
    try:
        for mode, alias in (("redis", None), ("journal_sqlite", "default"), ("journal_pg", "pg")):
            print(f"measuring {mode} ...", file=sys.stderr)
            journal = {**jobq_settings()["JOURNAL"], "DATABASE_ALIAS": alias or "default"}
            with override_settings(JOBQ={**jobq_settings(), "JOURNAL": journal}):
                durability = "redis" if alias is None else "journal"
                queue = Queue(QUEUE, storage=storage, durability=durability)
                results[mode] = measure(queue, alias, args.jobs)
                storage.obliterate(QUEUE, force=True)
                if alias is not None:
                    JournalEntry.objects.using(alias).filter(queue=QUEUE).delete()
        print("measuring reconcile ...", file=sys.stderr)
        results["reconcile_pg"] = measure_reconcile(storage, args.reconcile_jobs)
    finally:
        storage.obliterate(QUEUE, force=True)
        storage.close()
    base = results["redis"]
    for mode in ("journal_sqlite", "journal_pg"):
        results[mode]["one_vs_redis"] = round(results[mode]["one_per_s"] / base["one_per_s"], 3)
        results[mode]["bulk_vs_redis"] = round(results[mode]["bulk_per_s"] / base["bulk_per_s"], 3)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
