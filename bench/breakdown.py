"""Where the time goes: the breakdowns behind docs/benchmarks.md's analysis.

    python -m bench.breakdown rr      [--calls 500] [--concurrency 8] [--db postgres|sqlite]
    python -m bench.breakdown drain   [--jobs 10000] [--concurrency 64] [--top 25] [--shared-rng]
    python -m bench.breakdown enqueue [--jobs 50000]

``rr`` traces ``enqueue_and_wait`` calls against a worker process whose storage calls and
``execute`` are wrapped with timestamps (CLOCK_MONOTONIC is shared by all processes, so client
and worker stamps line up) and prints the median of each leg of the round trip. With ``--db``
it traces the database backend instead (``bench.core_db``'s database, emptied before and after).

``drain`` runs an in-process Worker (no process start-up) under cProfile (process-wide in
Python 3.12, so every handler thread is included) and reports the Redis server's own time per
job from ``INFO commandstats`` deltas (never CONFIG RESETSTAT: the server is shared).

``enqueue`` splits one-by-one and bulk enqueue into client Python and Redis server time.

Everything runs under its own ``jobqbench-prof-<random>`` prefix, deleted at the end.
"""

from __future__ import annotations

import argparse
import bisect
import cProfile
import io
import json
import os
import pstats
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.core import ROOT, delete_matching, log, redis_client, run_pattern, setup_django

QUEUE = "bench"


def server_usec(client: Any) -> tuple[int, int]:
    """(usec, calls) Redis has spent in EVALSHA so far: deltas of this are server time."""
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("usec", 0)), int(stats.get("calls", 0))


# -- rr ---------------------------------------------------------------------------------------


def traced_worker(concurrency: int, out_path: str) -> None:
    """Worker process of ``rr``: a real Worker whose storage calls record when they ran."""
    from django_jobq.backend import get_storage
    from django_jobq.worker import core as worker_mod
    from django_jobq.worker import stopsignals
    from django_jobq.worker.pools import thread as thread_pool

    storage = get_storage()
    stamps: list[tuple[str, str | None, int]] = []
    now = time.monotonic_ns
    wait, wait_and_claim, claim, ack_many, execute = (
        storage.wait_for_jobs,
        storage.wait_and_claim,
        storage.claim,
        storage.ack_many,
        thread_pool.execute,  # what the thread pool's runner calls per job
    )

    def traced_wait(*args: Any, **kwargs: Any) -> Any:
        result = wait(*args, **kwargs)
        stamps.append(("wake", None, now()))
        return result

    def traced_wait_and_claim(*args: Any, **kwargs: Any) -> Any:
        # Redis: the claim ran on the server as the wait ended and came back with the wake-up,
        # so the wake and both claim stamps are one instant (the claim legs read 0).
        batch = wait_and_claim(*args, **kwargs)
        t = now()
        if batch is not None:
            stamps.append(("wake", None, t))
            for job in batch.jobs:
                stamps.extend([("claim0", job.job_id, t), ("claim1", job.job_id, t)])
        else:
            stamps.append(("wake", None, t))
        return batch

    def traced_claim(*args: Any, **kwargs: Any) -> Any:
        t0 = now()
        batch = claim(*args, **kwargs)
        t1 = now()
        for job in batch.jobs:
            stamps.extend([("claim0", job.job_id, t0), ("claim1", job.job_id, t1)])
        return batch

    def traced_ack_many(queue: str, acks: Any) -> Any:
        t0 = now()
        outcomes = ack_many(queue, acks)
        t1 = now()
        for ack in acks:
            stamps.extend([("ack0", ack.job_id, t0), ("ack1", ack.job_id, t1)])
        return outcomes

    def traced_execute(claimed: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = now()
        verdict = execute(claimed, *args, **kwargs)
        stamps.extend([("exec0", claimed.job_id, t0), ("exec1", claimed.job_id, now())])
        return verdict

    storage.wait_for_jobs = traced_wait
    storage.wait_and_claim = traced_wait_and_claim
    storage.claim = traced_claim
    storage.ack_many = traced_ack_many
    thread_pool.execute = traced_execute
    worker = worker_mod.Worker([QUEUE], concurrency=concurrency)
    with stopsignals.relayed(lambda _: worker.stop(hurry=True), [signal.SIGTERM]):
        worker.run()
    with open(out_path, "w") as f:
        json.dump(stamps, f)


RR_LEGS = (
    "client: enqueue call returns",
    "client start -> worker's BLPOP returns (+claim)",
    "wake -> claim sent",
    "claim call (round trip + script)",
    "claim returned -> handler thread starts",
    "execute() of the no-op handler",
    "handler done -> acker sends",
    "ack_many call (round trip + script)",
    "TOTAL (client start -> result)",
)


def profile_rr(calls: int, concurrency: int, prefix: str, gap_ms: float = 0) -> None:
    """Median of every leg of a request/response, client and worker stamps aligned by id.
    ``gap_ms``: every call after that long a pause (as each block's first call in
    ``bench.core``'s interleaved measurement, which comes after the worker sat idle), so the
    legs say where an idle machine's first call spends its extra time."""
    from django_jobq.backend import get_storage
    from django_jobq.queue import Queue

    storage = get_storage()
    fd, out_path = tempfile.mkstemp(prefix="jobq-rr-trace-", suffix=".json")
    os.close(fd)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "bench.breakdown", "_worker", "--concurrency", str(concurrency),
           "--out", out_path, "--prefix", prefix]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    client_stamps: dict[str, dict[str, int]] = {}
    try:
        deadline = time.monotonic() + 30
        while not storage.list_workers():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the traced worker did not start")
            time.sleep(0.02)
        time.sleep(0.3)
        parse = getattr(storage, "_parse_enqueue", None)

        def traced_parse(jobs: Any, raw: Any) -> Any:
            # The enqueue's reply is in: on Redis enqueue_and_wait reads it while its BLPOP,
            # sent in the same write, is still blocked.
            for job in jobs:
                client_stamps.setdefault(job.job_id, {})["enq1"] = time.monotonic_ns()
            return parse(jobs, raw)  # type: ignore[misc]

        if parse is not None:
            storage._parse_enqueue = traced_parse
        else:  # the database backend: the enqueue call itself
            enqueue = storage.enqueue

            def traced_enqueue(queue: str, job: Any) -> Any:
                stored = enqueue(queue, job)
                client_stamps.setdefault(job.job_id, {})["enq1"] = time.monotonic_ns()
                return stored

            storage.enqueue = traced_enqueue
        queue = Queue(QUEUE)
        for i in range(50):
            queue.enqueue_and_wait(payload={"n": i}, timeout=10)
        client_stamps.clear()
        for i in range(calls):
            if gap_ms:
                time.sleep(gap_ms / 1000)
            job_id = uuid.uuid4().hex
            t0 = time.monotonic_ns()
            queue.enqueue_and_wait(job_id, {"n": i}, timeout=10)
            client_stamps[job_id].update(c0=t0, c2=time.monotonic_ns())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    with open(out_path) as f:
        stamps = json.load(f)
    os.unlink(out_path)
    wakes = sorted(t for kind, _, t in stamps if kind == "wake")
    worker: dict[str, dict[str, int]] = {}
    for kind, job_id, t in stamps:
        if job_id in client_stamps:
            worker.setdefault(job_id, {})[kind] = t
    legs: dict[str, list[int]] = {name: [] for name in RR_LEGS}
    for job_id, c in client_stamps.items():
        w = worker.get(job_id, {})
        if "ack1" not in w:
            continue
        i = bisect.bisect_right(wakes, w["claim0"]) - 1
        wake = wakes[i] if i >= 0 and wakes[i] > c["c0"] else None
        values = [
            c["enq1"] - c["c0"],
            None if wake is None else wake - c["c0"],
            None if wake is None else w["claim0"] - wake,
            w["claim1"] - w["claim0"],
            w["exec0"] - w["claim1"],
            w["exec1"] - w["exec0"],
            w["ack0"] - w["exec1"],
            w["ack1"] - w["ack0"],
            c["c2"] - c["c0"],
        ]
        for name, value in zip(RR_LEGS, values, strict=True):
            if value is not None:
                legs[name].append(value)
    gap = f", each after a {gap_ms:g} ms pause" if gap_ms else ""
    print(f"{calls} enqueue_and_wait calls, worker concurrency {concurrency}{gap} (µs):")
    for name, values in legs.items():
        values.sort()
        p50 = statistics.median(values) / 1e3
        p90 = values[int(len(values) * 0.9)] / 1e3
        print(f"  {name:44s} p50 {p50:8.1f}   p90 {p90:8.1f}")
    print("  (the client wakes when the ack script pushes the result, before ack_many returns)")


# -- drain ------------------------------------------------------------------------------------


def profile_drain(jobs: int, concurrency: int, top: int, shared_rng: bool) -> None:
    """In-process drain: rate without and with cProfile, server µs per job, hottest functions.

    ``shared_rng`` is an experiment, not a fix: it wraps the worker's ``execute`` so it gets one
    module-level ``random.Random`` instead of seeding a new one per job (a few lines later in
    the product), to measure what that per-job seeding costs.
    """
    from django_jobq import JobState
    from django_jobq.queue import Queue
    from django_jobq.worker import Worker
    from django_jobq.worker.pools import thread as thread_pool

    if shared_rng:
        execute, rng = thread_pool.execute, random.Random()

        def execute_shared_rng(claimed: Any, handlers: Any, job: Any = None) -> Any:
            return execute(claimed, handlers, job, rng)

        thread_pool.execute = execute_shared_rng

    client = redis_client()
    queue = Queue(QUEUE)

    def drain(profiler: cProfile.Profile | None) -> tuple[float, float]:
        base = queue.counts()[JobState.COMPLETED]
        for offset in range(0, jobs, 1000):
            queue.enqueue_many([(None, {"n": 1}) for _ in range(min(1000, jobs - offset))])
        usec0, _ = server_usec(client)
        worker = Worker([QUEUE], concurrency=concurrency)
        if profiler:
            profiler.enable()
        start = time.perf_counter()
        thread = worker.start()
        while queue.counts()[JobState.COMPLETED] - base < jobs:
            time.sleep(0.02)
        elapsed = time.perf_counter() - start
        if profiler:
            profiler.disable()
        worker.stop()
        thread.join(30)
        return elapsed, (server_usec(client)[0] - usec0) / jobs

    elapsed, server = drain(None)
    label = " (experiment: one shared Random)" if shared_rng else ""
    print(f"in-process drain, concurrency {concurrency}{label}: {jobs / elapsed:,.0f} jobs/s")
    print(f"  wall {elapsed / jobs * 1e6:.1f} µs/job; Redis EVALSHA time {server:.1f} µs/job")
    profiler = cProfile.Profile()
    elapsed, _ = drain(profiler)
    print(f"under cProfile: {jobs / elapsed:,.0f} jobs/s; hottest functions (all threads):")
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    print(text.getvalue())


# -- enqueue ----------------------------------------------------------------------------------


def profile_enqueue(jobs: int) -> None:
    """Client vs server share of one-by-one and bulk enqueue (the two run one after another:
    one-by-one waits a round trip per job; bulk packs everything, then waits once)."""
    from django_jobq.queue import Queue

    client = redis_client()
    queue = Queue("bench-enq")
    storage = queue.storage

    def timed(label: str, n: int, fn: Callable[[], Any]) -> None:
        usec0, calls0 = server_usec(client)
        start = time.perf_counter()
        fn()
        wall = (time.perf_counter() - start) / n * 1e6
        usec1, calls1 = server_usec(client)
        server = (usec1 - usec0) / n
        evalsha = calls1 - calls0
        print(
            f"  {label:38s} wall {wall:7.1f} µs/job  server {server:6.1f} µs/job"
            f"  ({evalsha} EVALSHA)"
        )

    one = min(jobs, 5000)
    for _ in range(200):
        client.ping()
    print("per job:")
    items = [(None, {"n": i}) for i in range(jobs)]
    built = [queue.build(None, {"n": i}) for i in range(jobs)]
    calls = [storage._enqueue_call("bench-enq", built[i : i + 500]) for i in range(0, jobs, 500)]
    connection = client.connection_pool.get_connection()

    def ping() -> None:
        for _ in range(one):
            client.ping()

    def build() -> None:
        for i in range(jobs):
            queue.build(None, {"n": i})

    def enqueue_one() -> None:
        for i in range(one):
            queue.enqueue(payload={"n": i})

    def enqueue_bulk() -> None:
        for i in range(0, jobs, 500):
            queue.enqueue_many(items[i : i + 500])

    def pack() -> None:
        for _, keys, args in calls:
            connection.pack_command("EVALSHA", "0" * 40, len(keys), *keys, *args)

    try:
        timed("PING (reference round trip)", one, ping)
        timed("Queue.build only (validate+serialise)", jobs, build)
        timed("Queue.enqueue, one per call", one, enqueue_one)
        timed("Queue.enqueue_many, 500 per call", jobs, enqueue_bulk)
        timed("redis-py packing of the bulk calls", jobs, pack)
    finally:
        client.connection_pool.release(connection)


def main(argv: list[str] | None = None) -> None:
    """Dispatch to one profile; always delete this run's keys."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["rr", "drain", "enqueue", "_worker"])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--gap-ms", type=float, default=0, help="rr: idle pause before each call")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--shared-rng", action="store_true", help="drain: the Random experiment")
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--db", choices=["postgres", "sqlite"], help="rr: the database backend")
    args = parser.parse_args(argv)
    if args.what == "_worker":  # the traced worker process of "rr"
        setup_django(args.prefix)
        traced_worker(args.concurrency, args.out)
        return
    prefix = f"jobqbench-prof-{uuid.uuid4().hex[:10]}"
    if args.db:
        if args.what != "rr":
            parser.error("--db applies to rr only")
        from bench import core_db

        core_db.setup(args.db)  # exports JOBQ_BENCH_DB, inherited by the traced worker
        core_db.reset()
        try:
            profile_rr(args.calls, args.concurrency or 8, prefix)
        finally:
            core_db.reset()
        return
    setup_django(prefix)
    try:
        if args.what == "rr":
            profile_rr(args.calls, args.concurrency or 8, prefix, args.gap_ms)
        elif args.what == "drain":
            profile_drain(args.jobs or 10_000, args.concurrency or 64, args.top, args.shared_rng)
        else:
            profile_enqueue(args.jobs or 50_000)
    finally:
        removed = delete_matching(redis_client(), run_pattern(prefix))
        log(f"deleted {removed} keys of {prefix}")


if __name__ == "__main__":
    main()
