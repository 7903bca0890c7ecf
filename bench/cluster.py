"""Redis Cluster: one queue on a single Redis vs on a local 3-master cluster, and the load spread
of queues placed on different masters.

Starts its own cluster (six ``redis-server`` processes on 7880-7885, stopped by PID) and uses the
single Redis at ``JOBQ_BENCH_REDIS_URL`` (default 127.0.0.1:6379/0) under a fresh key prefix
whose keys it deletes at the end. Storage level, in this process (no worker start-up in the
figures): ``enqueue_many`` in calls of 500, then a drain of claims of 100 answered by one
``ack_many`` each. Configurations, each run ``--runs`` times (median reported):

- ``single``: one queue on the single Redis (the reference of the same run);
- ``cluster_1``: one queue on the cluster (all of it on one master: a queue is one slot);
- ``cluster_3``: three queues whose slots are on the three masters, one thread each, the same
  total of jobs: how a deployment spreads load by hand (one queue per master).

Sharded queues (``--sharded``, docs/scaling.md): one *logical* queue through the Queue API
(``Queue(name, shards=N).enqueue_many`` in calls of 500, routed and grouped per partition), by
three producer threads, then drained by three consumer threads that each take the partitions
in turn as a worker does (claims of 100, one ``ack_many`` each):

- ``single_shard_1`` / ``single_shard_3``: on the single Redis: the overhead of sharding;
- ``cluster_shard_1`` / ``cluster_shard_3``: on the cluster: one queue on one master against
  the same queue spread over the three (its partitions pinned to the masters' slot ranges).

Per master it reports the script calls (``INFO commandstats``: evalsha) and the Redis CPU time
(``INFO cpu``: used_cpu_user + used_cpu_sys) each configuration cost: on this 2-core machine six
Redis processes and the client share the cores, so the wall-clock rate of ``cluster_3`` cannot
show the spread; CPU per master is the figure that predicts it on hardware where each master has
a core of its own. ``python -m bench.cluster [--jobs 20000] [--runs 3]`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from django_jobq.job import JobOptions, NewJob  # noqa: E402
from django_jobq.storage.base import Ack  # noqa: E402
from django_jobq.storage.redis.connection import client_from_url  # noqa: E402
from django_jobq.storage.redis.storage import RedisStorage  # noqa: E402
from tests.redis_cluster import LocalCluster  # noqa: E402


def _ports() -> range:
    """``JOBQ_BENCH_CLUSTER_PORTS`` ("8000-8005"), else 7880-7885."""
    low, _, high = os.environ.get("JOBQ_BENCH_CLUSTER_PORTS", "7880-7885").partition("-")
    return range(int(low), int(high) + 1)


PORTS = _ports()
ENQUEUE_CHUNK = 500
CLAIM = 100


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def master_stats(cluster: LocalCluster) -> dict[int, tuple[int, float, int]]:
    """Each master's (EVALSHA calls, CPU seconds, calls of every command) so far."""
    out = {}
    for port in cluster.masters():
        stats = cluster.node_cmd(port, "INFO", "commandstats")
        calls = every = 0
        for line in stats.splitlines():
            if line.startswith("cmdstat_"):
                n = int(line.split("calls=")[1].split(",")[0])
                every += n
                if line.startswith("cmdstat_evalsha:"):
                    calls = n
        cpu = cluster.node_cmd(port, "INFO", "cpu")
        fields = dict(line.split(":", 1) for line in cpu.splitlines() if ":" in line)
        cpu_s = float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"])
        out[port] = (calls, cpu_s, every)
    return out


def single_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def run_queues(storage: RedisStorage, queues: list[str], jobs: int) -> dict[str, float]:
    """Enqueue ``jobs`` spread over ``queues`` (a thread each), then drain them the same way."""
    per = jobs // len(queues)
    payload = b'{"n": 1}'

    def enqueue(q: str) -> None:
        batch = [NewJob(f"{q}-{i}", payload, JobOptions()) for i in range(per)]
        for start in range(0, per, ENQUEUE_CHUNK):
            storage.enqueue_many(q, batch[start : start + ENQUEUE_CHUNK])

    def drain(q: str) -> None:
        done = 0
        while done < per:
            claimed = storage.claim(q, "bench", CLAIM, 60_000).jobs
            if claimed:
                storage.ack_many(q, [Ack("complete", j.job_id, j.token, b"1") for j in claimed])
                done += len(claimed)

    figures = {}
    for name, step in (("enqueue", enqueue), ("drain", drain)):
        threads = [threading.Thread(target=step, args=(q,)) for q in queues]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        figures[f"{name}_per_s"] = round(per * len(queues) / (time.perf_counter() - t0))
    return figures


def run_logical(storage: RedisStorage, shards: int, jobs: int, threads: int = 3) -> dict:
    """One logical queue of ``shards`` partitions through the Queue API: ``threads``
    producers (``enqueue_many`` of 500), then ``threads`` consumers taking the partitions in
    turn (a worker's claim round), until every job is acknowledged."""
    from django_jobq.queue import Queue

    queue = Queue("bsq", storage=storage, shards=shards)
    names = [p.name for p in getattr(queue, "partitions", [queue])]
    per = jobs // threads
    done = [0]
    lock = threading.Lock()

    def enqueue(t: int) -> None:
        items = [(f"t{t}-{i}", {"n": 1}) for i in range(per)]
        for start in range(0, per, ENQUEUE_CHUNK):
            queue.enqueue_many(items[start : start + ENQUEUE_CHUNK])

    def drain(t: int) -> None:
        rotation = t
        while True:
            with lock:
                if done[0] >= per * threads:
                    return
            name = names[rotation % len(names)]
            rotation += 1
            claimed = storage.claim(name, f"bench-{t}", CLAIM, 60_000).jobs
            if claimed:
                storage.ack_many(name, [Ack("complete", j.job_id, j.token, b"1") for j in claimed])
                with lock:
                    done[0] += len(claimed)

    figures = {}
    for label, step in (("enqueue", enqueue), ("drain", drain)):
        workers = [threading.Thread(target=step, args=(t,)) for t in range(threads)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        figures[f"{label}_per_s"] = round(per * threads / (time.perf_counter() - t0))
    return figures


SHARDED = {"single_shard_1": 1, "single_shard_3": 3, "cluster_shard_1": 1, "cluster_shard_3": 3}


def spread_queues(cluster: LocalCluster, storage: RedisStorage, n: int) -> list[str]:
    chosen: dict[int, str] = {}
    for i in range(500):
        name = f"bq{i}"
        chosen.setdefault(cluster.master_of(storage.keys(name).wake), name)
        if len(chosen) == n:
            return list(chosen.values())
    raise RuntimeError("no queues on distinct masters")


def cleanup(client: Any, prefix: str) -> None:
    for key in list(client.scan_iter(match="{" + prefix + "*", count=1000)):
        client.delete(key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--sharded", action="store_true", help="also measure one logical queue with 1 and 3 shards"
    )
    parser.add_argument(
        "--only-sharded", action="store_true", help="measure only the sharded configurations"
    )
    args = parser.parse_args()
    import django
    from django.conf import settings

    if not settings.configured:  # the Queue API reads JOBQ: defaults are enough here
        settings.configure(INSTALLED_APPS=[], JOBQ={"BACKEND": "redis"})
        django.setup()
    single_url = os.environ.get("JOBQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="jobq-bench-cluster-") as workdir:
        cluster = LocalCluster(Path(workdir), PORTS)
        try:
            single = client_from_url(single_url)
            cclient = client_from_url(cluster.url)
            configs = [] if args.only_sharded else ["single", "cluster_1", "cluster_3"]
            if args.sharded or args.only_sharded:
                configs += list(SHARDED)
            runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
            for r in range(args.runs):
                for config in runs:  # interleaved: every run measures every configuration
                    prefix = f"jobqbench-{uuid.uuid4().hex[:8]}"
                    on_cluster = config.startswith("cluster")
                    client = cclient if on_cluster else single
                    storage = RedisStorage(client, prefix=prefix)
                    before = master_stats(cluster) if on_cluster else single_cpu(single)
                    figures: dict[str, Any]
                    if config in SHARDED:
                        figures = run_logical(storage, SHARDED[config], args.jobs)
                    else:
                        queues = (
                            spread_queues(cluster, storage, 3) if config == "cluster_3" else ["bq"]
                        )
                        figures = run_queues(storage, queues, args.jobs)
                    if on_cluster:
                        after = master_stats(cluster)
                        figures["per_master"] = {
                            str(p): {
                                "evalsha_calls": after[p][0] - before[p][0],  # type: ignore[index]
                                "all_calls": after[p][2] - before[p][2],  # type: ignore[index]
                                "cpu_s": round(after[p][1] - before[p][1], 3),  # type: ignore[index]
                            }
                            for p in after
                        }
                    else:
                        figures["cpu_s"] = round(single_cpu(single) - before, 3)  # type: ignore[operator]
                    cleanup(client, prefix)
                    if on_cluster:
                        storage._pool.shutdown(wait=False)  # type: ignore[attr-defined]
                    runs[config].append(figures)
                    log(f"run {r + 1} {config}: {json.dumps(figures)}")
            ping_t0 = time.perf_counter()
            for _ in range(2000):
                single.ping()
            ping_per_s = round(2000 / (time.perf_counter() - ping_t0))
        finally:
            cluster.stop()

    def median(config: str, key: str) -> float:
        return statistics.median(f[key] for f in runs[config])

    result: dict[str, Any] = {
        "jobs": args.jobs,
        "runs": args.runs,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "reference_ping_per_s": ping_per_s,
    }
    for config in runs:
        result[config] = {
            "enqueue_per_s": median(config, "enqueue_per_s"),
            "drain_per_s": median(config, "drain_per_s"),
        }
        if not config.startswith("cluster"):
            result[config]["redis_cpu_s"] = median(config, "cpu_s")
        else:
            masters = runs[config][-1]["per_master"]
            result[config]["per_master_last_run"] = masters
            cpu = [m["cpu_s"] for m in masters.values()]
            result[config]["busiest_master_cpu_s"] = max(cpu)
            result[config]["total_cpu_s"] = round(sum(cpu), 3)
    pairs = [("single", c) for c in ("cluster_1", "cluster_3") if "single" in runs]
    pairs += [(a, b) for a, b in (("single_shard_1", "single_shard_3"),
                                  ("cluster_shard_1", "cluster_shard_3")) if a in runs]  # fmt: skip
    for base, config in pairs:
        for key in ("enqueue_per_s", "drain_per_s"):
            result[f"{config}_{key}_vs_{base}"] = round(result[config][key] / result[base][key], 3)
    # What the spread predicts where each master has a core: the rate is bounded by the busiest
    # master's CPU per job, so the ratio of busiest-master CPU is the predicted speed-up.
    for one, three in (("cluster_1", "cluster_3"), ("cluster_shard_1", "cluster_shard_3")):
        if one in runs:
            result[f"predicted_speedup_3_masters_{three}"] = round(
                result[one]["busiest_master_cpu_s"] / result[three]["busiest_master_cpu_s"], 2
            )
    if "single_shard_1" in runs:
        result["sharding_cpu_overhead_single"] = round(
            result["single_shard_3"]["redis_cpu_s"] / result["single_shard_1"]["redis_cpu_s"], 3
        )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
