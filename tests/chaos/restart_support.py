"""Support of fault test 5 (test_redis_restart.py): a private redis-server with AOF
``everysec`` that can be SIGKILLed, rolled back to an older AOF and restarted; PostgreSQL
ledgers; and the worker / reaper processes, started as ``python -m tests.chaos.restart_support
<command> ...``, which registers the ledger handler and runs the real management command.

Ledgers (their own database, so pytest-django's flushes never touch them):
- ``enqueued(job_id)``: written by the producer after each accepted enqueue;
- ``executions(job_id, attempt, token, pid, started, finished)``: written by the handler;
- ``effects(job_id primary key)``: upserted by the handler at the end of each run.
Lost = enqueued - effects; duplicates = executions - 1 per job.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.helpers import Spawner, worker_ports

ROOT = Path(__file__).resolve().parents[2]
QUEUE = "chaos-restart"
# Another suite (tests/cluster/) running beside this one names its own ledger database here.
LEDGER_DB = os.environ.get("JOBQ_CHAOS_LEDGER_DB", "jobq_journal_ledger")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS enqueued (job_id text PRIMARY KEY, at double precision NOT NULL);
CREATE TABLE IF NOT EXISTS executions (
    id bigserial PRIMARY KEY, job_id text NOT NULL, attempt int NOT NULL, token bigint NOT NULL,
    pid int NOT NULL, started double precision NOT NULL, finished double precision
);
CREATE TABLE IF NOT EXISTS effects (job_id text PRIMARY KEY, runs int NOT NULL DEFAULT 1);
"""


def _dsn(dbname: str) -> str:
    user = os.environ.get("JOBQ_TEST_PG_USER", "postgres")
    return f"host=127.0.0.1 port=5432 user={user} dbname={dbname}"


# -- ledgers ------------------------------------------------------------------------------------


class Ledger:
    """The three ledger tables in their own PostgreSQL database (created when missing)."""

    def __init__(self, dbname: str = LEDGER_DB) -> None:
        import psycopg

        self.dbname = dbname
        with psycopg.connect(_dsn("postgres"), autocommit=True) as admin:
            exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [dbname])
            if exists.fetchone() is None:
                admin.execute(f'CREATE DATABASE "{dbname}"')
        self._local = threading.local()
        with self.connect() as conn:
            conn.execute(_SCHEMA)
            conn.execute("TRUNCATE enqueued, executions, effects")

    def connect(self):
        import psycopg

        return psycopg.connect(_dsn(self.dbname), autocommit=True)

    def _conn(self):
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self._local.conn = self.connect()
        return conn

    def accepted(self, job_ids: list[str]) -> None:
        with self._conn().cursor() as cur:
            cur.executemany(
                "INSERT INTO enqueued (job_id, at) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                [(job_id, time.time()) for job_id in job_ids],
            )

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()

    def figures(self) -> dict[str, int]:
        with self.connect() as conn:
            enqueued, lost = conn.execute(
                "SELECT (SELECT count(*) FROM enqueued), (SELECT count(*) FROM enqueued e"
                " WHERE NOT EXISTS (SELECT 1 FROM effects f WHERE f.job_id = e.job_id))"
            ).fetchone()
            executions, duplicated = conn.execute(
                "SELECT count(*), count(*) - count(DISTINCT job_id) FROM executions"
                " WHERE finished IS NOT NULL"
            ).fetchone()
            completed = conn.execute("SELECT count(*) FROM effects").fetchone()[0]
        return {"enqueued": enqueued, "completed": completed, "lost": lost,
                "executions": executions, "duplicated": duplicated}  # fmt: skip

    def lost_ids(self, limit: int = 20) -> list[str]:
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT job_id FROM enqueued e WHERE NOT EXISTS"
                " (SELECT 1 FROM effects f WHERE f.job_id = e.job_id) LIMIT %s",
                [limit],
            ).fetchall()
        return [r[0] for r in rows]

    def first_start_after(self, moment: float, pid: int) -> float | None:
        """When worker ``pid`` started its first run after ``moment`` (None: not yet)."""
        with self.connect() as conn:
            row = conn.execute(
                "SELECT min(started) FROM executions WHERE started > %s AND pid = %s",
                [moment, pid],
            ).fetchone()
        return row[0]


# -- the private Redis --------------------------------------------------------------------------


class RestartableRedis:
    """redis-server on a private port with ``appendonly yes``, ``appendfsync everysec``.

    ``kill`` is SIGKILL (no shutdown save); ``snapshot`` copies the AOF directory as it is on
    disk now, and ``restart(rollback=True)`` starts from that older copy, as a restart after a
    lost fsync window or a failover to a lagging replica would. Stopped by PID only."""

    def __init__(self, port: int, workdir: Path) -> None:
        self.port = port
        self.dir = workdir / "redis"
        self.snap = workdir / "redis-snapshot"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.log = workdir / "redis.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20.0) -> float:
        """Start and wait until it answers PING (AOF loaded); returns that moment (epoch s)."""
        self.proc = subprocess.Popen(
            [
                "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), "--appendonly", "yes", "--appendfsync", "everysec",
                "--auto-aof-rewrite-percentage", "0", "--save", "", "--protected-mode", "yes",
                "--logfile", str(self.log),
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        import redis

        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                try:
                    if client.ping():
                        return time.time()
                except redis.exceptions.ConnectionError:  # refused, or LOADING the AOF
                    time.sleep(0.02)
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited: see {self.log}")
        finally:
            client.close()
        raise RuntimeError(f"redis-server on {self.port} not ready in {timeout}s")

    def snapshot(self) -> None:
        if self.snap.exists():
            shutil.rmtree(self.snap)
        shutil.copytree(self.dir, self.snap)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def restart(self, *, rollback: bool = False) -> float:
        if rollback:
            shutil.rmtree(self.dir)
            shutil.copytree(self.snap, self.dir)
        return self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def free_port(first: int = 7200, last: int = 7299) -> int:
    """A free loopback port of this test's range (7200-7299), in this xdist worker's share: a
    restarted server's port is free for a moment and must not go to another worker."""
    import socket

    for port in worker_ports(range(first, last + 1)):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}-{last}")


def write_report(test: str, **figures) -> None:
    """One JSON line per run, in the fault suite's report file (JOBQ_CHAOS_REPORT)."""
    import json
    import tempfile

    path = Path(
        os.environ.get("JOBQ_CHAOS_REPORT", Path(tempfile.gettempdir()) / "chaos-report.jsonl")
    )
    row = {"test": test, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **figures}
    with path.open("a") as fh:
        fh.write(json.dumps(row) + "\n")
    print("chaos figures:", json.dumps(row))


# -- worker and reaper processes ----------------------------------------------------------------


class Processes(Spawner):
    """``runworker`` / ``runreaper`` through this module's entry point, stopped by PID."""

    def __init__(self, workdir: Path, redis_url: str) -> None:
        super().__init__(workdir, {
            "JOBQ_TEST_REDIS_URL": redis_url,
            "JOBQ_TEST_PREFIX": "jobq",
            "JOBQ_TEST_SQLITE": str(workdir / "subprocess.sqlite3"),
        })  # fmt: skip
        self.workdir = workdir

    def argv(self, args: tuple[str, ...]) -> list[str]:
        return [sys.executable, "-m", "tests.chaos.restart_support", *args]

    def spawn(self, *args: str, log: str) -> subprocess.Popen:
        return self(*args, log=log)


def _register_handler() -> None:
    from django_jobq import handler

    ledger_conns = threading.local()

    def conn():
        c = getattr(ledger_conns, "conn", None)
        if c is None or c.closed:
            import psycopg

            c = ledger_conns.conn = psycopg.connect(_dsn(LEDGER_DB), autocommit=True)
        return c

    @handler(QUEUE)
    def record(job):
        """Records its run (start, then end and effect) in the PostgreSQL ledgers."""
        c = conn()
        run_id = c.execute(
            "INSERT INTO executions (job_id, attempt, token, pid, started) VALUES"
            " (%s, %s, %s, %s, %s) RETURNING id",
            [job.id, job.attempt, job.token, os.getpid(), time.time()],
        ).fetchone()[0]
        time.sleep(job.payload.get("seconds", 0))
        with c.transaction():
            c.execute("UPDATE executions SET finished = %s WHERE id = %s", [time.time(), run_id])
            c.execute(
                "INSERT INTO effects (job_id) VALUES (%s)"
                " ON CONFLICT (job_id) DO UPDATE SET runs = effects.runs + 1",
                [job.id],
            )
        return job.id


def main(argv: list[str]) -> None:
    """``<command> args...``: the journal settings of the test, the ledger handler, then the
    real management command (runworker / runreaper / jobq_reconcile)."""
    import django

    import tests.settings as test_settings

    shards = int(os.environ.get("JOBQ_CHAOS_SHARDS", "1"))  # the cluster tests shard it
    test_settings.JOBQ = {
        **test_settings.JOBQ,
        "QUEUES": {QUEUE: {"durability": "journal", **({"shards": shards} if shards > 1 else {})}},
        "JOURNAL": {"DATABASE_ALIAS": "pg", "MIN_AGE": 2.0, "RECONCILE_INTERVAL": 2.0},
    }
    django.setup()
    _register_handler()
    from django.core.management import call_command

    call_command(*argv)


if __name__ == "__main__":
    main(sys.argv[1:])
