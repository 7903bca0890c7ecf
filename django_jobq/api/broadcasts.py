"""Broadcast endpoints: publish a message, and every group's status.

An API key's queue scopes name the broadcasts it may use too (``*``: all): ``enqueue`` lets it
publish, ``read`` lets it see the groups' status and dead letters, ``manage`` lets it run dead
letters again or purge them. A Django user needs the matching ``Job``
model permission, as for jobs."""

from __future__ import annotations

import base64
import json
from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from .. import permissions as ops
from ..broadcast.core import Broadcast, broadcast_names
from ..errors import UnknownGroup
from ..storage.broadcast_base import PublishOutcome
from .base import JobQView
from .jobs import ERRORS
from .permissions import JobQPermission, allowed_queues, request_key


class BroadcastPermission(JobQPermission):
    """``JobQPermission``, with the broadcast in the path checked against the key's scopes."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        key, name = request_key(request), view.kwargs.get("broadcast")
        if key is not None and name is not None and not key.allows_queue(name):
            self.message = f"this API key is not scoped to broadcast {name!r}"
            return False
        return True


class PublishSerializer(serializers.Serializer):
    id = serializers.CharField(
        required=False, max_length=128, help_text="Message id (dedup key); generated when omitted."
    )
    payload = serializers.JSONField(required=False, allow_null=True, default=None)


class PublishedSerializer(serializers.Serializer):
    id = serializers.CharField()
    # A plain string: a second enum named "outcome" would rename the jobs' OutcomeEnum.
    outcome = serializers.CharField(help_text="published, or duplicate (nothing written)")
    position = serializers.CharField(help_text="Place of the message in the broadcast's log.")


class GroupStatusSerializer(serializers.Serializer):
    group = serializers.CharField()
    lag = serializers.IntegerField(help_text="Messages the group has not read yet.")
    pending = serializers.IntegerField(help_text="Read, not handled yet (active + retrying).")
    active = serializers.IntegerField()
    retrying = serializers.IntegerField()
    dead = serializers.IntegerField(help_text="Failed for good (dead letters).")
    missed = serializers.IntegerField(
        help_text="Dropped by the retention before the group handled them."
    )
    position = serializers.CharField(help_text="Last message the group read ('' before any).")


class BroadcastSerializer(serializers.Serializer):
    name = serializers.CharField()
    length = serializers.IntegerField(help_text="Messages retained.")
    groups = GroupStatusSerializer(many=True)


def describe(name: str) -> dict[str, Any]:
    bc = Broadcast(name)
    groups = [{"group": s.group, "lag": s.lag, "pending": s.pending, "active": s.active,
               "retrying": s.retrying, "dead": s.dead, "missed": s.missed,
               "position": s.position} for s in bc.status()]  # fmt: skip
    return {"name": name, "length": bc.length(), "groups": groups}


class BroadcastView(JobQView):
    permission_classes = [BroadcastPermission]


class BroadcastListView(BroadcastView):
    jobq_operation = ops.READ

    @extend_schema(operation_id="broadcast_list",
                   responses={200: BroadcastSerializer(many=True), **ERRORS})  # fmt: skip
    def get(self, request: Request) -> Response:
        """Broadcasts this credential may read, each with its groups' status."""
        allowed = allowed_queues(request)
        names = [n for n in broadcast_names() if allowed is None or n in allowed]
        return Response([describe(n) for n in names])


class BroadcastDetailView(BroadcastView):
    jobq_operation = ops.READ

    @extend_schema(operation_id="broadcast_detail",
                   responses={200: BroadcastSerializer, 404: None, **ERRORS})  # fmt: skip
    def get(self, request: Request, broadcast: str) -> Response:
        """One broadcast: messages retained and every group's lag, pending, dead, missed."""
        if broadcast not in broadcast_names():
            raise NotFound(f"no broadcast {broadcast!r}")
        return Response(describe(broadcast))


class GroupStatusView(BroadcastView):
    jobq_operation = ops.READ

    @extend_schema(operation_id="broadcast_group",
                   responses={200: GroupStatusSerializer, 404: None, **ERRORS})  # fmt: skip
    def get(self, request: Request, broadcast: str, group: str) -> Response:
        """One subscriber group's status."""
        for g in describe(broadcast)["groups"]:
            if g["group"] == group:
                return Response(g)
        raise NotFound(str(UnknownGroup(broadcast, group)))


class PublishView(BroadcastView):
    jobq_operation = ops.ENQUEUE
    body_required = True

    @extend_schema(
        operation_id="broadcast_publish",
        request=PublishSerializer,
        responses={
            201: PublishedSerializer,
            200: OpenApiResponse(PublishedSerializer, "duplicate: a retained message has this id"),
            413: OpenApiResponse(description="payload over the limit"),
            **ERRORS,
        },
    )
    def post(self, request: Request, broadcast: str) -> Response:
        """Publish one message to every subscriber group of the broadcast."""
        data = PublishSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        result = Broadcast(broadcast).publish(spec.get("payload"), id=spec.get("id"))
        created = result.outcome is PublishOutcome.PUBLISHED
        body = {"id": result.message_id, "outcome": result.outcome.value,
                "position": result.position}  # fmt: skip
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


# -- dead letters of a group ----------------------------------------------------------------

POSITION = r"^[0-9]{1,20}(-[0-9]{1,20})?$"  # a counter (database, memory) or a stream id (Redis)


class DeadMessageSerializer(serializers.Serializer):
    position = serializers.CharField(help_text="Place of the message in the broadcast's log.")
    id = serializers.CharField(help_text="Message id.")
    payload = serializers.JSONField(
        allow_null=True,
        help_text='the decoded payload; {"undecodable_base64": ...} when it does not decode',
    )
    published_at = serializers.IntegerField(help_text="epoch ms")
    failed_at = serializers.IntegerField(help_text="epoch ms")
    attempts = serializers.IntegerField()
    error = serializers.JSONField(allow_null=True, help_text="error record of the last attempt")


class DeadMessagePageSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="dead letters of the group in all")
    results = DeadMessageSerializer(many=True)


class DeadParams(serializers.Serializer):
    limit = serializers.IntegerField(required=False, default=50, min_value=1, max_value=500)


class RetryDeadSerializer(serializers.Serializer):
    positions = serializers.ListField(
        child=serializers.RegexField(POSITION, max_length=41),
        required=False,
        max_length=1000,
        help_text="the dead letters to run again (default: all of the group's)",
    )


class CountSerializer(serializers.Serializer):
    count = serializers.IntegerField()


def _group_of(broadcast: str, group: str) -> tuple[Broadcast, int]:
    """The broadcast and the group's dead count; 404 for a group it does not have."""
    bc = Broadcast(broadcast)
    for status_ in bc.status():
        if status_.group == group:
            return bc, status_.dead
    raise NotFound(str(UnknownGroup(broadcast, group)))


def _decoded(bc: Broadcast, payload: bytes, content_type: str) -> Any:
    try:
        return bc.decode(payload, content_type)
    except Exception:  # noqa: BLE001 - shown as bytes, never a 500
        return {"undecodable_base64": base64.b64encode(payload).decode()}


def _error(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return {"undecodable": raw.decode(errors="replace")}


class DeadMessageListView(BroadcastView):
    jobq_operation = ops.READ

    @extend_schema(operation_id="broadcast_dead_list", parameters=[DeadParams],
                   responses={200: DeadMessagePageSerializer, 404: None, **ERRORS})  # fmt: skip
    def get(self, request: Request, broadcast: str, group: str) -> Response:
        """The group's dead letters (failed for good), oldest failure first."""
        params = DeadParams(data=request.query_params)
        params.is_valid(raise_exception=True)
        bc, count = _group_of(broadcast, group)
        results = [{"position": d.position, "id": d.message_id,
                    "payload": _decoded(bc, d.payload, d.content_type),
                    "published_at": d.published_at, "failed_at": d.failed_at,
                    "attempts": d.attempts, "error": _error(d.error)}
                   for d in bc.dead_letters(group, params.validated_data["limit"])]  # fmt: skip
        return Response({"count": count, "results": results})


class DeadMessageRetryView(BroadcastView):
    jobq_operation = ops.RETRY

    @extend_schema(operation_id="broadcast_dead_retry", request=RetryDeadSerializer,
                   responses={200: CountSerializer, 404: None, **ERRORS})  # fmt: skip
    def post(self, request: Request, broadcast: str, group: str) -> Response:
        """Run the group's dead letters again (all, or those at ``positions``), attempts reset;
        one whose message the retention dropped stays dead. ``count``: how many moved."""
        data = RetryDeadSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        bc, _ = _group_of(broadcast, group)
        return Response({"count": bc.retry_dead(group, data.validated_data.get("positions"))})


class DeadMessagePurgeView(BroadcastView):
    jobq_operation = ops.DELETE

    @extend_schema(operation_id="broadcast_dead_purge", request=None,
                   responses={200: CountSerializer, 404: None, **ERRORS})  # fmt: skip
    def post(self, request: Request, broadcast: str, group: str) -> Response:
        """Delete the group's dead letters for good; ``count``: how many."""
        bc, _ = _group_of(broadcast, group)
        return Response({"count": bc.purge_dead(group)})
