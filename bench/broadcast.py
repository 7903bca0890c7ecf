"""Broadcast rates: publish, and delivery per subscriber group, on Redis and on SQLite.

Publish: ``--messages`` single ``publish`` calls (one round trip / transaction each), then the
same number through ``publish_many`` in batches of 100. Delivery: the messages are published
first, then ``--groups`` subscriber groups (each served by one ``SubscriberWorker`` of
``--concurrency`` handler threads, all in this process, no-op handler) drain the backlog; a
group's rate is messages / seconds from the workers' start to its last verdict stored.

    python -m bench.broadcast [--messages 2000] [--groups 2] [--concurrency 8]
                              [--backends redis,sqlite]

Environment: JOBQ_BENCH_REDIS_URL (default redis://127.0.0.1:6379/0). SQLite runs on a
temporary file. Prints one JSON object on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.core import delete_matching, log


def storage_for(kind: str, prefix: str) -> Any:
    from django_jobq.storage.database import DatabaseStorage
    from django_jobq.storage.redis.connection import client_from_url
    from django_jobq.storage.redis.storage import RedisStorage

    if kind == "redis":
        url = os.environ.get("JOBQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
        return RedisStorage(client_from_url(url), prefix=prefix)
    return DatabaseStorage("default")


def publish_rates(storage: Any, name: str, n: int) -> dict[str, float]:
    from django_jobq.broadcast import Broadcast

    bc = Broadcast(name, storage=storage, maxlen=None, max_age=None)
    start = time.perf_counter()
    for i in range(n):
        bc.publish({"i": i}, id=f"single-{i}")
    single = n / (time.perf_counter() - start)
    start = time.perf_counter()
    for base in range(0, n, 100):
        bc.publish_many([(f"batch-{i}", {"i": i}) for i in range(base, min(n, base + 100))])
    batched = n / (time.perf_counter() - start)
    return {"publish_per_s": round(single), "publish_many_100_per_s": round(batched)}


def delivery_rates(storage: Any, name: str, n: int, groups: int, concurrency: int) -> dict:
    from django_jobq.broadcast import Broadcast, Subscription
    from django_jobq.subscribers import SubscriberWorker

    bc = Broadcast(name, storage=storage, maxlen=None, max_age=None)
    names = [f"g{i}" for i in range(groups)]
    for g in names:
        bc.subscribe(g, start="now")
    bc.publish_many([(f"m-{i}", {"i": i}) for i in range(n)])
    done = {g: threading.Event() for g in names}
    counts = dict.fromkeys(names, 0)
    lock = threading.Lock()

    def handler(job: Any) -> None:
        group = job.meta["group"]
        with lock:
            counts[group] += 1

    subs = [Subscription(name, g, handler) for g in names]
    workers = [SubscriberWorker([s], storage=storage, concurrency=concurrency, lease=30_000)
               for s in subs]  # fmt: skip
    start = time.perf_counter()
    for w in workers:
        w.start()
    finished: dict[str, float] = {}
    while len(finished) < len(names):
        for status in bc.status():
            if status.group not in finished and status.lag == 0 and status.pending == 0:
                finished[status.group] = time.perf_counter() - start
                done[status.group].set()
        time.sleep(0.01)
    for w in workers:
        w.stop(hurry=True)
        w.stopped.wait(20)
    return {
        "per_group_per_s": {g: round(n / finished[g]) for g in names},
        "handled": counts,
    }


def run(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"bcbench-{uuid.uuid4().hex[:8]}"
    storage = storage_for(kind, prefix)
    try:
        log(f"{kind}: publishing {args.messages} messages")
        result: dict[str, Any] = publish_rates(storage, "bench-pub", args.messages)
        log(f"{kind}: {args.groups} groups draining {args.messages} messages")
        result.update(delivery_rates(storage, "bench-del", args.messages, args.groups,
                                     args.concurrency))  # fmt: skip
        return result
    finally:
        if kind == "redis":
            delete_matching(storage.client, "{" + prefix + "*")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--backends", default="redis,sqlite")
    args = parser.parse_args()
    db = Path(tempfile.mkdtemp()) / "bench-broadcast.sqlite3"
    os.environ["JOBQ_BENCH_SQLITE"] = str(db)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    out: dict[str, Any] = {
        "messages": args.messages, "groups": args.groups, "concurrency": args.concurrency,
        "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
    }  # fmt: skip
    for kind in args.backends.split(","):
        out[kind] = run(kind, args)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
