"""Broadcast endpoints: publish a message, and every group's status.

An API key's queue scopes name the broadcasts it may use too (``*``: all): ``enqueue`` lets it
publish, ``read`` lets it see the groups' status. A Django user needs the matching ``Job``
model permission, as for jobs."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from .. import permissions as ops
from ..broadcast import Broadcast, broadcast_names
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
        raise NotFound(f"broadcast {broadcast!r} has no group {group!r}")


class PublishView(BroadcastView):
    jobq_operation = ops.ENQUEUE

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
