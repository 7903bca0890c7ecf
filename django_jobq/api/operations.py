"""Workers, schedules and ``/health``."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Min
from django.db.models.functions import Coalesce
from django.utils import timezone
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from .. import permissions as ops
from ..backend import get_storage
from ..conf import jobq_settings
from ..job import ms_to_datetime
from ..mirror import check as mirror_check
from ..models import Job, MirrorReject, Schedule
from ..queue.core import get_queue
from ..schedules.core import fire_now, validate_schedule
from ..states import JobState
from ..storage.base import Storage, WorkerRecord
from ..validation import logical_name
from .base import STORAGE_ERRORS, Conflict, JobQView
from .jobs import ERRORS, enqueue_body
from .listing import rows_alias
from .permissions import allowed_queues, may, may_read, may_see_queue
from .queues import known_queues, physical_queues
from .serializers import (
    EnqueueResultSerializer,
    HealthSerializer,
    ScheduleSerializer,
    ScheduleWriteSerializer,
    WorkerSerializer,
)


def worker_body(rec: WorkerRecord, allowed: set[str] | None = None) -> dict[str, Any]:
    """A worker as the API shows it; with ``allowed`` (a scoped key's queue names, which name
    its broadcasts too) only the queues and groups in that scope are listed."""
    info = rec.info
    queues, groups = _served(rec, allowed)
    return {
        "id": rec.worker_id, "host": info.get("host", ""), "pid": info.get("pid"),
        "queues": queues, "groups": groups, "pool": str(info.get("pool", "")),
        "concurrency": info.get("concurrency", 0),
        "in_flight": info.get("in_flight", 0), "started_at": ms_to_datetime(info.get("started")),
        "last_seen": ms_to_datetime(rec.last_seen), "completed": info.get("completed", 0),
        "failed": info.get("failed", 0),
    }  # fmt: skip


def _served(rec: WorkerRecord, allowed: set[str] | None) -> tuple[list[str], list[str]]:
    """(queues, "broadcast:group" labels) the worker serves, within ``allowed`` when given."""
    queues = [str(q) for q in rec.info.get("queues", [])]
    groups = [str(g) for g in rec.info.get("groups", []) if ":" in str(g)]
    if allowed is None:
        return queues, groups
    return ([q for q in queues if q in allowed],
            [g for g in groups if g.split(":", 1)[0] in allowed])  # fmt: skip


class WorkerListView(JobQView):
    jobq_operation = ops.READ

    @extend_schema(operation_id="worker_list", responses={200: WorkerSerializer(many=True),
                                                          **ERRORS})  # fmt: skip
    def get(self, request: Request) -> Response:
        """Live workers, job and subscriber workers alike. A key scoped to some names sees
        the workers serving one of its queues or a group of one of its broadcasts (the scope's
        names stand for both, as on the broadcast endpoints), each listing only the queues and
        groups within its scope: a key learns nothing about the names of others."""
        allowed = allowed_queues(request)
        bodies = [worker_body(r, allowed) for r in get_storage().list_workers()]
        if allowed is not None:
            bodies = [b for b in bodies if b["queues"] or b["groups"]]
        return Response(WorkerSerializer(bodies, many=True).data)


class ScheduleListView(JobQView):
    jobq_operation = ops.SCHEDULE_READ

    @extend_schema(operation_id="schedule_list", responses={200: ScheduleSerializer(many=True),
                                                            **ERRORS})  # fmt: skip
    def get(self, request: Request) -> Response:
        schedules = Schedule.objects.using(rows_alias()).order_by("name")
        allowed = allowed_queues(request)
        if allowed is not None:
            schedules = schedules.filter(queue__in=sorted(allowed))
        return Response(ScheduleSerializer(schedules, many=True).data)


SCHEDULE_QUEUE = OpenApiParameter(
    "queue", OpenApiTypes.STR, OpenApiParameter.QUERY,
    description="the schedule's queue: needed only when the credential sees schedules of this "
    "name on several queues (names are unique per queue)",
)  # fmt: skip


def find_schedule(request: Request, name: str) -> Schedule:
    """The schedule ``name`` among those this credential may see (``?queue=`` picks one when
    several queues have one of that name). Schedules of other queues do not exist for it: a
    key scoped to other queues gets 404, as its schedule list shows nothing."""
    found = Schedule.objects.using(rows_alias()).filter(name=name)
    queue = request.query_params.get("queue")
    if queue is not None:
        found = found.filter(queue=queue)
    allowed = allowed_queues(request)
    if allowed is not None:
        found = found.filter(queue__in=sorted(allowed))
    schedules = list(found[:2])
    if not schedules:
        raise NotFound(f"no schedule {name!r}")
    if len(schedules) > 1:
        raise serializers.ValidationError(
            {"queue": [f"schedules named {name!r} exist on several queues: give ?queue="]}
        )
    return schedules[0]


class ScheduleRunView(JobQView):
    jobq_operation = ops.SCHEDULE_CHANGE

    @extend_schema(operation_id="schedule_run", request=None, parameters=[SCHEDULE_QUEUE],
                   responses={200: EnqueueResultSerializer, 404: None, **ERRORS})  # fmt: skip
    def post(self, request: Request, name: str) -> Response:
        """Enqueue one extra run of a schedule now (``schedule.<name>.manual-<ms>``); its
        regular ticks are not affected. The credential needs ``manage`` on its queue."""
        schedule = find_schedule(request, name)
        result = fire_now(schedule, storage=get_storage())
        return Response(enqueue_body(get_queue(schedule.queue), result, may_read=may_read(request)))


# -- health -----------------------------------------------------------------------------------


def oldest_waiting(storage: Storage, alias: str, queues: list[str]) -> dict[str, float]:
    """Seconds the longest-waiting runnable job of each queue has waited (since it was due).

    With Redis from the storage itself, like the counts beside it (the mirror's rows may lag,
    and a queue the counts call empty must not show a waiting job); with the database
    backend from the rows, which are the state."""
    now_ms = time.time() * 1000
    if hasattr(storage, "oldest_waiting_ms"):
        ages = {name: storage.oldest_waiting_ms(name) for name in queues}
        return {n: round(max(0.0, (now_ms - ms) / 1000), 3) for n, ms in ages.items() if ms}
    now = timezone.now()
    rows = (
        Job.objects.using(alias).filter(state=JobState.QUEUED).values("queue")
        .annotate(since=Min(Coalesce("run_at", "created_at")))
    )  # fmt: skip
    return {r["queue"]: round(max(0.0, (now - r["since"]).total_seconds()), 3) for r in rows}


def mirror_rejected(storage: Storage, alias: str) -> int | None:
    """Jobs the mirror set aside because the database refused their rows (Redis only)."""
    if not hasattr(storage, "group_backlog") or not jobq_settings()["MIRROR"]["ENABLED"]:
        return None
    return MirrorReject.objects.using(alias).count()


def redis_memory(storage: Storage) -> dict[str, Any] | None:
    memory = getattr(storage, "memory_info", None)  # Redis only
    return None if memory is None else memory()


def health_report(visible: Callable[[list[str]], list[str]] | None = None
                  ) -> tuple[dict[str, Any], bool]:  # fmt: skip
    """The health answer. ``visible`` (the queues a credential may see, from all of them): the
    full report, per queue; None (an anonymous caller, a load balancer): only what costs no
    work per queue and names nothing, status, workers and the number of queues."""
    storage = get_storage()
    conf = jobq_settings()
    report: dict[str, Any] = {
        "status": "ok", "backend": conf["BACKEND"], "storage_reachable": True, "workers": None,
        "queue_count": None, "queues": None, "mirror_lag_seconds": None,
        "mirror_backlog_events": None, "mirror_rejected": None, "mirror_gaps": None,
        "jobs_lost": None, "mirror_sampled": None, "memory": None,
    }  # fmt: skip
    try:
        report["workers"] = len(storage.list_workers())
        if visible is None:
            report["queue_count"] = len(known_queues())
            return report, True
        queues, physical = visible(known_queues()), physical_queues()
        physical = [name for name in physical if logical_name(name) in set(queues)]
        report["queue_count"], report["queues"] = len(queues), []
        alias = rows_alias()
        ages: dict[str, float] = {}
        for name, age in oldest_waiting(storage, alias, physical).items():
            ages[logical_name(name)] = max(age, ages.get(logical_name(name), 0.0))
        summaries = storage.queue_summaries(physical)  # pipelined: not reads per queue
        waiting: dict[str, int] = {}
        paused: dict[str, bool] = {}
        for name, summary in summaries.items():
            logical = logical_name(name)
            waiting[logical] = waiting.get(logical, 0) + summary.counts.get(JobState.QUEUED, 0)
            paused[logical] = paused.get(logical, False) or summary.paused
        for name in queues:
            report["queues"].append({
                "name": name, "paused": paused.get(name, False),
                "waiting": waiting.get(name, 0),
                "oldest_waiting_seconds": ages.get(name),
            })  # fmt: skip
        lag, backlog = mirror_check.lag(storage, physical)
        report.update(mirror_lag_seconds=lag, mirror_backlog_events=backlog)
        report["mirror_rejected"] = mirror_rejected(storage, alias)
        if lag is not None:
            report["mirror_gaps"] = [
                {k: gap.get(k) for k in ("queue", "at", "why", "rows", "lost")}
                for gap in mirror_check.recent_gaps(storage, physical)
            ]
            report["jobs_lost"] = mirror_check.lost_rows(alias, physical)
            report["mirror_sampled"] = mirror_check.sampled_queues(storage, queues)
        report["memory"] = redis_memory(storage)
    except STORAGE_ERRORS:
        report.update(status="unavailable", storage_reachable=False)
        return report, False
    return report, True


class HealthThrottle(SimpleRateThrottle):
    """Anonymous health checks per client address (``JOBQ["API"]["HEALTH_RATE"]``): a
    monitor polls every few seconds; anything faster is load, not monitoring."""

    scope = "jobq-health"

    def __init__(self) -> None:
        self.rate = jobq_settings()["API"]["HEALTH_RATE"] or None
        self.num_requests, self.duration = self.parse_rate(self.rate)  # type: ignore[assignment]

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        if self.rate is None or request.user.is_authenticated:
            return None  # not throttled here: a credential has its own throttle
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class HealthView(APIView):
    """No credential needed: load balancers and monitors call it, and get the status, the
    workers and the number of queues, at a cost that does not grow with the queues and naming
    none. A credential that may read queues gets the full report on the queues it may see
    (waiting, age, paused; the mirror's lag, gaps and samples; Redis memory). Never a job, a
    payload or a result."""

    authentication_classes = JobQView.authentication_classes
    permission_classes = [AllowAny]
    throttle_classes = [HealthThrottle]
    schema = AutoSchema()

    @extend_schema(operation_id="health", responses={200: HealthSerializer,
                                                     503: HealthSerializer})  # fmt: skip
    def get(self, request: Request) -> Response:
        reader = request.user.is_authenticated and may(request, ops.READ)
        report, ok = health_report(partial(visible_of, request) if reader else None)
        return Response(HealthSerializer(report).data, status=200 if ok else 503)


def visible_of(request: Request, names: list[str]) -> list[str]:
    allowed = allowed_queues(request)
    return [name for name in names if allowed is None or name in allowed]


# -- editing schedules --------------------------------------------------------------------------

EDITABLE = ("queue", "cron", "interval", "timezone", "payload", "job_options", "enabled",
            "missed")  # fmt: skip


def _validated(schedule: Schedule) -> Schedule:
    """The admin form's checks (cron, time zone, job options, payload), as 400 field errors."""
    try:
        validate_schedule(schedule)
    except DjangoValidationError as exc:
        raise serializers.ValidationError(exc.message_dict) from exc
    return schedule


def _edits(data: Any, *, partial: bool) -> dict[str, Any]:
    body = ScheduleWriteSerializer(data=data, partial=partial)
    body.is_valid(raise_exception=True)
    return {k: v for k, v in body.validated_data.items() if k in EDITABLE}


class ScheduleCreateView(ScheduleListView):
    jobq_operation = ops.SCHEDULE_READ
    body_required = True

    def get_permissions(self) -> list:
        self.jobq_operation = (
            ops.SCHEDULE_ADD if self.request.method == "POST" else ops.SCHEDULE_READ
        )
        return super().get_permissions()

    @extend_schema(operation_id="schedule_create", request=ScheduleWriteSerializer,
                   responses={201: ScheduleSerializer, 409: None, **ERRORS})  # fmt: skip
    def post(self, request: Request) -> Response:
        """Create a schedule (cron expression or interval). A key needs ``manage`` on the
        schedule's queue."""
        body = ScheduleWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        name = body.validated_data["name"]
        fields = _edits(request.data, partial=False)
        if not may_see_queue(request, fields["queue"]):
            raise PermissionDenied(f"this API key is not scoped to queue {fields['queue']!r}")
        schedules = Schedule.objects.using(rows_alias())
        # Names are unique per queue, and the credential may see this queue: a schedule of the
        # same name on a queue it cannot see is neither a conflict nor revealed.
        if schedules.filter(name=name, queue=fields["queue"]).exists():
            raise Conflict(f"a schedule named {name!r} exists on queue {fields['queue']!r}",
                           "exists")  # fmt: skip
        schedule = _validated(Schedule(name=name, **fields))
        schedule.save(using=rows_alias())
        return Response(ScheduleSerializer(schedule).data, status=201)


class ScheduleDetailView(JobQView):
    def get_permissions(self) -> list:
        self.jobq_operation = {"GET": ops.SCHEDULE_READ, "DELETE": ops.SCHEDULE_DELETE}.get(
            self.request.method or "", ops.SCHEDULE_CHANGE
        )
        return super().get_permissions()

    def _schedule(self, request: Request, name: str) -> Schedule:
        return find_schedule(request, name)

    @extend_schema(operation_id="schedule_get", parameters=[SCHEDULE_QUEUE],
                   responses={200: ScheduleSerializer, 404: None, **ERRORS})  # fmt: skip
    def get(self, request: Request, name: str) -> Response:
        return Response(ScheduleSerializer(self._schedule(request, name)).data)

    @extend_schema(operation_id="schedule_update", request=ScheduleWriteSerializer,
                   parameters=[SCHEDULE_QUEUE],
                   responses={200: ScheduleSerializer, 404: None, **ERRORS})  # fmt: skip
    def patch(self, request: Request, name: str) -> Response:
        """Change some fields; a new cron, interval or time zone recomputes the next run."""
        schedule = self._schedule(request, name)
        fields = _edits(request.data, partial=True)
        if "queue" in fields and not may_see_queue(request, fields["queue"]):
            raise PermissionDenied(f"this API key is not scoped to queue {fields['queue']!r}")
        moved_to = fields.get("queue", schedule.queue)
        others = Schedule.objects.using(rows_alias()).exclude(pk=schedule.pk)
        if others.filter(name=name, queue=moved_to).exists():
            raise Conflict(f"a schedule named {name!r} exists on queue {moved_to!r}", "exists")
        for field, value in fields.items():
            setattr(schedule, field, value)
        if "cron" in fields and fields["cron"]:
            schedule.interval = None  # exactly one of the two: the new one wins
        elif fields.get("interval") is not None:
            schedule.cron = ""
        _validated(schedule).save(using=rows_alias())
        return Response(ScheduleSerializer(schedule).data)

    @extend_schema(operation_id="schedule_delete", request=None, parameters=[SCHEDULE_QUEUE],
                   responses={204: None, 404: None, **ERRORS})  # fmt: skip
    def delete(self, request: Request, name: str) -> Response:
        """Delete a schedule; jobs it already enqueued are not touched."""
        self._schedule(request, name).delete()
        return Response(status=204)
