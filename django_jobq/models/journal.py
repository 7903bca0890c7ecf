"""Journal mode's rows (``queue/journal.py``): every accepted enqueue of a journal queue."""

from __future__ import annotations

from django.db import models


class JournalEntry(models.Model):
    """An accepted job of a queue in ``durability="journal"`` mode (``journal.py``).

    Written in the producer's transaction when one is open, so the job is accepted exactly when
    the producer's rows are; ``jobq_reconcile`` re-creates in Redis every entry whose job Redis
    no longer knows and deletes entries whose job Redis reports finished. The entry carries what
    re-creating the job exactly needs: payload bytes, content type and every enqueue option.
    """

    queue = models.CharField(max_length=64)
    job_id = models.CharField(max_length=128)
    payload = models.BinaryField()
    content_type = models.CharField(max_length=16, default="json")
    # JobOptions and the scheduling options as JSON (journal.encode_options); a ``delay`` is
    # stored as the absolute due time, so a job re-created later keeps its original due time.
    options = models.JSONField()
    created_ms = models.BigIntegerField()  # epoch ms of the (latest) accepted enqueue

    class Meta:
        verbose_name_plural = "journal entries"
        constraints = [
            models.UniqueConstraint(fields=["queue", "job_id"], name="jobq_journal_queue_job")
        ]
        # Reconcile walks one queue's entries in primary-key order, a batch at a time.
        indexes = [models.Index(fields=["queue", "id"], name="jobq_journal_queue_id")]

    def __str__(self) -> str:
        return f"{self.queue}/{self.job_id}"
