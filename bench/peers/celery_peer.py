"""Celery 5 on the Redis transport and Redis result backend.

Most favourable reasonable settings, and why:

- worker ``-P solo``: the task runs in the worker's own process and thread, no pool hand-off
  (prefork pipes every task to a child; threads add a hand-off and the GIL): for a no-op task
  it is Celery's fastest pool, and the one its own docs suggest for I/O-light work on one core.
- ``--prefetch-multiplier 64``: the consumer keeps up to 64 messages reserved ahead, so the
  next one is usually in memory when a task ends (tried 4, the default, 64 and 256 with 3,000
  jobs: the differences were within this machine's noise, 64 was best once).
- ``--without-gossip --without-mingle --without-heartbeat``, no task events: no cluster
  chatter on the broker connection during the run (Celery's own advice for throughput).
- ``task_ignore_result`` for the no-op (no result write per job), early ack (the default):
  the cheapest delivery Celery offers. The request/response task keeps its result, which
  the client gets through the Redis backend's pub/sub (``AsyncResult.get``), not by polling.
- bulk enqueue: Celery itself has no bulk call (``group(...).apply_async()`` publishes its
  messages one by one and adds a group result), but kombu 5.7's ``Producer.batch(max_size)``
  buffers the ``apply_async`` calls made through one producer and sends them as one Redis
  pipeline per ``max_size`` messages: that is Celery's fastest way to enqueue many, and it is
  what is measured (1,000 per batch, as for django_jobq).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import celery
from celery import Celery

from bench.peers.common import QUEUE, Adapter, probe_record, redis_url

PREFETCH = 64

app = Celery("peerbench", broker=redis_url(), backend=redis_url())
app.conf.update(
    task_default_queue=QUEUE,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    task_acks_late=False,
    worker_prefetch_multiplier=PREFETCH,
    worker_send_task_events=False,
    task_send_sent_event=False,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="peerbench.noop")
def noop(n: int) -> None:
    probe_record()


@app.task(name="peerbench.echo", ignore_result=False)
def echo(n: int) -> int:
    return 1


def make_adapter() -> Adapter:
    def enqueue_one(n: int) -> None:
        for i in range(n):
            noop.apply_async((i,))

    def enqueue_bulk(n: int, chunk: int) -> None:
        with app.producer_or_acquire() as producer:
            for offset in range(0, n, chunk):
                with producer.batch(max_size=chunk):
                    for i in range(offset, min(n, offset + chunk)):
                        noop.apply_async((i,), producer=producer)

    def worker_command(role: str) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", "bench.peers.celery_peer", "worker",
                "-P", "solo", "-Q", QUEUE, "-l", "WARNING", "--prefetch-multiplier",
                str(PREFETCH), "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-n", f"peerbench-{uuid.uuid4().hex[:8]}@%h"]  # fmt: skip

    def rr_call() -> int:
        return echo.apply_async((1,)).get(timeout=10)

    return Adapter(
        name="Celery",
        version=celery.__version__,
        settings={
            "pool": "solo",
            "prefetch_multiplier": PREFETCH,
            "acks": "early (default)",
            "results": "ignored for the no-op; Redis backend (pub/sub) for request/response",
            "flags": "--without-gossip --without-mingle --without-heartbeat",
            "bulk": "kombu Producer.batch(max_size=1000) around apply_async",
        },
        enqueue_one=enqueue_one,
        enqueue_bulk=enqueue_bulk,
        fill=lambda n: enqueue_bulk(n, 1000),
        worker_command=worker_command,
        rr_call=rr_call,
        close=app.close,
    )


def run_worker(role: str) -> None:
    raise SystemExit(f"Celery workers run as `celery worker` ({Path(__file__).name})")
