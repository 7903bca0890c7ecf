"""Job endpoints of one queue: enqueue (single and bulk), status, result (long-poll), cancel."""

from __future__ import annotations

import math
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from .. import permissions as ops
from ..job import CancelOutcome, EnqueueOutcome, EnqueueResult, RetryOutcome
from ..queue.core import Queue, get_queue
from ..states import TERMINAL_STATES
from .base import Conflict, JobQView, check_queue_budget
from .idempotency import HEADER, idempotent
from .permissions import may, may_read
from .serializers import (
    ActionResultSerializer,
    BulkEnqueueSerializer,
    BulkResultSerializer,
    ConflictSerializer,
    EnqueueResultSerializer,
    EnqueueSerializer,
    JobResultSerializer,
    JobStatusSerializer,
    enqueue_spec,
    public_error,
)
from .waiting import MAX_WAIT, wait_for_result

FORCE = OpenApiParameter(
    "force", OpenApiTypes.BOOL, OpenApiParameter.QUERY,
    description="for a running job: also kill it (process pool: its child; async pool: its "
    "task); the thread pool can only set the job's cancel flag",
)  # fmt: skip
IDEMPOTENCY = OpenApiParameter(
    HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER,
    description="The first answer to this key and body is replayed for 24 h; another body: 422.",
)  # fmt: skip
ERRORS = {
    400: OpenApiResponse(description="invalid field(s)"),
    401: OpenApiResponse(description="not authenticated"),
    403: OpenApiResponse(description="not allowed for this credential"),
    503: OpenApiResponse(description="storage unreachable"),
}


def enqueue_body(queue: Queue, result: EnqueueResult, *, may_read: bool) -> dict[str, Any]:
    """The answer to an enqueue. Re-enqueueing a known id answers with that job's state,
    result and error; a credential without ``read`` gets the outcome word only, or an
    enqueue-only key could read any job whose id it can guess."""
    outcome = result.outcome
    if not may_read and outcome is EnqueueOutcome.COMPLETED:
        outcome = EnqueueOutcome.DUPLICATE  # that the job finished is a read (docs/api.md)
    body = {"id": result.job_id, "queue": queue.name, "outcome": outcome.value,
            "state": None, "result": None, "error": None}  # fmt: skip
    if may_read:
        body.update(state=result.state.value, result=result.result,
                    error=public_error(result.error))  # fmt: skip
    return body


class EnqueueView(JobQView):
    jobq_operation = ops.ENQUEUE
    body_required = True

    @extend_schema(
        operation_id="enqueue",
        request=EnqueueSerializer,
        parameters=[IDEMPOTENCY],
        responses={
            201: EnqueueResultSerializer,
            200: OpenApiResponse(EnqueueResultSerializer, "duplicate, completed or updated"),
            413: OpenApiResponse(description="payload over the queue's limit"),
            422: OpenApiResponse(description="Idempotency-Key reused with another body"),
            **ERRORS,
        },
    )
    def post(self, request: Request, queue: str) -> Response:
        check_queue_budget(queue)
        q = get_queue(queue)

        def run(ids: list[str] | None) -> Response:
            data = EnqueueSerializer(data=request.data, context={"queue": q})
            data.is_valid(raise_exception=True)
            refuse_updates(request, [data.validated_data])
            spec = enqueue_spec(data.validated_data)
            job_id = spec.pop("id", None) or (ids[0] if ids else None)
            result = q.enqueue(job_id, spec.pop("payload", None), **spec)
            # pending: journal mode stored it in the database; Redis gets it on commit
            created = result.outcome in (EnqueueOutcome.QUEUED, EnqueueOutcome.PENDING)
            body = enqueue_body(q, result, may_read=may_read(request))
            return Response(body, status=201 if created else status.HTTP_200_OK)

        return idempotent(request, run, fresh_ids=0 if _has_id(request.data) else 1)


#: Enqueue options that rewrite a job already waiting under the id: the change scope's work
#: (``manage`` for a key), not an enqueue's, or an enqueue-only key could rewrite any waiting
#: job whose id it can guess.
UPDATES = ("update_data", "update_run_at", "update_max_attempts", "update_backoff",
           "reset_counts")  # fmt: skip


def refuse_updates(request: Request, items: list[dict[str, Any]]) -> None:
    asked = sorted({name for item in items for name in UPDATES
                    if item.get(name) not in (None, False, "no")})  # fmt: skip
    if asked and not may(request, ops.CHANGE):
        raise PermissionDenied(f"{', '.join(asked)}: rewriting a waiting job needs the change "
                               "permission (an API key's manage action), not enqueue")  # fmt: skip


def _has_id(item: object) -> bool:
    return isinstance(item, dict) and bool(item.get("id"))


class BulkEnqueueView(JobQView):
    jobq_operation = ops.ENQUEUE
    body_required = True

    @extend_schema(
        operation_id="enqueue_bulk",
        request=BulkEnqueueSerializer,
        parameters=[IDEMPOTENCY],
        responses={200: BulkResultSerializer, 413: OpenApiResponse(), 422: OpenApiResponse(),
                   **ERRORS},
    )  # fmt: skip
    def post(self, request: Request, queue: str) -> Response:
        """Up to 1000 jobs; every item is validated before any is stored (all or nothing)."""
        check_queue_budget(queue)
        q = get_queue(queue)

        def run(ids: list[str] | None) -> Response:
            data = BulkEnqueueSerializer(data=request.data, context={"queue": q})
            data.is_valid(raise_exception=True)
            refuse_updates(request, data.validated_data["jobs"])
            fresh = iter(ids or ())
            items = []
            for item in data.validated_data["jobs"]:
                spec = enqueue_spec(item)
                spec["id"] = spec.get("id") or next(fresh, None)
                items.append(spec)
            results = q.enqueue_many(items)
            reader = may_read(request)
            return Response({"results": [enqueue_body(q, r, may_read=reader) for r in results]})

        jobs = request.data.get("jobs") if isinstance(request.data, dict) else None
        fresh = sum(not _has_id(j) for j in jobs) if isinstance(jobs, list) else 0
        return idempotent(request, run, fresh_ids=fresh)


class JobStatusView(JobQView):
    jobq_operation = ops.READ

    @extend_schema(operation_id="job_status", responses={200: JobStatusSerializer, 404: None,
                                                         **ERRORS})  # fmt: skip
    def get(self, request: Request, queue: str, job_id: str) -> Response:
        job = get_queue(queue).get_status(job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r} in queue {queue!r} (unknown or expired)")
        return Response(JobStatusSerializer(job).data)


class WaitSerializer(serializers.Serializer):
    wait = serializers.FloatField(required=False, default=0, min_value=0, max_value=MAX_WAIT)

    def validate_wait(self, value: float) -> float:
        if not math.isfinite(value):  # NaN passes the range checks
            raise serializers.ValidationError("must be a number of seconds")
        return value


class JobResultView(JobQView):
    jobq_operation = ops.READ

    @extend_schema(
        operation_id="job_result",
        parameters=[WaitSerializer],
        responses={200: JobResultSerializer, 404: None, **ERRORS},
    )
    def get(self, request: Request, queue: str, job_id: str) -> Response:
        """The value (completed) or error (failed). ``?wait=<seconds>`` (at most 30) holds the
        request until the job is final; ``ready`` says whether it is."""
        params = WaitSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        q = get_queue(queue)
        result = wait_for_result(q, job_id, params.validated_data["wait"])
        if result is None:
            raise NotFound(f"no job {job_id!r} in queue {queue!r} (unknown or expired)")
        body = {
            "id": job_id, "queue": queue, "state": result.state.value,
            "ready": result.state in TERMINAL_STATES, "value": result.value,
            "error": public_error(result.error),
        }  # fmt: skip
        return Response(body)


class CancelView(JobQView):
    jobq_operation = ops.CANCEL

    @extend_schema(
        operation_id="job_cancel",
        request=None,
        parameters=[FORCE],
        responses={
            200: ActionResultSerializer,
            202: ActionResultSerializer,
            404: None,
            409: ConflictSerializer,
            **ERRORS,
        },  # fmt: skip
    )
    def post(self, request: Request, queue: str, job_id: str) -> Response:
        """Cancel a job. Waiting: 200, cancelled. Running: 202, its worker was asked to stop
        it (``?force=true``: and to kill it where its pool can); it ends ``cancelled``.
        Finished: 409 with its state."""
        force = request.query_params.get("force", "false").lower()
        if force not in ("true", "false", "1", "0"):
            raise serializers.ValidationError({"force": "must be true or false"})
        q = get_queue(queue)
        outcome = q.cancel(job_id, force=force in ("true", "1"))
        if outcome is CancelOutcome.NOT_FOUND:
            raise NotFound(f"no job {job_id!r} in queue {queue!r} (unknown or expired)")
        if outcome is CancelOutcome.REQUESTED:
            return Response({"id": job_id, "queue": queue, "outcome": "requested",
                             "state": "active"}, status=status.HTTP_202_ACCEPTED)  # fmt: skip
        if outcome is not CancelOutcome.CANCELLED:
            raise Conflict(f"job {job_id!r} is {outcome.value}: only a waiting or running job "
                           "can be cancelled", outcome.value)  # fmt: skip
        return Response({"id": job_id, "queue": queue, "outcome": "cancelled",
                         "state": "cancelled"})  # fmt: skip


class RetryView(JobQView):
    jobq_operation = ops.RETRY

    @extend_schema(
        operation_id="job_retry",
        request=None,
        responses={200: ActionResultSerializer, 404: None, 409: ConflictSerializer, **ERRORS},
    )
    def post(self, request: Request, queue: str, job_id: str) -> Response:
        """Run a failed or cancelled job again from attempt 1; 409 with its state otherwise."""
        q = get_queue(queue)
        outcome = q.retry(job_id)
        if outcome is RetryOutcome.NOT_FOUND:
            raise NotFound(f"no job {job_id!r} in queue {queue!r} (unknown or expired)")
        if outcome is not RetryOutcome.RETRIED:
            current = q.get_status(job_id)
            state = current.state.value if current is not None else outcome.value
            raise Conflict(f"job {job_id!r} is {state}: only a failed or cancelled job can be "
                           "retried", state)  # fmt: skip
        current = q.get_status(job_id)
        state = current.state.value if current is not None else "queued"
        return Response({"id": job_id, "queue": queue, "outcome": "retried", "state": state})
