"""Broadcast state of the database backend (``storage/broadcast_database.py``): these rows are
the state, changed in short transactions. Imported by ``models.py``. Times are epoch ms, the
storage clock's unit, so the contract's injected clock drives them as it drives Redis."""

from __future__ import annotations

from django.db import models


class BroadcastLog(models.Model):
    """One row per broadcast: its message counter, and the row publishers lock."""

    name = models.CharField(max_length=64, unique=True)
    last_seq = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = "broadcast"

    def __str__(self) -> str:
        return self.name


class BroadcastMessage(models.Model):
    """A retained message; ``seq`` orders a broadcast's messages (1, 2, ...)."""

    broadcast = models.CharField(max_length=64)
    seq = models.BigIntegerField()
    message_id = models.CharField(max_length=128)
    payload = models.BinaryField()
    content_type = models.CharField(max_length=16, default="json")
    published_at = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["broadcast", "seq"], name="jobq_bmsg_seq"),
            models.UniqueConstraint(fields=["broadcast", "message_id"], name="jobq_bmsg_id"),
        ]
        indexes = [models.Index(fields=["broadcast", "published_at"], name="jobq_bmsg_age")]

    def __str__(self) -> str:
        return f"{self.broadcast}/{self.message_id}"


class BroadcastGroup(models.Model):
    """A subscriber group: the ``cursor`` (seq of the last message it read) moves under this
    row's lock, so the workers of one group never read a message twice."""

    broadcast = models.CharField(max_length=64)
    group = models.CharField(max_length=64)
    cursor = models.BigIntegerField(default=0)
    missed = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["broadcast", "group"], name="jobq_bgroup_name"),
        ]

    def __str__(self) -> str:
        return f"{self.broadcast}:{self.group}"


class BroadcastDelivery(models.Model):
    """A message read by a group and not yet handled (active, retrying) or failed for good
    (dead, with a copy of the message that outlives retention). Deleted once handled."""

    broadcast = models.CharField(max_length=64)
    group = models.CharField(max_length=64)
    seq = models.BigIntegerField()
    message_id = models.CharField(max_length=128)
    state = models.CharField(max_length=16, default="active")  # active | retrying | dead
    token = models.BigIntegerField(default=0)
    failures = models.IntegerField(default=0)
    stalls = models.IntegerField(default=0)
    lease_until = models.BigIntegerField(default=0)
    due = models.BigIntegerField(default=0)
    progress = models.BinaryField(null=True)
    error = models.BinaryField(default=b"")
    failed_at = models.BigIntegerField(default=0)
    payload = models.BinaryField(null=True)  # dead letters only
    content_type = models.CharField(max_length=16, default="")
    published_at = models.BigIntegerField(default=0)

    class Meta:
        verbose_name_plural = "broadcast deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["broadcast", "group", "seq"], name="jobq_bdelivery_seq"
            ),
        ]
        indexes = [
            models.Index(fields=["broadcast", "group", "state", "due"], name="jobq_bdelivery_due"),
        ]

    def __str__(self) -> str:
        return f"{self.broadcast}:{self.group}/{self.message_id}"
