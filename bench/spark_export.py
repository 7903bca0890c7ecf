"""Benchmark of ``jobq_export``: wall time and peak memory exporting a PostgreSQL history.

    .venv/bin/python -m bench.spark_export --events 10000000 [--chunk 50000]

Creates a database of its own (``jobq_bench_export_<pid>`` on 127.0.0.1:5432, dropped at the
end), fills it in SQL with ``--events`` events (3 per job: queued, active, completed; 4 queues,
one day), then times ``export_history`` into a temporary directory. Peak memory is this
process's maximum resident set (the export runs no JVM): it should not grow with ``--events``,
only with ``--chunk``. One JSON object goes to stdout; progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DB_NAME = f"jobq_bench_export_{os.getpid()}"
os.environ["JOBQ_BENCH_PG_DB"] = DB_NAME
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.spark_settings")

JOBS_SQL = """
INSERT INTO django_jobq_job (queue, job_id, handler, state, payload, content_type, attempts,
    max_attempts, stalls, max_stalls, priority, min_backoff, max_backoff, result_ttl,
    created_at, started_at, finished_at, worker, token, waiters, error)
SELECT 'q' || (i %% 4), 'job-' || i, 'app.jobs.h' || (i %% 8), 'completed', '', 'json', 1, 3, 0,
    1, 0, 1000, 3600000, 86400000, ts, ts + interval '1 second', ts + interval '2 seconds',
    'w' || (i %% 16), 0, 0, NULL
FROM generate_series(1, %s) AS i,
    LATERAL (SELECT timestamptz '2026-03-01' + i * (interval '86400 seconds' / %s) AS ts) AS t
"""
EVENTS_SQL = """
INSERT INTO django_jobq_jobevent (job_id, queue, kind, at, worker, detail, stream_id)
SELECT j.id, j.queue, k.kind, j.created_at + k.off, j.worker, NULL, ''
FROM django_jobq_job AS j CROSS JOIN (VALUES ('queued', interval '0'),
    ('active', interval '1 second'), ('completed', interval '2 seconds')) AS k(kind, off)
ORDER BY j.id, k.off
"""


def _psql(*args: str) -> None:
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-q", *args], check=True)


def _fill(events: int) -> None:
    from django.db import connection

    jobs = events // 3
    with connection.cursor() as cursor:
        cursor.execute(JOBS_SQL, [jobs, jobs])
        cursor.execute(EVENTS_SQL)
        cursor.execute("ANALYZE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--chunk", type=int, default=50_000)
    args = parser.parse_args()
    _psql("-c", f"CREATE DATABASE {DB_NAME}")
    work = Path(tempfile.mkdtemp(prefix="jobq-bench-export-"))
    try:
        result = _run(args, work)
    finally:
        from django.db import connections

        connections.close_all()
        shutil.rmtree(work, ignore_errors=True)
        _psql("-c", f"DROP DATABASE IF EXISTS {DB_NAME}")
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _run(args: argparse.Namespace, work: Path) -> dict:
    import django

    django.setup()
    from django.core.management import call_command

    from django_jobq.contrib.spark.export import export_history

    call_command("migrate", verbosity=0)
    t0 = time.perf_counter()
    _fill(args.events)
    fill_s = time.perf_counter() - t0
    print(f"filled {args.events} events in {fill_s:.1f} s", file=sys.stderr)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t1 = time.perf_counter()
    out = export_history(work, chunk=args.chunk, settle=0)
    wall_s = time.perf_counter() - t1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "events": out.events, "jobs": out.jobs, "files": out.files, "chunk": args.chunk,
        "fill_s": round(fill_s, 1), "export_wall_s": round(wall_s, 1),
        "events_per_s": round(out.events / wall_s) if wall_s else None,
        "peak_rss_mib": round(peak / 1024), "rss_before_export_mib": round(rss_before / 1024),
        "parquet_mib": round(sum(f.stat().st_size for f in work.rglob("*.parquet")) / 2**20),
        "cores": os.cpu_count(), "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }  # fmt: skip


if __name__ == "__main__":
    main()
