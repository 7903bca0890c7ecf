"""Cost of observability on the drain: one ``runworker`` draining no-op jobs with and without.

    python -m bench.observability [--pairs 3] [--jobs 20000] [--concurrency 64]
                                  [--mode metrics[,tracing-sampled,tracing...]]

Each pair drains the same number of queued no-op jobs (``bench.core``'s queue and handler) with
one ``runworker`` process twice: once plain, once with ``--mode`` on in the worker
(``metrics``: ``JOBQ["METRICS"]["ENABLED"]``: the worker counts every claim and verdict;
``tracing``: an OpenTelemetry SDK tracer provider sampling every trace, with a batch processor
and an exporter that drops the spans, so every enqueue and attempt makes a span and every job
carries its context; ``tracing-sampled``: the same sampling 1 % of traces, the usual set-up in
production; ``tracing-noexport``: the SDK's tracer provider configured with no span processor,
"installed but unused"). "Off" always has ``opentelemetry-api`` installed and no provider.
The order inside a pair alternates; with several modes (comma-separated) the pairs of the
modes are interleaved (pair 0 of each mode, then pair 1 of each...), so a change of load
on the machine falls on every mode alike.

Two figures per drain: the wall-clock rate (what ``bench.core`` reports), and the **worker's
CPU time per job** (user + system, read from ``/proc/<pid>/stat`` between the first sample with
a completion and the end, so start-up is left out). On a machine shared with other load, the
wall-clock rate swings with the neighbours; CPU time per job is what observability adds, and
the ratio of the two CPU figures is the overhead we report, beside the ratio of the wall-clock
rates (start-up included, and steady: first completion to last). One JSON object on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

from bench.core import QUEUE, ROOT, delete_matching, log, redis_client, run_pattern, setup_django

# mode -> (environment variable of bench/settings.py, its value when on)
MODES = {"metrics": ("JOBQ_BENCH_METRICS", "1"), "tracing": ("JOBQ_BENCH_TRACING", "1"),
         "tracing-sampled": ("JOBQ_BENCH_TRACING", "0.01"),
         "tracing-noexport": ("JOBQ_BENCH_TRACING", "noexport")}  # fmt: skip
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def producer_provider(value: str) -> object:
    """The tracer provider of this (enqueueing) process for a tracing mode that is on: the
    same as the worker's (bench/settings.py), so sampled jobs carry their producer context."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Drop(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    if value == "noexport":
        return TracerProvider()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(float(value))))
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    return provider


def drain(n: int, concurrency: int, tag: str, log_dir: Path, producer: object = None) -> dict:
    from django_jobq import JobState
    from django_jobq.observability import tracing
    from django_jobq.queue import Queue

    queue = Queue(QUEUE)
    base = queue.counts()[JobState.COMPLETED]
    ids = [f"obs-{tag}-{i}" for i in range(n)]
    tracing.use_provider(producer)
    try:  # enqueue_many: one send span per call, its context in each of its jobs
        for offset in range(0, n, 100):
            queue.enqueue_many([(job_id, {"n": 1}) for job_id in ids[offset : offset + 100]])
    finally:
        tracing.use_provider(None)
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


def isolated_us_per_job(mode: str, value: str, batch: int = 64, rounds: int = 300) -> float:
    """CPU (``process_time``) per job of what the worker does for ``mode``, alone, per claim
    batch of ``batch`` jobs: metrics, the tally's ``started`` and ``verdicts``; tracing, the
    ``active()`` check and, when spans are made, a consumer span per job started (from a
    carried context when the job's ``send`` was sampled, else marked as sent unsampled or,
    before the mark, as a root: as in a drain, each job's send decided at the ratio), made
    current around the handler and ended. The steadier figure on a loaded machine: it does
    not depend on how the scheduler treats a drain, only on the code it times."""
    import time as clock

    from django_jobq.observability import tracing
    from django_jobq.observability.metrics.tally import Tally

    if mode == "metrics":
        tally = Tally()
        waited: list[int | None] = [3] * batch
        timed = [("completed", 0.0)] * batch

        def one_batch() -> None:
            tally.started("bench", batch, waited)
            tally.verdicts("bench", 0.002, timed)

    else:
        provider = producer_provider(value)
        carried_meta: dict = {}
        if value != "noexport":  # a sampled send's context, as its jobs carry it
            tracing.use_provider(producer_provider("1"))
            with tracing.producer_span("bench") as (_, carrier):
                carried_meta = {tracing.TRACE_META: dict(carrier)}
        tracing.use_provider(provider)
        # The jobs of a drain, each sent by its own send decided at the ratio: exactly that
        # share carry a sampled send's context (evenly spread), the others were sent unsampled
        # (a plain JSON job marked so: one trailing space; a worker before the mark ignores
        # it). A cycle of 25 batches, reused: a small heap, as the worker's batches are.
        ratio = 0.0 if value == "noexport" else float(value)
        cycle = 25 * batch
        carried = round(ratio * cycle)
        jobs, metas = [], []
        for i in range(cycle):
            carries = i * carried // cycle != (i + 1) * carried // cycle
            payload = b'{"n":1}' if carries else b'{"n":1} '
            jobs.append(SimpleNamespace(queue="bench", job_id=str(i), attempt=1, payload=payload,
                                        content_type="json"))  # fmt: skip
            metas.append(carried_meta if carries else {})
        batches = itertools.cycle([(jobs[k : k + batch], metas[k : k + batch])
                                   for k in range(0, cycle, batch)])  # fmt: skip

        def handler() -> None:
            return None

        def one_batch() -> None:
            jobs, metas = next(batches)
            if tracing.active():  # as the worker: start, current around the handler, end
                spans = tracing.start_consumers(jobs, metas, "w")
                for span in spans:
                    tracing.call_in(span, handler)
                for span in spans:
                    if span.is_recording():
                        tracing.end_consumer(span, "completed", None)

    try:
        start = clock.process_time()
        for _ in range(rounds):
            one_batch()
        return round((clock.process_time() - start) / (rounds * batch) * 1e6, 3)
    finally:
        tracing.use_provider(None)


def run_pairs(modes: list[str], pairs: int, jobs: int, concurrency: int) -> dict[str, list]:
    """``pairs`` off/on drain pairs per mode, the modes interleaved, each pair's order
    alternating."""
    results: dict[str, list] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="jobq-bench-") as tmp:
        for i in range(pairs):
            for mode in modes:
                env, value = MODES[mode]
                figures = {}
                for on in (False, True) if i % 2 == 0 else (True, False):
                    os.environ[env] = value if on else "0"
                    traced = on and env == "JOBQ_BENCH_TRACING"
                    try:
                        result = drain(jobs, concurrency, f"{mode}-{i}-{int(on)}", Path(tmp),
                                       producer_provider(value) if traced else None)  # fmt: skip
                    finally:
                        os.environ.pop(env, None)
                    figures["on" if on else "off"] = result
                    log(f"pair {i} {mode} {'on' if on else 'off'}: {result}")
                off, on_ = figures["off"], figures["on"]
                results[mode].append({
                    "off": off, "on": on_,
                    "cpu_ratio": round(on_["cpu_us_per_job"] / off["cpu_us_per_job"], 3),
                    "wall_ratio": round(on_["per_s"] / off["per_s"], 3),
                    "steady_wall_ratio": round(on_["steady_per_s"] / off["steady_per_s"], 3),
                })  # fmt: skip
    return results


def summary(mode: str, pairs: list[dict]) -> dict:
    """One mode's figures: each pair, the medians, and the isolated cost of its code."""
    isolated = isolated_us_per_job(mode, MODES[mode][1])
    off_cpu = statistics.median(p["off"]["cpu_us_per_job"] for p in pairs)
    return {
        "isolated_us_per_job": isolated,
        "isolated_share_of_off_cpu": round(isolated / off_cpu, 4),
        "median_off_cpu_us_per_job": off_cpu,
        "median_cpu_ratio": statistics.median(p["cpu_ratio"] for p in pairs),
        "median_wall_ratio": statistics.median(p["wall_ratio"] for p in pairs),
        "median_steady_wall_ratio": statistics.median(p["steady_wall_ratio"] for p in pairs),
        "pairs": pairs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--mode",
        default="metrics",
        help=f"one or more of {', '.join(sorted(MODES))}, comma-separated",
    )
    args = parser.parse_args()
    modes = args.mode.split(",")
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown mode(s): {', '.join(sorted(unknown))}")
    prefix = f"jobqbench-{uuid.uuid4().hex[:10]}"
    setup_django(prefix)
    load_start, uptime_start = os.getloadavg(), Path("/proc/loadavg").read_text().split()[:3]
    try:
        results = run_pairs(modes, args.pairs, args.jobs, args.concurrency)
    finally:
        delete_matching(redis_client(), run_pattern(prefix))
    print(json.dumps({
        "jobs": args.jobs, "concurrency": args.concurrency, "pairs_per_mode": args.pairs,
        "loadavg_1_5_15_start": [float(x) for x in uptime_start],
        "loadavg_1_5_15_end": [round(x, 2) for x in os.getloadavg()],
        "loadavg_1m_start_end": [load_start[0], os.getloadavg()[0]],
        "modes": {mode: summary(mode, pairs) for mode, pairs in results.items()},
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
