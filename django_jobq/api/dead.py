"""``GET queues/<queue>/dead/``: the queue's dead letters (jobs that failed for good), newest
failure first, each with its status, error and payload, to decide what to retry."""

from __future__ import annotations

import base64
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from .. import permissions as ops
from ..queue.core import get_queue
from .base import JobQView
from .jobs import ERRORS
from .serializers import JobStatusSerializer


class DeadLetterSerializer(serializers.Serializer):
    status = JobStatusSerializer()
    payload = serializers.JSONField(
        allow_null=True,
        help_text='the decoded payload; {"undecodable_base64": ...} when it no longer decodes',
    )


class DeadLetterPageSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="dead letters of the queue in all")
    failure_calls = serializers.IntegerField(
        help_text="failure-handler calls of the queue not done yet (docs/failures.md)"
    )
    results = DeadLetterSerializer(many=True)


class DeadPageParams(serializers.Serializer):
    offset = serializers.IntegerField(required=False, default=0, min_value=0, max_value=1_000_000)
    limit = serializers.IntegerField(required=False, default=50, min_value=1, max_value=500)


def _json_payload(payload: Any) -> Any:
    # Queue.dead_letters hands back raw bytes for a payload that no longer decodes.
    if isinstance(payload, bytes | bytearray):
        return {"undecodable_base64": base64.b64encode(payload).decode()}
    return payload


class DeadLetterListView(JobQView):
    jobq_operation = ops.READ

    @extend_schema(
        operation_id="dead_letter_list",
        parameters=[DeadPageParams],
        responses={200: DeadLetterPageSerializer, **ERRORS},
    )
    def get(self, request: Request, queue: str) -> Response:
        params = DeadPageParams(data=request.query_params)
        params.is_valid(raise_exception=True)
        q = get_queue(queue)
        letters = q.dead_letters(**params.validated_data)
        results = [
            {"status": JobStatusSerializer(d.status).data, "payload": _json_payload(d.payload)}
            for d in letters
        ]
        body = {"count": q.count_dead(), "failure_calls": q.count_failure_calls()}
        return Response({**body, "results": results})
