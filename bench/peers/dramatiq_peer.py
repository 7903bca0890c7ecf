"""Dramatiq 2 with its Redis broker and Redis results backend.

Most favourable reasonable settings, and why:

- one worker process with 8 threads (``dramatiq --processes 1 --threads 8``; Dramatiq's
  default is one process per core): enough threads to overlap each thread's Redis round
  trips, few enough that a no-op task does not spend its time fighting over the GIL.
- ``dramatiq_queue_prefetch=64``: each fetch moves up to 64 messages in one Lua call
  (the default, twice the threads, fetches 16).
- ``dramatiq_worker_timeout=1`` (ms): the Redis broker does not block on an empty queue, it
  polls with a back-off that grows up to this timeout (default 1,000 ms, which would put up
  to a second into every request/response). 1 ms is the smallest it takes: the idle worker
  then polls about every 0.5-1 ms, the best latency it can have.
- default middleware (age limit, time limit, retries...), ``max_retries=0``; the Results
  middleware only for the request/response actor (``store_results=True``), whose result the
  client waits for with ``get_result(block=True)`` (a blocking BRPOPLPUSH, no polling).
- bulk enqueue: Dramatiq has none (``group(...).run()`` enqueues message by message), so n/a.
"""

from __future__ import annotations

from pathlib import Path

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from bench.peers.common import QUEUE, Adapter, probe_record, redis_url

THREADS = 8
PREFETCH = 64
WORKER_TIMEOUT_MS = 1

broker = RedisBroker(url=redis_url())
broker.add_middleware(Results(backend=RedisBackend(url=redis_url())))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def noop(n: int) -> None:
    probe_record()


@dramatiq.actor(queue_name=QUEUE, max_retries=0, store_results=True)
def echo(n: int) -> int:
    return 1


def make_adapter() -> Adapter:
    def enqueue_one(n: int) -> None:
        for i in range(n):
            noop.send(i)

    def worker_command(role: str) -> list[str]:
        import sys

        cli = str(Path(sys.executable).with_name("dramatiq"))
        return [cli, "bench.peers.dramatiq_peer", "--processes", "1", "--threads",
                str(THREADS), "--queues", QUEUE]  # fmt: skip

    def rr_call() -> int:
        return echo.send(1).get_result(block=True, timeout=10_000)

    return Adapter(
        name="Dramatiq",
        version=dramatiq.__version__,
        settings={
            "processes": 1,
            "threads": THREADS,
            "dramatiq_queue_prefetch": PREFETCH,
            "dramatiq_worker_timeout_ms": WORKER_TIMEOUT_MS,
            "results": "Results middleware (Redis) for request/response only, blocking get",
        },
        enqueue_one=enqueue_one,
        enqueue_bulk=None,
        fill=enqueue_one,
        worker_command=worker_command,
        rr_call=rr_call,
        not_available={
            "enqueue_bulk": "no bulk enqueue: group().run() enqueues one message at a time"
        },
        worker_env={
            "dramatiq_queue_prefetch": str(PREFETCH),
            "dramatiq_worker_timeout": str(WORKER_TIMEOUT_MS),
        },
        close=broker.close,
    )


def run_worker(role: str) -> None:
    raise SystemExit("Dramatiq workers run as the `dramatiq` command")
