"""Core benchmark: enqueue, bulk enqueue, drain and request/response against a local Redis.

    python -m bench.core [--quick] [--runs N] [--drain-concurrency 32,64,128] [--out FILE]
    python -m bench.core --db postgres|sqlite [--quick] [--runs N]   (bench/core_db.py)
    python -m bench.core --observability metrics|tracing|tracing-sampled|tracing-noexport

``--observability MODE`` runs every figure *with* that feature on (workers and this producing
process alike; the modes of ``bench/observability.py``), so the issue's "bench.core with and
without" is two invocations; ``bench.observability`` does the same pairwise, interleaved,
with the worker's CPU per job beside the rates.

Measures, side by side in one process run, the four figures of ``/work/shared/TARGETS.md``
(and ``docs/benchmarks.md``) plus raw Redis references taken with the same redis-py client, so
each figure can be read against what the machine and the client allow at all:

1. ``enqueue_one_per_s``: sequential ``Queue.enqueue`` calls, one job each.
2. ``enqueue_bulk_per_s``: ``Queue.enqueue_many`` in chunks (best chunk size reported).
3. ``drain_per_s``: 10,000 queued no-op jobs, one ``manage.py runworker`` process, from the
   moment it is spawned to the last completion (start-up included, nothing subtracted); the
   steady rate (first completion to last) and the start-up time are reported beside it.
4. ``rr_p50_ms`` / ``rr_p99_ms``: sequential ``Queue.enqueue_and_wait`` against an idle worker.
5. References: PING round trip, LPUSH pipelined x16, LPUSH+BRPOP hand-off between processes.

With ``--runs N`` every figure is measured N times and the median is reported. One JSON object
goes to stdout; progress goes to stderr.

Isolation: every invocation uses its own key prefix ``jobqbench-<random>`` (handed to the worker
subprocess through ``JOBQ_BENCH_PREFIX``) and deletes only that prefix's keys at the end; worker
subprocesses are stopped by PID (SIGTERM, then SIGKILL if they hang).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "bench"  # served by bench/benchapp/jobs.py
ENQ_QUEUE = "bench-enq"  # enqueue-only phases: nobody serves it, emptied after each phase

# The figures to compare against (peers measured on this kind of machine) and the minimum bar.
TARGETS: dict[str, float] = {
    "enqueue_one_per_s": 10_000,
    "enqueue_bulk_per_s": 40_000,
    "drain_per_s": 5_000,
    "rr_p50_ms": 0.5,
    "rr_p99_ms": 1.0,
}
MIN_TARGETS: dict[str, float] = {
    "enqueue_one_per_s": 8_000,
    "enqueue_bulk_per_s": 40_000,
    "drain_per_s": 5_000,
    "rr_p50_ms": 1.5,
}
PEERS: dict[str, str] = {
    "enqueue_one_per_s": "Dramatiq 7,363/s, Huey 7,303/s",
    "enqueue_bulk_per_s": "RQ enqueue_many 16,754/s",
    "drain_per_s": "arq (tuned) 2,294/s; Dramatiq 1,995/s; Huey 1,971/s; Celery 991/s",
    "rr_ms": "Huey (8 threads) 0.61 / 1.14 ms; Celery solo 1.37 / 2.19 ms",
}
LOWER_IS_BETTER = ("rr_p50_ms", "rr_p99_ms")
# Goals as ratios to a reference of the same run (TARGETS.md): enqueue one by one at least
# 0.8x the sequential PING rate, request/response p50 at most 3x and p99 at most 5x the
# LPUSH->BRPOP hand-off's p50, a runworker's spawn -> first claim at most 0.4 s, and several
# worker processes draining faster than one from spawn to the last completion.
GOALS: dict[str, float] = {
    "enqueue_one_vs_ping": 0.8,
    "rr_p50_vs_handoff": 3.0,
    "rr_p99_vs_handoff": 5.0,
    "worker_startup_s": 0.4,
}


def log(message: str) -> None:
    """Progress on stderr, so stdout carries nothing but the JSON result."""
    print(f"[bench.core] {message}", file=sys.stderr, flush=True)


# -- set-up -----------------------------------------------------------------------------------


def setup_django(prefix: str) -> None:
    """Point Django at bench.settings with this run's prefix before anything reads settings."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["JOBQ_BENCH_PREFIX"] = prefix
    import django

    django.setup()


def redis_client() -> Any:
    """The client the Queue API itself uses (django_jobq's pool, hiredis parser if present)."""
    from django_jobq.backend import get_storage

    return get_storage().client


def redis_url() -> str:
    """The Redis URL of bench.settings, for the hand-off child and redis-benchmark."""
    from django_jobq.conf import jobq_settings

    return jobq_settings()["REDIS_URL"]


def delete_matching(client: Any, pattern: str) -> int:
    """UNLINK the keys matching ``pattern`` (SCAN, never KEYS or FLUSH*); returns how many."""
    deleted, batch = 0, []
    for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            deleted += client.unlink(*batch)
            batch = []
    if batch:
        deleted += client.unlink(*batch)
    return deleted


def queue_pattern(prefix: str, queue: str) -> str:
    """SCAN pattern of one queue's keys: all of them carry the hash tag ``{prefix:queue}``."""
    return "{" + f"{prefix}:{queue}" + "}*"


def run_pattern(prefix: str) -> str:
    """SCAN pattern of every key of this run: ``{prefix:queue}...`` and ``{prefix}:...``.

    The bracket stops a prefix that happens to start another prefix from matching its keys.
    """
    return "{" + prefix + "[:}]*"


def cpu_busy_pct(seconds: float = 0.5) -> float:
    """Share of all CPUs busy over ``seconds`` (from /proc/stat): other load on a 2-core box
    skews every figure, so each run records how busy the machine was just before it."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + fields[4]
        return sum(fields), idle

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except OSError:
        return float("nan")
    total = total1 - total0
    return round(100.0 * (1 - (idle1 - idle0) / total), 1) if total else 0.0


def wait_quiet(max_wait: float, threshold: float = 15.0) -> float:
    """Wait up to ``max_wait`` seconds for the machine to be nearly idle; returns the last
    busy figure so the report says what the run competed with."""
    deadline = time.monotonic() + max_wait
    busy = cpu_busy_pct()
    while busy > threshold and time.monotonic() < deadline:
        log(f"machine {busy:.0f}% busy before the run; waiting for it to quieten")
        time.sleep(2)
        busy = cpu_busy_pct()
    return busy


# -- statistics -------------------------------------------------------------------------------


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile: p99 of 500 samples is the 495th, an observed value."""
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def latency_summary(ns: list[int], unit: float) -> dict[str, float]:
    """p50 / p99 / mean / max of ``ns`` samples, divided by ``unit`` (1e3: µs, 1e6: ms)."""
    values = sorted(x / unit for x in ns)
    return {
        "p50": round(statistics.median(values), 4),
        "p99": round(percentile(values, 99), 4),
        "mean": round(statistics.fmean(values), 4),
        "max": round(values[-1], 4),
    }


# -- worker subprocess ------------------------------------------------------------------------


@contextmanager
def running_worker(concurrency: int, log_dir: Path) -> Iterator[subprocess.Popen]:
    """A ``manage.py runworker bench`` subprocess, stopped by PID (SIGTERM) whatever happens."""
    with running_workers(concurrency, 1, log_dir) as procs:
        yield procs[0]


@contextmanager
def running_workers(
    concurrency: int, processes: int, log_dir: Path, prefork: bool = False
) -> Iterator[list[subprocess.Popen]]:
    """``processes`` ``manage.py runworker bench`` subprocesses started together (as several
    worker hosts or containers would be), each stopped by its PID (SIGTERM) whatever happens;
    with ``prefork``, one ``runworker --processes N`` that forks them after one set-up (its
    SIGTERM reaches every child)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "PYTHONPATH": str(ROOT),
    }
    started: list[tuple[subprocess.Popen, Path]] = []
    extra = ["--processes", str(processes)] if prefork else []
    try:
        for _ in range(1 if prefork else processes):
            log_path = log_dir / f"worker-c{concurrency}-{uuid.uuid4().hex[:6]}.log"
            with log_path.open("w") as out:
                proc = subprocess.Popen(
                    [sys.executable, str(ROOT / "manage.py"), "runworker", QUEUE,
                     "--concurrency", str(concurrency), *extra, "--settings", "bench.settings"],
                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
            started.append((proc, log_path))
        yield [proc for proc, _ in started]
    finally:
        for proc, _ in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # all at once, so their grace periods overlap
        for proc, log_path in started:
            stop_process(proc, log_path, signalled=True)


def stop_process(proc: subprocess.Popen, log_path: Path, signalled: bool = False) -> None:
    """SIGTERM by PID and wait; SIGKILL only if it does not leave within the grace period.

    ``signalled``: SIGTERM was already sent (a second one would cut the worker's grace short).
    """
    if proc.poll() is None:
        if not signalled:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            log(f"worker {proc.pid} ignored SIGTERM; killing it (log: {log_path})")
            proc.kill()
            proc.wait(timeout=10)
    if proc.returncode not in (0, -signal.SIGTERM):
        log(f"worker {proc.pid} exited {proc.returncode}; log tail:\n{tail(log_path)}")


def tail(path: Path, lines: int = 20) -> str:
    """The end of a worker log, for error messages."""
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` every 20 ms; fail loudly rather than report a figure for a hang."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


# -- measurements -----------------------------------------------------------------------------


def measure_enqueue_one(n: int, prefix: str) -> dict[str, Any]:
    """N sequential ``Queue.enqueue`` calls: one script round trip each, like a web request
    enqueueing one job."""
    from django_jobq.queue import Queue

    client = redis_client()
    queue = Queue(ENQ_QUEUE)
    for i in range(200):  # warm-up: script cache, connection, queue registration
        queue.enqueue(payload={"n": -i})
    start = time.perf_counter()
    for i in range(n):
        queue.enqueue(payload={"n": i})
    elapsed = time.perf_counter() - start
    delete_matching(client, queue_pattern(prefix, ENQ_QUEUE))
    return {"jobs": n, "seconds": round(elapsed, 4), "per_s": round(n / elapsed, 1)}


def measure_enqueue_vs_ping(blocks: int, block: int, prefix: str) -> dict[str, Any]:
    """Blocks of ``block`` sequential PINGs and of as many one-job ``Queue.enqueue`` calls,
    alternated, and the median over pairs of (PING time / enqueue time): the enqueue rate as
    a share of the PING rate with both taken within a second of each other, so load that comes
    and goes on a shared machine hits both sides of each ratio alike."""
    from django_jobq.queue import Queue

    client = redis_client()
    queue = Queue(ENQ_QUEUE)
    for i in range(200):
        queue.enqueue(payload={"n": -i})
        client.ping()
    ratios, n = [], 0
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(block):
            client.ping()
        ping = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(block):
            queue.enqueue(payload={"n": n})
            n += 1
        ratios.append(ping / (time.perf_counter() - start))
    delete_matching(client, queue_pattern(prefix, ENQ_QUEUE))
    ratios.sort()
    return {"blocks": blocks, "block": block, "ratio": round(statistics.median(ratios), 3),
            "min": round(ratios[0], 3), "max": round(ratios[-1], 3)}  # fmt: skip


# Producer threads of the concurrent one-by-one figures: a small and a large web server.
# From 3 threads on, the Redis backend combines calls that meet (see storage.redis._Combiner).
PRODUCER_THREADS = (4, 16)


def measure_enqueue_one_threads(n: int, threads: int, prefix: str) -> dict[str, Any]:
    """The same one-job calls from ``threads`` producer threads (a web server's request
    threads): each call still waits for its own reply, but calls overlap on the wire. On a
    machine whose sequential PING rate is below the one-by-one target, this is the figure that
    shows what the queue itself can take."""
    import threading

    from django_jobq.queue import Queue

    client = redis_client()
    queue = Queue(ENQ_QUEUE)
    for i in range(200):
        queue.enqueue(payload={"n": -i})
    per_thread = n // threads
    barrier = threading.Barrier(threads + 1)

    def produce() -> None:
        barrier.wait()
        for i in range(per_thread):
            queue.enqueue(payload={"n": i})

    workers = [threading.Thread(target=produce) for _ in range(threads)]
    for t in workers:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in workers:
        t.join()
    elapsed = time.perf_counter() - start
    delete_matching(client, queue_pattern(prefix, ENQ_QUEUE))
    jobs = per_thread * threads
    return {"jobs": jobs, "threads": threads, "seconds": round(elapsed, 4),
            "per_s": round(jobs / elapsed, 1)}  # fmt: skip


def measure_enqueue_bulk(n: int, chunk: int, prefix: str) -> dict[str, Any]:
    """N jobs through ``Queue.enqueue_many`` ``chunk`` at a time (items built before timing:
    the caller's own loop is not the queue's cost; validation and serialisation are timed)."""
    from django_jobq.queue import Queue

    client = redis_client()
    queue = Queue(ENQ_QUEUE)
    queue.enqueue_many([(None, {"n": -i}) for i in range(chunk)])  # warm-up
    items = [(None, {"n": i}) for i in range(n)]
    start = time.perf_counter()
    for offset in range(0, n, chunk):
        queue.enqueue_many(items[offset : offset + chunk])
    elapsed = time.perf_counter() - start
    delete_matching(client, queue_pattern(prefix, ENQ_QUEUE))
    return {"jobs": n, "chunk": chunk, "seconds": round(elapsed, 4), "per_s": round(n / elapsed, 1)}


def job_times(client: Any, prefix: str, ids: list[str]) -> tuple[list[int], list[int]]:
    """(started, finished) epoch ms of the given jobs, read from their records in one pipeline
    per thousand; the scripts stamp them with Redis TIME, on this host's clock."""
    from django_jobq.storage.redis.keys import QueueKeys

    keys = QueueKeys.for_queue(prefix, QUEUE)
    started: list[int] = []
    finished: list[int] = []
    for offset in range(0, len(ids), 1000):
        pipe = client.pipeline(transaction=False)
        for job_id in ids[offset : offset + 1000]:
            pipe.hmget(keys.job(job_id), "started", "finished")
        for s, f in pipe.execute():
            if s is not None and f is not None:
                started.append(int(s))
                finished.append(int(f))
    return started, finished


def measure_drain(
    n: int,
    concurrency: int,
    prefix: str,
    tag: str,
    log_dir: Path,
    processes: int = 1,
    prefork: bool = False,
) -> dict:
    """Queue N no-op jobs, spawn ``processes`` workers, time spawn -> last completion.

    The end is detected by polling the queue's completed counter every 20 ms; the figures
    themselves come from the jobs' own ``started``/``finished`` stamps, so the poll interval
    adds nothing to them. Job records are deleted afterwards so every trial starts from the
    same keyspace.
    """
    from django_jobq import JobState
    from django_jobq.queue import Queue
    from django_jobq.storage.redis.keys import QueueKeys

    client = redis_client()
    queue = Queue(QUEUE)
    baseline = queue.counts()[JobState.COMPLETED]
    ids = [f"drain-{tag}-{i}" for i in range(n)]
    for offset in range(0, n, 1000):
        queue.enqueue_many([(job_id, {"n": 1}) for job_id in ids[offset : offset + 1000]])
    queued = queue.counts()[JobState.QUEUED]
    if queued != n:
        raise RuntimeError(f"expected {n} queued jobs before the drain, found {queued}")

    spawn_ms = time.time() * 1000
    start = time.perf_counter()
    with running_workers(concurrency, processes, log_dir, prefork) as procs:

        def drained() -> bool:
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"worker exited {proc.returncode} during the drain")
            return queue.counts()[JobState.COMPLETED] - baseline >= n

        wait_for(drained, 300, f"{n} jobs to complete")
        polled = time.perf_counter() - start
    started, finished = job_times(client, prefix, ids)
    if len(finished) != n:
        raise RuntimeError(f"only {len(finished)} of {n} drained jobs have a finished stamp")
    first_claim, first_done, last_done = min(started), min(finished), max(finished)
    total = (last_done - spawn_ms) / 1000
    steady = (last_done - first_done) / 1000
    keys = QueueKeys.for_queue(prefix, QUEUE)
    for offset in range(0, n, 1000):
        client.unlink(*[keys.job(job_id) for job_id in ids[offset : offset + 1000]])
    return {
        "jobs": n,
        "concurrency": concurrency,
        "processes": processes,
        "prefork": prefork,
        "per_s": round(n / total, 1),
        "seconds": round(total, 4),
        "polled_seconds": round(polled, 4),
        "startup_s": round((first_claim - spawn_ms) / 1000, 4),
        "first_to_last_s": round(steady, 4),
        "steady_per_s": round((n - 1) / steady, 1) if steady > 0 else None,
    }


def measure_rr(n: int, warmup: int, concurrency: int, prefix: str, log_dir: Path) -> dict:
    """Sequential ``enqueue_and_wait`` against a worker that is running and idle (blocked on
    its wake-up key), after ``warmup`` calls, timed one by one."""
    from django_jobq.queue import Queue
    from django_jobq.storage.redis.keys import GlobalKeys

    client = redis_client()
    queue = Queue(QUEUE)
    with running_worker(concurrency, log_dir) as proc:
        wait_for(lambda: client.zcard(GlobalKeys(prefix).workers) > 0, 60, "the worker")
        time.sleep(0.3)  # let it reach its blocking wait
        for i in range(warmup):
            queue.enqueue_and_wait(payload={"n": i}, timeout=10)
        samples: list[int] = []
        for i in range(n):
            t0 = time.perf_counter_ns()
            queue.enqueue_and_wait(payload={"n": i}, timeout=10)
            samples.append(time.perf_counter_ns() - t0)
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited {proc.returncode} during the rr test")
    summary = latency_summary(samples, 1e6)
    return {"calls": n, "warmup": warmup, "concurrency": concurrency, **summary}


def measure_ping(n: int) -> dict[str, Any]:
    """Sequential PING on the same client: the floor under any one-round-trip call."""
    client = redis_client()
    for _ in range(200):
        client.ping()
    samples = []
    start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter_ns()
        client.ping()
        samples.append(time.perf_counter_ns() - t0)
    elapsed = time.perf_counter() - start
    return {"calls": n, "per_s": round(n / elapsed, 1), **latency_summary(samples, 1e3)}


def measure_ping_raw(n: int) -> dict[str, Any]:
    """Sequential PING written and read on one pooled connection, below redis-py's command
    layer: the same path a lone enqueue takes (``Scripts.call_packed``), so a reader can tell
    the client library's share of the PING reference from the round trip's."""
    client = redis_client()
    pool = client.connection_pool
    conn = pool.get_connection()
    packed = (b"*1\r\n$4\r\nPING\r\n",)
    try:
        for _ in range(200):
            conn.send_packed_command(packed)
            conn.read_response()
        start = time.perf_counter()
        for _ in range(n):
            conn.send_packed_command(packed)
            conn.read_response()
        elapsed = time.perf_counter() - start
    finally:
        pool.release(conn)
    return {"calls": n, "per_s": round(n / elapsed, 1)}


def measure_lpush_pipelined(n: int, prefix: str) -> dict[str, Any]:
    """LPUSH in pipelines of 16 on the same client: what redis-py can push per second."""
    client = redis_client()
    key = "{" + prefix + "}:ref:lpush"
    payload = b'{"n":1}'
    rounds = max(1, n // 16)
    start = time.perf_counter()
    for i in range(rounds):
        pipe = client.pipeline(transaction=False)
        for _ in range(16):
            pipe.lpush(key, payload)
        pipe.execute()
        if i % 1000 == 999:
            client.ltrim(key, 0, 0)  # bound memory; one extra call per 16,000 pushes
    elapsed = time.perf_counter() - start
    client.unlink(key)
    return {"pushes": rounds * 16, "per_s": round(rounds * 16 / elapsed, 1)}


def redis_benchmark_lpush(prefix: str, url: str) -> float | None:
    """``redis-benchmark -P 16 LPUSH`` (50 clients, C, no Python): the server's own ceiling,
    likely what TARGETS.md's 1.5 M/s is. On this run's key, deleted after; None if absent."""
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return None
    parsed = urlparse(url)
    key = "{" + prefix + "}:ref:redis-benchmark"
    cmd = [exe, "-h", parsed.hostname or "127.0.0.1", "-p", str(parsed.port or 6379),
           "-P", "16", "-n", "1000000", "-q", "lpush", key, "x"]  # fmt: skip
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        log(f"redis-benchmark failed: {exc}")
        return None
    finally:
        redis_client().unlink(key)
    found = re.findall(r"([\d.]+) requests per second", out)
    return float(found[-1]) if found else None


def measure_rr_vs_handoff(
    blocks: int, per_block: int, prefix: str, log_dir: Path, concurrency: int = 8
) -> dict[str, Any]:
    """Request/response against the hand-off, in alternating blocks: ``per_block`` sequential
    ``enqueue_and_wait`` calls, then ``per_block`` LPUSH→BRPOP ping-pongs with the hand-off
    child, ``blocks`` times. Each pair's ratio is rr p50 ÷ one-way hand-off p50 of that pair,
    both measured within a second of each other, so the load of a shared machine (which
    moves both) mostly cancels out; the median pair is reported, and p99 against the
    hand-off p50 over all blocks."""
    from django_jobq.queue import Queue
    from django_jobq.storage.redis.connection import blocking_command
    from django_jobq.storage.redis.keys import GlobalKeys

    client = redis_client()
    queue = Queue(QUEUE)
    inbox = "{" + prefix + "}:ref:rrho:in"
    outbox = "{" + prefix + "}:ref:rrho:out"
    child = multiprocessing.get_context("spawn").Process(
        target=_handoff_child, args=(redis_url(), inbox, outbox, blocks * per_block)
    )
    ratios: list[float] = []
    rr_all: list[int] = []
    handoff_all: list[int] = []
    client_cpu = worker_cpu = 0  # ns of CPU over the rr blocks (not the hand-off's)
    client_user = 0.0  # s of the caller's user-mode CPU (its Python, without the kernel's)
    with running_worker(concurrency, log_dir) as proc:
        child.start()
        try:
            wait_for(lambda: client.zcard(GlobalKeys(prefix).workers) > 0, 60, "the worker")
            blocking_command(client, 30, "BRPOP", outbox, 30)  # the child is "ready"
            for i in range(50):
                queue.enqueue_and_wait(payload={"n": i}, timeout=10)
            for _ in range(blocks):
                rr: list[int] = []
                cpu0 = (time.process_time_ns(), _cpu_ns(proc.pid), _user_s())
                for i in range(per_block):
                    t0 = time.perf_counter_ns()
                    queue.enqueue_and_wait(payload={"n": i}, timeout=10)
                    rr.append(time.perf_counter_ns() - t0)
                client_cpu += time.process_time_ns() - cpu0[0]
                worker_cpu += _cpu_ns(proc.pid) - cpu0[1]
                client_user += _user_s() - cpu0[2]
                handoff: list[int] = []
                for _ in range(per_block):
                    t0 = time.monotonic_ns()
                    client.lpush(inbox, t0)
                    blocking_command(client, 10, "BRPOP", outbox, 10)
                    handoff.append((time.monotonic_ns() - t0) // 2)
                ratios.append(statistics.median(rr) / statistics.median(handoff))
                rr_all += rr
                handoff_all += handoff
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited {proc.returncode} during the rr test")
        finally:
            child.join(timeout=30)
            if child.is_alive():
                child.terminate()  # by its own handle (PID), never by name
                child.join(timeout=10)
            client.unlink(inbox, outbox, outbox + ":result")
    rr_sum = latency_summary(rr_all, 1e3)
    # Each block's first call and first hand-off (every per_block-th sample) come after a
    # block of the other kind, which every process on their path sat idle through.
    rr_first, handoff_first = rr_all[::per_block], handoff_all[::per_block]
    handoff_p50 = statistics.median(handoff_all) / 1e3
    return {
        "blocks": blocks,
        "per_block": per_block,
        "rr_us": rr_sum,
        "handoff_p50_us": round(handoff_p50, 2),
        # The hand-off's own tail, against its p50: what the machine does to one wake-up, the
        # floor under the rr p99 ratio (a round trip has two of them).
        "handoff_p99_vs_handoff_p50": round(
            latency_summary(handoff_all, 1e3)["p99"] / handoff_p50, 2
        ),
        "rr_p50_vs_handoff_p50": round(statistics.median(ratios), 2),
        "rr_p99_vs_handoff_p50": round(rr_sum["p99"] / handoff_p50, 2),
        # Diagnostics, not goals: each block's first call is 1 in per_block of the samples
        # (2 % here), so the p99 above is mostly those calls, made after the worker sat idle
        # for a block of hand-offs; a hand-off after its own idle block is slower by about as
        # much (measured on the 2-vCPU VM: first one-way ~2x the steady one). The p99 of the
        # other calls, and the two first-of-block medians, say which of the two a p99 is.
        "rr_p99_after_first_vs_handoff_p50": round(
            latency_summary([v for i, v in enumerate(rr_all) if i % per_block], 1e3)["p99"]
            / handoff_p50,
            2,
        ),
        "rr_first_of_block_p50_us": round(statistics.median(rr_first) / 1e3, 1),
        "handoff_first_of_block_p50_us": round(statistics.median(handoff_first) / 1e3, 1),
        # CPU per request/response, the caller's process and the worker's (every thread):
        # the Python the round trip costs, which the wall-clock ratio only shows through the
        # machine's noise.
        "client_cpu_us_per_rr": round(client_cpu / len(rr_all) / 1e3, 1),
        "worker_cpu_us_per_rr": round(worker_cpu / len(rr_all) / 1e3, 1),
        "client_user_cpu_us_per_rr": round(client_user / len(rr_all) * 1e6, 1),
    }


def _user_s() -> float:
    """This process's user-mode CPU so far (s): its Python, without the kernel's share."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of process ``pid`` so far, in ns (Linux ``schedstat``; 0
    elsewhere, where the figures above read 0)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            pass
    return total


def _handoff_child(url: str, inbox: str, outbox: str, n: int) -> None:
    """The other end of the hand-off: BRPOP a timestamp, note the one-way delay, push one
    back at once. Results go back through Redis so no pipe adds its own latency."""
    from django_jobq.storage.redis.connection import blocking_command, client_from_url

    client = client_from_url(url)
    client.lpush(outbox, "ready")
    delays = []
    for _ in range(n):
        _, value = blocking_command(client, 10, "BRPOP", inbox, 10)
        delays.append(time.monotonic_ns() - int(value))
        client.lpush(outbox, time.monotonic_ns())
    client.lpush(outbox + ":result", json.dumps(delays))
    client.close()


def measure_handoff(n: int, warmup: int, prefix: str) -> dict[str, Any]:
    """LPUSH+BRPOP hand-off between two processes, ping-pong (one message in flight): the
    one-way delay a worker blocked on a list sees; a request/response needs two of them."""
    from django_jobq.storage.redis.connection import blocking_command

    client = redis_client()
    inbox = "{" + prefix + "}:ref:handoff:in"
    outbox = "{" + prefix + "}:ref:handoff:out"
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_handoff_child, args=(redis_url(), inbox, outbox, n + warmup))
    child.start()
    try:
        # The client's socket timeout (1 s) is for ordinary commands: a child that takes longer
        # to start on a loaded machine must not fail the run (blocking_command reads with the
        # wait plus that timeout).
        blocking_command(client, 30, "BRPOP", outbox, 30)  # "ready"
        one_way: list[int] = []
        round_trip: list[int] = []
        for i in range(n + warmup):
            t0 = time.monotonic_ns()
            client.lpush(inbox, t0)
            _, value = blocking_command(client, 10, "BRPOP", outbox, 10)
            t1 = time.monotonic_ns()
            if i >= warmup:
                one_way.append(t1 - int(value))
                round_trip.append(t1 - t0)
        _, raw = blocking_command(client, 30, "BRPOP", outbox + ":result", 30)
        one_way += json.loads(raw)[warmup:]
        child.join(timeout=30)
    finally:
        if child.is_alive():
            child.terminate()  # by its own handle (PID), never by name
            child.join(timeout=10)
        client.unlink(inbox, outbox, outbox + ":result")
    summary = latency_summary(one_way, 1e3)
    return {
        "samples": len(one_way),
        "one_way_us": summary,
        "round_trip_p50_us": round(statistics.median(round_trip) / 1e3, 2),
    }


# -- one run, many runs -----------------------------------------------------------------------


def compile_bytecode() -> bool:
    """Write the bytecode of ``django_jobq`` and ``bench`` next to their sources, as ``pip
    install`` does for an installed package, so each worker spawn loads it instead of
    compiling the sources. Why: a checkout run with ``PYTHONDONTWRITEBYTECODE`` (as this
    machine's sessions are) has no ``__pycache__``, and every ``runworker`` then compiled
    about 60 modules, 0.1 s of CPU of its start-up that no deployment pays. ``--no-compile``
    measures that case. The files are git-ignored."""
    import compileall

    return all(compileall.compile_dir(ROOT / name, quiet=1) for name in ("django_jobq", "bench"))


def one_run(args: argparse.Namespace, prefix: str, index: int, log_dir: Path) -> dict[str, Any]:
    """Every measurement once, in a fixed order; references first so they see a quiet Redis."""
    sizes = args.sizes
    busy = wait_quiet(args.wait_quiet) if args.wait_quiet else cpu_busy_pct()
    run: dict[str, Any] = {"cpu_busy_before_pct": busy, "loadavg_before": os.getloadavg()[0]}
    log(f"run {index + 1}: references (machine {busy:.0f}% busy before)")
    run["ping"] = measure_ping(sizes["ping"])
    run["ping_raw"] = measure_ping_raw(sizes["ping"])
    run["lpush_pipelined"] = measure_lpush_pipelined(sizes["lpush"], prefix)
    run["handoff"] = measure_handoff(sizes["handoff"], 100, prefix)

    log(f"run {index + 1}: enqueue one by one, {sizes['one']} jobs")
    run["enqueue_one"] = measure_enqueue_one(sizes["one"], prefix)
    log(f"  {run['enqueue_one']['per_s']:,.0f}/s")
    run["enqueue_vs_ping"] = measure_enqueue_vs_ping(20, 500, prefix)
    log(f"  interleaved with PINGs: {run['enqueue_vs_ping']['ratio']:.2f}x the PING rate")
    for threads in PRODUCER_THREADS:
        log(f"run {index + 1}: enqueue one by one from {threads} threads, {sizes['one']} jobs")
        key = f"enqueue_one_threads_{threads}"
        run[key] = measure_enqueue_one_threads(sizes["one"], threads, prefix)
        log(f"  {run[key]['per_s']:,.0f}/s")
    run["enqueue_bulk"] = []
    for chunk in args.chunks:
        log(f"run {index + 1}: enqueue_many, {sizes['bulk']} jobs in chunks of {chunk}")
        result = measure_enqueue_bulk(sizes["bulk"], chunk, prefix)
        run["enqueue_bulk"].append(result)
        log(f"  {result['per_s']:,.0f}/s")

    run["drain"] = []
    for concurrency in args.drain_concurrency:
        log(f"run {index + 1}: drain {sizes['drain']} jobs, one worker, concurrency {concurrency}")
        tag = f"r{index}c{concurrency}"
        result = measure_drain(sizes["drain"], concurrency, prefix, tag, log_dir)
        run["drain"].append(result)
        log(
            f"  {result['per_s']:,.0f}/s spawn to last ({result['seconds']:.2f}s, start-up "
            f"{result['startup_s']:.2f}s), steady {result['steady_per_s']:,.0f}/s"
        )

    if args.drain_processes > 1:
        procs, concurrency = args.drain_processes, args.drain_processes_concurrency
        # The launcher users run (runworker --processes N: one set-up, N forks), then N
        # separate runworker spawns (N set-ups queueing for the cores) as before it.
        for key, prefork, what in (
            ("drain_processes", True, f"one runworker --processes {procs}"),
            ("drain_spawns", False, f"{procs} separate runworker spawns"),
        ):
            log(
                f"run {index + 1}: drain {sizes['drain']} jobs, {what}, "
                f"concurrency {concurrency} each"
            )
            tag = f"r{index}{'p' if prefork else 's'}{procs}"
            result = measure_drain(
                sizes["drain"], concurrency, prefix, tag, log_dir, processes=procs, prefork=prefork
            )
            run[key] = result
            log(
                f"  {result['per_s']:,.0f}/s spawn to last (start-up {result['startup_s']:.2f}s), "
                f"steady {result['steady_per_s']:,.0f}/s"
            )

    log(f"run {index + 1}: request/response, {sizes['rr']} sequential calls")
    run["rr"] = measure_rr(sizes["rr"], 50, args.rr_concurrency, prefix, log_dir)
    run["rr_vs_handoff"] = measure_rr_vs_handoff(
        10, max(sizes["rr"] // 10, 20), prefix, log_dir, args.rr_concurrency
    )
    log(f"  rr in blocks alternated with hand-offs: p50 "
        f"{run['rr_vs_handoff']['rr_p50_vs_handoff_p50']:.2f}x, p99 "
        f"{run['rr_vs_handoff']['rr_p99_vs_handoff_p50']:.2f}x the hand-off p50")  # fmt: skip
    log(f"  (p99 without each block's first call "
        f"{run['rr_vs_handoff']['rr_p99_after_first_vs_handoff_p50']:.2f}x; first calls p50 "
        f"{run['rr_vs_handoff']['rr_first_of_block_p50_us']:.0f} us, first hand-offs p50 "
        f"{run['rr_vs_handoff']['handoff_first_of_block_p50_us']:.0f} us)")  # fmt: skip
    log(f"  p50 {run['rr']['p50']:.3f} ms, p99 {run['rr']['p99']:.3f} ms")
    return run


def med(values: Iterable[float | None]) -> float | None:
    """Median of the runs' figures (None when a figure could not be measured)."""
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians across runs; the best chunk size and concurrency are chosen on those medians."""
    bulk_by_chunk = {
        r["chunk"]: med(run["enqueue_bulk"][i]["per_s"] for run in runs)
        for i, r in enumerate(runs[0]["enqueue_bulk"])
    }
    best_chunk = max(bulk_by_chunk, key=lambda c: bulk_by_chunk[c] or 0)
    drain_by_c: dict[int, dict[str, float | None]] = {}
    for i, r in enumerate(runs[0]["drain"]):
        drain_by_c[r["concurrency"]] = {
            field: med(run["drain"][i][field] for run in runs)
            for field in ("per_s", "seconds", "startup_s", "first_to_last_s", "steady_per_s")
        }
    best_c = max(drain_by_c, key=lambda c: drain_by_c[c]["per_s"] or 0)
    best = drain_by_c[best_c]
    several: dict[str, Any] = {}
    # drain_N_processes_*: one runworker --processes N (pre-fork launcher); drain_N_spawns_*:
    # N separate runworker processes started together (the figure before the launcher).
    for key, label in (("drain_processes", "processes"), ("drain_spawns", "spawns")):
        if key not in runs[0]:
            continue
        procs = runs[0][key]["processes"]
        for field in ("per_s", "startup_s", "steady_per_s"):
            several[f"drain_{procs}_{label}_{field}"] = med(run[key][field] for run in runs)
        several[f"drain_{procs}_{label}_concurrency"] = runs[0][key]["concurrency"]
    return {
        "enqueue_one_per_s": med(run["enqueue_one"]["per_s"] for run in runs),
        **{
            f"enqueue_one_{t}_threads_per_s": med(
                run[f"enqueue_one_threads_{t}"]["per_s"] for run in runs
            )
            for t in PRODUCER_THREADS
        },
        "enqueue_one_vs_ping_interleaved": med(run["enqueue_vs_ping"]["ratio"] for run in runs),
        "enqueue_bulk_per_s": bulk_by_chunk[best_chunk],
        "enqueue_bulk_chunk": best_chunk,
        "enqueue_bulk_by_chunk": bulk_by_chunk,
        "drain_per_s": best["per_s"],
        "drain_concurrency": best_c,
        "drain_seconds": best["seconds"],
        "drain_worker_startup_s": best["startup_s"],
        "drain_first_to_last_s": best["first_to_last_s"],
        "drain_steady_per_s": best["steady_per_s"],
        "drain_by_concurrency": drain_by_c,
        **several,
        "rr_p50_ms": med(run["rr"]["p50"] for run in runs),
        "rr_p99_ms": med(run["rr"]["p99"] for run in runs),
        "rr_mean_ms": med(run["rr"]["mean"] for run in runs),
        "rr_max_ms": med(run["rr"]["max"] for run in runs),
        "rr_concurrency": runs[0]["rr"]["concurrency"],
        "redis_ping_p50_us": med(run["ping"]["p50"] for run in runs),
        "redis_ping_p99_us": med(run["ping"]["p99"] for run in runs),
        "redis_ping_per_s": med(run["ping"]["per_s"] for run in runs),
        "redis_ping_raw_per_s": med(run["ping_raw"]["per_s"] for run in runs),
        "lpush_pipelined_per_s": med(run["lpush_pipelined"]["per_s"] for run in runs),
        "handoff_p50_us": med(run["handoff"]["one_way_us"]["p50"] for run in runs),
        "handoff_p99_us": med(run["handoff"]["one_way_us"]["p99"] for run in runs),
        "handoff_round_trip_p50_us": med(run["handoff"]["round_trip_p50_us"] for run in runs),
        "rr_p50_vs_handoff_p50_interleaved": med(
            run["rr_vs_handoff"]["rr_p50_vs_handoff_p50"] for run in runs
        ),
        "rr_p99_vs_handoff_p50_interleaved": med(
            run["rr_vs_handoff"]["rr_p99_vs_handoff_p50"] for run in runs
        ),
        "rr_p99_after_first_vs_handoff_p50_interleaved": med(
            run["rr_vs_handoff"]["rr_p99_after_first_vs_handoff_p50"] for run in runs
        ),
        "rr_first_of_block_p50_us": med(
            run["rr_vs_handoff"]["rr_first_of_block_p50_us"] for run in runs
        ),
        "handoff_first_of_block_p50_us": med(
            run["rr_vs_handoff"]["handoff_first_of_block_p50_us"] for run in runs
        ),
    }


def ratios_and_verdicts(s: dict[str, Any]) -> dict[str, Any]:
    """Ours against the raw Redis references and against the targets (throughput: above 1 is
    better; latency: below 1 is better, the key says which way)."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    rr_us = s["rr_p50_ms"] * 1000 if s["rr_p50_ms"] is not None else None
    handoff = s["handoff_p50_us"]
    ratios = {
        "enqueue_one_vs_ping_calls": ratio(s["enqueue_one_per_s"], s["redis_ping_per_s"]),
        "enqueue_bulk_vs_lpush_pipelined": ratio(
            s["enqueue_bulk_per_s"], s["lpush_pipelined_per_s"]
        ),
        "drain_vs_ping_calls": ratio(s["drain_per_s"], s["redis_ping_per_s"]),
        "rr_p50_vs_handoff_p50": ratio(rr_us, handoff),
        "rr_p50_vs_two_handoffs": ratio(rr_us, 2 * handoff if handoff else None),
        "rr_p50_vs_ping_p50": ratio(rr_us, s["redis_ping_p50_us"]),
    }
    ratios["enqueue_one_vs_ping_raw_calls"] = ratio(
        s["enqueue_one_per_s"], s["redis_ping_raw_per_s"]
    )
    ratios["rr_p99_vs_handoff_p50"] = ratio(
        s["rr_p99_ms"] * 1000 if s["rr_p99_ms"] is not None else None, handoff
    )
    procs = next((k for k in s if re.fullmatch(r"drain_\d+_processes_per_s", k)), None)
    if procs:
        ratios["drain_processes_vs_one_spawn_to_last"] = ratio(s[procs], s["drain_per_s"])
    spawns = next((k for k in s if re.fullmatch(r"drain_\d+_spawns_per_s", k)), None)
    if spawns:
        ratios["drain_spawns_vs_one_spawn_to_last"] = ratio(s[spawns], s["drain_per_s"])
    for key, target in TARGETS.items():
        ratios[f"{key}_vs_target"] = ratio(s[key], target)
    meets = {}
    for name, targets in (("target", TARGETS), ("minimum", MIN_TARGETS)):
        for key, target in targets.items():
            value = s[key]
            ok = value is not None and (
                value <= target if key in LOWER_IS_BETTER else value >= target
            )
            meets[f"{key}_{name}"] = ok
    # The goals of docs/benchmarks.md ("The hot path"), each a ratio to this run's reference.
    goal_checks = (
        ("enqueue_one_vs_ping_calls", GOALS["enqueue_one_vs_ping"], True),
        ("enqueue_one_vs_ping_interleaved", GOALS["enqueue_one_vs_ping"], True),
        ("rr_p50_vs_handoff_p50", GOALS["rr_p50_vs_handoff"], False),
        ("rr_p99_vs_handoff_p50", GOALS["rr_p99_vs_handoff"], False),
        ("rr_p50_vs_handoff_p50_interleaved", GOALS["rr_p50_vs_handoff"], False),
        ("rr_p99_vs_handoff_p50_interleaved", GOALS["rr_p99_vs_handoff"], False),
        ("drain_processes_vs_one_spawn_to_last", 1.0, True),
    )
    for which in ("p50", "p99"):  # (alternating blocks: the ratio that survives a busy machine)
        name = f"rr_{which}_vs_handoff_p50_interleaved"
        ratios[name] = s.get(name)
    ratios["enqueue_one_vs_ping_interleaved"] = s["enqueue_one_vs_ping_interleaved"]
    values = {name: ratios.get(name) for name, _, _ in goal_checks}
    values["worker_startup_s"] = s["drain_worker_startup_s"]
    for name, bar, higher in (*goal_checks, ("worker_startup_s", GOALS["worker_startup_s"], False)):
        value = values[name]
        meets[f"goal_{name}"] = value is not None and (value >= bar if higher else value <= bar)
    meets["all_targets"] = all(meets[f"{key}_target"] for key in TARGETS)
    meets["all_minimums"] = all(meets[f"{key}_minimum"] for key in MIN_TARGETS)
    # Not a target (start-up excluded), shown so a miss can be told apart from slow start-up.
    steady = s["drain_steady_per_s"]
    meets["drain_steady_per_s_at_drain_target"] = (
        steady is not None and steady >= TARGETS["drain_per_s"]
    )
    return {"ratios": ratios, "meets": meets}


def environment() -> dict[str, Any]:
    """What the figures were measured on: they mean little without it."""
    import django
    import redis

    try:
        import hiredis

        hiredis_version: str | None = hiredis.__version__
    except ImportError:
        hiredis_version = None
    info = redis_client().info("server")
    return {
        "python": platform.python_version(),
        "django": django.get_version(),
        "redis_py": redis.__version__,
        "hiredis": hiredis_version,
        "redis_server": info.get("redis_version"),
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "platform": platform.platform(),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line; ``--quick`` shrinks every size so the whole thing takes seconds."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one run")
    parser.add_argument("--runs", type=int, help="repetitions (median reported); default 3")
    parser.add_argument(
        "--drain-concurrency",
        default="32,64,128",
        help="worker --concurrency values tried for the drain (best reported)",
    )
    parser.add_argument(
        "--drain-processes",
        type=int,
        default=4,
        help="also drain with this many runworker processes at once (0 or 1: skip)",
    )
    parser.add_argument(
        "--drain-processes-concurrency",
        type=int,
        default=32,
        help="--concurrency of each of the --drain-processes workers",
    )
    parser.add_argument("--rr-concurrency", type=int, default=8, help="worker of the rr test")
    parser.add_argument("--chunks", default="500,1000", help="enqueue_many chunk sizes tried")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0,
        help="wait up to this many seconds for other load to stop before each run",
    )
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="do not write django_jobq's bytecode first (workers then compile it at each spawn "
        "when PYTHONDONTWRITEBYTECODE is set and the checkout has no __pycache__)",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON result to this file")
    parser.add_argument(
        "--observability",
        choices=["off", "metrics", "tracing", "tracing-sampled", "tracing-noexport"],
        default="off",
        help="run with this observability feature on (bench/observability.py's modes)",
    )
    args = parser.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 3)
    args.drain_concurrency = [int(x) for x in args.drain_concurrency.split(",")]
    args.chunks = [int(x) for x in args.chunks.split(",")]
    full = {"one": 20_000, "bulk": 100_000, "drain": 10_000, "rr": 500, "ping": 20_000}
    full |= {"lpush": 160_000, "handoff": 3_000}
    quick = {"one": 3_000, "bulk": 20_000, "drain": 10_000, "rr": 500, "ping": 5_000}
    quick |= {"lpush": 32_000, "handoff": 1_000}
    args.sizes = quick if args.quick else full
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, clean up this run's keys and subprocesses, print the JSON."""
    args = parse_args(argv)
    prefix = f"jobqbench-{uuid.uuid4().hex[:10]}"
    setup_django(prefix)
    observe(args.observability)
    client = redis_client()
    began = time.perf_counter()
    compiled = False if args.no_compile else compile_bytecode()
    log(f"prefix {prefix}; {args.runs} run(s); sizes {args.sizes}; bytecode written: {compiled}")
    runs = []
    try:
        with tempfile.TemporaryDirectory(prefix="jobq-bench-") as tmp:
            for index in range(args.runs):
                runs.append(one_run(args, prefix, index, Path(tmp)))
            rb = redis_benchmark_lpush(prefix, redis_url())
    finally:
        removed = delete_matching(client, run_pattern(prefix))
        log(f"deleted {removed} keys of {prefix}")
    summary = summarise(runs)
    verdicts = ratios_and_verdicts(summary)
    result = {
        **summary,
        "redis_benchmark_lpush_p16_per_s": rb,
        **verdicts,
        "targets": TARGETS,
        "goals": GOALS,
        "minimum_targets": MIN_TARGETS,
        "peers": PEERS,
        "runs": args.runs,
        "quick": args.quick,
        "observability": args.observability,
        "sizes": args.sizes,
        "cpu_busy_before_pct": [run["cpu_busy_before_pct"] for run in runs],
        "loadavg_before": [run["loadavg_before"] for run in runs],
        "bytecode_compiled": compiled,
        "wall_seconds": round(time.perf_counter() - began, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **environment(),
        "per_run": runs,
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return result


def observe(mode: str) -> None:
    """Turn ``mode`` on: in the environment the worker subprocesses inherit (bench/settings.py
    reads it), and for tracing in this process too, so enqueues make their ``send`` spans."""
    if mode == "off":
        return
    from bench.observability import MODES, producer_provider
    from django_jobq.observability import tracing

    env, value = MODES[mode]
    os.environ[env] = value
    if env == "JOBQ_BENCH_TRACING":
        tracing.use_provider(producer_provider(value))


# -- database backend --------------------------------------------------------------------------


def database_main(argv: list[str]) -> dict[str, Any] | None:
    """``python -m bench.core --db postgres|sqlite [...]``: the database backend's figures,
    measured by ``bench/core_db.py`` (its own references: ``SELECT 1`` and ``INSERT`` +
    ``COMMIT`` on the same connection); None without ``--db``."""
    if not any(a == "--db" or a.startswith("--db=") for a in argv):
        return None
    from bench import core_db

    return core_db.main(argv)


if __name__ == "__main__":
    if database_main(sys.argv[1:]) is None:
        main()
