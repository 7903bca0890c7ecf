"""Request and response shapes. Requests are checked field by field here, then once more by
the Queue API itself (``Queue.build``), whose refusals are mapped back onto the field named."""

from __future__ import annotations

import re
from typing import Any

from rest_framework import serializers

from ..conf import jobq_settings
from ..errors import InvalidJobId, PayloadTooLarge
from ..errors import ValidationError as JobQValidationError
from ..job import DedupMode
from ..models import Job
from ..queue.core import Queue
from ..states import JobState
from ..validation import MAX_DURATION_MS, PRIORITY_RANGE, logical_name

MS = {"min_value": 0, "max_value": MAX_DURATION_MS}
COUNT = {"min_value": 1, "max_value": 1_000_000}
RUN_AT_UPDATES = {"no": False, "yes": True, "if_later": "if_later", "if_earlier": "if_earlier"}
MAX_BULK = 1000


class EnqueueSerializer(serializers.Serializer):
    """One job to enqueue. Every field but ``payload`` is optional (see docs/scheduling.md)."""

    id = serializers.CharField(
        required=False, max_length=128, help_text="Job id (dedup key); generated when omitted."
    )
    payload = serializers.JSONField(required=False, allow_null=True, default=None)
    max_attempts = serializers.IntegerField(required=False, **COUNT)
    result_ttl = serializers.IntegerField(required=False, min_value=1, max_value=MAX_DURATION_MS)
    min_backoff = serializers.IntegerField(required=False, **MS)
    max_backoff = serializers.IntegerField(required=False, **MS)
    max_stalls = serializers.IntegerField(required=False, min_value=0, max_value=1_000_000)
    priority = serializers.IntegerField(
        required=False, min_value=PRIORITY_RANGE[0], max_value=PRIORITY_RANGE[1]
    )
    delay = serializers.IntegerField(required=False, help_text="ms from now", **MS)
    run_at = serializers.DateTimeField(required=False)
    lifo = serializers.BooleanField(required=False)
    group = serializers.CharField(required=False, max_length=128)
    singleton = serializers.BooleanField(required=False)
    dedup_key = serializers.CharField(required=False, max_length=128)
    dedup_mode = serializers.ChoiceField(required=False, choices=[m.value for m in DedupMode])
    dedup_ttl = serializers.IntegerField(required=False, min_value=1, max_value=MAX_DURATION_MS)
    update_data = serializers.BooleanField(required=False)
    update_run_at = serializers.ChoiceField(required=False, choices=list(RUN_AT_UPDATES))
    update_max_attempts = serializers.BooleanField(required=False)
    update_backoff = serializers.BooleanField(required=False)
    reset_counts = serializers.BooleanField(required=False)
    timeout = serializers.FloatField(
        required=False, min_value=0.001, max_value=86400,
        help_text="seconds: this job's soft timeout (over its handler's)",
    )  # fmt: skip
    hard_timeout = serializers.FloatField(
        required=False, min_value=0.001, max_value=86400,
        help_text="seconds: this job's hard timeout (over its handler's)",
    )  # fmt: skip

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        spec = enqueue_spec(attrs)
        queue: Queue = self.context["queue"]
        try:
            queue.build(spec.pop("id", None), spec.pop("payload", None), **spec)
        except PayloadTooLarge:
            raise  # 413, not a field error: the view answers it
        except InvalidJobId as exc:
            raise serializers.ValidationError({"id": [str(exc)]}) from None
        except JobQValidationError as exc:
            raise serializers.ValidationError({_field_of(str(exc), attrs): [str(exc)]}) from None
        return attrs


def enqueue_spec(attrs: dict[str, Any]) -> dict[str, Any]:
    """Validated fields as ``Queue.enqueue`` keywords (plus ``id`` and ``payload``)."""
    spec = dict(attrs)
    if "update_run_at" in spec:
        spec["update_run_at"] = RUN_AT_UPDATES[spec["update_run_at"]]
    return spec


def _field_of(message: str, attrs: dict[str, Any]) -> str:
    """The request field a core error is about: the first field it names that the request
    sent (else the first it names at all)."""
    fields = EnqueueSerializer().fields
    named = [w for w in re.findall(r"[a-z_]+", message) if w in fields]
    sent = [w for w in named if w in attrs]
    return (sent or named or ["non_field_errors"])[0]


class BulkEnqueueSerializer(serializers.Serializer):
    jobs = EnqueueSerializer(many=True, allow_empty=False, max_length=MAX_BULK)


def public_error(error: Any) -> Any:
    """A job's error as the API answers it. Unless ``JOBQ["API"]["TRACEBACKS"]`` is True the
    traceback is withheld (null): it shows the server's file paths, code lines and library
    versions to every credential with ``read``, while a client needs the type and message to
    decide what to do. Operators read the whole traceback in the admin."""
    if not isinstance(error, dict) or error.get("traceback") is None:
        return error
    if jobq_settings()["API"]["TRACEBACKS"]:
        return error
    return {**error, "traceback": None}


class ErrorField(serializers.JSONField):
    """A job's error: ``{"type", "message", "traceback"}``, the traceback withheld by default."""

    def to_representation(self, value: Any) -> Any:
        return public_error(super().to_representation(value))


class EnqueueResultSerializer(serializers.Serializer):
    id = serializers.CharField()
    queue = serializers.CharField()
    outcome = serializers.ChoiceField(
        choices=["queued", "duplicate", "completed", "updated", "pending"]
    )
    state = serializers.ChoiceField(
        choices=JobState.choices, allow_null=True,
        help_text="null when the credential may not read jobs (no read action/permission)",
    )  # fmt: skip
    result = serializers.JSONField(
        allow_null=True, help_text="cached result (completed); null without read"
    )
    error = ErrorField(allow_null=True, help_text="null without read")


class BulkResultSerializer(serializers.Serializer):
    results = EnqueueResultSerializer(many=True)


class JobStatusSerializer(serializers.Serializer):
    id = serializers.CharField(source="job_id")
    queue = serializers.CharField()
    state = serializers.ChoiceField(choices=JobState.choices)
    attempts = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    stalls = serializers.IntegerField()
    priority = serializers.IntegerField()
    created_at = serializers.DateTimeField(allow_null=True)
    run_at = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    worker = serializers.CharField(allow_null=True)
    error = ErrorField(allow_null=True)
    lifo = serializers.BooleanField()
    group = serializers.CharField(allow_null=True)
    dedup_key = serializers.CharField(allow_null=True)
    has_successor = serializers.BooleanField()
    progress = serializers.JSONField(
        allow_null=True, help_text="the handler's last job.set_progress value"
    )
    logs = serializers.SerializerMethodField(help_text="the job's last log lines, oldest first")
    task = serializers.CharField(
        allow_null=True, help_text="the task function the job calls (@task); null: a plain job"
    )

    def get_logs(self, status: Any) -> list[dict[str, Any]]:
        return [{"at": at.isoformat(), "line": line} for at, line in status.logs]


class JobResultSerializer(serializers.Serializer):
    id = serializers.CharField()
    queue = serializers.CharField()
    state = serializers.ChoiceField(choices=JobState.choices)
    ready = serializers.BooleanField(
        help_text="true once the job is completed, failed or cancelled"
    )
    value = serializers.JSONField(allow_null=True)
    error = ErrorField(allow_null=True)


class ActionResultSerializer(serializers.Serializer):
    id = serializers.CharField()
    queue = serializers.CharField()
    outcome = serializers.CharField()
    state = serializers.ChoiceField(choices=JobState.choices)


class ConflictSerializer(serializers.Serializer):
    detail = serializers.CharField()
    state = serializers.CharField()


class JobRowSerializer(serializers.ModelSerializer):
    """A job in a list: the mirrored row (Redis) or the row itself (database backend)."""

    id = serializers.SerializerMethodField()
    error = ErrorField(allow_null=True)

    class Meta:
        model = Job
        fields = [
            "id", "queue", "handler", "state", "attempts", "max_attempts", "priority",
            "created_at", "run_at", "started_at", "finished_at", "worker", "error",
        ]  # fmt: skip

    def get_id(self, obj: Job) -> str:
        # The database backend parks singleton runs under "<id>~next" / "<id>~<pk>".
        return obj.job_id.partition("~")[0]

    def to_representation(self, instance: Job) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["queue"] = logical_name(data["queue"])  # a partition's row: its queue's name
        return data


class JobPageSerializer(serializers.Serializer):
    results = JobRowSerializer(many=True)
    next = serializers.CharField(allow_null=True, help_text="URL of the next (older) page")


class QueueSerializer(serializers.Serializer):
    name = serializers.CharField()
    paused = serializers.BooleanField()
    counts = serializers.DictField(child=serializers.IntegerField())
    limits = serializers.DictField(child=serializers.IntegerField(allow_null=True))
    stats = serializers.DictField(
        child=serializers.FloatField(allow_null=True),
        help_text="last hour, from the job rows: completed, failed, mean wait and run seconds",
    )


class PausedSerializer(serializers.Serializer):
    name = serializers.CharField()
    paused = serializers.BooleanField()


class WorkerSerializer(serializers.Serializer):
    id = serializers.CharField()
    host = serializers.CharField(allow_blank=True)
    pid = serializers.IntegerField(allow_null=True)
    queues = serializers.ListField(child=serializers.CharField())
    groups = serializers.ListField(
        child=serializers.CharField(),
        help_text="Subscriber groups it serves, as broadcast:group (a subscriber worker).",
    )
    pool = serializers.CharField(
        allow_blank=True, help_text="Where its handlers run: thread, process or async."
    )
    concurrency = serializers.IntegerField()
    in_flight = serializers.IntegerField()
    started_at = serializers.DateTimeField(allow_null=True)
    last_seen = serializers.DateTimeField(allow_null=True)
    completed = serializers.IntegerField()
    failed = serializers.IntegerField()


class ScheduleSerializer(serializers.Serializer):
    name = serializers.CharField()
    queue = serializers.CharField()
    cron = serializers.CharField(allow_blank=True)
    interval = serializers.IntegerField(allow_null=True)
    timezone = serializers.CharField()
    enabled = serializers.BooleanField()
    missed = serializers.CharField()
    payload = serializers.JSONField()
    job_options = serializers.JSONField()
    next_run_at = serializers.DateTimeField(allow_null=True)
    last_run_at = serializers.DateTimeField(allow_null=True)
    last_job_id = serializers.CharField(allow_blank=True)


class ScheduleWriteSerializer(serializers.Serializer):
    """What a client may set; the cron, time zone and job options are checked afterwards with
    the admin form's rules (``validate_schedule``)."""

    name = serializers.RegexField(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,95}$")
    queue = serializers.CharField(max_length=64)
    cron = serializers.CharField(allow_blank=True, required=False, default="", max_length=120)
    interval = serializers.IntegerField(allow_null=True, required=False, default=None,
                                        min_value=1)  # fmt: skip
    timezone = serializers.CharField(required=False, default="UTC", max_length=64)
    payload = serializers.JSONField(required=False, default=dict)
    job_options = serializers.JSONField(required=False, default=dict)
    enabled = serializers.BooleanField(required=False, default=True)
    missed = serializers.ChoiceField(choices=["skip", "run_once"], required=False, default="skip")


class HealthQueueSerializer(serializers.Serializer):
    name = serializers.CharField()
    paused = serializers.BooleanField()
    waiting = serializers.IntegerField()
    oldest_waiting_seconds = serializers.FloatField(allow_null=True)


class MirrorGapSerializer(serializers.Serializer):
    queue = serializers.CharField()
    at = serializers.FloatField(help_text="epoch seconds the resync started")
    why = serializers.CharField()
    rows = serializers.IntegerField(help_text="job rows rewritten from Redis records")
    lost = serializers.IntegerField(
        allow_null=True, help_text="rows marked lost: their jobs were no longer in Redis"
    )


class MirrorSampledSerializer(serializers.Serializer):
    queue = serializers.CharField()
    since = serializers.FloatField(help_text="epoch seconds the queue was switched")
    why = serializers.CharField()
    counts = serializers.DictField(
        child=serializers.IntegerField(), help_text="jobs per state, read from Redis now"
    )


class HealthSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["ok", "unavailable"])
    backend = serializers.CharField()
    storage_reachable = serializers.BooleanField()
    workers = serializers.IntegerField(allow_null=True)
    queue_count = serializers.IntegerField(
        allow_null=True, help_text="queues known (of those the credential may see)"
    )
    queues = HealthQueueSerializer(
        many=True, allow_null=True,
        help_text="per queue; null without a credential that may read queues (as every field "
        "below: an anonymous check costs nothing per queue and names none)",
    )  # fmt: skip
    mirror_lag_seconds = serializers.FloatField(
        allow_null=True,
        help_text="age of the oldest event not yet written to the models, 0 when none (Redis only)",
    )
    mirror_backlog_events = serializers.IntegerField(
        allow_null=True, help_text="events not yet written to the models (Redis only)"
    )
    mirror_rejected = serializers.IntegerField(
        allow_null=True,
        help_text="jobs the mirror set aside because the database refused them (Redis only)",
    )
    mirror_gaps = MirrorGapSerializer(
        many=True,
        allow_null=True,
        help_text="queues the mirror re-read from Redis in the last hour because events were "
        "lost before it wrote them (stream cap, flush, restart); latest per queue (Redis only)",
    )
    jobs_lost = serializers.IntegerField(
        allow_null=True,
        help_text="accepted jobs Redis lost before they finished (a restart or flush without "
        "the journal): their rows are marked lost (Redis with the mirror)",
    )
    mirror_sampled = MirrorSampledSerializer(
        many=True,
        allow_null=True,
        help_text="queues whose rows are only a sample (the mirror fell behind on a big queue): "
        "trust these counts from Redis until the queue is exact again (Redis only)",
    )
    memory = serializers.DictField(allow_null=True, help_text="Redis memory use (Redis only)")
