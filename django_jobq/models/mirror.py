"""What the Redis mirror writes beside the job rows: the jobs it set aside because the
database refused their rows, and the per-minute rollup the admin's charts read.

Grouping the job rows by minute on every page view costs seconds on a million rows; the rollup
rows are folded from the jobs finished since the last fold (``mirror/rollup.py``), so a chart
reads at most 1,440 small rows per queue and day whatever the size of the jobs table.
"""

from __future__ import annotations

from django.db import models


class MirrorReject(models.Model):
    """A job the Redis mirror could not write into the models (a value the database refuses,
    such as a non-finite float in its progress, or a malformed stream entry).

    The mirror sets such a job aside instead of retrying its batch forever, so one bad record
    never holds back every other job; the row says what failed, and it is updated (``events``
    and ``last_seen``) each time the job's events fail again. Deleting the row changes nothing
    in Redis: the job's next event that can be written brings its row up to date."""

    queue = models.CharField(max_length=64)
    job_id = models.CharField(max_length=160)  # as read from the stream, cut to fit
    stream_id = models.CharField(max_length=32)  # the first entry that failed
    kind = models.CharField(max_length=16, blank=True, default="")  # that entry's event kind
    error = models.TextField()  # the database's (or the decoder's) error message
    events = models.PositiveIntegerField(default=1)  # entries of this job set aside so far
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()

    class Meta:
        verbose_name = "mirror reject"
        constraints = [
            models.UniqueConstraint(fields=["queue", "job_id"], name="jobq_mirrorreject_job")
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.job_id} not mirrored: {self.error[:60]}"


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
    # Sums of the same wait and run times (ms): the API's mean wait and run are exact, where
    # a mean read from the histograms would be off by up to 9%.
    wait_ms_total = models.FloatField(default=0)
    run_ms_total = models.FloatField(default=0)

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
