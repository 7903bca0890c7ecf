"""Per-minute finish counts and time histograms per queue, kept for the admin's charts.

Grouping the job rows by minute on every page view costs seconds on a million rows; these rows
are folded from the jobs finished since the last fold (``django_jobq.rollup``), so a chart
reads at most 1,440 small rows per queue and day whatever the size of the jobs table.
"""

from __future__ import annotations

from django.db import models


class JobMinute(models.Model):
    """Jobs of ``queue`` that finished in the minute starting at ``minute`` (UTC)."""

    queue = models.CharField(max_length=64)
    minute = models.DateTimeField()
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    # Sparse log histograms {bucket: jobs} of wait (due -> started) and run (started ->
    # finished) times in ms; see rollup.bucket_of. Mergeable by adding counts.
    waits = models.JSONField(default=dict)
    runs = models.JSONField(default=dict)

    class Meta:
        verbose_name = "job minute"
        constraints = [
            models.UniqueConstraint(fields=["queue", "minute"], name="jobq_jobminute_uniq")
        ]
        indexes = [models.Index(fields=["minute"], name="jobq_jobminute_minute")]

    def __str__(self) -> str:
        return (
            f"{self.queue} {self.minute:%Y-%m-%d %H:%M}: {self.completed} ok, {self.failed} failed"
        )


class RollupMark(models.Model):
    """One row: minutes from ``until`` on are not folded yet (or may still change)."""

    until = models.DateTimeField()

    def __str__(self) -> str:
        return f"folded until {self.until:%Y-%m-%d %H:%M}"
