"""The fault tests' ledgers, kept in PostgreSQL (never in the Redis under test).

- ``enqueued(job_id)``: written by the test after each enqueue the storage accepted;
- ``executions(job_id, attempt, token, pid, started, finished)``: written by the handler, a row
  when a run starts and its ``finished`` when the run's side effect is done;
- ``effects(job_id primary key)``: upserted by the handler, the side effect the job exists for.

Lost = enqueued − completed; duplicates = executions − 1 per job. The ledger database is one of
this test run's own (``jobq_chaos_ledger_<pid>_<n>``), created for a test and dropped after it.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg

PG_ADMIN_DSN = os.environ.get("JOBQ_CHAOS_PG_DSN", "host=127.0.0.1 port=5432 user=postgres")
ENV_DSN = "JOBQ_CHAOS_LEDGER_DSN"  # how worker processes find the ledger

SCHEMA = """
CREATE TABLE enqueued (job_id text PRIMARY KEY);
CREATE TABLE executions (
    id bigserial PRIMARY KEY,
    job_id text NOT NULL,
    attempt int NOT NULL,
    token bigint NOT NULL,
    pid int NOT NULL,
    started double precision NOT NULL,
    finished double precision
);
CREATE INDEX executions_job ON executions (job_id);
CREATE TABLE effects (job_id text PRIMARY KEY, runs int NOT NULL DEFAULT 1);
"""


@dataclass(frozen=True)
class Tally:
    """What a fault run did to its jobs, from the ledgers and the storage's final states."""

    enqueued: int
    completed: int
    lost: int  # enqueued − completed
    duplicated: int  # executions − 1, summed over jobs
    effects: int
    executions: int
    unfinished_runs: int  # runs that started but whose process died before the effect


class Ledger:
    """One ledger database; ``dsn`` is passed to worker processes through ``ENV_DSN``."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or f"jobq_chaos_ledger_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.name}"')
        self.dsn = f"{PG_ADMIN_DSN} dbname={self.name}"
        self._conn = psycopg.connect(self.dsn, autocommit=True)
        self._conn.execute(SCHEMA)
        self._lock = threading.Lock()

    def drop(self) -> None:
        self._conn.close()
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def record_enqueued(self, job_ids: Iterable[str]) -> None:
        rows = [(job_id,) for job_id in job_ids]
        with self._lock, self._conn.cursor() as cur:
            cur.executemany("INSERT INTO enqueued VALUES (%s) ON CONFLICT DO NOTHING", rows)

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock, self._conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()

    def runs_per_job(self) -> dict[str, int]:
        return dict(self.query("SELECT job_id, count(*) FROM executions GROUP BY job_id"))

    def executions_of(self, job_id: str) -> list[tuple]:
        """(attempt, token, pid, started, finished) of each run of one job, oldest first."""
        return self.query(
            "SELECT attempt, token, pid, started, finished FROM executions"
            " WHERE job_id = %s ORDER BY started",
            (job_id,),
        )

    def tally(self, completed: Iterable[str]) -> Tally:
        enqueued = {row[0] for row in self.query("SELECT job_id FROM enqueued")}
        done = enqueued & set(completed)
        runs = self.runs_per_job()
        (effects,) = self.query("SELECT count(*) FROM effects")[0]
        (unfinished,) = self.query("SELECT count(*) FROM executions WHERE finished IS NULL")[0]
        return Tally(
            enqueued=len(enqueued),
            completed=len(done),
            lost=len(enqueued - done),
            duplicated=sum(n - 1 for job, n in runs.items() if job in enqueued and n > 1),
            effects=effects,
            executions=sum(runs.values()),
            unfinished_runs=unfinished,
        )


# -- the handler's side (worker processes) -----------------------------------------------------

# One connection per worker process, shared by its handler threads under a lock: a connection
# per thread would take 128 of PostgreSQL's 100 slots with 4 workers × 32, and each write here
# is a fraction of a millisecond.
_conn: psycopg.Connection | None = None
_conn_lock = threading.Lock()


def _connection() -> psycopg.Connection:
    global _conn
    if _conn is None or _conn.closed:
        _conn = psycopg.connect(os.environ[ENV_DSN], autocommit=True)
        # The ledger is the test's record, not the system under test: PostgreSQL is not crashed
        # here, so commits need not wait for the disk (a 2-core machine runs 20,000 jobs).
        _conn.execute("SET synchronous_commit = off")
    return _conn


def start_run(job_id: str, attempt: int, token: int, started: float) -> int:
    with _conn_lock:
        row = (
            _connection()
            .execute(
                "INSERT INTO executions (job_id, attempt, token, pid, started)"
                " VALUES (%s, %s, %s, %s, %s) RETURNING id",
                (job_id, attempt, token, os.getpid(), started),
            )
            .fetchone()
        )
    assert row is not None
    return int(row[0])


def finish_run(run_id: int, job_id: str, finished: float) -> None:
    with _conn_lock:
        conn = _connection()
        with conn.transaction():
            conn.execute(
                "INSERT INTO effects (job_id) VALUES (%s)"
                " ON CONFLICT (job_id) DO UPDATE SET runs = effects.runs + 1",
                (job_id,),
            )
            conn.execute("UPDATE executions SET finished = %s WHERE id = %s", (finished, run_id))
