"""The PostgreSQL database of a database-backed peer: one per system, named
``test_jobq_peers_<system>`` (``PEERBENCH_PG_PREFIX`` changes the prefix), created when missing.
Only the standard library and psycopg, which every database peer's venv brings."""

from __future__ import annotations

import os


def conninfo(system: str) -> str:
    """The peer's database, created if missing (on the server of ``PEERBENCH_PG_HOST``)."""
    import psycopg

    host = os.environ.get("PEERBENCH_PG_HOST", "127.0.0.1")
    user = os.environ.get("PEERBENCH_PG_USER", "postgres")
    name = os.environ.get("PEERBENCH_PG_PREFIX", "test_jobq_peers_") + system
    with psycopg.connect(host=host, user=user, dbname="postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    return f"host={host} user={user} dbname={name}"


# This machine's PostgreSQL runs with autovacuum off (a test server); a production server's
# autovacuum analyzes a table once 50 + 10 % of its rows changed, i.e. soon after a drain's
# 10,000 jobs are queued. Without statistics the planner sized the freshly filled table from
# nothing, and Procrastinate's fetch drained 172 jobs/s instead of 662/s (one round each, the
# same minutes). Every system's drain therefore starts from an analyzed table
# (bench/core_db.py does the same for django_jobq).
ANALYZE_AFTER_FILL = "ANALYZE"
