"""Benchmark of ``jobq_analytics``: wall time and peak memory over a generated history.

    .venv/bin/python -m bench.spark_analytics --events 10000000 [--master local[*]]

Generates ``--events`` events (about 3.3 per job: claims, completions, retries, failures over
24 hours, 4 queues, 8 handlers) with Spark into an export-layout Parquet directory, then times
``run_analytics`` on it exactly as the command runs it (read, compute minute/hour/day metrics,
upsert them into ``QueueMetric`` on a SQLite file of its own). Peak memory is the largest
resident set of the whole process tree (this Python, the driver JVM, Python workers), sampled
every 0.2 s. One JSON object goes to stdout; progress to stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.spark_settings")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from django_jobq.contrib.spark import get_spark, run_analytics  # noqa: E402
from django_jobq.models import QueueMetric  # noqa: E402

EVENTS_PER_JOB = 0.85 * 3 + 0.10 * 6 + 0.05 * 3
START = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


def _tree_rss_kib(root: int) -> int:
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        pid, ppid = int(entry.name), int(fields["PPid"])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0])
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


class PeakMemory(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_kib = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.peak_kib = max(self.peak_kib, _tree_rss_kib(os.getpid()))


def _h(salt: int) -> F.Column:
    return F.abs(F.hash(F.col("id"), F.lit(salt)))


def generate(spark: SparkSession, events: int, path: Path) -> int:
    """An export-layout history of about ``events`` rows; returns the exact count."""
    jobs = int(events / EVENTS_PER_JOB)
    base_us = int(START.timestamp() * 1_000_000)
    span_us = 86_400 * 1_000_000
    df = spark.range(jobs).select(
        "id",
        (F.lit(base_us) + F.col("id") * F.lit(span_us // max(jobs, 1))).alias("t0"),
        (_h(1) % 5_000_000).alias("wait"),
        (_h(2) % 3_000_000).alias("run"),
        (_h(3) % 100).alias("roll"),
        F.concat(F.lit("q"), (F.col("id") % 4).cast("string")).alias("queue"),
        F.concat(F.lit("app.jobs.h"), (F.col("id") % 8).cast("string")).alias("handler"),
        F.concat(F.lit("w"), (_h(4) % 16).cast("string")).alias("worker"),
    )
    df.select("*", _kinds().alias("ev")).select("*", F.posexplode("ev").alias("n", "e")).select(
        (F.col("id") * 8 + F.col("n")).alias("event_id"),
        F.col("id").alias("job_pk"),
        F.concat(F.lit("job-"), F.col("id").cast("string")).alias("job_id"),
        "handler",
        F.col("e.kind").alias("kind"),
        F.timestamp_micros(F.col("t0") + F.col("e.offset")).alias("at"),
        F.when(F.col("e.kind") == "queued", F.lit("")).otherwise(F.col("worker")).alias("worker"),
        F.when(F.col("e.kind") == "failed", F.lit("ValueError")).alias("error_type"),
        F.when(F.col("e.kind") == "failed", F.concat(F.lit("bad input "), (F.col("id") % 5))).alias(
            "error_message"
        ),
        "queue",
        F.date_format(F.timestamp_micros(F.col("t0") + F.col("e.offset")), "yyyy-MM-dd").alias(
            "date"
        ),
    ).write.partitionBy("queue", "date").mode("overwrite").parquet(str(path / "events"))
    return spark.read.parquet(str(path / "events")).count()


def _kinds() -> F.Column:
    w, r = F.col("wait"), F.col("run")

    def ev(kind: str, offset: F.Column) -> F.Column:
        return F.struct(F.lit(kind).alias("kind"), offset.alias("offset"))

    plain = [ev("queued", F.lit(0)), ev("active", w)]
    done = F.array(*plain, ev("completed", w + r))
    failed = F.array(*plain, ev("failed", w + r))
    retried = F.array(
        *plain, ev("retrying", w + r), ev("queued", w + r + 1_000_000),
        ev("active", w * 2 + r + 1_000_000), ev("completed", w * 2 + r * 2 + 1_000_000),
    )  # fmt: skip
    return F.when(F.col("roll") < 85, done).when(F.col("roll") < 95, retried).otherwise(failed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--keep", metavar="DIR", help="generate into DIR and keep it")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    work = Path(args.keep or tempfile.mkdtemp(prefix="jobq-bench-spark-"))
    spark = get_spark(
        args.master, app_name="jobq-bench", shuffle_partitions=args.shuffle_partitions,
        conf={"spark.driver.memory": args.driver_memory},
    )  # fmt: skip
    try:
        result = _measure(spark, args, work)
    finally:
        spark.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        if "JOBQ_BENCH_SPARK_SQLITE" not in os.environ:  # our own per-run file: leave nothing
            Path(settings.DATABASES["default"]["NAME"]).unlink(missing_ok=True)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _measure(spark: SparkSession, args: argparse.Namespace, work: Path) -> dict:
    t0 = time.perf_counter()
    events = generate(spark, args.events, work)
    generated_s = time.perf_counter() - t0
    print(f"generated {events} events in {generated_s:.1f} s", file=sys.stderr)
    QueueMetric.objects.all().delete()
    monitor = PeakMemory()
    monitor.start()
    t1 = time.perf_counter()
    outcome = run_analytics(spark, input_dir=str(work))
    wall_s = time.perf_counter() - t1
    monitor.stop.set()
    monitor.join()
    return {
        "events": events, "metric_rows": outcome.metrics, "master": args.master,
        "driver_memory": args.driver_memory, "shuffle_partitions": args.shuffle_partitions,
        "cores": os.cpu_count(), "generate_s": round(generated_s, 1),
        "analytics_wall_s": round(wall_s, 1),
        "events_per_s": round(events / wall_s) if wall_s else None,
        "peak_rss_mib": round(monitor.peak_kib / 1024),
        "parquet_mib": round(sum(f.stat().st_size for f in work.rglob("*.parquet")) / 2**20),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }  # fmt: skip


if __name__ == "__main__":
    main()
