"""Enqueue on PostgreSQL, interleaved: django_jobq's database backend against Procrastinate.

    python -m bench.db_enqueue [--rounds 5] [--one 1000] [--bulk 20000] [--before DIR]
                               [--sweep] [--out FILE]

Why a script of its own: on a machine others load, figures taken minutes apart differ by more
than the changes being judged. Every round here runs, in an order rotated from round to round,
each system's single enqueue (one call per job) and bulk enqueue (1,000 jobs a call), each in a
fresh subprocess on the same PostgreSQL server, plus the references of the same moment
(``bench.core_db``: one-row ``INSERT`` + ``COMMIT``, the WAL-flush floor under any
one-transaction enqueue; ``SELECT 1``, the round trip). ``--before DIR`` adds the django_jobq
of another checkout (e.g. ``main``) as a third system, so before and after come from one run.
The summary gives each round's ratios and their medians; ``uptime`` is recorded per round.

``--sweep`` also times ``enqueue_many`` in calls of 10,000 jobs with the storage's PostgreSQL
chunk (``PG_BULK_CHUNK``: jobs per ``INSERT … FROM unnest``) at 500, 1,000, 2,000 and 5,000,
interleaved in one process.

Procrastinate runs in its own venv (``python -m bench.peers`` builds it; only that peer is
needed). Databases: ``JOBQ_BENCH_PG_DB`` for django_jobq (``<name>_before`` for ``--before``),
``<JOBQ_BENCH_PG_DB>_procrastinate`` for the peer. Nothing here touches Redis.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEER_PY = ROOT / "bench" / "peers" / ".venv" / "procrastinate" / "bin" / "python"
WORKLOADS = ("enqueue_one", "enqueue_bulk")


def log(message: str) -> None:
    print(f"[db_enqueue] {message}", file=sys.stderr, flush=True)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{command[2:4]} exit {done.returncode}: {done.stderr[-1500:]}")
    return json.loads(lines[-1])


def measure(system: str, workload: str, jobs: int, opts: argparse.Namespace) -> float:
    """One figure (jobs/s) of one system, in a fresh subprocess."""
    bench_db = os.environ.get("JOBQ_BENCH_PG_DB", "test_jobq_bench_db")
    env = {**os.environ, "JOBQ_PEER_DB": "postgres"}
    log_dir = ["--log-dir", str(opts.log_dir / system)]
    args = [workload, "--jobs", str(jobs), *log_dir]
    if system == "procrastinate":
        env |= {"PYTHONPATH": str(ROOT), "PEERBENCH_PG_PREFIX": f"{bench_db}_"}
        command = [str(PEER_PY), "-m", "bench.peers.common", "procrastinate", *args]
        return _run(command, ROOT, env)["value"]
    root = ROOT if system == "jobq" else opts.before
    env |= {"PYTHONPATH": str(root),
            "JOBQ_BENCH_PG_DB": bench_db if system == "jobq" else f"{bench_db}_before"}  # fmt: skip
    command = [sys.executable, "-m", "bench.peers.jobq_peer", *args]
    return _run(command, root, env)["value"]


REFERENCE = (
    "import json, sys\n"
    "from bench import core_db\n"
    "core_db.setup('postgres')\n"
    "n = int(sys.argv[1])\n"
    "print(json.dumps({'insert_commit_per_s': core_db.measure_insert_commit(n)['per_s'],\n"
    "                  'select_one_per_s': core_db.measure_select_one(n)['per_s']}))\n"
)


def references(n: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", REFERENCE, str(n)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def sweep(rounds: int, calls_of: int = 10_000, total: int = 20_000) -> dict[str, list[float]]:
    """``enqueue_many`` rate by the storage's PostgreSQL chunk size, interleaved in-process."""
    from bench import core_db

    core_db.setup("postgres")
    from django_jobq.queue import Queue
    from django_jobq.storage.database import enqueue as module

    queue = Queue(core_db.ENQ_QUEUE)
    queue.enqueue_many([(None, {"n": -i}) for i in range(1000)])  # warm-up
    sizes = (500, 1000, 2000, 5000)
    rates: dict[str, list[float]] = {str(s): [] for s in sizes}
    saved = module.PG_BULK_CHUNK
    try:
        for r in range(rounds):
            for size in sizes[r % len(sizes) :] + sizes[: r % len(sizes)]:
                module.PG_BULK_CHUNK = size
                items = [(None, {"n": i}) for i in range(total)]
                start = time.perf_counter()
                for offset in range(0, total, calls_of):
                    queue.enqueue_many(items[offset : offset + calls_of])
                rates[str(size)].append(round(total / (time.perf_counter() - start), 1))
                core_db.reset()
    finally:
        module.PG_BULK_CHUNK = saved
    return rates


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", type=int, default=1000, help="single enqueues per figure")
    parser.add_argument("--bulk", type=int, default=20_000, help="jobs per bulk figure")
    parser.add_argument("--before", type=Path, help="another checkout's django_jobq to compare")
    parser.add_argument("--sweep", action="store_true", help="also sweep PG_BULK_CHUNK")
    parser.add_argument(
        "--log-dir", type=Path, default=Path(tempfile.gettempdir()) / "jobq-db-enqueue"
    )
    parser.add_argument("--out", type=Path)
    opts = parser.parse_args(argv)
    if not PEER_PY.exists():
        sys.exit(f"{PEER_PY} is missing: build it with python -m bench.peers (procrastinate)")
    systems = ["jobq", "procrastinate"] + (["before"] if opts.before else [])
    rounds = []
    for r in range(opts.rounds):
        order = systems[r % len(systems) :] + systems[: r % len(systems)]
        row: dict[str, Any] = {"uptime": uptime(), "order": order}
        row |= references(opts.one)
        for workload in WORKLOADS:
            jobs = opts.one if workload == "enqueue_one" else opts.bulk
            for system in order:
                row[f"{system}_{workload}"] = measure(system, workload, jobs, opts)
        after = references(opts.one)  # after too: the floor moves with the load
        row |= {f"{k}_after": v for k, v in after.items()}
        rounds.append(row)
        log(json.dumps(row))
    summary = summarise(rounds, systems)
    result: dict[str, Any] = {"rounds": rounds, "summary": summary}
    if opts.sweep:
        result["sweep"] = sweep(max(3, opts.rounds))
        result["sweep_median"] = {k: statistics.median(v) for k, v in result["sweep"].items()}
    print(json.dumps(result, indent=1))
    if opts.out:
        opts.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def summarise(rounds: list[dict[str, Any]], systems: list[str]) -> dict[str, Any]:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    out: dict[str, Any] = {f"{s}_{w}": med(f"{s}_{w}") for s in systems for w in WORKLOADS}
    out["insert_commit_per_s"] = med("insert_commit_per_s")
    out["insert_commit_after_per_s"] = med("insert_commit_per_s_after")
    out["select_one_per_s"] = med("select_one_per_s")
    ratios = {
        "one_vs_procrastinate": [r["jobq_enqueue_one"] / r["procrastinate_enqueue_one"]
                                 for r in rounds],
        "bulk_vs_batch_defer": [r["jobq_enqueue_bulk"] / r["procrastinate_enqueue_bulk"]
                                for r in rounds],
        "one_vs_insert_commit": [r["jobq_enqueue_one"] / r["insert_commit_per_s"]
                                 for r in rounds],
    }  # fmt: skip
    if "before" in systems:
        ratios["one_after_vs_before"] = [
            r["jobq_enqueue_one"] / r["before_enqueue_one"] for r in rounds
        ]
        ratios["bulk_after_vs_before"] = [
            r["jobq_enqueue_bulk"] / r["before_enqueue_bulk"] for r in rounds
        ]
        ratios["before_bulk_vs_batch_defer"] = [
            r["before_enqueue_bulk"] / r["procrastinate_enqueue_bulk"] for r in rounds
        ]
    out["ratios_per_round"] = {k: [round(x, 3) for x in v] for k, v in ratios.items()}
    out["ratios_median"] = {k: round(statistics.median(v), 3) for k, v in ratios.items()}
    return out


if __name__ == "__main__":
    main()
