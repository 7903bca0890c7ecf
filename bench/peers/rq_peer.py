"""RQ 2 with its non-forking ``SimpleWorker``.

Most favourable reasonable settings, and why:

- ``SimpleWorker`` (``rq worker -w rq.worker.SimpleWorker``): runs each job in the worker
  process itself. RQ's default worker forks a child per job (about 65 jobs/s here), which no
  one would choose for short jobs.
- ``result_ttl=0`` for the no-op: no result is kept, so RQ skips writing it; the
  request/response job keeps the default TTL and the client waits with
  ``Job.latest_result(timeout=...)``, which blocks on the result stream (no polling).
- ``--logging_level WARNING``: RQ logs two lines per job at INFO.
- bulk: ``Queue.enqueue_many`` (one pipeline per call), 1,000 jobs a call as for django_jobq.
"""

from __future__ import annotations

import sys
from pathlib import Path

import rq
from redis import Redis
from rq import Queue

from bench.peers.common import QUEUE, Adapter, probe_record, redis_url


def noop(n: int) -> None:
    probe_record()


def echo(n: int) -> int:
    return 1


def make_adapter() -> Adapter:
    connection = Redis.from_url(redis_url())
    queue = Queue(QUEUE, connection=connection)

    def enqueue_one(n: int) -> None:
        for i in range(n):
            queue.enqueue(noop, i, result_ttl=0)

    def enqueue_bulk(n: int, chunk: int) -> None:
        for offset in range(0, n, chunk):
            queue.enqueue_many(
                [
                    Queue.prepare_data(noop, (i,), result_ttl=0)
                    for i in range(offset, min(n, offset + chunk))
                ]
            )

    def worker_command(role: str) -> list[str]:
        rq_cli = str(Path(sys.executable).with_name("rq"))
        return [rq_cli, "worker", "-w", "rq.worker.SimpleWorker", "-u", redis_url(),
                "--logging_level", "WARNING", QUEUE]  # fmt: skip

    def rr_call() -> int:
        job = queue.enqueue(echo, 1)
        result = job.latest_result(timeout=10)
        if result is None:
            raise RuntimeError("RQ job gave no result within 10 s")
        return result.return_value

    return Adapter(
        name="RQ",
        version=rq.__version__,
        settings={
            "worker": "rq.worker.SimpleWorker (no fork per job)",
            "result_ttl": "0 for the no-op; default for request/response",
            "wait": "Job.latest_result(timeout) (blocking read of the result stream)",
            "logging": "WARNING",
            "bulk": "Queue.enqueue_many, 1,000 jobs per call",
        },
        enqueue_one=enqueue_one,
        enqueue_bulk=enqueue_bulk,
        fill=lambda n: enqueue_bulk(n, 1000),
        worker_command=worker_command,
        rr_call=rr_call,
        close=connection.close,
    )


def run_worker(role: str) -> None:
    raise SystemExit("RQ workers run as `rq worker`")
