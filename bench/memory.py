"""Cost as work grows: Redis bytes per job, and the drain rate with a large backlog.

    python -m bench.memory --port 7600 [--jobs 1000000] [--small 10000] [--rq-jobs 1000000]
                           [--rq-done 50000] [--out FILE]

Runs against a redis-server of its own, started on ``--port`` (loopback, no persistence) and
stopped by its PID at the end, because the figures are ``INFO memory`` deltas and a drain
with a million jobs waiting: another client's keys on a shared server would be counted, and
FLUSHDB (between phases) is only allowed on a server nobody else uses.

Measured, in this order:

1. **Waiting jobs**: ``used_memory`` after ``enqueue_many`` of ``--jobs`` small jobs
   (payload ``{"n": i}``) minus before, per job; plus ``MEMORY USAGE`` of one job record.
2. **Drain with the backlog**: one ``runworker --concurrency 64`` drains those jobs; the rate is
   read from the jobs' own ``finished`` stamps (completions 2,000 to 8,000 of the first
   10,000 ids, FIFO, so after start-up).
3. **Finished jobs kept for their result TTL** (the default 24 h): ``used_memory`` once every
   job completed, minus the empty server, per job. The events stream is capped (10,000
   entries), so it is a constant, not a per-job cost.
4. **Drain with a small backlog**: the same worker and the same window with ``--small`` jobs
   waiting. The ratio large/small is the slowdown.
5. **RQ** (bench/peers' venv, if built: ``python -m bench.peers --peers rq`` builds it): bytes
   per waiting job for ``--rq-jobs`` jobs enqueued with ``Queue.enqueue_many``, and per
   finished job kept for RQ's default result TTL for ``--rq-done`` jobs run by a burst
   ``SimpleWorker`` (RQ's worker runs ~2,000 jobs/s here, so a million would take ten minutes).

One JSON object goes to stdout; progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "bench"  # served by bench/benchapp/jobs.py (a no-op)
WINDOW = (2_000, 8_000)  # completions whose rate is compared, among the first 10,000 ids
RQ_PYTHON = ROOT / "bench" / "peers" / ".venv" / "rq" / "bin" / "python"


def log(message: str) -> None:
    print(f"[bench.memory] {message}", file=sys.stderr, flush=True)


def noop(n: int) -> None:
    """RQ's job function (importable without Django)."""


def start_redis(port: int, workdir: str) -> subprocess.Popen:
    """A private redis-server on loopback, no persistence; stopped by PID by the caller."""
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    import redis

    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {port} did not start") from None
            time.sleep(0.05)
    client.close()
    return proc


def admin_client(client: Any) -> Any:
    """A client on the same server whose commands may take long (FLUSHDB of a million keys
    runs for seconds; the storage's client gives up after 1 s)."""
    import redis

    kwargs = client.connection_pool.connection_kwargs
    return redis.Redis(host=kwargs.get("host", "127.0.0.1"), port=kwargs["port"],
                       db=kwargs.get("db", 0), socket_timeout=600)  # fmt: skip


def server_cpu(client: Any) -> float:
    """CPU seconds the server has used (user + system, all its threads)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def used_memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def drain_window(client: Any, prefix: str, ids: list[str], total: int, log_dir: Path) -> float:
    """Spawn one runworker, wait until ``total`` jobs completed, return the rate (jobs/s)
    between completions WINDOW of ``ids`` (the first ids enqueued: FIFO, claimed first)."""
    from bench.core import job_times, running_workers, wait_for
    from django_jobq import JobState
    from django_jobq.errors import StorageUnavailable
    from django_jobq.queue import Queue

    queue = Queue(QUEUE)
    with running_workers(64, 1, log_dir) as procs:

        def done() -> bool:
            if procs[0].poll() is not None:
                raise RuntimeError(f"worker exited {procs[0].returncode}")
            try:
                return queue.counts()[JobState.COMPLETED] >= total
            except StorageUnavailable:  # a slow answer on a loaded machine: ask again
                return False

        wait_for(done, 3600, f"{total} completions")
    _, finished = job_times(client, prefix, ids)
    finished.sort()
    lo, hi = WINDOW
    return round((hi - lo) / ((finished[hi] - finished[lo]) / 1000), 1)


def measure_jobq(n: int, small: int, log_dir: Path, rate_only: bool = False) -> dict[str, Any]:
    from bench.core import redis_client
    from django_jobq.conf import jobq_settings
    from django_jobq.queue import Queue
    from django_jobq.storage.redis.keys import QueueKeys

    prefix = jobq_settings()["PREFIX"]
    client = admin_client(redis_client())
    queue = Queue(QUEUE)
    first = [f"m-{i}" for i in range(10_000)]

    client.flushdb()
    queue.storage.register_queue(QUEUE)
    base = used_memory(client)
    log(f"jobq: enqueueing {n:,} jobs")
    for offset in range(0, n, 1000):
        queue.enqueue_many([(f"m-{i}", {"n": i}) for i in range(offset, min(n, offset + 1000))])
    waiting = used_memory(client)
    record = client.memory_usage(QueueKeys.for_queue(prefix, QUEUE).job("m-1"), samples=0)
    log(f"jobq: {(waiting - base) / n:.0f} bytes/waiting job; draining with {n:,} waiting")
    large_rate = drain_window(client, prefix, first, len(first) if rate_only else n, log_dir)
    finished = used_memory(client)
    record_done = client.memory_usage(QueueKeys.for_queue(prefix, QUEUE).job("m-1"), samples=0)
    log(f"jobq: {large_rate:,.0f} jobs/s with {n:,} waiting; "
        f"{(finished - base) / n:.0f} bytes/finished job")  # fmt: skip

    client.flushdb()
    queue.storage.register_queue(QUEUE)
    for offset in range(0, small, 1000):
        queue.enqueue_many([(f"m-{i}", {"n": i}) for i in range(offset, min(small, offset + 1000))])
    log(f"jobq: draining with {small:,} waiting")
    small_rate = drain_window(client, prefix, first[:small], small, log_dir)
    log(f"jobq: {small_rate:,.0f} jobs/s with {small:,} waiting")
    client.flushdb()
    return {
        "jobs": n,
        "bytes_per_waiting_job": round((waiting - base) / n, 1),
        "bytes_per_finished_job": None if rate_only else round((finished - base) / n, 1),
        "memory_usage_one_waiting_record": record,
        "memory_usage_one_finished_record": record_done,
        "drain_rate_large_backlog_per_s": large_rate,
        "drain_rate_small_backlog_per_s": small_rate,
        "small_backlog_jobs": small,
        "large_vs_small": round(large_rate / small_rate, 3),
        "window": WINDOW,
    }


def measure_interleaved(
    port: int, n: int, small: int, rounds: int, log_dir: Path
) -> dict[str, Any]:
    """The drain rate with ``n`` jobs waiting against ``small`` waiting, measured as pairs of
    drains alternated between two private servers (``port`` holds the large backlog,
    ``port + 1`` the small one), so that load that comes and goes on a shared machine hits both
    sides of each pair alike (the sequential phases of ``measure_jobq`` were minutes apart).

    Each drain is one ``runworker -c 64`` on the server's queue, stopped (SIGTERM) once
    ``WINDOW[1]`` jobs completed; the rate is read from the ``finished`` stamps of completions
    ``WINDOW`` among the ids that were at the head of the queue (FIFO: claimed first), so the
    worker's start-up is not in it. After each drain the queue is topped up to its backlog
    with new jobs at the tail, so every round starts with ``n`` / ``small`` waiting."""
    from bench.core import running_workers, wait_for
    from django_jobq import JobState
    from django_jobq.conf import jobq_settings
    from django_jobq.queue import Queue
    from django_jobq.storage.redis.connection import client_from_url
    from django_jobq.storage.redis.keys import QueueKeys
    from django_jobq.storage.redis.storage import RedisStorage

    prefix = jobq_settings()["PREFIX"]
    keys = QueueKeys.for_queue(prefix, QUEUE)
    sides = {"large": (port, n), "small": (port + 1, small)}
    queues: dict[str, tuple[Queue, Any]] = {}
    made = 0
    for side, (side_port, backlog) in sides.items():
        client = client_from_url(f"redis://127.0.0.1:{side_port}/0", socket_timeout=600)
        queue = Queue(QUEUE, storage=RedisStorage(client, prefix=prefix))
        queues[side] = (queue, client)
        admin_client(client).flushdb()
        queue.storage.register_queue(QUEUE)
        log(f"interleaved: {side}: enqueueing {backlog:,} jobs on port {side_port}")
        for offset in range(0, backlog, 1000):
            count = min(1000, backlog - offset)
            queue.enqueue_many([(f"i-{made + i}", {"n": i}) for i in range(count)])
            made += count
    rates: dict[str, list[float]] = {"large": [], "small": []}
    # Redis CPU seconds per drained job (INFO cpu): what the backlog costs the server, which a
    # shared machine's load moves much less than a rate.
    server_us: dict[str, list[float]] = {"large": [], "small": []}
    lo, hi = WINDOW
    for round_ in range(rounds):
        order = ("large", "small") if round_ % 2 == 0 else ("small", "large")
        for side in order:
            side_port, backlog = sides[side]
            queue, client = queues[side]
            head = [x.decode() for x in client.zrange(keys.queued, 0, hi)]
            baseline = queue.counts()[JobState.COMPLETED]
            cpu_before = server_cpu(client)
            os.environ["JOBQ_BENCH_REDIS_URL"] = f"redis://127.0.0.1:{side_port}/0"
            with running_workers(64, 1, log_dir) as procs:

                def enough(procs: list = procs, queue: Queue = queue, base: int = baseline) -> bool:
                    if procs[0].poll() is not None:
                        raise RuntimeError(f"worker exited {procs[0].returncode}")
                    return queue.counts()[JobState.COMPLETED] - base > hi

                wait_for(enough, 600, f"{hi} completions")
            drained = queue.counts()[JobState.COMPLETED] - baseline
            server_us[side].append(round((server_cpu(client) - cpu_before) / drained * 1e6, 2))
            pipe = client.pipeline(transaction=False)
            for job_id in head:
                pipe.hget(keys.job(job_id), "finished")
            finished = sorted(int(f) for f in pipe.execute() if f is not None)
            rate = round((hi - lo) / ((finished[hi] - finished[lo]) / 1000), 1)
            rates[side].append(rate)
            load = os.getloadavg()[0]
            log(f"interleaved round {round_ + 1} {side}: {rate:,.0f} jobs/s, Redis "
                f"{server_us[side][-1]:.1f} us CPU/job (load {load:.1f})")  # fmt: skip
            missing = backlog - queue.counts()[JobState.QUEUED]
            for offset in range(0, missing, 1000):
                count = min(1000, missing - offset)
                queue.enqueue_many([(f"i-{made + i}", {"n": i}) for i in range(count)])
                made += count
    pairs = sorted(a / b for a, b in zip(rates["large"], rates["small"], strict=True))
    return {
        "large_backlog_jobs": n,
        "small_backlog_jobs": small,
        "rounds": rounds,
        "window": WINDOW,
        "large_per_s": rates["large"],
        "small_per_s": rates["small"],
        "large_vs_small_pairs": [round(p, 3) for p in pairs],
        "large_vs_small_median": round(statistics.median(pairs), 3),
        "server_cpu_us_per_job_large": server_us["large"],
        "server_cpu_us_per_job_small": server_us["small"],
        "server_cpu_large_vs_small_median": round(
            statistics.median(server_us["large"]) / statistics.median(server_us["small"]), 3
        ),
    }


def rq_child(port: int, waiting_jobs: int, done_jobs: int) -> None:
    """In RQ's venv: bytes per waiting and per finished job (default result TTL)."""
    import rq
    from redis import Redis
    from rq import Queue

    client = Redis(port=port, socket_timeout=600)
    queue = Queue("mem", connection=client)

    def fill(n: int) -> None:
        for offset in range(0, n, 1000):
            queue.enqueue_many(
                [Queue.prepare_data(noop, (i,)) for i in range(offset, min(n, offset + 1000))]
            )

    client.flushdb()
    base = used_memory(client)
    fill(waiting_jobs)
    waiting = used_memory(client)
    client.flushdb()
    base2 = used_memory(client)
    fill(done_jobs)
    rq_cli = str(Path(sys.executable).with_name("rq"))
    subprocess.run(
        [rq_cli, "worker", "--burst", "-w", "rq.worker.SimpleWorker", "-u",
         f"redis://127.0.0.1:{port}/0", "--logging_level", "WARNING", "mem"],
        check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    finished = used_memory(client)
    client.flushdb()
    print(json.dumps({
        "version": rq.__version__,
        "waiting_jobs": waiting_jobs,
        "bytes_per_waiting_job": round((waiting - base) / waiting_jobs, 1),
        "finished_jobs": done_jobs,
        "bytes_per_finished_job": round((finished - base2) / done_jobs, 1),
        "result_ttl": "RQ default (500 s)",
    }))  # fmt: skip


def measure_rq(port: int, waiting_jobs: int, done_jobs: int) -> dict[str, Any] | None:
    if not RQ_PYTHON.exists():
        log("RQ's venv is not built (python -m bench.peers --peers rq builds it): skipped")
        return None
    log(f"rq: {waiting_jobs:,} waiting, {done_jobs:,} finished")
    out = subprocess.run(
        [str(RQ_PYTHON), "-m", "bench.memory", "_rq", "--port", str(port),
         "--rq-jobs", str(waiting_jobs), "--rq-done", str(done_jobs)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", default="all", choices=["all", "jobq", "rq", "_rq"])
    # (--interleave replaces "all"/"jobq": only the interleaved drains run)
    parser.add_argument("--port", type=int, required=True, help="port of the private Redis")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--rq-jobs", type=int, default=1_000_000)
    parser.add_argument("--rq-done", type=int, default=50_000)
    parser.add_argument(
        "--rate-only",
        action="store_true",
        help="jobq: stop the large drain after the window (no bytes per finished job)",
    )
    parser.add_argument(
        "--interleave",
        type=int,
        metavar="ROUNDS",
        help="jobq: instead of the phases, alternate ROUNDS pairs of drains between a server "
        "holding --jobs waiting (--port) and one holding --small waiting (--port + 1)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.what == "_rq":
        rq_child(args.port, args.rq_jobs, args.rq_done)
        return {}
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "loadavg_before": os.getloadavg()[0]}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="jobq-memory-") as tmp:
        server = start_redis(args.port, tmp)
        second = None
        try:
            if args.interleave:
                second_dir = Path(tmp) / "second"
                second_dir.mkdir()
                second = start_redis(args.port + 1, str(second_dir))
                os.environ["JOBQ_BENCH_REDIS_URL"] = f"redis://127.0.0.1:{args.port}/0"
                from bench.core import compile_bytecode, setup_django

                compile_bytecode()
                setup_django("jobqmem")
                result["interleaved"] = measure_interleaved(
                    args.port, args.jobs, args.small, args.interleave, Path(tmp)
                )
                args.what = "none"
            if args.what in ("all", "jobq"):
                os.environ["JOBQ_BENCH_REDIS_URL"] = f"redis://127.0.0.1:{args.port}/0"
                from bench.core import setup_django

                setup_django("jobqmem")
                result["jobq"] = measure_jobq(args.jobs, args.small, Path(tmp), args.rate_only)
            if args.what in ("all", "rq"):
                result["rq"] = measure_rq(args.port, args.rq_jobs, args.rq_done)
        finally:
            for proc in (server, second):
                if proc is not None:
                    proc.send_signal(signal.SIGTERM)  # by its PID
                    proc.wait(timeout=30)
    result["loadavg_after"] = os.getloadavg()[0]
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
