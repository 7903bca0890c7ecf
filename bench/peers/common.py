"""The harness every peer adapter shares: the four workloads, timed the same way for all.

Runs inside a peer's own virtual environment (``bench/peers/.venv/<peer>``), so it needs nothing
but the standard library and redis-py, which every peer brings. An adapter module supplies
the peer-specific parts (see ``Adapter``) and calls ``main(adapter)``; the orchestrator
(``python -m bench.peers``) starts it once per workload:

    <peer venv>/bin/python -m bench.peers.<peer> WORKLOAD --jobs N --redis-url URL [--processes P]

and reads one JSON object from its last stdout line (progress goes to stderr).

Completion of a drain is seen through a *probe*, the same for every peer: the no-op task calls
``probe_record()``, which only bumps a per-process counter and notes the time; a daemon thread
of the worker process writes the counter and the first/last completion times to one Redis hash
every 10 ms. So a job costs its peer no extra Redis round trip, and the harness reads the
finish times without polling each peer's own bookkeeping (which differs per peer, and which
some peers, with results off, do not keep at all).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
QUEUE = "peerbench"  # the queue every peer's worker serves
PROBE_KEY_ENV = "PEERBENCH_PROBE_KEY"
REDIS_URL_ENV = "PEERBENCH_REDIS_URL"
WORKLOADS = ("enqueue_one", "enqueue_bulk", "drain", "rr")


class NotAvailable(Exception):
    """The peer has no way to do this workload; the message says why (reported as "n/a")."""


def redis_url() -> str:
    """The Redis URL of this run, for modules imported by a peer's worker process."""
    return os.environ.get(REDIS_URL_ENV, "redis://127.0.0.1:6379/5")


def log(message: str) -> None:
    print(f"[bench.peers] {message}", file=sys.stderr, flush=True)


# -- the probe, inside the worker processes ---------------------------------------------------

_counter = itertools.count(1)  # next() is atomic under the GIL, so threaded workers can share it
_done = 0
_first: float | None = None
_last = 0.0
_flusher: threading.Thread | None = None
_flusher_lock = threading.Lock()


def probe_record() -> None:
    """Called by a peer's no-op task: count it and note the time, nothing else on the job's path."""
    global _done, _first, _last
    now = time.time()
    _done = next(_counter)
    _last = now
    if _first is None:
        _first = now
        _start_flusher()


def _start_flusher() -> None:
    global _flusher
    with _flusher_lock:
        if _flusher is not None or not os.environ.get(PROBE_KEY_ENV):
            return
        _flusher = threading.Thread(target=_flush_loop, name="peerbench-probe", daemon=True)
        _flusher.start()


def _flush_loop() -> None:
    """Every 10 ms, when the count moved, write this process's count and first/last times."""
    import redis

    client = redis.Redis.from_url(redis_url())
    key = os.environ[PROBE_KEY_ENV]
    pid = os.getpid()
    written = -1
    while True:
        done = _done
        if done != written:
            client.hset(key, mapping={f"{pid}:done": done, f"{pid}:first": repr(_first),
                                      f"{pid}:last": repr(_last)})  # fmt: skip
            written = done
        time.sleep(0.01)


def probe_read(client: Any, key: str) -> tuple[int, float | None, float | None]:
    """(jobs done, first completion, last completion) over all worker processes."""
    fields = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
    done = sum(int(v) for k, v in fields.items() if k.endswith(":done"))
    firsts = [float(v) for k, v in fields.items() if k.endswith(":first") and v != "None"]
    lasts = [float(v) for k, v in fields.items() if k.endswith(":last")]
    return done, (min(firsts) if firsts else None), (max(lasts) if lasts else None)


# -- worker processes -------------------------------------------------------------------------


def start_workers(commands: list[list[str]], env: dict[str, str], log_dir: Path) -> list:
    """Start the peer's worker processes (one command each), logs to files."""
    procs = []
    for index, command in enumerate(commands):
        out = (log_dir / f"worker-{os.getpid()}-{index}.log").open("w")
        procs.append(
            subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        )
        out.close()
    return procs


def stop_workers(procs: list, log_dir: Path) -> None:
    """SIGTERM each by its PID, at once; SIGKILL those still there after 30 s."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log(f"worker {proc.pid} ignored SIGTERM; killing it by PID")
            proc.kill()
            proc.wait(timeout=10)


def worker_env(probe_key: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        PROBE_KEY_ENV: probe_key,
        REDIS_URL_ENV: redis_url(),
    }


def log_tail(log_dir: Path, lines: int = 15) -> str:
    text = []
    for path in sorted(log_dir.glob("worker-*.log")):
        text += path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join(text)


# -- the adapter contract ---------------------------------------------------------------------


@dataclass
class Adapter:
    """What a peer module supplies. ``None`` for a workload the peer cannot do, with the reason
    in ``not_available``."""

    name: str
    version: str
    settings: dict[str, Any]
    enqueue_one: Callable[[int], None]  # enqueue jobs 0..n-1, one call each, on an unserved queue
    enqueue_bulk: Callable[[int, int], None] | None  # (n, chunk): the peer's bulk call
    fill: Callable[[int], None]  # queue n no-op jobs for the drain (fastest way, not timed)
    worker_command: Callable[[str], list[str]]  # role "drain" or "rr" -> one process's argv
    rr_call: Callable[[], Any]  # enqueue one job and wait for its result
    not_available: dict[str, str] = field(default_factory=dict)
    worker_env: dict[str, str] = field(default_factory=dict)  # extra environment of the workers
    # Async peers time their whole request/response loop inside their event loop, so no
    # per-call loop entry is charged to them: (n, warmup) -> nanoseconds per timed call.
    rr_timed: Callable[[int, int], list[int]] | None = None
    close: Callable[[], None] = lambda: None


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile, as bench/core.py: p99 of 500 samples is the 495th."""
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def time_enqueue_one(adapter: Adapter, n: int) -> dict[str, Any]:
    adapter.enqueue_one(200)  # warm-up: connection, script cache
    start = time.perf_counter()
    adapter.enqueue_one(n)
    elapsed = time.perf_counter() - start
    return {"value": round(n / elapsed, 1), "unit": "jobs/s", "jobs": n,
            "seconds": round(elapsed, 4)}  # fmt: skip


def time_enqueue_bulk(adapter: Adapter, n: int, chunk: int) -> dict[str, Any]:
    if adapter.enqueue_bulk is None:
        raise NotAvailable(adapter.not_available["enqueue_bulk"])
    adapter.enqueue_bulk(chunk, chunk)  # warm-up
    start = time.perf_counter()
    adapter.enqueue_bulk(n, chunk)
    elapsed = time.perf_counter() - start
    return {"value": round(n / elapsed, 1), "unit": "jobs/s", "jobs": n, "chunk": chunk,
            "seconds": round(elapsed, 4)}  # fmt: skip


def time_drain(adapter: Adapter, n: int, processes: int, log_dir: Path) -> dict[str, Any]:
    """Queue n no-op jobs, spawn the worker processes, time spawn -> last completion, as
    bench/core.py does for django_jobq (start-up included; steady rate beside it)."""
    import redis

    client = redis.Redis.from_url(redis_url())
    probe_key = f"peerbench:probe:{os.getpid()}:{processes}"
    client.delete(probe_key)
    adapter.fill(n)
    env = worker_env(probe_key) | adapter.worker_env
    spawn = time.time()
    procs = start_workers([adapter.worker_command("drain") for _ in range(processes)], env, log_dir)
    try:
        deadline = time.monotonic() + 300
        while True:
            done, first, last = probe_read(client, probe_key)
            if done >= n:
                break
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"worker exited {proc.returncode} during the drain:\n{log_tail(log_dir)}"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(f"drain timed out: {done} of {n} done\n{log_tail(log_dir)}")
            time.sleep(0.02)
    finally:
        stop_workers(procs, log_dir)
    if done != n or first is None or last is None:
        raise RuntimeError(f"drain counted {done} completions for {n} jobs")
    total = last - spawn
    steady = last - first
    return {
        "value": round(n / total, 1),
        "unit": "jobs/s",
        "jobs": n,
        "processes": processes,
        "seconds": round(total, 4),
        "startup_s": round(first - spawn, 4),
        "steady_per_s": round((n - 1) / steady, 1) if steady > 0 else None,
    }


async def timed_async(call: Callable[[], Any], n: int, warmup: int) -> list[int]:
    """time_rr's loop for an asyncio client (``rr_timed``): ``warmup`` calls, a pause for the
    worker to settle into its idle wait, then ``n`` timed calls (ns)."""
    import asyncio

    for _ in range(warmup):
        await call()
    await asyncio.sleep(0.3)
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await call()
        samples.append(time.perf_counter_ns() - t0)
    return samples


def time_rr(adapter: Adapter, n: int, warmup: int, log_dir: Path) -> dict[str, Any]:
    """Sequential enqueue-and-wait calls against one idle worker process; the first warm-up
    call also waits out the worker's start-up."""
    env = worker_env(f"peerbench:probe:{os.getpid()}:rr") | adapter.worker_env
    procs = start_workers([adapter.worker_command("rr")], env, log_dir)
    try:
        if adapter.rr_timed is not None:
            samples = adapter.rr_timed(n, warmup)
        else:
            for _ in range(warmup):
                adapter.rr_call()
            time.sleep(0.3)  # let the worker settle into its idle wait, as bench/core.py does
            samples = []
            for _ in range(n):
                t0 = time.perf_counter_ns()
                adapter.rr_call()
                samples.append(time.perf_counter_ns() - t0)
        if procs[0].poll() is not None:
            raise RuntimeError(f"worker exited during the rr test:\n{log_tail(log_dir)}")
    finally:
        stop_workers(procs, log_dir)
    values = sorted(x / 1e6 for x in samples)
    return {
        "value": round(statistics.median(values), 4),
        "unit": "ms",
        "p50_ms": round(statistics.median(values), 4),
        "p99_ms": round(percentile(values, 99), 4),
        "mean_ms": round(statistics.fmean(values), 4),
        "max_ms": round(values[-1], 4),
        "calls": n,
        "warmup": warmup,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=WORKLOADS)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--log-dir", type=Path, required=True)
    return parser.parse_args(argv)


def run_workload(adapter: Adapter, args: argparse.Namespace) -> dict[str, Any]:
    """One workload; a NotAvailable becomes an "n/a" record with its reason, never a number."""
    result: dict[str, Any] = {"system": adapter.name, "version": adapter.version,
                              "workload": args.workload}  # fmt: skip
    if args.workload == "drain":
        result["workload"] = f"drain_{args.processes}"
    try:
        if args.workload == "enqueue_one":
            result |= time_enqueue_one(adapter, args.jobs)
        elif args.workload == "enqueue_bulk":
            result |= time_enqueue_bulk(adapter, args.jobs, args.chunk)
        elif args.workload == "drain":
            result |= time_drain(adapter, args.jobs, args.processes, args.log_dir)
        else:
            result |= time_rr(adapter, args.jobs, args.warmup, args.log_dir)
    except NotAvailable as reason:
        result |= {"value": None, "na": str(reason)}
    finally:
        adapter.close()
    result["settings"] = adapter.settings
    return result


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.peers.common PEER WORKLOAD ...``: one workload, one JSON line on stdout;
    ``python -m bench.peers.common PEER worker ROLE``: one worker process of the peer's own
    making (for peers whose worker is a library call rather than a command)."""
    import importlib

    argv = sys.argv[1:] if argv is None else argv
    module = importlib.import_module(f"bench.peers.{argv[0]}_peer")
    if argv[1] == "worker":
        module.run_worker(argv[2])
        return
    args = parse_args(argv[1:])
    args.log_dir.mkdir(parents=True, exist_ok=True)
    result = run_workload(module.make_adapter(), args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: the peer modules import
    # bench.peers.common, and its NotAvailable and probe must be the ones they see.
    from bench.peers import common

    common.main()
