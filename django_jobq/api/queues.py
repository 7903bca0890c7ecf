"""Queue endpoints: list with counts and stats, one queue, pause and resume."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import urlencode

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from .. import permissions as ops
from ..mirror import rollup
from ..queue.core import Queue, get_queue
from ..queue.sharding import collapse
from .base import JobQView
from .jobs import ERRORS
from .listing import physical_queues, rows_alias
from .permissions import allowed_queues
from .serializers import PausedSerializer, QueueSerializer

STATS_WINDOW = dt.timedelta(hours=1)


def known_queues() -> list[str]:
    """Queues as users name them (a sharded queue's partitions as their logical queue)."""
    return collapse(physical_queues())


def visible_queues(request: Request) -> list[str]:
    allowed = allowed_queues(request)
    return [name for name in known_queues() if allowed is None or name in allowed]


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else round(ms / 1000, 3)


def finished_stats(now: dt.datetime | None = None) -> dict[str, rollup.Finished]:
    """The last hour of finished jobs of every queue, from the per-minute rollup the admin
    reads (folded first, within its budget) plus the rows it has not folded yet: one grouped
    read for the whole page. Aggregating each queue's rows cost 1.3–3.6 s for 20 queues
    over a million rows, and disagreed with the admin's figures."""
    now = now or timezone.now()
    alias = rows_alias()
    folded = rollup.fold(alias, now)
    return rollup.finished_since(alias, now - STATS_WINDOW, folded.until)


def queue_stats(finished: rollup.Finished) -> dict[str, float | None]:
    """A queue's ``stats``: its wait is from when the job was due (its run_at when delayed)
    to its start, as on the admin's charts."""
    return {
        "completed_last_hour": finished.completed,
        "failed_last_hour": finished.failed,
        "mean_wait_seconds": _seconds(finished.mean_wait_ms()),
        "mean_run_seconds": _seconds(finished.mean_run_ms()),
    }


def describe_queue(q: Queue, finished: dict[str, rollup.Finished]) -> dict[str, Any]:
    limits = q.get_limits()
    return {
        "name": q.name,
        "paused": q.is_paused(),
        "counts": {state.value: n for state, n in q.counts().items()},
        "limits": {name: getattr(limits, name) for name in limits.__dataclass_fields__},
        "stats": queue_stats(finished.get(q.name) or rollup.Finished()),
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
    """Queues in name order, a page at a time: each queue costs a few storage reads, so an
    unbounded list grew with the number of queues past any timeout (16.8 s at 3,000).
    ``Link: <…>; rel="next"`` names the next page, ``X-Total-Count`` how many queues there
    are."""

    jobq_operation = ops.READ

    @extend_schema(operation_id="queue_list", parameters=[QueuePageSerializer],
                   responses={200: QueueSerializer(many=True), **ERRORS})  # fmt: skip
    def get(self, request: Request) -> Response:
        params = QueuePageSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        limit, after = params.validated_data["limit"], params.validated_data["after"]
        names = visible_queues(request)
        page = [name for name in names if name > after][:limit]
        finished = finished_stats() if page else {}
        response = Response([describe_queue(get_queue(name), finished) for name in page])
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
        return Response(describe_queue(get_queue(queue), finished_stats()))


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
