"""Procrastinate 3 (PostgreSQL): the database-backed peer of django_jobq's database backend.

Most favourable reasonable settings, and why:
- an ``async def`` no-op task: Procrastinate runs sync tasks in a thread, async ones on its
  loop, which is cheaper per job;
- the worker's ``listen_notify`` on (the default): an idle worker is woken by ``NOTIFY`` at
  once, not after its fetch polling interval;
- drain: one worker process, ``concurrency=10`` (of 10 and 50, the faster on this machine in
  the session that opened this comparison);
- request/response: Procrastinate keeps no results, so the client defers the job and reads its
  status (``JobManager.get_job_status``) every 1 ms until it succeeded: what a caller of
  Procrastinate has to do;
- bulk: ``Task.batch_defer``, 1,000 jobs per call, as for django_jobq;
- ``delete_jobs="never"`` (the default): finished jobs are kept, as django_jobq keeps records.

The jobs table is emptied before each workload (``TRUNCATE``), in its own database, and
analyzed after the drain's jobs are queued, as autovacuum would (``pg.ANALYZE_AFTER_FILL``).
"""

from __future__ import annotations

import sys
import time
from importlib.metadata import version

import procrastinate

from bench.peers.common import QUEUE, Adapter, probe_record
from bench.peers.pg import ANALYZE_AFTER_FILL, conninfo

ENQ_QUEUE = "peerbench-enq"
DRAIN_CONCURRENCY = 10

CONNINFO = conninfo("procrastinate")
# One app: the worker runs it async; the benchmark's client side opens it sync (``App.open``),
# which makes Procrastinate use the connector's sync counterpart.
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=CONNINFO))


@app.task(queue=QUEUE, name="noop")
async def noop(n: int) -> None:
    probe_record()


def _prepare() -> None:
    """The schema on first use, and an empty jobs table for this workload."""
    sync = app.connector.get_sync_connector()
    ready = sync.execute_query_one("SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS ready")
    if not ready["ready"]:  # as `procrastinate schema --apply`; sent without parameters
        import psycopg

        with psycopg.connect(CONNINFO, autocommit=True) as conn:
            conn.execute(app.schema_manager.get_schema())
    sync.execute_query("TRUNCATE procrastinate_jobs CASCADE")


def make_adapter() -> Adapter:
    client = app.open()
    _prepare()
    deferrer = noop.configure(queue=ENQ_QUEUE)
    drain_deferrer = noop.configure(queue=QUEUE)

    def enqueue_one(n: int) -> None:
        for i in range(n):
            deferrer.defer(n=i)

    def enqueue_bulk(n: int, chunk: int) -> None:
        for offset in range(0, n, chunk):
            deferrer.batch_defer(*({"n": i} for i in range(offset, min(n, offset + chunk))))

    def fill(n: int) -> None:
        for offset in range(0, n, 1000):
            drain_deferrer.batch_defer(*({"n": i} for i in range(offset, min(n, offset + 1000))))
        app.connector.get_sync_connector().execute_query(ANALYZE_AFTER_FILL)  # see pg.py

    def worker_command(role: str) -> list[str]:
        return [sys.executable, "-m", "bench.peers.common", "procrastinate", "worker", role]

    def rr_call() -> None:
        job_id = drain_deferrer.defer(n=0)
        deadline = time.monotonic() + 10
        while client.job_manager.get_job_status(job_id) != procrastinate.jobs.Status.SUCCEEDED:
            if time.monotonic() > deadline:
                raise RuntimeError("Procrastinate job did not succeed within 10 s")
            time.sleep(0.001)

    return Adapter(
        name="Procrastinate",
        version=version("procrastinate"),
        settings={
            "task": "async def no-op",
            "drain_concurrency": DRAIN_CONCURRENCY,
            "listen_notify": True,
            "rr_wait": "get_job_status every 1 ms (Procrastinate keeps no results)",
            "bulk": "Task.batch_defer, 1,000 jobs per call",
        },
        enqueue_one=enqueue_one,
        enqueue_bulk=enqueue_bulk,
        fill=fill,
        worker_command=worker_command,
        rr_call=rr_call,
        close=client.close,
    )


def run_worker(role: str) -> None:
    """One worker process; SIGTERM stops it (Procrastinate's own signal handlers)."""
    app.run_worker(
        queues=[QUEUE],
        concurrency=DRAIN_CONCURRENCY if role == "drain" else 1,
        install_signal_handlers=True,
    )
