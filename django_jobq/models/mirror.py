"""Jobs the Redis mirror set aside because the database refused their rows."""

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
