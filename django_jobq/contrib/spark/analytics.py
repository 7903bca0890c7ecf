"""``jobq_analytics``: read the history, compute the metrics, write them into the models."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from .history import read_jdbc, read_parquet
from .metrics import PERIODS, attempt_facts, compute_metrics
from .store import write_metrics


@dataclass
class AnalyticsResult:
    events: int
    metrics: int
    since: dt.datetime | None


def day_start(moment: dt.datetime) -> dt.datetime:
    """Midnight UTC before ``moment``: reading from there, every bucket (down to the day) is
    whole, so a partial day never overwrites the complete figures of an earlier run."""
    utc = moment.astimezone(dt.UTC)
    return utc.replace(hour=0, minute=0, second=0, microsecond=0)


def load_history(
    spark: SparkSession,
    *,
    input_dir: str | None = None,
    jdbc: bool = False,
    using: str = "default",
    since: dt.datetime | None = None,
) -> DataFrame:
    """The event history from an export directory or (``jdbc``) from PostgreSQL."""
    if (input_dir is None) == (not jdbc):
        raise ValueError("read from exactly one source: input_dir or jdbc")
    if input_dir is not None:
        return read_parquet(spark, input_dir, since)
    return read_jdbc(spark, using=using, since=since)


def run_analytics(
    spark: SparkSession,
    *,
    input_dir: str | None = None,
    jdbc: bool = False,
    using: str = "default",
    since: dt.datetime | None = None,
    periods: tuple[str, ...] = tuple(PERIODS),
) -> AnalyticsResult:
    """Compute every metric of the history (from ``since``, widened to whole days) and upsert
    it into ``QueueMetric`` on the database ``using``.

    Reruns over the same history rewrite the same rows: safe to schedule every few minutes."""
    since = day_start(since) if since is not None else None
    events = load_history(spark, input_dir=input_dir, jdbc=jdbc, using=using, since=since)
    facts = attempt_facts(events).persist()
    try:
        count = facts.count()
        metrics = compute_metrics(facts, periods)
        written = write_metrics(metrics.toLocalIterator(), using=using)
    finally:
        facts.unpersist()
    return AnalyticsResult(events=count, metrics=written, since=since)
