"""Periodic schedules (``schedules/``): a row per schedule, declared in code or made in the
admin."""

from __future__ import annotations

import json
from typing import Any

from django.db import models


class FloatKeepingEncoder(json.JSONEncoder):
    """PostgreSQL's ``jsonb`` keeps numbers as ``numeric``, so the float 1e16 (JSON ``1e+16``)
    reads back as the int 10000000000000000: the handler would get another type, and the
    sync's digest would see drift on every run. Written with a fraction, ``10000000000000000.0``,
    it reads back a float. Only integral floats print with an exponent, so text without
    ``e+`` takes the plain path."""

    def encode(self, o: Any) -> str:
        text = super().encode(o)
        if "e+" not in text:
            return text
        floats: list[float] = []
        try:
            text = super().encode(_marked(o, floats))
        except RecursionError:  # as deep as the C encoder allows: keep the plain text
            return text
        for i, number in enumerate(floats):
            # The marker starts with NUL, which a stored value cannot hold (check_json_value).
            text = text.replace(json.dumps(f"\x00{i}"), f"{int(number)}.0", 1)
        return text


def _marked(value: Any, floats: list[float]) -> Any:
    """``value`` with each integral float replaced by a marker string naming it in ``floats``."""
    if type(value) is float and value.is_integer() and "e" in repr(value):
        floats.append(value)
        return f"\x00{len(floats) - 1}"
    if isinstance(value, dict):
        return {k: _marked(v, floats) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_marked(v, floats) for v in value]
    return value


class Schedule(models.Model):
    """A periodic job: the reaper enqueues it on every tick of ``cron`` or ``interval``.

    Each tick is enqueued under the id ``schedule.<name>.<tick epoch seconds>``, so several
    reapers firing the same tick store it once (see ``schedules.py``)."""

    class Missed(models.TextChoices):
        SKIP = "skip", "Skip missed ticks"
        RUN_ONCE = "run_once", "Run once for all missed ticks"

    # Unique per queue, not across queues: a name taken on a queue a credential cannot see must
    # not be refused to it (the refusal would reveal that schedule). Tick ids are per queue.
    name = models.CharField(max_length=100)
    queue = models.CharField(max_length=64, default="default")
    cron = models.CharField(
        max_length=120, blank=True, default="",
        help_text="Five fields: minute hour day-of-month month day-of-week (or @hourly, …).",
    )  # fmt: skip
    interval = models.PositiveIntegerField(
        null=True, blank=True, help_text="Seconds between runs (instead of cron)."
    )
    timezone = models.CharField(max_length=64, default="UTC")
    payload = models.JSONField(default=dict, blank=True, encoder=FloatKeepingEncoder)
    job_options = models.JSONField(
        default=dict, blank=True, encoder=FloatKeepingEncoder,
        help_text='Job options, e.g. {"priority": 5}.',
    )  # fmt: skip
    enabled = models.BooleanField(default=True)
    missed = models.CharField(max_length=16, choices=Missed.choices, default=Missed.SKIP)
    next_run_at = models.DateTimeField(null=True, blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_job_id = models.CharField(max_length=128, blank=True, default="")
    # "settings": declared in JOBQ["SCHEDULES"] and kept by schedule_sync (created, updated,
    # deleted there); "admin": made by hand (admin, API, code), never touched by the sync.
    source = models.CharField(
        max_length=16,
        choices=[("admin", "Admin or code"), ("settings", "JOBQ['SCHEDULES']")],
        default="admin",
        editable=False,
    )
    # Of a settings row: a digest of the fields as the last sync wrote them. A row whose fields
    # no longer match it was edited since (drift, reported and overwritten by the next sync).
    settings_digest = models.CharField(max_length=64, blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["enabled", "next_run_at"], name="jobq_schedule_due")]
        constraints = [
            models.UniqueConstraint(fields=["queue", "name"], name="jobq_schedule_queue_name")
        ]
        ordering = ["name", "queue"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Refuse, as every other way in does, a payload or option no database can hold (NaN,
        infinities, NUL, nesting too deep) with ``InvalidPayload`` before the database sees it:
        SQLite and PostgreSQL would refuse it with an error that names neither the field nor
        the cause, and the admin form and the REST API already check the same rule."""
        from ..errors import InvalidPayload
        from ..serde import check_json_value

        for field in ("payload", "job_options"):
            try:
                check_json_value(getattr(self, field), f"schedule {field}")
            except InvalidPayload as exc:
                message = str(exc)
                if not message.startswith("schedule "):
                    message = f"schedule {field}: {message}"
                raise InvalidPayload(message) from exc
        super().save(*args, **kwargs)
