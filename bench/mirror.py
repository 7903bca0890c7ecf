"""Mirror lag under load: does the model mirror keep up with a worker draining 2,000 jobs/s?

    python -m bench.mirror [--rate 2000] [--seconds 60] [--db sqlite|postgres] [--quick]
    python -m bench.mirror --bulk 30000 --seconds 0 [--db sqlite|postgres]

With ``--bulk`` (or a ``--rate`` above what one worker completes), the worker is saturated and the
run puts the mirror's sustained rate (events/s and job rows/s over the time it spent on
batches) beside that worker's completion rate, measured in the same run on the same machine:
``mirror_over_worker`` above 1 means the mirror keeps up with a saturated worker.

Three processes, as in production: this one produces jobs at a steady rate, one ``runworker``
drains them, one mirror (``Mirror.run``, the loop ``runmirror`` and ``runreaper`` use) writes
the rows. Lag is measured by the mirror itself for every event: event time (Redis ``TIME``,
stamped by the Lua script) to the commit of the batch that wrote it. Backlog (events not yet
acknowledged by the mirror's group) is sampled every second: it must not grow. At the end the
rows are checked against the jobs: every job mirrored, in its final state.

Prints one JSON object on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "mirrorbench"
PG_DB = os.environ.get("JOBQ_BENCH_PG_DB", "jobq_mirror_bench")


def log(message: str) -> None:
    print(f"[bench.mirror] {message}", file=sys.stderr, flush=True)


def child() -> None:
    """The mirror process: run until SIGTERM, then report the lag it measured."""
    import django

    django.setup()
    from django_jobq.mirror import Mirror
    from django_jobq.worker import stopsignals

    mirror = Mirror(queues=[QUEUE], consumer="bench-mirror")
    mirror.lag.keep = 10_000_000
    cpu = {"mirror": 0.0, "database": 0.0}  # CPU seconds of this process and of its server
    backend = database_backend(mirror.using)
    busy = {"seconds": 0.0, "events": 0}
    run_once = mirror.run_once

    def timed(block: float | None = None) -> int:
        # Time spent on batches that had events: the mirror's capacity, whatever it waited.
        start = time.perf_counter()
        cpu_start = time.process_time()
        backend_start = backend_cpu(backend) if backend else 0.0
        waited = not n_last[0] and bool(block)  # a blocking read: it may wait for events
        n = run_once(block=0.0 if n_last[0] else block)
        if n:
            seconds = time.perf_counter() - start
            cpu["mirror"] += time.process_time() - cpu_start
            if backend:  # the PostgreSQL backend process of this connection, same machine
                cpu["database"] += backend_cpu(backend) - backend_start
            if waited:  # its wait for the first events is not work (up to ``block``, 1 s):
                # the read's time goes to idle_read, its few entries' decoding with it
                wait = call.pop("stream_read", 0.0)
                phases["idle_read"] += wait
                seconds -= wait
            busy["seconds"] += seconds
            busy["events"] += n
            for name, spent in call.items():
                phases[name] += spent
        else:  # a read that found nothing (it may have waited up to ``block``): not work
            phases["idle_read"] += sum(call.values())
        call.clear()
        n_last[0] = n
        return n

    n_last = [0]
    mirror.run_once = timed  # type: ignore[method-assign]
    jobs = {"written": 0}
    apply = mirror._apply

    def counted(events: list) -> None:
        # Jobs per read: a job's events in one read share one record read and one row write.
        jobs["written"] += len({e.job_id for e in events})
        apply(events)

    mirror._apply = counted  # type: ignore[method-assign]
    # Where the busy time goes: reading and decoding the stream, reading and decoding the
    # records, and the rest of the writes (building rows, SQL, commits). Counted for the
    # batches that had events only (as the busy time): the reads that found nothing, the
    # mirror waiting up to ``block`` for the run to start or after it drained, are apart.
    phases = dict.fromkeys(("stream_read", "records_read", "write", "ack", "idle_read"), 0.0)
    call: dict[str, float] = defaultdict(float)  # the phases of the run_once under way

    def timed_phase(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                call[name] += time.perf_counter() - start

        return wrapper

    storage = mirror.storage
    storage.read_group = timed_phase("stream_read", storage.read_group)
    storage.get_records = timed_phase("records_read", storage.get_records)
    mirror._write_jobs = timed_phase("write", mirror._write_jobs)  # type: ignore[method-assign]
    storage.ack_events = timed_phase("ack", storage.ack_events)
    profile = os.environ.get("JOBQ_BENCH_MIRROR_PROFILE")
    with stopsignals.relayed(lambda _: mirror.stop(), [signal.SIGTERM]):
        if profile:  # --profile: where the mirror process spends its time (cProfile stats)
            import cProfile

            cProfile.runctx("mirror.run()", globals(), {"mirror": mirror}, profile)
        else:
            mirror.run()
    samples = sorted(mirror.lag.samples)

    def pct(p: float) -> float | None:
        return (
            float(samples[min(len(samples) - 1, int(p / 100 * len(samples)))]) if samples else None
        )

    print(json.dumps({
        "events": len(samples), "p50": pct(50), "p90": pct(90), "p99": pct(99),
        "max": float(samples[-1]) if samples else None,
        "mean": statistics.fmean(samples) if samples else None,
        "busy_events": busy["events"], "busy_seconds": round(busy["seconds"], 2),
        "job_writes": jobs["written"],
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        "resyncs": mirror.resyncs,
        # "write" includes the records read inside it: the SQL side is write - records_read.
        "phases_s": {**{k: round(v, 2) for k, v in phases.items()},
                     "sql_and_rows": round(phases["write"] - phases["records_read"], 2)},
    }))  # fmt: skip


def database_backend(using: str) -> int | None:
    """The pid of the PostgreSQL backend serving this process's connection, when it runs on
    this machine (its CPU time is then readable in /proc), else None."""
    from django.db import connections

    conn = connections[using]
    if conn.vendor != "postgresql" or conn.settings_dict["HOST"] not in ("127.0.0.1", "localhost"):
        return None
    with conn.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = int(cursor.fetchone()[0])
    return pid if Path(f"/proc/{pid}/stat").exists() else None


def backend_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prepare_database(env: dict[str, str], db: str) -> None:
    if db == "sqlite":
        path = Path(env["JOBQ_BENCH_SQLITE"])
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    else:
        import psycopg

        with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {PG_DB}")
            c.execute(f"CREATE DATABASE {PG_DB}")
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0", "--settings", "bench.mirror_settings"],
        cwd=ROOT, env=env, check=True,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=2000, help="jobs per second to produce")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to produce")
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--concurrency", type=int, default=32, help="worker concurrency")
    parser.add_argument("--quick", action="store_true", help="10 s instead of 60 s")
    parser.add_argument(
        "--bulk", type=int, default=0,
        help="instead of a rate: enqueue this many jobs at once, then let the worker drain them",
    )  # fmt: skip
    parser.add_argument(
        "--drain-timeout", type=float, default=300.0, help="seconds allowed to catch up after"
    )
    parser.add_argument("--profile", default="", help="write the mirror's cProfile stats here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.mirror_settings")
    if args.child:
        child()
        return
    seconds = 10.0 if args.quick else args.seconds

    prefix = f"jobqbench-mirror-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "bench.mirror_settings",
        "JOBQ_BENCH_PREFIX": prefix,
        "JOBQ_BENCH_DB": args.db,
        "JOBQ_BENCH_SQLITE": f"/tmp/jobq-mirror-bench-{os.getpid()}.sqlite3",  # noqa: S108
        "JOBQ_BENCH_PG_DB": PG_DB,
        "JOBQ_BENCH_REDIS_URL": os.environ.get("JOBQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "JOBQ_BENCH_MIRROR_PROFILE": os.path.abspath(args.profile) if args.profile else "",
    }
    os.environ.update(env)
    prepare_database(env, args.db)

    import django

    django.setup()
    from django_jobq.backend import get_storage
    from django_jobq.models import Job
    from django_jobq.queue import Queue
    from django_jobq.states import JobState

    storage = get_storage()
    queue = Queue(QUEUE)
    storage.register_queue(QUEUE)
    storage.ensure_group(QUEUE, "jobq-mirror")
    procs: list[subprocess.Popen] = []
    result: dict[str, Any] = {}
    try:
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "runworker", QUEUE, "-c", str(args.concurrency),
             "-v", "0", "--settings", "bench.mirror_settings"],
            cwd=ROOT, env=env,
        )  # fmt: skip
        procs.append(worker)
        mirror = subprocess.Popen(
            [sys.executable, "-m", "bench.mirror", "--child"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        procs.append(mirror)
        deadline = time.monotonic() + 30
        while not storage.list_workers():
            if time.monotonic() > deadline:
                raise RuntimeError("worker did not start")
            time.sleep(0.05)
        time.sleep(1.0)  # the mirror process imports Django meanwhile

        def backlog() -> int:
            return storage.group_backlog(QUEUE, "jobq-mirror")[0]

        stream_lengths: list[int] = []  # XLEN: bounded by what the mirror acknowledged

        samples: list[tuple[float, int]] = []
        completions: list[tuple[float, int]] = []  # (time, jobs completed): the worker's rate
        produced = 0
        if args.bulk:
            # Held back while enqueued, then released at once: the worker runs flat out with
            # no producer taking CPU from it, and the mirror has its queued events to write too.
            queue.pause()
            for first in range(0, args.bulk, 5000):
                part = range(first, min(args.bulk, first + 5000))
                queue.enqueue_many([(f"m{i}", i) for i in part])
            produced = args.bulk
            log(f"enqueued {produced} in bulk; released to the worker, mirror into {args.db}")
            queue.resume()
        else:
            log(f"producing {args.rate} jobs/s for {seconds:.0f} s; mirror into {args.db}")
        start = time.monotonic()
        next_sample = start + 1.0
        while (elapsed := time.monotonic() - start) < seconds or (
            args.bulk and queue.counts()[JobState.COMPLETED] < produced
        ):
            due = 0 if args.bulk else int(args.rate * elapsed) - produced
            if due > 0:
                queue.enqueue_many([(f"m{produced + i}", i) for i in range(due)])
                produced += due
            now = time.monotonic()
            if now >= next_sample:
                samples.append((round(now - start, 1), backlog()))
                stream_lengths.append(storage.client.xlen(storage.keys(QUEUE).events))
                completions.append((now, queue.counts()[JobState.COMPLETED]))
                next_sample += 1.0
            time.sleep(0.01)
        produce_s = time.monotonic() - start
        log(f"produced {produced} in {produce_s:.1f} s; waiting for the worker and mirror")
        drain_deadline = time.monotonic() + args.drain_timeout
        worker_done_s = None
        while queue.counts()[JobState.COMPLETED] < produced or backlog() > 0:
            if time.monotonic() > drain_deadline:
                raise RuntimeError(f"worker or mirror did not catch up in {args.drain_timeout} s")
            done_now = queue.counts()[JobState.COMPLETED]
            if worker_done_s is None:
                # The worker's rate is sampled up to its last completion: a bulk drain is over
                # in seconds, before the once-a-second samples of the producing loop have two.
                completions.append((time.monotonic(), done_now))
                if done_now >= produced:
                    worker_done_s = time.monotonic() - start
            time.sleep(0.1)
        worker_done_s = worker_done_s or time.monotonic() - start
        catch_up_s = time.monotonic() - start - produce_s
        mirror.send_signal(signal.SIGTERM)
        out, _ = mirror.communicate(timeout=60)
        lag = json.loads(out.strip().splitlines()[-1])

        rows = Job.objects.filter(queue=QUEUE)
        mirrored, completed_rows = rows.count(), rows.filter(state="completed").count()
        # From the first sample with a completion (the worker's start-up is not its rate).
        started = [i for i, (_, c) in enumerate(completions) if c > 0]
        (t0, c0) = completions[max(started[0] - 1, 0)] if started else completions[0]
        (t1, c1) = completions[-1]
        worker_rate = (c1 - c0) / (t1 - t0) if t1 > t0 else None
        busy = lag["busy_seconds"]
        mirror_rate = lag["busy_events"] / busy if busy else None
        mirror_jobs = lag["job_writes"] / busy if busy else None
        third = max(1, len(samples) // 3)
        first, last = samples[:third], samples[-third:]
        result = {
            "bench": "mirror_lag",
            "db": args.db,
            "rate_target_per_s": args.rate,
            "rate_achieved_per_s": round(produced / produce_s, 1),
            "seconds": round(produce_s, 1),
            "jobs": produced,
            "events_mirrored": lag["events"],
            # Sustained capacity: events over the time spent on batches that had events.
            "mirror_events_per_s": round(mirror_rate, 1) if mirror_rate else None,
            # Job rows written per second of work (a job whose events share a read counts once).
            "mirror_job_rows_per_s": round(mirror_jobs, 1) if mirror_jobs else None,
            "worker_completed_per_s": round(worker_rate, 1) if worker_rate else None,
            "worker_events_per_s": round(worker_rate * 3, 1) if worker_rate else None,
            # The same ratio in jobs: job rows handled per second of work (a job whose events
            # share a read counts once) over jobs completed per second.
            "mirror_jobs_over_worker": round(mirror_jobs / worker_rate, 2)
            if mirror_jobs and worker_rate
            else None,
            "mirror_phases_s": lag["phases_s"],
            # CPU seconds over the busy batches: the mirror process, and its PostgreSQL
            # backend (where the statements run; null on SQLite, which runs in the process).
            "mirror_cpu_s": lag["cpu_s"]["mirror"],
            "database_cpu_s": lag["cpu_s"]["database"] if args.db == "postgres" else None,
            # Above 1: the mirror writes events faster than this worker makes them.
            "mirror_over_worker": round(mirror_rate / (worker_rate * 3), 2)
            if mirror_rate and worker_rate
            else None,
            "worker_done_after_s": round(worker_done_s, 1),
            "mirror_done_after_s": round(time.monotonic() - start, 1),
            "stream_len_max": max(stream_lengths),
            "stream_len_last_third_avg": round(
                statistics.fmean(stream_lengths[-max(1, len(stream_lengths) // 3) :]), 1
            ),
            "mirror_resyncs": lag["resyncs"],
            "lag_p50_ms": lag["p50"],
            "lag_p90_ms": lag["p90"],
            "lag_p99_ms": lag["p99"],
            "lag_max_ms": lag["max"],
            "backlog_first_third_avg": round(statistics.fmean(b for _, b in first), 1),
            "backlog_last_third_avg": round(statistics.fmean(b for _, b in last), 1),
            "backlog_max": max(b for _, b in samples),
            "catch_up_after_producing_s": round(catch_up_s, 2),
            "rows_mirrored": mirrored,
            "rows_completed": completed_rows,
            "target_lag_p99_ms": 1000,
            "meets_lag_target": lag["p99"] is not None and lag["p99"] < 1000,
            "all_rows_final": mirrored == produced and completed_rows == produced,
        }
    finally:
        for proc in procs:  # by PID, never by name
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        keys = list(storage.client.scan_iter(match="{" + prefix + "*", count=5000))
        for first in range(0, len(keys), 1000):  # in slices: no single call blocks Redis long
            storage.client.unlink(*keys[first : first + 1000])
        if args.db == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(env["JOBQ_BENCH_SQLITE"] + suffix).unlink(missing_ok=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
