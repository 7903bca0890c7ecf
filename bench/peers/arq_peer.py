"""arq (asyncio) with a tuned poll delay.

Most favourable reasonable settings, and why:

- ``poll_delay=0.001`` s on the worker (default 0.5 s): arq's worker does not block on Redis,
  it sleeps ``poll_delay`` between reads of the queue, so the default puts up to half a
  second into every request/response and between every batch of a drain. 1 ms polls the
  idle queue ~1,000 times a second: the lowest sensible setting.
- ``max_jobs=100`` (default 10) and the default ``queue_read_limit`` (5 × max_jobs): more jobs
  in flight per poll, fewer polls per job.
- the client waits with ``Job.result(poll_delay=0.001)``: arq has no blocking wait for a result.
- ``keep_result=0`` for the no-op (no result written); the request/response task keeps its
  result (the client reads it).
- the worker is started with ``arq.run_worker`` from Python, without arq's CLI logging set-up
  (which logs two lines per job at INFO).
- bulk enqueue: arq has none (``enqueue_job`` is one job per call), so n/a.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import arq
from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import func

from bench.peers.common import QUEUE, Adapter, probe_record, redis_url, timed_async

POLL_DELAY = 0.001
MAX_JOBS = 100


async def noop(ctx: dict, n: int) -> None:
    probe_record()


async def echo(ctx: dict, n: int) -> int:
    return 1


class WorkerSettings:
    functions = [func(noop, name="noop", keep_result=0), func(echo, name="echo")]
    redis_settings = RedisSettings.from_dsn(redis_url())
    queue_name = QUEUE
    poll_delay = POLL_DELAY
    max_jobs = MAX_JOBS
    handle_signals = True


def make_adapter() -> Adapter:
    loop = asyncio.new_event_loop()
    pool = loop.run_until_complete(create_pool(WorkerSettings.redis_settings))

    async def enqueue(n: int) -> None:
        for i in range(n):
            await pool.enqueue_job("noop", i, _queue_name=QUEUE)

    async def fill(n: int) -> None:
        # Not timed: many enqueue_job calls in flight at once, only to queue the drain's jobs
        # quickly (arq's client is asyncio, so this is its natural way to enqueue many).
        for offset in range(0, n, 100):
            calls = (pool.enqueue_job("noop", i, _queue_name=QUEUE)
                     for i in range(offset, min(n, offset + 100)))  # fmt: skip
            await asyncio.gather(*calls)

    async def one_rr() -> Any:
        job = await pool.enqueue_job("echo", 1, _queue_name=QUEUE)
        return await job.result(timeout=10, poll_delay=POLL_DELAY)

    def worker_command(role: str) -> list[str]:
        return [sys.executable, "-m", "bench.peers.common", "arq", "worker", role]

    def close() -> None:
        loop.run_until_complete(pool.aclose())
        loop.close()

    return Adapter(
        name="arq",
        version=arq.VERSION,
        settings={
            "poll_delay_s": POLL_DELAY,
            "max_jobs": MAX_JOBS,
            "result_wait": f"Job.result(poll_delay={POLL_DELAY})",
            "keep_result": "0 for the no-op",
            "logging": "arq's per-job INFO lines not configured",
        },
        enqueue_one=lambda n: loop.run_until_complete(enqueue(n)),
        enqueue_bulk=None,
        fill=lambda n: loop.run_until_complete(fill(n)),
        worker_command=worker_command,
        rr_call=lambda: loop.run_until_complete(one_rr()),
        rr_timed=lambda n, warmup: loop.run_until_complete(timed_async(one_rr, n, warmup)),
        not_available={"enqueue_bulk": "no bulk enqueue: enqueue_job takes one job per call"},
        close=close,
    )


def run_worker(role: str) -> None:
    from arq.worker import run_worker as arq_run_worker

    arq_run_worker(WorkerSettings)  # type: ignore[arg-type]
