"""Cost of observability on the drain: one ``runworker`` draining no-op jobs with and without.

    python -m bench.observability [--pairs 3] [--jobs 20000] [--concurrency 64] [--mode metrics]

Each pair drains the same number of queued no-op jobs (``bench.core``'s queue and handler) with
one ``runworker`` process twice: once plain, once with ``--mode`` on in the worker
(``metrics``: ``JOBQ["METRICS"]["ENABLED"]``: the worker counts every claim and verdict;
``tracing``: an OpenTelemetry SDK tracer provider sampling every trace, with a batch processor
and an exporter that drops the spans, so every enqueue and attempt makes a span and every job
carries its context; ``tracing-sampled``: the same sampling 1 % of traces, the usual set-up in
production). The order inside a pair alternates.

Two figures per drain: the wall-clock rate (what ``bench.core`` reports), and the **worker's
CPU time per job** (user + system, read from ``/proc/<pid>/stat`` between the first sample with
a completion and the end, so start-up is left out). On a machine shared with other load, the
wall-clock rate swings with the neighbours; CPU time per job is what observability adds, and
the ratio of the two CPU figures is the overhead we report. One JSON object on stdout.
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
import uuid
from pathlib import Path

from bench.core import QUEUE, ROOT, delete_matching, log, redis_client, run_pattern, setup_django

# mode -> (environment variable of bench/settings.py, its value when on)
MODES = {"metrics": ("JOBQ_BENCH_METRICS", "1"), "tracing": ("JOBQ_BENCH_TRACING", "1"),
         "tracing-sampled": ("JOBQ_BENCH_TRACING", "0.01")}  # fmt: skip
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def drain(n: int, concurrency: int, tag: str, log_dir: Path) -> dict:
    from django_jobq import JobState
    from django_jobq.queue import Queue

    queue = Queue(QUEUE)
    base = queue.counts()[JobState.COMPLETED]
    ids = [f"obs-{tag}-{i}" for i in range(n)]
    for offset in range(0, n, 1000):
        queue.enqueue_many([(job_id, {"n": 1}) for job_id in ids[offset : offset + 1000]])
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "PYTHONPATH": str(ROOT)}
    with (log_dir / f"worker-{tag}.log").open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runworker", QUEUE, "--concurrency",
             str(concurrency), "--settings", "bench.settings"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        start = time.perf_counter()
        first: tuple[int, float, float] | None = None
        while True:
            done = queue.counts()[JobState.COMPLETED] - base
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited {proc.returncode}")
            if done > 0 and first is None:
                first = (done, cpu_seconds(proc.pid), time.perf_counter())
            if done >= n:
                cpu, end = cpu_seconds(proc.pid), time.perf_counter()
                break
            time.sleep(0.02)
    finally:
        proc.terminate()
        proc.wait(30)
    assert first is not None
    jobs = n - first[0]
    return {
        "per_s": round(n / (end - start), 1),
        "steady_per_s": round(jobs / (end - first[2]), 1),
        "cpu_us_per_job": round((cpu - first[1]) / jobs * 1e6, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--mode", choices=sorted(MODES), default="metrics")
    args = parser.parse_args()
    prefix = f"jobqbench-{uuid.uuid4().hex[:10]}"
    setup_django(prefix)
    env, value = MODES[args.mode]
    pairs = []
    try:
        with tempfile.TemporaryDirectory(prefix="jobq-bench-") as tmp:
            for i in range(args.pairs):
                figures = {}
                for on in (False, True) if i % 2 == 0 else (True, False):
                    os.environ[env] = value if on else "0"
                    result = drain(args.jobs, args.concurrency, f"{i}-{int(on)}", Path(tmp))
                    figures["on" if on else "off"] = result
                    log(f"pair {i} {args.mode} {'on' if on else 'off'}: {result}")
                off, on_ = figures["off"], figures["on"]
                pairs.append({
                    "off": off, "on": on_,
                    "cpu_ratio": round(on_["cpu_us_per_job"] / off["cpu_us_per_job"], 3),
                    "wall_ratio": round(on_["per_s"] / off["per_s"], 3),
                })  # fmt: skip
    finally:
        os.environ.pop(env, None)
        delete_matching(redis_client(), run_pattern(prefix))
    print(json.dumps({
        "mode": args.mode, "jobs": args.jobs, "concurrency": args.concurrency, "pairs": pairs,
        "median_cpu_ratio": statistics.median(p["cpu_ratio"] for p in pairs),
        "median_wall_ratio": statistics.median(p["wall_ratio"] for p in pairs),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
