"""What retention costs on the Redis acknowledgement path: completions with no policy and with
a count policy in its steady state (every finish indexes its job and removes the oldest one).

    python -m bench.retention [--jobs 5000] [--runs 5] [--redis redis://127.0.0.1:6379/0]

Each run completes blocks of 100 jobs on the two queues turn about (off, on, on, off, ...), so
that load from elsewhere falls on both sides alike:

1. ``batch_*_per_s``: jobs completed per second through ``ack_many`` batches of 100 (one
   ``complete_many`` script call per batch, the worker's path);
2. ``one_*_per_s``: jobs completed per second by one ``complete`` call each (one round trip a
   job: the per-call overhead shows here);
3. ``*_server_us_per_job``: the server's time in the scripts per job (``INFO commandstats``),
   which client-side load moves much less than wall time; read it on a private server, since
   other clients' scripts on a shared one count too.

"on" is a queue whose completed index already holds ``--keep`` records, so each finish also
deletes one record (ZADD + ZCARD + ZPOPMIN + HMGET + DEL + XADD of a ``removed`` event);
"index" a queue whose count is never reached (the finish only indexes: ZADD + ZCARD). The
ratios on/off are the figures to read; medians of ``--runs``. ``uptime`` load is printed beside
them. Uses its own key prefix and deletes only its keys. One JSON line out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid

from django_jobq.job import JobOptions, Keep, NewJob, Retention
from django_jobq.storage.base import Ack
from django_jobq.storage.redis.connection import client_from_url
from django_jobq.storage.redis.storage import RedisStorage

BATCH = 100
SIDES = ("off", "on", "index")


def claimed(storage: RedisStorage, queue: str, jobs: int, tag: str) -> list:
    options = JobOptions(max_attempts=1)
    storage.enqueue_many(queue, [NewJob(f"{tag}{i}", b'{"n":1}', options) for i in range(jobs)])
    out: list = []
    while len(out) < jobs:
        out += storage.claim(queue, "bench", 500, 600_000).jobs
    return out


def script_usec(storage: RedisStorage) -> float:
    """Microseconds the server spent in EVALSHA so far (INFO commandstats). Meaningful on a
    Redis of the bench's own (``--redis`` to a private server): others' scripts count too."""
    stats = storage.client.info("commandstats").get("cmdstat_evalsha", {})
    return float(stats.get("usec", 0))


def ack_block(storage: RedisStorage, queue: str, block: list, way: str) -> tuple[float, float]:
    """Seconds to complete ``block`` (one ``ack_many``, or one call per job) and the server's
    script microseconds for it."""
    usec = script_usec(storage)
    start = time.perf_counter()
    if way == "batch":
        storage.ack_many(queue, [Ack("complete", c.job_id, c.token, b"1") for c in block])
    else:
        for c in block:
            storage.complete(queue, c.job_id, c.token, b"1")
    return time.perf_counter() - start, script_usec(storage) - usec


def one_run(storage: RedisStorage, jobs: int, run: int) -> dict[str, float]:
    """Both sides' jobs are claimed first; then blocks of BATCH jobs are completed turn about
    (off, on, on, off, ...), and each side's time is the sum of its blocks."""
    out: dict[str, float] = {}
    for way in ("batch", "one"):
        todo = {side: claimed(storage, f"ret-{side}", jobs, f"{way}{run}-") for side in SIDES}
        spent = dict.fromkeys(SIDES, 0.0)
        server = dict.fromkeys(SIDES, 0.0)
        for n, i in enumerate(range(0, jobs, BATCH)):
            for side in SIDES if n % 2 == 0 else SIDES[::-1]:
                wall, usec = ack_block(storage, f"ret-{side}", todo[side][i : i + BATCH], way)
                spent[side] += wall
                server[side] += usec
        for side in SIDES:
            out[f"{way}_{side}_per_s"] = jobs / spent[side]
            out[f"{way}_{side}_server_us_per_job"] = server[side] / jobs
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", type=int, default=1000)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    storage = RedisStorage(client_from_url(args.redis), prefix=f"jobqbench-{uuid.uuid4().hex[:8]}")
    try:
        storage.set_retention("ret-on", Retention(completed=Keep(count=args.keep)))
        # "index": a policy whose count is never reached: the finish indexes, removes nothing.
        storage.set_retention("ret-index", Retention(completed=Keep(count=10**9)))
        # Fill the "on" index to its count first, so every timed finish also removes one.
        ack_block(storage, "ret-on", claimed(storage, "ret-on", args.keep, "fill-"), "batch")
        load_before = os.getloadavg()
        runs = [one_run(storage, args.jobs, r) for r in range(args.runs)]
        load_after = os.getloadavg()
        kept = storage.client.zcard(storage.keys("ret-on").finished("completed"))
        assert kept == args.keep, kept
    finally:
        for queue in ("ret-on", "ret-off", "ret-index"):
            storage.obliterate(queue, force=True)
    result: dict[str, float | str] = {
        k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]
    }
    for way in ("batch", "one"):
        ratios = [r[f"{way}_on_per_s"] / r[f"{way}_off_per_s"] for r in runs]
        result[f"{way}_on_off_ratio"] = round(statistics.median(ratios), 3)
    result["load_1min_before_after"] = f"{load_before[0]:.2f} / {load_after[0]:.2f}"
    result["jobs"], result["runs"], result["keep"] = args.jobs, args.runs, args.keep
    print(json.dumps(result))


if __name__ == "__main__":
    main()
