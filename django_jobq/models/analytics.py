"""What the Spark pipeline writes (``contrib/spark/``): analytics results, and how far the
history export got."""

from __future__ import annotations

from django.db import models


class QueueMetric(models.Model):
    """Per queue, handler and time bucket: figures the Spark analytics computed from the history.

    Rows are keyed by (queue, handler, period, bucket) and rewritten in place on every run, so
    re-running the analytics over the same history changes nothing; the admin charts read them
    without touching the (much larger) event table."""

    class Period(models.TextChoices):
        MINUTE = "minute", "Minute"
        HOUR = "hour", "Hour"
        DAY = "day", "Day"

    queue = models.CharField(max_length=64)
    handler = models.CharField(max_length=200, blank=True, default="")
    period = models.CharField(max_length=8, choices=Period.choices)
    bucket = models.DateTimeField()  # start of the minute / hour / day (UTC)
    started = models.PositiveBigIntegerField(default=0)  # claims (attempts begun)
    completed = models.PositiveBigIntegerField(default=0)
    failed = models.PositiveBigIntegerField(default=0)
    retried = models.PositiveBigIntegerField(default=0)  # attempts that failed and will retry
    stalled = models.PositiveBigIntegerField(default=0)  # leases expired and reclaimed
    throughput = models.FloatField(default=0.0)  # completed jobs per second over the bucket
    # Milliseconds; None when the bucket had no such interval. Approximate (percentile_approx).
    wait_p50 = models.FloatField(null=True, blank=True)
    wait_p95 = models.FloatField(null=True, blank=True)
    wait_p99 = models.FloatField(null=True, blank=True)
    run_p50 = models.FloatField(null=True, blank=True)
    run_p95 = models.FloatField(null=True, blank=True)
    run_p99 = models.FloatField(null=True, blank=True)
    retry_rate = models.FloatField(null=True, blank=True)  # retried / finished attempts
    stall_rate = models.FloatField(null=True, blank=True)  # stalled / started
    # [{"type", "count", "messages": [{"message", "count"}, ...]}, ...], most frequent first.
    failure_classes = models.JSONField(default=list, blank=True)
    busy_ms = models.PositiveBigIntegerField(default=0)  # handler time of attempts ended here
    workers = models.PositiveIntegerField(default=0)  # distinct workers that ran attempts
    utilisation = models.FloatField(null=True, blank=True)  # busy_ms / (bucket ms × workers)
    computed_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "handler", "period", "bucket"], name="jobq_metric_uniq"
            )
        ]
        indexes = [
            # dashboard charts: one queue, one period, a time range
            models.Index(fields=["queue", "period", "bucket"], name="jobq_metric_chart"),
        ]
        ordering = ["queue", "handler", "period", "bucket"]

    def __str__(self) -> str:
        return f"{self.queue}/{self.handler or '-'} {self.period} {self.bucket:%Y-%m-%d %H:%M}"


class ExportWatermark(models.Model):
    """How far ``jobq_export`` has written the history into one target directory.

    A rerun starts after the watermark, so it never writes an event or a finished job twice."""

    target = models.CharField(max_length=500, unique=True)  # absolute path of the export root
    last_event_id = models.BigIntegerField(default=0)  # JobEvent pk
    rows_written = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.target
