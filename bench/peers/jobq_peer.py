"""django_jobq's side of the peer comparison: the same four workloads, measured by bench/core.py.

Runs in the project's own virtual environment (``python -m bench.peers.jobq_peer WORKLOAD ...``,
the same arguments as a peer's ``python -m bench.peers.common PEER WORKLOAD ...``) and prints
one JSON line in the same shape. The measurements are bench/core.py's own functions, called
with the peer run's sizes, so the figures here and in ``python -m bench.core`` are the same
thing measured the same way:

- enqueue one: ``core.measure_enqueue_one`` (sequential ``Queue.enqueue``);
- bulk: ``core.measure_enqueue_bulk`` (``Queue.enqueue_many``, 1,000 per call);
- drain: ``core.measure_drain`` with 1 or 4 ``runworker`` processes (spawn to last completion);
- request/response: ``core.measure_rr`` (sequential ``Queue.enqueue_and_wait``).

The Redis URL comes from ``JOBQ_BENCH_REDIS_URL`` (``bench/settings.py``), which the orchestrator
sets to the peers' database; keys carry a fresh ``jobqbench-<random>`` prefix and are deleted
at the end, as in bench/core.py.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from importlib.metadata import version
from typing import Any

from bench import core
from bench.peers.common import parse_args

# Worker --concurrency of each workload: bench/core.py's best single-process drain setting,
# 32 per process when four share the two cores (128 jobs in flight either way), and its
# request/response worker.
DRAIN_CONCURRENCY = {1: 128, 4: 32}
RR_CONCURRENCY = 8
DB_DRAIN_CONCURRENCY = 64  # database backend: one runworker process


def run(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    if os.environ.get("JOBQ_PEER_DB"):
        return run_database(args, os.environ["JOBQ_PEER_DB"])
    prefix = f"jobqbench-{uuid.uuid4().hex[:10]}"
    core.setup_django(prefix)
    client = core.redis_client()
    settings: dict[str, Any] = {
        "backend": "redis",
        "drain_concurrency_per_process": DRAIN_CONCURRENCY,
        "rr_worker_concurrency": RR_CONCURRENCY,
        "bulk": "Queue.enqueue_many, 1,000 jobs per call",
        "measured_by": "bench/core.py",
    }
    result: dict[str, Any] = {"system": "django_jobq", "version": version("django-jobq"),
                              "workload": args.workload}  # fmt: skip
    try:
        if args.workload == "enqueue_one":
            got = core.measure_enqueue_one(args.jobs, prefix)
            result |= {"value": got["per_s"], "unit": "jobs/s", "jobs": got["jobs"],
                       "seconds": got["seconds"]}  # fmt: skip
        elif args.workload == "enqueue_bulk":
            got = core.measure_enqueue_bulk(args.jobs, args.chunk, prefix)
            result |= {"value": got["per_s"], "unit": "jobs/s", "jobs": got["jobs"],
                       "chunk": got["chunk"], "seconds": got["seconds"]}  # fmt: skip
        elif args.workload == "drain":
            concurrency = DRAIN_CONCURRENCY.get(args.processes, 32)
            tag = f"peers-{uuid.uuid4().hex[:6]}"
            got = core.measure_drain(
                args.jobs, concurrency, prefix, tag, args.log_dir, processes=args.processes
            )
            result |= {"workload": f"drain_{args.processes}", "value": got["per_s"],
                       "unit": "jobs/s", "jobs": got["jobs"], "processes": args.processes,
                       "concurrency": concurrency, "seconds": got["seconds"],
                       "startup_s": got["startup_s"],
                       "steady_per_s": got["steady_per_s"]}  # fmt: skip
        else:
            got = core.measure_rr(args.jobs, args.warmup, RR_CONCURRENCY, prefix, args.log_dir)
            result |= {"value": got["p50"], "unit": "ms", "p50_ms": got["p50"],
                       "p99_ms": got["p99"], "mean_ms": got["mean"], "max_ms": got["max"],
                       "calls": got["calls"], "warmup": got["warmup"]}  # fmt: skip
    finally:
        core.delete_matching(client, core.run_pattern(prefix))
    result["settings"] = settings
    return result


def run_database(args: Any, db: str) -> dict[str, Any]:
    """``python -m bench.peers --db postgres``: the same workloads on the database backend,
    measured by bench/core_db.py's functions (one worker process for the drain)."""
    from bench import core_db

    core_db.setup(db)
    core_db.reset()
    settings: dict[str, Any] = {
        "backend": f"database ({db})",
        "drain_concurrency": DB_DRAIN_CONCURRENCY,
        "rr_worker_concurrency": RR_CONCURRENCY,
        "bulk": "Queue.enqueue_many, 1,000 jobs per call",
        "measured_by": "bench/core_db.py",
    }
    result: dict[str, Any] = {"system": "django_jobq", "version": version("django-jobq"),
                              "workload": args.workload, "settings": settings}  # fmt: skip
    if args.workload == "enqueue_one":
        got = core_db.measure_enqueue_one(args.jobs)
        return result | {"value": got["per_s"], "unit": "jobs/s", "jobs": got["jobs"]}
    if args.workload == "enqueue_bulk":
        got = core_db.measure_enqueue_bulk(args.jobs, args.chunk)
        return result | {"value": got["per_s"], "unit": "jobs/s", "jobs": got["jobs"],
                         "chunk": got["chunk"]}  # fmt: skip
    if args.workload == "drain":
        tag = f"peers-{uuid.uuid4().hex[:6]}"
        got = core_db.measure_drain(args.jobs, DB_DRAIN_CONCURRENCY, tag, args.log_dir)
        return result | {"workload": "drain_1", "value": got["per_s"], "unit": "jobs/s",
                         "jobs": got["jobs"], "processes": 1, "seconds": got["seconds"],
                         "startup_s": got["startup_s"],
                         "steady_per_s": got["steady_per_s"]}  # fmt: skip
    got = core_db.measure_rr(args.jobs, args.warmup, RR_CONCURRENCY, args.log_dir)
    return result | {"value": got["p50"], "unit": "ms", "p50_ms": got["p50"], "p99_ms": got["p99"],
                     "mean_ms": got["mean"], "max_ms": got["max"], "calls": got["calls"],
                     "warmup": got["warmup"]}  # fmt: skip


def main() -> None:
    print(json.dumps(run(sys.argv[1:])), flush=True)


if __name__ == "__main__":
    main()
