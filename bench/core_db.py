"""Core benchmark of the database backend: enqueue, bulk enqueue, drain and request/response.

    python -m bench.core --db postgres|sqlite [--quick] [--runs N] [--out FILE]
    python -m bench.core_db --db postgres|sqlite ...      (the same)

The figures of ``docs/benchmarks.md`` ("Database backend"), each beside a reference measured in
the same run on the same connection, so a figure can be read against what the machine and the
driver allow at all:

1. ``enqueue_one_per_s``: sequential ``Queue.enqueue`` calls (each its own transaction).
2. ``enqueue_bulk_per_s``: ``Queue.enqueue_many`` in chunks of 1,000.
3. ``drain_per_s``: N queued no-op jobs, one ``manage.py runworker`` process, spawn to last
   completion (start-up included); the steady rate (first to last completion) beside it.
4. ``rr_p50_ms`` / ``rr_p99_ms``: sequential ``Queue.enqueue_and_wait`` against an idle worker.
5. References: ``SELECT 1`` round trips per second, single-row ``INSERT`` + ``COMMIT`` per
   second into a scratch table (the floor under any one-transaction enqueue), and
   ``notify_handoff``: the one-way ``NOTIFY`` → ``LISTEN`` hand-off between two processes
   (ping-pong, one message in flight), the database's counterpart of Redis' LPUSH→BRPOP.
   A request/response needs two commits and two such hand-offs at least:
   ``rr_floor_ms`` = 2 / ``insert_commit_per_s`` + 2 × the hand-off p50, beside the goal
   (``goals``: rr p50 ≤ 2 ms; ``meets``).

``--only rr``: the references and the request/response alone (a quick look under load).

Procrastinate and Django Tasks' database backend, on the same PostgreSQL in the same session,
are measured by ``python -m bench.peers --peers procrastinate,django_tasks_db``.

Isolation: PostgreSQL runs in a database of its own, ``JOBQ_BENCH_PG_DB`` (default
``test_jobq_bench_db``), created and migrated when missing, its job tables emptied before each
figure; SQLite in ``JOBQ_BENCH_SQLITE`` (a temporary file by default). Workers are stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.core import (
    QUEUE,
    cpu_busy_pct,
    latency_summary,
    log,
    running_workers,
    wait_for,
)

ENQ_QUEUE = "bench-enq"


def setup(db: str) -> None:
    """Settings for the database backend on ``db``; creates and migrates the database."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["JOBQ_BENCH_DB"] = db
    os.environ.setdefault("JOBQ_BENCH_PG_DB", "test_jobq_bench_db")
    if db == "sqlite":
        os.environ.setdefault(
            "JOBQ_BENCH_SQLITE", os.path.join(tempfile.gettempdir(), "jobq-bench-db.sqlite3")
        )
    else:
        import psycopg

        name = os.environ["JOBQ_BENCH_PG_DB"]
        with psycopg.connect(
            host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def reset() -> None:
    """Empty the backend's tables (only this benchmark's database is touched)."""
    from django.db import connection

    from django_jobq.models import (
        ClaimLog,
        DedupKey,
        Job,
        JobEvent,
        QueueConfig,
        StateCount,
        WorkerInfo,
    )

    models = (JobEvent, DedupKey, ClaimLog, Job, WorkerInfo, StateCount)  # the counts last
    tables = [m._meta.db_table for m in models]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("TRUNCATE " + ", ".join(tables))
        else:
            for table in tables:
                cursor.execute(f"DELETE FROM {table}")  # noqa: S608 (model table names)
    QueueConfig.objects.exclude(name__in=[QUEUE, ENQ_QUEUE]).delete()


def analyze() -> None:
    """On PostgreSQL, what every database peer does after its fill (why: bench/peers/pg.py)."""
    from django.db import connection

    from bench.peers.pg import ANALYZE_AFTER_FILL

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(ANALYZE_AFTER_FILL)


def measure_select_one(n: int) -> dict[str, Any]:
    """Sequential ``SELECT 1``: the round trip under every call."""
    from django.db import connection

    samples = []
    with connection.cursor() as cursor:
        for _ in range(n):
            t0 = time.perf_counter_ns()
            cursor.execute("SELECT 1")
            cursor.fetchall()
            samples.append(time.perf_counter_ns() - t0)
    total = sum(samples) / 1e9
    return {"calls": n, "per_s": round(n / total, 1), **latency_summary(samples, 1e3)}


def measure_insert_commit(n: int) -> dict[str, Any]:
    """Sequential one-row ``INSERT`` + ``COMMIT`` into a scratch table: the floor under an
    enqueue, which is one transaction too."""
    from django.db import connection, transaction

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS jobq_bench_scratch (id INTEGER PRIMARY KEY, body TEXT)"
        )
        cursor.execute("DELETE FROM jobq_bench_scratch")
    start = time.perf_counter()
    for i in range(n):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("INSERT INTO jobq_bench_scratch (id, body) VALUES (%s, %s)", [i, "x"])
    elapsed = time.perf_counter() - start
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE jobq_bench_scratch")
    return {"rows": n, "per_s": round(n / elapsed, 1)}


def _notify_child(params: dict[str, Any], n: int) -> None:
    """The other end of ``measure_notify_handoff``: answers each ``ping`` with a ``pong`` (one
    connection listens, another sends: a connection waiting on its notifications is busy)."""
    import psycopg

    with (
        psycopg.connect(**params, autocommit=True) as listen,
        psycopg.connect(**params, autocommit=True) as send,
    ):
        listen.execute("LISTEN jobq_bench_ping")
        send.execute("NOTIFY jobq_bench_pong, 'ready'")
        for _ in range(n):
            if not list(listen.notifies(timeout=10, stop_after=1)):
                return  # the parent is gone
            send.execute("NOTIFY jobq_bench_pong, 'x'")


def measure_notify_handoff(n: int, warmup: int = 50) -> dict[str, Any]:
    """One-way NOTIFY → LISTEN hand-off between two processes (half a ping-pong's round trip,
    autocommit: a NOTIFY alone writes no WAL record to flush)."""
    import multiprocessing

    import psycopg
    from django.db import connection

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with (
        psycopg.connect(**params, autocommit=True) as listen,
        psycopg.connect(**params, autocommit=True) as send,
    ):
        listen.execute("LISTEN jobq_bench_pong")
        child = multiprocessing.get_context("spawn").Process(
            target=_notify_child, args=(params, n + warmup)
        )
        child.start()
        try:
            if not list(listen.notifies(timeout=60, stop_after=1)):
                raise RuntimeError("the NOTIFY hand-off child did not start")
            samples = []
            for i in range(n + warmup):
                t0 = time.perf_counter_ns()
                send.execute("NOTIFY jobq_bench_ping, 'x'")
                if not list(listen.notifies(timeout=10, stop_after=1)):
                    raise RuntimeError("no answer from the NOTIFY hand-off child")
                if i >= warmup:
                    samples.append((time.perf_counter_ns() - t0) // 2)
        finally:
            child.join(timeout=10)
            if child.is_alive():
                child.terminate()  # by its own handle (PID)
                child.join(timeout=10)
    return {"samples": n, "one_way_us": latency_summary(samples, 1e3)}


def measure_enqueue_one(n: int) -> dict[str, Any]:
    from django_jobq.queue import Queue

    queue = Queue(ENQ_QUEUE)
    for i in range(200):  # warm-up: connection, queue registration
        queue.enqueue(payload={"n": -i})
    start = time.perf_counter()
    for i in range(n):
        queue.enqueue(payload={"n": i})
    elapsed = time.perf_counter() - start
    reset()
    return {"jobs": n, "seconds": round(elapsed, 4), "per_s": round(n / elapsed, 1)}


def measure_enqueue_bulk(n: int, chunk: int) -> dict[str, Any]:
    from django_jobq.queue import Queue

    queue = Queue(ENQ_QUEUE)
    queue.enqueue_many([(None, {"n": -i}) for i in range(chunk)])  # warm-up
    items = [(None, {"n": i}) for i in range(n)]
    start = time.perf_counter()
    for offset in range(0, n, chunk):
        queue.enqueue_many(items[offset : offset + chunk])
    elapsed = time.perf_counter() - start
    reset()
    return {"jobs": n, "chunk": chunk, "seconds": round(elapsed, 4), "per_s": round(n / elapsed, 1)}


def _done(ids_prefix: str) -> tuple[int, float | None, float | None, float | None]:
    """(completed, first started, first finished, last finished) epoch s of the drain's jobs."""
    from django.db.models import Count, Max, Min

    from django_jobq.models import Job

    agg = Job.objects.filter(
        queue=QUEUE, job_id__startswith=ids_prefix, state="completed"
    ).aggregate(n=Count("id"), s=Min("started_at"), f=Min("finished_at"), l=Max("finished_at"))
    ts = [None if agg[k] is None else agg[k].timestamp() for k in ("s", "f", "l")]
    return agg["n"], ts[0], ts[1], ts[2]


def measure_drain(n: int, concurrency: int, tag: str, log_dir: Path) -> dict[str, Any]:
    """Queue N no-op jobs, spawn one worker, time spawn -> last completion (the jobs' own
    ``started_at``/``finished_at``; the 20 ms poll only detects the end)."""
    from django_jobq import JobState
    from django_jobq.queue import Queue

    reset()
    queue = Queue(QUEUE)
    ids = [f"drain-{tag}-{i}" for i in range(n)]
    for offset in range(0, n, 1000):
        queue.enqueue_many([(job_id, {"n": 1}) for job_id in ids[offset : offset + 1000]])
    if queue.counts()[JobState.QUEUED] != n:
        raise RuntimeError(f"expected {n} queued jobs before the drain")
    analyze()
    spawn = time.time()
    with running_workers(concurrency, 1, log_dir) as procs:

        def drained() -> bool:
            if procs[0].poll() is not None:
                raise RuntimeError(f"worker exited {procs[0].returncode} during the drain")
            return queue.counts()[JobState.COMPLETED] >= n

        wait_for(drained, 600, f"{n} jobs to complete")
    done, first_start, first_done, last_done = _done(f"drain-{tag}-")
    if done != n or last_done is None or first_done is None or first_start is None:
        raise RuntimeError(f"only {done} of {n} drained jobs completed")
    total, steady = last_done - spawn, last_done - first_done
    reset()
    return {
        "jobs": n,
        "concurrency": concurrency,
        "per_s": round(n / total, 1),
        "seconds": round(total, 4),
        "startup_s": round(first_start - spawn, 4),
        "steady_per_s": round((n - 1) / steady, 1) if steady > 0 else None,
    }


def measure_rr(n: int, warmup: int, concurrency: int, log_dir: Path) -> dict[str, Any]:
    """Sequential ``enqueue_and_wait`` against a running, idle worker."""
    from django_jobq.models import WorkerInfo
    from django_jobq.queue import Queue

    reset()
    queue = Queue(QUEUE)
    with running_workers(concurrency, 1, log_dir) as procs:
        wait_for(lambda: WorkerInfo.objects.exists(), 60, "the worker")
        time.sleep(0.3)  # let it reach its wait
        for i in range(warmup):
            queue.enqueue_and_wait(payload={"n": i}, timeout=10)
        samples = []
        for i in range(n):
            t0 = time.perf_counter_ns()
            queue.enqueue_and_wait(payload={"n": i}, timeout=10)
            samples.append(time.perf_counter_ns() - t0)
        if procs[0].poll() is not None:
            raise RuntimeError(f"worker exited {procs[0].returncode} during the rr test")
    reset()
    return {"calls": n, "warmup": warmup, "concurrency": concurrency,
            **latency_summary(samples, 1e6)}  # fmt: skip


def one_run(args: argparse.Namespace, index: int, log_dir: Path) -> dict[str, Any]:
    sizes = args.sizes
    run: dict[str, Any] = {"cpu_busy_before_pct": cpu_busy_pct(), "loadavg": os.getloadavg()[0]}
    log(f"run {index + 1}: references ({run['cpu_busy_before_pct']:.0f}% busy before)")
    run["select_one"] = measure_select_one(sizes["ping"])
    run["insert_commit"] = measure_insert_commit(sizes["insert"])
    log(f"  SELECT 1 {run['select_one']['per_s']:,.0f}/s, INSERT+COMMIT "
        f"{run['insert_commit']['per_s']:,.0f}/s")  # fmt: skip
    if args.db == "postgres":
        run["notify_handoff"] = measure_notify_handoff(sizes["handoff"])
        log(f"  NOTIFY hand-off p50 {run['notify_handoff']['one_way_us']['p50']:.0f} µs")
    if args.only == "rr":
        run["rr"] = measure_rr(sizes["rr"], 50, args.rr_concurrency, log_dir)
        log(f"  rr p50 {run['rr']['p50']:.2f} ms, p99 {run['rr']['p99']:.2f} ms")
        return run
    run["enqueue_one"] = measure_enqueue_one(sizes["one"])
    log(f"  enqueue one {run['enqueue_one']['per_s']:,.0f}/s")
    run["enqueue_bulk"] = measure_enqueue_bulk(sizes["bulk"], 1000)
    log(f"  enqueue_many {run['enqueue_bulk']['per_s']:,.0f}/s")
    run["drain"] = []
    for c in args.drain_concurrency:
        result = measure_drain(sizes["drain"], c, f"r{index}c{c}", log_dir)
        run["drain"].append(result)
        log(f"  drain c{c}: {result['per_s']:,.0f}/s spawn to last (start-up "
            f"{result['startup_s']:.2f}s), steady {result['steady_per_s']:,.0f}/s")  # fmt: skip
    run["rr"] = measure_rr(sizes["rr"], 50, args.rr_concurrency, log_dir)
    log(f"  rr p50 {run['rr']['p50']:.2f} ms, p99 {run['rr']['p99']:.2f} ms")
    return run


def med(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


GOALS = {"rr_p50_ms": 2.0}  # issue 25, goal 5: request/response p50 on PostgreSQL


def summarise_rr(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Request/response beside its references: the NOTIFY hand-off and the two-commit floor."""
    s: dict[str, Any] = {
        "select_one_per_s": med([r["select_one"]["per_s"] for r in runs]),
        "select_one_p50_us": med([r["select_one"]["p50"] for r in runs]),
        "insert_commit_per_s": med([r["insert_commit"]["per_s"] for r in runs]),
        "rr_p50_ms": med([r["rr"]["p50"] for r in runs]),
        "rr_p99_ms": med([r["rr"]["p99"] for r in runs]),
    }
    handoff = med([r["notify_handoff"]["one_way_us"]["p50"] for r in runs if "notify_handoff" in r])
    s["notify_handoff_p50_us"] = handoff
    ins = s["insert_commit_per_s"]
    if handoff is not None and ins:
        s["rr_floor_ms"] = round(2000 / ins + 2 * handoff / 1000, 3)
    rr = s["rr_p50_ms"]
    s["rr_ratios"] = {
        "rr_p50_vs_notify_handoff_p50": round(rr * 1000 / handoff, 2) if handoff else None,
        "rr_p50_vs_floor": round(rr / s["rr_floor_ms"], 2) if s.get("rr_floor_ms") else None,
    }
    s["goals"] = GOALS
    s["meets"] = {"goal_rr_p50_ms": rr is not None and rr <= GOALS["rr_p50_ms"]}
    return s


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    if "drain" not in runs[0]:  # --only rr
        return summarise_rr(runs)
    by_c = {
        r["concurrency"]: {
            f: med([run["drain"][i][f] for run in runs])
            for f in ("per_s", "steady_per_s", "startup_s")
        }
        for i, r in enumerate(runs[0]["drain"])
    }
    best = max(by_c, key=lambda c: by_c[c]["per_s"] or 0)
    s = {
        "select_one_per_s": med([r["select_one"]["per_s"] for r in runs]),
        "select_one_p50_us": med([r["select_one"]["p50"] for r in runs]),
        "insert_commit_per_s": med([r["insert_commit"]["per_s"] for r in runs]),
        "enqueue_one_per_s": med([r["enqueue_one"]["per_s"] for r in runs]),
        "enqueue_bulk_per_s": med([r["enqueue_bulk"]["per_s"] for r in runs]),
        "drain_per_s": by_c[best]["per_s"],
        "drain_steady_per_s": by_c[best]["steady_per_s"],
        "drain_startup_s": by_c[best]["startup_s"],
        "drain_concurrency": best,
        "drain_by_concurrency": by_c,
        "rr_p50_ms": med([r["rr"]["p50"] for r in runs]),
        "rr_p99_ms": med([r["rr"]["p99"] for r in runs]),
    }
    ref, ins = s["select_one_per_s"], s["insert_commit_per_s"]
    s["ratios"] = {
        "enqueue_one_vs_insert_commit": round(s["enqueue_one_per_s"] / ins, 3) if ins else None,
        "enqueue_one_vs_select_one": round(s["enqueue_one_per_s"] / ref, 3) if ref else None,
        "rr_p50_vs_select_one_p50": round(s["rr_p50_ms"] * 1000 / s["select_one_p50_us"], 2)
        if s["select_one_p50_us"]
        else None,
    }
    return {**s, **{k: v for k, v in summarise_rr(runs).items() if k not in s}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--quick", action="store_true", help="small sizes, one run")
    parser.add_argument("--runs", type=int, help="repetitions (median reported); default 3")
    parser.add_argument("--drain-concurrency", default="32,128")
    parser.add_argument("--rr-concurrency", type=int, default=8)
    parser.add_argument("--only", choices=("rr",), help="rr: references and rr alone")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 3)
    args.drain_concurrency = [int(x) for x in args.drain_concurrency.split(",")]
    full = {"one": 5_000, "bulk": 50_000, "drain": 10_000, "rr": 500, "ping": 5_000}
    quick = {"one": 1_000, "bulk": 10_000, "drain": 5_000, "rr": 200, "ping": 2_000}
    args.sizes = (quick if args.quick else full) | {"insert": 1_000 if args.quick else 3_000}
    args.sizes["handoff"] = 500 if args.quick else 2_000
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    setup(args.db)
    reset()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="jobq-bench-db-") as tmp:
        runs = [one_run(args, i, Path(tmp)) for i in range(args.runs)]
    import django

    result = {
        "db": args.db,
        **summarise(runs),
        "runs": args.runs,
        "sizes": args.sizes,
        "loadavg": [r["loadavg"] for r in runs],
        "cpu_busy_before_pct": [r["cpu_busy_before_pct"] for r in runs],
        "wall_seconds": round(time.perf_counter() - began, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": sys.version.split()[0],
        "django": django.get_version(),
        "cores": os.cpu_count(),
        "per_run": runs,
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
