"""BullMQ for Python (asyncio) on Redis.

Most favourable reasonable settings, and why:

- worker ``concurrency=8`` for the drain (default 1): the Python worker keeps ``concurrency``
  fetches and jobs in flight on one event loop, so it needs several to overlap its Redis round
  trips; tried here at 1, 4, 8, 16, 64 and 256 with 3,000 jobs, 4-8 was best (64 ran at half
  the rate of 8). The request/response worker runs at concurrency 1: with 64, a lone no-op job
  took ~10 ms from start to finish in the worker, against ~1 ms at 1. The idle worker blocks
  on the queue's marker key (BZPOPMIN), so no poll delay stands in the way.
- ``removeOnComplete`` for the no-op (no completed-set bookkeeping kept).
- request/response: the client waits on ``QueueEvents`` (a blocking XREAD on the queue's
  event stream) for the job's ``completed`` event, the BullMQ way to wait for a job.
- bulk: ``Queue.addBulk`` (one multi-job call), 1,000 jobs per call as for django_jobq.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from importlib.metadata import version
from typing import Any

from bullmq import Queue, QueueEvents, Worker

from bench.peers.common import QUEUE, Adapter, probe_record, redis_url, timed_async

CONCURRENCY = 8
RR_CONCURRENCY = 1
NOOP_OPTS = {"removeOnComplete": True}


async def process(job: Any, token: str) -> int:
    if job.name == "noop":
        probe_record()
    return 1


def make_adapter() -> Adapter:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    queue = Queue(QUEUE, {"connection": redis_url()})
    events: list[QueueEvents] = []

    async def enqueue(n: int) -> None:
        for i in range(n):
            await queue.add("noop", {"n": i}, NOOP_OPTS)

    async def bulk(n: int, chunk: int) -> None:
        for offset in range(0, n, chunk):
            await queue.addBulk(
                [
                    {"name": "noop", "data": {"n": i}, "opts": NOOP_OPTS}
                    for i in range(offset, min(n, offset + chunk))
                ]
            )

    async def one_rr() -> Any:
        if not events:
            # From the stream's start: the database is flushed before every workload, so
            # nothing old is there, and no event can slip past before the first XREAD.
            events.append(QueueEvents(QUEUE, {"connection": redis_url(), "lastEventId": "0"}))
        job_id = uuid.uuid4().hex
        done: asyncio.Future = loop.create_future()

        def completed(*args: Any) -> None:
            if not done.done():
                done.set_result(args)

        channel = f"completed:{job_id}"
        events[0].on(channel, completed)
        try:
            await queue.add("echo", {"n": 1}, {"jobId": job_id, "removeOnComplete": True})
            return await asyncio.wait_for(done, 10)
        finally:
            events[0].off(channel, completed)

    def worker_command(role: str) -> list[str]:
        return [sys.executable, "-m", "bench.peers.common", "bullmq", "worker", role]

    def close() -> None:
        async def shut() -> None:
            for e in events:
                await e.close()
            await queue.close()

        loop.run_until_complete(shut())
        loop.close()

    return Adapter(
        name="BullMQ",
        version=version("bullmq"),
        settings={
            "concurrency": CONCURRENCY,
            "removeOnComplete": True,
            "result_wait": "QueueEvents completed:<jobId> (blocking XREAD)",
            "bulk": "Queue.addBulk, 1,000 jobs per call",
        },
        enqueue_one=lambda n: loop.run_until_complete(enqueue(n)),
        enqueue_bulk=lambda n, chunk: loop.run_until_complete(bulk(n, chunk)),
        fill=lambda n: loop.run_until_complete(bulk(n, 1000)),
        worker_command=worker_command,
        rr_call=lambda: loop.run_until_complete(one_rr()),
        rr_timed=lambda n, warmup: loop.run_until_complete(timed_async(one_rr, n, warmup)),
        close=close,
    )


def run_worker(role: str) -> None:
    """One worker process until SIGTERM, then a graceful close (in-flight jobs finish)."""

    async def serve() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        default = CONCURRENCY if role == "drain" else RR_CONCURRENCY
        concurrency = int(os.environ.get("PEERBENCH_BULLMQ_CONCURRENCY", default))
        worker = Worker(QUEUE, process, {"connection": redis_url(), "concurrency": concurrency})
        await stop.wait()
        await worker.close()

    asyncio.run(serve())
