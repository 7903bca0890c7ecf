"""The REST API's own rows (``api/``): its keys, and the answers kept for ``Idempotency-Key``."""

from __future__ import annotations

from django.db import models


class ApiKey(models.Model):
    """A credential for the REST API (``django_jobq.api``), scoped to queues and actions.

    Only a hash of the secret is stored: a leaked database gives no usable key. ``prefix`` is
    the public part written in front of the secret, so a request finds its row by an indexed
    lookup and only then compares hashes in constant time."""

    class Action(models.TextChoices):
        ENQUEUE = "enqueue", "Enqueue jobs"
        READ = "read", "Read jobs, queues, workers and schedules"
        MANAGE = "manage", "Cancel, retry, pause and resume"

    name = models.CharField(max_length=100, help_text="Who or what uses this key.")
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    hashed_secret = models.CharField(max_length=64, editable=False)
    queues = models.JSONField(
        default=list, blank=True, help_text='Queue names this key may touch; ["*"] for all.'
    )
    actions = models.JSONField(
        default=list, blank=True, help_text='Any of "enqueue", "read", "manage".'
    )
    throttle_rate = models.CharField(
        max_length=32, blank=True, default="",
        help_text='Requests allowed, e.g. "100/min" (empty: the API default).',
    )  # fmt: skip
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def allows_queue(self, queue: str) -> bool:
        return "*" in self.queues or queue in self.queues

    def allows_action(self, action: str) -> bool:
        return action in self.actions


class IdempotencyRecord(models.Model):
    """The first response to a POST carrying an ``Idempotency-Key`` header, replayed for the
    same key and body for 24 hours. Kept in the database because it must hold across web
    processes and the embedded default has no Redis."""

    # Whose key it is: two clients choosing the same key must not see each other's responses.
    owner = models.CharField(max_length=160)
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    response = models.JSONField()
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "key"], name="jobq_idem_owner_key_uniq")
        ]
        indexes = [models.Index(fields=["expires_at"], name="jobq_idem_expires")]
        verbose_name = "idempotency record"

    def __str__(self) -> str:
        return f"{self.owner}/{self.key}"
