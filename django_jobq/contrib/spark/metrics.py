"""The analytics: from a flat event history to one row per (queue, handler, period, bucket).

Definitions (docs/spark.md repeats them for operators):

- counts by the bucket of the event: ``started`` (claims, kind ``active``), ``completed``,
  ``failed``, ``retried`` (kind ``retrying``), ``stalled``;
- ``throughput``: completed per second of the bucket;
- wait time: a claim minus the event just before it of the same job, when that one made the
  job runnable (queued, released, requeued after a stall); in the bucket of the claim;
- run time: an attempt's outcome (completed, failed, retrying) minus its claim; in the bucket of
  the outcome; the busy time of a worker also counts attempts it released or postponed;
- percentiles: ``percentile_approx`` with ``ACCURACY`` (relative rank error 1/ACCURACY);
- ``retry_rate``: retried / (completed + failed + retried); ``stall_rate``: stalled / started;
- ``utilisation``: busy time / (bucket length × distinct workers that ran attempts there),
  i.e. the busy share of one slot per worker (above 1 when workers run jobs concurrently);
- failure classes: failed events by error type, with the ``TOP_MESSAGES`` most frequent messages.

Why a window over each job's events rather than a self-join: one sort by (queue, job) gives every
event its predecessor, where a join would shuffle the history twice.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .schema import BUSY_OUTCOMES, RUN_OUTCOMES, RUNNABLE_KINDS

ACCURACY = 10_000
TOP_MESSAGES = 3
PERIODS = {"minute": 60, "hour": 3600, "day": 86_400}
KEYS = ("queue", "handler", "period", "bucket")
QUANTILES = (0.5, 0.95, 0.99)


def _ms_between(later: Column, earlier: Column) -> Column:
    return (F.unix_micros(later) - F.unix_micros(earlier)) / F.lit(1000.0)


def attempt_facts(events: DataFrame) -> DataFrame:
    """Each event with the intervals it closes: ``wait_ms``, ``run_ms``, ``busy_ms`` and the
    worker that was busy (null where the event closes none)."""
    job = Window.partitionBy("queue", "job_pk").orderBy("at", "event_id")
    prev_kind, prev_at = F.lag("kind").over(job), F.lag("at").over(job)
    prev_worker = F.lag("worker").over(job)
    with_prev = events.select(
        "queue",
        F.coalesce(F.col("handler"), F.lit("")).alias("handler"),
        "kind", "at", "worker", "error_type", "error_message",
        prev_kind.alias("prev_kind"), prev_at.alias("prev_at"), prev_worker.alias("prev_worker"),
    )  # fmt: skip
    span = _ms_between(F.col("at"), F.col("prev_at"))
    after_claim = F.col("prev_kind") == "active"
    busy = F.col("kind").isin(*BUSY_OUTCOMES) & after_claim
    return with_prev.select(
        "queue", "handler", "kind", "at", "error_type", "error_message",
        F.when((F.col("kind") == "active") & F.col("prev_kind").isin(*RUNNABLE_KINDS), span)
        .alias("wait_ms"),
        F.when(F.col("kind").isin(*RUN_OUTCOMES) & after_claim, span).alias("run_ms"),
        F.when(busy, span).alias("busy_ms"),
        F.when(busy, F.coalesce(F.nullif(F.col("prev_worker"), F.lit("")), F.col("worker")))
        .alias("busy_worker"),
    )  # fmt: skip


def _count(kind: str) -> Column:
    return F.sum(F.when(F.col("kind") == kind, 1).otherwise(0)).cast("long")


def _quantiles(column: str, prefix: str) -> list[Column]:
    q = F.percentile_approx(column, list(QUANTILES), ACCURACY)
    return [q[i].cast("double").alias(f"{prefix}_p{int(p * 100)}") for i, p in enumerate(QUANTILES)]


def _counts_and_times(facts: DataFrame) -> DataFrame:
    grouped = facts.groupBy("queue", "handler", "period", "bucket", "seconds").agg(
        _count("active").alias("started"),
        _count("completed").alias("completed"),
        _count("failed").alias("failed"),
        _count("retrying").alias("retried"),
        _count("stalled").alias("stalled"),
        *_quantiles("wait_ms", "wait"),
        *_quantiles("run_ms", "run"),
        F.coalesce(F.sum("busy_ms"), F.lit(0.0)).alias("busy"),
        # A set per bucket (workers are few) instead of count_distinct, which would make Spark
        # expand every row once per distinct aggregate.
        F.size(F.collect_set("busy_worker")).alias("workers"),
    )
    finished = F.col("completed") + F.col("failed") + F.col("retried")
    seconds = F.col("seconds")
    return grouped.select(
        *KEYS, "started", "completed", "failed", "retried", "stalled",
        (F.col("completed") / seconds).alias("throughput"),
        "wait_p50", "wait_p95", "wait_p99", "run_p50", "run_p95", "run_p99",
        F.when(finished > 0, F.col("retried") / finished).alias("retry_rate"),
        F.when(F.col("started") > 0, F.col("stalled") / F.col("started")).alias("stall_rate"),
        F.round("busy").cast("long").alias("busy_ms"),
        "workers",
        F.when(F.col("workers") > 0, F.col("busy") / (seconds * 1000 * F.col("workers")))
        .alias("utilisation"),
    )  # fmt: skip


def _failure_classes(facts: DataFrame) -> DataFrame:
    keys = ["queue", "handler", "period", "bucket"]
    per_message = (
        facts.where(F.col("kind") == "failed")
        .groupBy(*keys, "error_type", "error_message")
        .agg(F.count(F.lit(1)).alias("n"))
    )
    by_type = Window.partitionBy(*keys, "error_type")
    ranked = per_message.select(
        "*",
        F.sum("n").over(by_type).alias("type_n"),
        F.row_number()
        .over(by_type.orderBy(F.desc("n"), F.asc_nulls_last("error_message")))
        .alias("rank"),
    ).where(F.col("rank") <= TOP_MESSAGES)
    types = ranked.groupBy(*keys, "error_type", "type_n").agg(
        F.collect_list(
            F.struct(F.col("n").alias("count"), F.col("error_message").alias("message"))
        ).alias("messages")
    )
    return types.groupBy(*keys).agg(
        F.collect_list(
            F.struct(F.col("type_n").alias("count"), F.col("error_type").alias("type"), "messages")
        ).alias("failure_classes")
    )


def compute_metrics(facts: DataFrame, periods: tuple[str, ...] = tuple(PERIODS)) -> DataFrame:
    """One row per (queue, handler, period, bucket) of ``facts`` (from ``attempt_facts``;
    persist them when asking for several periods: each period reads them again)."""
    unknown = set(periods) - set(PERIODS)
    if unknown:
        raise ValueError(f"unknown period(s) {sorted(unknown)}; choose from {list(PERIODS)}")
    per_period = None
    for period in periods:
        bucketed = facts.select(
            "*",
            F.lit(period).alias("period"),
            F.date_trunc(period, "at").alias("bucket"),
            F.lit(float(PERIODS[period])).alias("seconds"),
        )
        per_period = bucketed if per_period is None else per_period.unionByName(bucketed)
    assert per_period is not None
    metrics = _counts_and_times(per_period)
    joined = metrics.join(_failure_classes(per_period), list(KEYS), "left")
    # Epoch seconds: collected timestamps would be turned into the Python process's local time.
    return joined.withColumn("bucket_epoch", F.unix_seconds("bucket"))
