"""What failure-handler calls cost on Redis: permanent failures with the hook off and on, and
claiming + settling the recorded calls.

    python -m bench.failure_calls [--jobs 5000] [--runs 3] [--redis redis://127.0.0.1:6379/0]

1. ``fail_off_per_s`` / ``fail_on_per_s``: jobs failed for good per second through
   ``ack_many`` batches of 100 (one pipelined round trip each), with the queue's failure hook off,
   then on (each permanent failure then also records a call in the same script).
2. ``claim_settle_per_s``: recorded calls claimed one at a time and settled ok, as the worker's
   failure thread does (without running a failure handler): two round trips a call.

Median of ``--runs``. Uses its own key prefix and deletes only its keys. One JSON line out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid

from django_jobq.job import JobOptions, NewJob
from django_jobq.storage.base import Ack
from django_jobq.storage.redis.connection import client_from_url
from django_jobq.storage.redis.storage import RedisStorage

Q = "bench-onfail"
ERROR = b'{"type": "ValueError", "message": "boom", "traceback": ""}'


def fail_all(storage: RedisStorage, jobs: int) -> float:
    """Enqueue ``jobs`` single-attempt jobs, claim them, and time failing them for good."""
    options = JobOptions(max_attempts=1)
    storage.enqueue_many(Q, [NewJob(f"j{i}", b'{"n":1}', options) for i in range(jobs)])
    claimed = []
    while len(claimed) < jobs:
        claimed += storage.claim(Q, "bench", 500, 600_000).jobs
    start = time.perf_counter()
    for i in range(0, jobs, 100):
        batch = [Ack("fail", c.job_id, c.token, ERROR, permanent=True)
                 for c in claimed[i : i + 100]]  # fmt: skip
        storage.ack_many(Q, batch)
    return jobs / (time.perf_counter() - start)


def drain_calls(storage: RedisStorage) -> tuple[int, float]:
    done, start = 0, time.perf_counter()
    while calls := storage.claim_failure_calls(Q, "bench", 1, 600_000):
        for call in calls:
            assert storage.settle_failure_call(Q, call, ok=True)
            done += 1
    return done, done / (time.perf_counter() - start)


def one_run(client, jobs: int) -> dict[str, float]:
    storage = RedisStorage(client, prefix=f"jobqbench-{uuid.uuid4().hex[:8]}")
    try:
        storage.set_failure_hook(Q, False)
        off = fail_all(storage, jobs)
        storage.purge_dead(Q)
        storage.set_failure_hook(Q, True)
        on = fail_all(storage, jobs)
        recorded = storage.count_failure_calls(Q)
        assert recorded == jobs, (recorded, jobs)
        drained, rate = drain_calls(storage)
        assert drained == jobs
        return {"fail_off_per_s": off, "fail_on_per_s": on, "claim_settle_per_s": rate}
    finally:
        storage.obliterate(Q, force=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    client = client_from_url(args.redis)
    runs = []
    for n in range(args.runs):
        runs.append(one_run(client, args.jobs))
        print(f"run {n + 1}: {runs[-1]}", file=sys.stderr)
    out = {key: round(statistics.median(r[key] for r in runs)) for key in runs[0]}
    print(json.dumps({"jobs": args.jobs, "runs": args.runs, **out}))


if __name__ == "__main__":
    main()
