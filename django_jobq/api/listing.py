"""``GET /jobs/``: job rows across queues, filtered, newest first, keyset-paginated.

Rows come from the models: the state itself on the database backend, the mirror on Redis (as
fresh as the mirror's lag, which ``/health`` reports)."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from .. import permissions as ops
from ..backend import get_storage
from ..models import Job
from ..queue.sharding import members
from ..schedules.core import schedules_alias
from ..states import JobState
from ..validation import QUEUE_NAME_PATTERN
from .base import JobQView, physical_queues
from .jobs import ERRORS
from .pagination import page
from .permissions import allowed_queues
from .serializers import JobPageSerializer, JobRowSerializer


def rows_alias() -> str:
    """Where job rows live: the database backend's own alias, else the mirror's."""
    return schedules_alias(get_storage())


def rows_of(name: str, known: list[str] | None = None) -> list[str]:
    """The physical queues whose rows are queue ``name``'s (its partitions when sharded)."""
    return members(name, physical_queues() if known is None else known) or [name]


class JobFilterSerializer(serializers.Serializer):
    queue = serializers.RegexField(rf"^{QUEUE_NAME_PATTERN}\Z", required=False)
    state = serializers.ChoiceField(choices=JobState.choices, required=False)
    handler = serializers.CharField(required=False, max_length=200)
    created_after = serializers.DateTimeField(required=False)
    created_before = serializers.DateTimeField(required=False)
    cursor = serializers.CharField(required=False, max_length=200)
    limit = serializers.IntegerField(required=False, default=50, min_value=1, max_value=500)


def filtered(request: Request, params: dict) -> QuerySet:
    rows = Job.objects.using(rows_alias())
    allowed = allowed_queues(request)
    if "queue" in params:
        if allowed is not None and params["queue"] not in allowed:
            raise PermissionDenied(f"this API key is not scoped to queue {params['queue']!r}")
        rows = rows.filter(queue__in=rows_of(params["queue"]))
    elif allowed is not None:
        known = physical_queues()
        rows = rows.filter(queue__in=sorted({p for name in allowed for p in rows_of(name, known)}))
    if "state" in params:
        rows = rows.filter(state=params["state"])
    if "handler" in params:
        rows = rows.filter(handler=params["handler"])
    if "created_after" in params:
        rows = rows.filter(created_at__gte=params["created_after"])
    if "created_before" in params:
        rows = rows.filter(created_at__lt=params["created_before"])
    return rows.defer("payload", "result")


class JobListView(JobQView):
    jobq_operation = ops.READ

    @extend_schema(
        operation_id="job_list",
        parameters=[JobFilterSerializer],
        responses={200: JobPageSerializer, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        """Jobs newest first; follow ``next`` for older ones (stable while jobs are added)."""
        params = JobFilterSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        rows, cursor = page(filtered(request, data), data.get("cursor"), data["limit"])
        next_url = None
        if cursor is not None:
            query = request.query_params.copy()
            query["cursor"] = cursor
            next_url = request.build_absolute_uri(f"{request.path}?{query.urlencode()}")
        return Response({"results": JobRowSerializer(rows, many=True).data, "next": next_url})
