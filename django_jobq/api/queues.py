"""Queue endpoints: list with counts and stats, one queue, pause and resume."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import urlencode

from django.db.models import Avg, Count, DurationField, ExpressionWrapper, F, Q
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from .. import permissions as ops
from ..models import Job
from ..queue.core import Queue, get_queue
from ..queue.sharding import collapse
from ..states import JobState
from .base import JobQView
from .jobs import ERRORS
from .listing import physical_queues, rows_alias, rows_of
from .permissions import allowed_queues
from .serializers import PausedSerializer, QueueSerializer

STATS_WINDOW = dt.timedelta(hours=1)


def known_queues() -> list[str]:
    """Queues as users name them (a sharded queue's partitions as their logical queue)."""
    return collapse(physical_queues())


def visible_queues(request: Request) -> list[str]:
    allowed = allowed_queues(request)
    return [name for name in known_queues() if allowed is None or name in allowed]


def _seconds(value: dt.timedelta | None) -> float | None:
    return None if value is None else round(value.total_seconds(), 3)


def queue_stats(name: str) -> dict[str, float | None]:
    """The last hour of finished jobs, from the rows (one aggregate query)."""
    since = timezone.now() - STATS_WINDOW
    finished = Q(finished_at__gte=since)
    agg = Job.objects.using(rows_alias()).filter(queue__in=rows_of(name)).aggregate(
        completed=Count("id", filter=finished & Q(state=JobState.COMPLETED)),
        failed=Count("id", filter=finished & Q(state=JobState.FAILED)),
        wait=Avg(ExpressionWrapper(F("started_at") - F("created_at"), DurationField()),
                 filter=finished & Q(started_at__isnull=False)),
        run=Avg(ExpressionWrapper(F("finished_at") - F("started_at"), DurationField()),
                filter=finished & Q(started_at__isnull=False)),
    )  # fmt: skip
    return {
        "completed_last_hour": agg["completed"],
        "failed_last_hour": agg["failed"],
        "mean_wait_seconds": _seconds(agg["wait"]),
        "mean_run_seconds": _seconds(agg["run"]),
    }


def describe_queue(q: Queue) -> dict[str, Any]:
    limits = q.get_limits()
    return {
        "name": q.name,
        "paused": q.is_paused(),
        "counts": {state.value: n for state, n in q.counts().items()},
        "limits": {name: getattr(limits, name) for name in limits.__dataclass_fields__},
        "stats": queue_stats(q.name),
    }


PAGE = 100  # queues per page of the list, unless ?limit= says otherwise
MAX_PAGE = 500


class QueuePageSerializer(serializers.Serializer):
    limit = serializers.IntegerField(
        required=False, default=PAGE, min_value=1, max_value=MAX_PAGE, help_text="queues per page"
    )
    after = serializers.CharField(
        required=False, default="", allow_blank=True, max_length=200,
        help_text="the last name of the page before (its Link: next)",
    )  # fmt: skip


class QueueListView(JobQView):
    """Queues in name order, a page at a time: each queue costs a few storage reads and one
    aggregate over its last hour of rows, so an unbounded list grew with the number of
    queues past any timeout (16.8 s at 3,000). ``Link: <…>; rel="next"`` names the next
    page, ``X-Total-Count`` how many queues there are."""

    jobq_operation = ops.READ

    @extend_schema(operation_id="queue_list", parameters=[QueuePageSerializer],
                   responses={200: QueueSerializer(many=True), **ERRORS})  # fmt: skip
    def get(self, request: Request) -> Response:
        params = QueuePageSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        limit, after = params.validated_data["limit"], params.validated_data["after"]
        names = visible_queues(request)
        page = [name for name in names if name > after][:limit]
        response = Response([describe_queue(get_queue(name)) for name in page])
        response["X-Total-Count"] = str(len(names))
        if page and page[-1] != names[-1]:
            query = urlencode({"limit": limit, "after": page[-1]})
            response["Link"] = f'<{request.build_absolute_uri(request.path)}?{query}>; rel="next"'
        return response


class QueueDetailView(JobQView):
    jobq_operation = ops.READ

    @extend_schema(operation_id="queue_detail", responses={200: QueueSerializer, 404: None,
                                                           **ERRORS})  # fmt: skip
    def get(self, request: Request, queue: str) -> Response:
        if queue not in known_queues():
            raise NotFound(f"no queue {queue!r}")
        return Response(describe_queue(get_queue(queue)))


class PauseView(JobQView):
    jobq_operation = ops.PAUSE
    pause = True

    @extend_schema(request=None, responses={200: PausedSerializer, **ERRORS})
    def post(self, request: Request, queue: str) -> Response:
        """Pause: workers stop taking jobs (enqueues still accepted). Resume undoes it."""
        q = get_queue(queue)
        if self.pause:
            q.pause()
        else:
            q.resume()
        return Response({"name": queue, "paused": q.is_paused()})


class ResumeView(PauseView):
    pause = False
