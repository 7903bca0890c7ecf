"""Job state as Django models.

With the database backend these rows *are* the state (``storage/database.py`` changes them in
short transactions). With Redis they are a read-only mirror written in batches from the event
streams, for the admin, the API and analytics; the hot path never waits on them.
"""

from __future__ import annotations

from django.db import models

from .states import JobState


class JobQuerySet(models.QuerySet):
    """QuerySet methods named after states, so callers read like the state machine."""

    def in_queue(self, queue: str) -> JobQuerySet:
        return self.filter(queue=queue)

    def queued(self) -> JobQuerySet:
        return self.filter(state=JobState.QUEUED)

    def scheduled(self) -> JobQuerySet:
        return self.filter(state__in=(JobState.SCHEDULED, JobState.RETRYING))

    def active(self) -> JobQuerySet:
        return self.filter(state=JobState.ACTIVE)

    def finished(self) -> JobQuerySet:
        return self.filter(state__in=(JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED))


class Job(models.Model):
    queue = models.CharField(max_length=64)
    job_id = models.CharField(max_length=128)
    handler = models.CharField(max_length=200, blank=True, default="")
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    # Exact bytes as enqueued (JSON or msgpack, see content_type): the worker decodes them.
    payload = models.BinaryField(default=b"")
    content_type = models.CharField(max_length=16, default="json")
    result = models.BinaryField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)  # {"type", "message", "traceback"}
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    stalls = models.PositiveIntegerField(default=0)
    max_stalls = models.PositiveIntegerField(default=1)
    priority = models.IntegerField(default=0)
    min_backoff = models.PositiveIntegerField(default=1000)  # ms
    max_backoff = models.PositiveIntegerField(default=3_600_000)  # ms
    result_ttl = models.PositiveBigIntegerField(default=86_400_000)  # ms
    run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)  # finished record (and dedup) ends
    worker = models.CharField(max_length=128, blank=True, default="")
    token = models.PositiveBigIntegerField(default=0)  # fencing token of the current claim
    lease_deadline = models.DateTimeField(null=True, blank=True)
    waiters = models.PositiveIntegerField(default=0)

    objects = JobQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "job_id"], name="jobq_job_queue_id_uniq")
        ]
        indexes = [
            # admin/API lists: per queue and state, newest first
            models.Index(fields=["queue", "state", "created_at"], name="jobq_job_q_state_created"),
            # claim order: lowest priority, then FIFO (id), among queued jobs of a queue
            models.Index(fields=["queue", "state", "priority", "id"], name="jobq_job_claim"),
            # promotion of due scheduled / retrying jobs
            models.Index(fields=["queue", "state", "run_at"], name="jobq_job_due"),
            # reaping of expired leases
            models.Index(fields=["state", "lease_deadline"], name="jobq_job_lease"),
            # retention and result expiry
            models.Index(fields=["finished_at"], name="jobq_job_finished"),
            models.Index(fields=["expires_at"], name="jobq_job_expires"),
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.queue}/{self.job_id} ({self.state})"


class JobEvent(models.Model):
    """One transition of one job: the history the timeline and the analytics read."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    queue = models.CharField(max_length=64)  # denormalised: per-queue history without a join
    kind = models.CharField(max_length=16)
    at = models.DateTimeField()
    worker = models.CharField(max_length=128, blank=True, default="")
    detail = models.JSONField(null=True, blank=True)
    # Stream id of the Redis event this row mirrors (idempotent re-delivery); "" for database.
    stream_id = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        constraints = [
            # A re-delivered stream event (mirror restart before its ack) is written once.
            models.UniqueConstraint(
                fields=["queue", "stream_id"],
                condition=~models.Q(stream_id=""),
                name="jobq_event_stream_uniq",
            )
        ]
        indexes = [
            models.Index(fields=["job", "at"], name="jobq_event_job_at"),
            models.Index(fields=["at"], name="jobq_event_at"),
            models.Index(fields=["queue", "id"], name="jobq_event_queue"),
        ]
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind} at {self.at:%Y-%m-%d %H:%M:%S}"


class WorkerInfo(models.Model):
    worker_id = models.CharField(max_length=128, unique=True)
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.PositiveIntegerField(null=True, blank=True)
    queues = models.JSONField(default=list)
    concurrency = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    jobs_done = models.PositiveBigIntegerField(default=0)
    jobs_failed = models.PositiveBigIntegerField(default=0)
    info = models.JSONField(default=dict, blank=True)

    class Meta:
        verbose_name = "worker"

    def __str__(self) -> str:
        return self.worker_id


class QueueConfig(models.Model):
    name = models.CharField(max_length=64, unique=True)
    paused = models.BooleanField(default=False)
    defaults = models.JSONField(default=dict, blank=True)  # job option overrides
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "queue"

    def __str__(self) -> str:
        return self.name
