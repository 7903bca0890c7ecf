"""Broadcast rates: publish, and delivery per subscriber group, on Redis, SQLite and PostgreSQL.

Publish: ``--messages`` single ``publish`` calls (one round trip / transaction each), then the
same number through ``publish_many`` in batches of 100. Delivery: the messages are published
first, then ``--groups`` subscriber groups (each served by one ``SubscriberWorker`` of
``--concurrency`` handler threads, all in this process, no-op handler) drain the backlog; a
group's rate is messages / seconds from the workers' start to its last verdict stored.

References, measured in the same run on the same backend, so that the ratios (not the raw
rates of a shared, noisy machine) are what to compare: ``enqueue_per_s``, as many single
``Queue.enqueue`` calls as messages (the job twin of ``publish``), and ``job_drain_per_s``, a
``Worker`` of the same concurrency draining as many no-op jobs (the twin of one group's
delivery). ``ratios``: publish / enqueue and per-group delivery / job drain. Those phases run
one after another, so a load that changes meanwhile moves the ratio; ``interleaved`` measures
single publishes and single enqueues again in alternating blocks of 50 calls (each kind's rate
from its own blocks' time), so both see the same load: ``publish_to_enqueue_interleaved``.

    python -m bench.broadcast [--messages 2000] [--groups 2] [--concurrency 8]
                              [--backends redis,sqlite,postgres]

Environment: JOBQ_BENCH_REDIS_URL (default redis://127.0.0.1:6379/0), JOBQ_BENCH_PG_DB
(default bench_jobq_broadcast, created when missing, tables emptied after), JOBQ_BENCH_PG_USER
/ _HOST. SQLite runs on a temporary file. One JSON object on stdout; progress on stderr.
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
    return DatabaseStorage("pg" if kind == "postgres" else "default")


def reference_rates(storage: Any, n: int, concurrency: int) -> dict[str, float]:
    """Single enqueues, then a drain of them by one in-process ``Worker`` (no-op handler)."""
    from django_jobq.queue import Queue
    from django_jobq.tasks.registry import HandlerRegistry
    from django_jobq.worker import Worker

    q = Queue("bench-bc-ref", storage=storage)
    start = time.perf_counter()
    for i in range(n):
        q.enqueue(payload={"i": i})
    enqueue = n / (time.perf_counter() - start)
    handlers = HandlerRegistry()
    handlers.register("bench-bc-ref", lambda job: None)
    worker = Worker(["bench-bc-ref"], storage=storage, handlers=handlers,
                    concurrency=concurrency, lease=30_000)  # fmt: skip
    start = time.perf_counter()
    worker.start()
    while worker.stats["completed"] < n:
        time.sleep(0.01)
    drain = n / (time.perf_counter() - start)
    worker.stop(hurry=True)
    worker.stopped.wait(20)
    return {"enqueue_per_s": round(enqueue), "job_drain_per_s": round(drain)}


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


def interleaved_rates(storage: Any, name: str, n: int, block: int = 50) -> dict[str, float]:
    """Single publishes and single enqueues in alternating blocks: the same load for both."""
    from django_jobq.broadcast import Broadcast
    from django_jobq.queue import Queue

    bc = Broadcast(name, storage=storage, maxlen=None, max_age=None)
    q = Queue("bench-bc-inter", storage=storage)
    spent = {"publish": 0.0, "enqueue": 0.0}
    for base in range(0, n, block):
        ids = range(base, min(n, base + block))
        start = time.perf_counter()
        for i in ids:
            bc.publish({"i": i}, id=f"inter-{i}")
        spent["publish"] += time.perf_counter() - start
        start = time.perf_counter()
        for i in ids:
            q.enqueue(payload={"i": i})
        spent["enqueue"] += time.perf_counter() - start
    return {f"{kind}_per_s": round(n / seconds) for kind, seconds in spent.items()}


def delivery_rates(storage: Any, name: str, n: int, groups: int, concurrency: int) -> dict:
    from django_jobq.broadcast import Broadcast, Subscription
    from django_jobq.broadcast.subscribers import SubscriberWorker

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
        log(f"{kind}: reference (enqueue and drain of {args.messages} jobs)")
        ref = reference_rates(storage, args.messages, args.concurrency)
        result["reference"] = ref
        log(f"{kind}: {args.messages} publishes and enqueues in alternating blocks")
        inter = interleaved_rates(storage, "bench-inter", args.messages)
        result["interleaved"] = inter
        per_group = result["per_group_per_s"].values()
        result["ratios"] = {
            "publish_to_enqueue": round(result["publish_per_s"] / ref["enqueue_per_s"], 3),
            "group_delivery_to_job_drain": round(min(per_group) / ref["job_drain_per_s"], 3),
            "publish_to_enqueue_interleaved": round(
                inter["publish_per_s"] / inter["enqueue_per_s"], 3
            ),
        }
        return result
    finally:
        if kind == "redis":
            delete_matching(storage.client, "{" + prefix + "*")
            delete_matching(storage.client, prefix + "*")
        else:
            empty_tables("pg" if kind == "postgres" else "default")


def empty_tables(alias: str) -> None:
    """What this run wrote (the database is the benchmark's own; kept for the next run)."""
    from django_jobq import models
    from django_jobq.models import broadcasts as bm

    for model in (bm.BroadcastDelivery, bm.BroadcastGroup, bm.BroadcastMessage,
                  bm.BroadcastLog, models.Job, models.JobEvent, models.WorkerInfo):  # fmt: skip
        model.objects.using(alias).all().delete()


def ensure_pg_database() -> None:
    import psycopg

    name = os.environ.get("JOBQ_BENCH_PG_DB", "bench_jobq_broadcast")
    user = os.environ.get("JOBQ_BENCH_PG_USER", "postgres")
    host = os.environ.get("JOBQ_BENCH_PG_HOST", "127.0.0.1")
    with psycopg.connect(host=host, user=user, dbname="postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--backends", default="redis,sqlite,postgres")
    args = parser.parse_args()
    kinds = args.backends.split(",")
    db = Path(tempfile.mkdtemp()) / "bench-broadcast.sqlite3"
    os.environ["JOBQ_BENCH_SQLITE"] = str(db)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.broadcast_settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    if "postgres" in kinds:
        ensure_pg_database()
        call_command("migrate", database="pg", verbosity=0)
    out: dict[str, Any] = {
        "messages": args.messages, "groups": args.groups, "concurrency": args.concurrency,
        "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
    }  # fmt: skip
    for kind in kinds:
        out[kind] = run(kind, args)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
