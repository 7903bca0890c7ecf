"""Writing analytics results into ``QueueMetric``, idempotently.

Why an upsert on (queue, handler, period, bucket) and not delete-then-insert: a rerun over the
same history writes the same values into the same rows, and a dashboard reading meanwhile never
sees a bucket vanish. Rows stream from Spark with ``toLocalIterator`` (one partition in driver
memory at a time) and are written in batches.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from typing import Any

from django.db import transaction

from ...models import QueueMetric

VALUE_FIELDS = (
    "started", "completed", "failed", "retried", "stalled", "throughput", "wait_p50",
    "wait_p95", "wait_p99", "run_p50", "run_p95", "run_p99", "retry_rate", "stall_rate",
    "failure_classes", "busy_ms", "workers", "utilisation", "computed_at",
)  # fmt: skip


def _classes(raw: Any) -> list[dict[str, Any]]:
    """Spark structs → JSON, most frequent type first (ties by name: stable across runs)."""
    classes = [
        {
            "type": c["type"],
            "count": int(c["count"]),
            "messages": sorted(
                ({"message": m["message"], "count": int(m["count"])} for m in c["messages"]),
                key=lambda m: (-m["count"], m["message"] or ""),
            ),
        }
        for c in raw or []
    ]
    return sorted(classes, key=lambda c: (-c["count"], c["type"]))


def metric_rows(rows: Iterable[Any], computed_at: dt.datetime) -> Iterator[QueueMetric]:
    for row in rows:
        values = row.asDict(recursive=True)
        bucket = dt.datetime.fromtimestamp(values["bucket_epoch"], tz=dt.UTC)
        yield QueueMetric(
            queue=values["queue"],
            handler=values["handler"],
            period=values["period"],
            bucket=bucket,
            failure_classes=_classes(values.get("failure_classes")),
            computed_at=computed_at,
            **{f: values[f] for f in VALUE_FIELDS if f not in ("failure_classes", "computed_at")},
        )


def write_metrics(rows: Iterable[Any], *, using: str = "default", batch: int = 1000) -> int:
    """Upsert Spark result rows into ``QueueMetric``; returns how many rows were written."""
    computed_at = dt.datetime.now(dt.UTC)
    pending: list[QueueMetric] = []
    total = 0
    for metric in metric_rows(rows, computed_at):
        pending.append(metric)
        if len(pending) >= batch:
            total += _flush(pending, using)
            pending = []
    if pending:
        total += _flush(pending, using)
    return total


def _flush(metrics: list[QueueMetric], using: str) -> int:
    with transaction.atomic(using=using):
        QueueMetric.objects.using(using).bulk_create(
            metrics,
            update_conflicts=True,
            unique_fields=["queue", "handler", "period", "bucket"],
            update_fields=list(VALUE_FIELDS),
        )
    return len(metrics)
