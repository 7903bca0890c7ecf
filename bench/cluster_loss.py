"""What a Redis Cluster failover loses without the journal, and what the journal costs there.

    python -m bench.cluster_loss [--windows 0.1,0.5,1.0] [--ports 7890] [--pg-db NAME] [--out FILE]

A failover loses what the promoted replica had not received: the replica's lag. On loopback a
replica never lags, so the lag is made exact (as in tests/cluster/test_cluster_loss.py): with a
producer enqueueing one job per call (``Queue.enqueue``, sequentially, as fast as it can), the
replica of the queue's master is paused (SIGSTOP), the master closes its replication link
(``CLIENT KILL TYPE replica``), the producer keeps going for ``window`` seconds (the lag), the
master is SIGKILLed, and the replica is resumed and promoted (``CLUSTER FAILOVER TAKEOVER``).
Every enqueue the master acknowledged after the cut is on the dead master only.

Per window, side by side on fresh clusters (six ``redis-server`` processes on ``--ports`` ..
``--ports``+5, stopped by PID; one cluster per run), ``redis`` then ``journal`` durability:

- ``accepted``: enqueues answered ``queued``/``pending`` (the producer was told "accepted");
  ``in_window``: of those, acknowledged between the cut and the kill;
- ``lost``: accepted jobs the promoted master does not know; ``journal`` mode then runs the
  reaper's replay (``journal.reconcile``) and reports ``recreated`` and ``lost_after_replay``;
- ``in_window_per_s``: accepted enqueues per second of the window: the loss is that rate
  times the lag;
- ``takeover_s``: TAKEOVER sent to the producer's client reaching the new master.

First, ``cost``: what the journal costs per enqueue on the cluster (journal on PostgreSQL:
each enqueue is also one committed row), ``redis`` and ``journal`` alternated in blocks on
one fresh cluster (see ``journal_cost``), and beside them ``redis_wait``: plain enqueues each
followed by ``WAIT 1 1000`` on the queue's master (the product has no WAIT mode; this is what
one would cost).

One JSON object goes to stdout, progress to stderr; ``uptime`` before and after is in it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.journal import configure, ensure_pg_database  # noqa: E402
from tests.helpers import wait_until  # noqa: E402
from tests.redis_cluster import LocalCluster  # noqa: E402

QUEUE = "bench-loss"
WARMUP_JOBS = 100  # accepted before the cut (they must all survive)


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


class Producer(threading.Thread):
    """Sequential single enqueues until stopped; records each acknowledgment's time."""

    def __init__(self, queue: Any) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.stop = threading.Event()
        self.acked: list[tuple[str, float]] = []
        self.errors = 0

    def run(self) -> None:
        from django.db import connections

        from django_jobq.job import EnqueueOutcome

        n = 0
        try:
            while not self.stop.is_set():
                job_id = f"j{n}"
                n += 1
                try:
                    result = self.queue.enqueue(job_id, {"n": n})
                except Exception:
                    self.errors += 1
                    continue
                if result.outcome in (EnqueueOutcome.QUEUED, EnqueueOutcome.PENDING):
                    self.acked.append((job_id, time.monotonic()))
        finally:
            connections.close_all()


def one_run(ports: range, durability: str, window: float) -> dict[str, Any]:
    from django.test import override_settings

    from django_jobq.conf import jobq_settings
    from django_jobq.models import JournalEntry
    from django_jobq.queue import Queue
    from django_jobq.queue.journal import reconcile
    from django_jobq.storage.redis.connection import client_from_url
    from django_jobq.storage.redis.storage import RedisStorage

    workdir = Path(tempfile.mkdtemp(prefix="jobq-cluster-loss-"))
    cluster = LocalCluster(workdir, ports)
    client = client_from_url(cluster.url)
    journal = {**jobq_settings()["JOURNAL"], "DATABASE_ALIAS": "pg"}
    try:
        with override_settings(JOBQ={**jobq_settings(), "JOURNAL": journal}):
            storage = RedisStorage(client, prefix="jqbenchloss")
            queue = Queue(QUEUE, storage=storage, durability=durability)
            JournalEntry.objects.using("pg").filter(queue=QUEUE).delete()
            tag = storage.keys(QUEUE).wake
            master = cluster.master_of(tag)
            replica = cluster.replica_of(master)
            producer = Producer(queue)
            producer.start()
            # Jobs accepted (and replicated) before the cut: they must all survive.
            assert wait_until(lambda: len(producer.acked) >= WARMUP_JOBS, 120, 0.01)
            cluster.pause(replica)
            cut_at = time.monotonic()
            cluster.cut_replication(master)
            cut_done = time.monotonic()
            time.sleep(window)  # the replica's lag: the parameter being measured
            kill_at = time.monotonic()
            producer.stop.set()
            cluster.kill(master)
            producer.join(60)
            cluster.resume(replica)
            t0 = time.monotonic()
            cluster.takeover(replica)
            assert wait_until(lambda: cluster.master_of(tag) == replica, 60, 0.02)
            assert wait_until(lambda: _answers(storage), 60, 0.02)
            takeover_s = time.monotonic() - t0
            ids = [job_id for job_id, _ in producer.acked]
            # After the cut returned: on the master only (the last call may be acknowledged
            # just after the kill was sent, and is on the master only as well).
            in_window = sum(1 for _, at in producer.acked if at >= cut_done)
            unsure = sum(1 for _, at in producer.acked if cut_at <= at < cut_done)
            acked_at = dict(producer.acked)
            lost = [
                j for j, s in zip(ids, storage.job_states(QUEUE, ids), strict=True) if s is None
            ]
            lost_before_cut = sum(1 for j in lost if acked_at[j] < cut_at)
            out: dict[str, Any] = {
                "durability": durability,
                "window_s": window,
                "accepted": len(ids),
                "in_window": in_window,
                "acked_during_cut_command": unsure,
                "lost": len(lost),
                "lost_before_cut": lost_before_cut,  # replicated: must be 0
                "window_measured_s": round(kill_at - cut_done, 3),
                "in_window_per_s": round(in_window / max(1e-3, kill_at - cut_done)),
                "producer_errors": producer.errors,
                "takeover_s": round(takeover_s, 3),
            }
            if durability == "journal":
                report = reconcile(storage, [QUEUE], min_age=0)[QUEUE]
                states = storage.job_states(QUEUE, ids)
                out["recreated"] = report.recreated
                out["lost_after_replay"] = sum(1 for s in states if s is None)
                JournalEntry.objects.using("pg").filter(queue=QUEUE).delete()
            return out
    finally:
        client.close()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _answers(storage: Any) -> bool:
    try:
        storage.job_states(QUEUE, ["probe"])
    except Exception:
        return False
    return True


def journal_cost(ports: range, pairs: int, block: int) -> dict[str, Any]:
    """Single enqueues on one cluster queue, ``redis``, ``journal`` and ``redis_wait`` alternated
    in blocks of ``block`` calls (after one block of each as warm-up): the median over the
    rounds of each rate / the redis rate, so a shared machine's changing load cancels out."""
    import statistics

    from django.test import override_settings

    from django_jobq.conf import jobq_settings
    from django_jobq.models import JournalEntry
    from django_jobq.queue import Queue
    from django_jobq.storage.redis.connection import client_from_url, node_client
    from django_jobq.storage.redis.storage import RedisStorage

    workdir = Path(tempfile.mkdtemp(prefix="jobq-cluster-cost-"))
    cluster = LocalCluster(workdir, ports)
    client = client_from_url(cluster.url)
    journal = {**jobq_settings()["JOURNAL"], "DATABASE_ALIAS": "pg"}
    modes = ("redis", "journal", "redis_wait")
    rates: dict[str, list[float]] = {m: [] for m in modes}
    lat: dict[str, list[float]] = {m: [] for m in modes}
    try:
        with override_settings(JOBQ={**jobq_settings(), "JOURNAL": journal}):
            storage = RedisStorage(client, prefix="jqbenchcost")
            queues = {m: Queue(QUEUE, storage=storage, durability=m.split("_")[0]) for m in modes}
            # Not a product feature: what an enqueue followed by WAIT (the master holds the
            # answer until its replica acknowledged the write) would cost, for comparison.
            master = node_client(client, storage.keys(QUEUE).wake)
            for n in range(pairs + 1):
                for mode, queue in queues.items():
                    start = time.perf_counter()
                    for _ in range(block):
                        t0 = time.perf_counter()
                        queue.enqueue(payload={"n": n})
                        if mode == "redis_wait":
                            assert master.execute_command("WAIT", 1, 1000) == 1
                        if n:
                            lat[mode].append((time.perf_counter() - t0) * 1000)
                    if n:  # the first round warms connections up
                        rates[mode].append(block / (time.perf_counter() - start))
            JournalEntry.objects.using("pg").filter(queue=QUEUE).delete()
    finally:
        client.close()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    ratios = [j / r for j, r in zip(rates["journal"], rates["redis"], strict=True)]
    waits = [w / r for w, r in zip(rates["redis_wait"], rates["redis"], strict=True)]
    return {
        "pairs": pairs,
        "block": block,
        **{f"{d}_per_s": round(statistics.median(v)) for d, v in rates.items()},
        **{f"{d}_p50_ms": round(statistics.median(v), 2) for d, v in lat.items()},
        "journal_vs_redis": round(statistics.median(ratios), 3),
        "journal_vs_redis_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "redis_wait_vs_redis": round(statistics.median(waits), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", default="0.1,0.5,1.0", help="lags to model, seconds")
    parser.add_argument("--ports", type=int, default=7890, help="first of six cluster ports")
    parser.add_argument("--pg-db", default="jobq_cluster_loss_bench")
    parser.add_argument("--pairs", type=int, default=10, help="cost: rounds of blocks")
    parser.add_argument("--block", type=int, default=200, help="cost: enqueues per block")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    ensure_pg_database(args.pg_db)
    configure(
        os.environ.get("JOBQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"), args.pg_db
    )  # unused: each Queue gets the cluster
    from django.core.management import call_command

    call_command("migrate", "django_jobq", database="pg", verbosity=0)
    ports = range(args.ports, args.ports + 6)
    results: dict[str, Any] = {"load_before": os.getloadavg(), "runs": []}
    log("journal cost on the cluster ...")
    results["cost"] = journal_cost(ports, args.pairs, args.block)
    for window in (float(w) for w in args.windows.split(",")):
        for durability in ("redis", "journal"):  # interleaved: same load for both
            log(f"window {window} s, {durability} ...")
            results["runs"].append(one_run(ports, durability, window))
    results["load_after"] = os.getloadavg()
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
