"""Delayed-job lateness on Redis: how long after its due time a delayed job starts.

One ``runworker`` subprocess serves the queue while this process enqueues delayed jobs whose
due times are spread over ``--spread`` seconds, plus the same number of immediate jobs mixed
in as the baseline of the same run (their pick-up latency: created -> started). Lateness is
``started - run_at``, both stamped by the Lua scripts with Redis TIME, so no client clock
enters the figure. A job that starts before its due time counts as ``early`` (must be 0).

    python -m bench.delayed [--jobs 2000] [--spread 5] [--runs 3]

Prints one JSON object on stdout: per run and median of runs, lateness p50/p90/p99/max (ms),
the baseline's, their ratio, and whether the target (p99 <= 100 ms) holds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.core import (
    QUEUE,
    delete_matching,
    log,
    percentile,
    queue_pattern,
    redis_client,
    run_pattern,
    running_worker,
    setup_django,
    wait_for,
)

TARGET_P99_MS = 100


def summary(values: list[int]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": percentile(ordered, 50),
        "p90": percentile(ordered, 90),
        "p99": percentile(ordered, 99),
        "max": float(ordered[-1]),
    }


def one_run(n: int, spread: float, prefix: str, log_dir: Path) -> dict[str, Any]:
    from django_jobq import JobState
    from django_jobq.queue import Queue
    from django_jobq.storage.redis.keys import QueueKeys

    client = redis_client()
    queue = Queue(QUEUE)
    keys = QueueKeys.for_queue(prefix, QUEUE)
    rng = random.Random(7)  # noqa: S311 - spread of due times, not security
    with running_worker(8, log_dir):
        wait_for(lambda: len(queue.storage.list_workers()) == 1, 30, "the worker to register")
        start = dt.datetime.now(dt.UTC) + dt.timedelta(milliseconds=300)
        delayed = sorted(rng.uniform(0, spread) for _ in range(n))
        ids_delayed, ids_now = [], []
        began = time.monotonic()
        for i, offset in enumerate(delayed):
            # keep real time moving under the schedule: enqueue each job shortly before it is
            # due at the latest, as an application would, instead of all of them up front
            ahead = offset - (time.monotonic() - began) - 0.25
            if ahead > 0:
                time.sleep(ahead)
            run_at = start + dt.timedelta(seconds=offset)
            queue.enqueue(f"d{i}", i, run_at=run_at)
            ids_delayed.append(f"d{i}")
            queue.enqueue(f"n{i}", i)
            ids_now.append(f"n{i}")
        total = 2 * n
        wait_for(lambda: queue.counts()[JobState.COMPLETED] >= total, spread + 60, "all jobs")

    def fields(ids: list[str], *names: str) -> list[list[int]]:
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(keys.job(job_id), *names)
        return [[int(v) for v in row] for row in pipe.execute()]

    lateness = [started - run_at for run_at, started in fields(ids_delayed, "run_at", "started")]
    pickup = [started - created for created, started in fields(ids_now, "created", "started")]
    delete_matching(client, queue_pattern(prefix, QUEUE))
    return {
        "jobs_delayed": n,
        "early": sum(1 for v in lateness if v < 0),
        "lateness_ms": summary(lateness),
        "immediate_pickup_ms": summary(pickup),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--spread", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    prefix = f"jobqbench-{uuid.uuid4().hex[:8]}"
    setup_django(prefix)
    client = redis_client()
    runs = []
    try:
        with tempfile.TemporaryDirectory(prefix="jobq-bench-") as tmp:
            for i in range(args.runs):
                log(f"run {i + 1}/{args.runs}: {args.jobs} delayed jobs over {args.spread}s")
                runs.append(one_run(args.jobs, args.spread, prefix, Path(tmp)))
    finally:
        delete_matching(client, run_pattern(prefix))
    med = {
        part: {k: statistics.median(r[part][k] for r in runs) for k in ("p50", "p90", "p99", "max")}
        for part in ("lateness_ms", "immediate_pickup_ms")
    }
    baseline_p99 = med["immediate_pickup_ms"]["p99"] or 1.0
    result = {
        "benchmark": "delayed_lateness",
        "runs": runs,
        "median": med,
        "early_total": sum(r["early"] for r in runs),
        "ratio_lateness_p99_to_immediate_p99": round(med["lateness_ms"]["p99"] / baseline_p99, 2),
        "target_p99_ms": TARGET_P99_MS,
        "meets_target": med["lateness_ms"]["p99"] <= TARGET_P99_MS
        and sum(r["early"] for r in runs) == 0,
    }
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
