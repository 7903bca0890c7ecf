"""``GET queues/<queue>/events/``: a queue's event feed as server-sent events.

The HTTP form of ``Queue.events``, for dashboards and services that react to completions without
Python: each event is one SSE message (``id`` = the event id, ``event`` = its kind, ``data`` =
JSON), so a browser's ``EventSource`` resumes after a dropped connection by itself (it resends
the last id as ``Last-Event-ID``), and any client can resume with ``?since=<id>``.

Why it is bounded: a stream is one long request, and a long request is a resource held on the
server. So a stream lasts at most ``timeout`` seconds (then it closes cleanly, telling the
client where to resume; ``EventSource`` reconnects), sends a comment every ``heartbeat``
seconds (proxies keep the connection, and a client that left is noticed at the next write), and
holds no database connection while idle: the API key was checked before the first byte, after
which the request's connections are closed; the database backends are polled without a
connection held between polls (their own blocking wait keeps one). Under WSGI (the dev server,
gunicorn) the stream is a plain iterator on the request's thread, and Redis and memory block in
the storage. Under an ASGI server it is an async iterator that polls every backend, each read
in a thread: it never blocks the event loop, and an idle stream holds no thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import connections
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import renderers, serializers
from rest_framework.request import Request

from .. import permissions as ops
from ..backend import get_storage
from ..conf import configured_shards
from ..errors import EventsLost
from ..job import Event
from ..models import ApiKey
from ..permissions import API_ACTIONS, user_may
from ..queue.events import KINDS, validate_kinds, validate_since
from ..queue.sharded_events import MAX_CURSOR, MergedEvents, parse_cursor
from ..storage.base import Storage
from ..validation import partition_names
from .base import JobQView
from .jobs import ERRORS
from .permissions import request_key

logger = logging.getLogger("django_jobq.api")

RETRY_MS = 1000  # the reconnect delay a client is told to use (SSE "retry" field)
PAGE = 500  # events read per storage round trip
POLL = 0.5  # seconds between polled reads while nothing happens (see Feed.polled)
BLOCK = 1.0  # seconds one blocking read of Redis or memory waits at most
RECHECK = 5.0  # seconds between checks that the stream's credential still may read the queue


class EventStreamRenderer(renderers.BaseRenderer):
    """Lets a client send ``Accept: text/event-stream`` (DRF answers 406 to a media type no
    renderer offers); it renders only the error bodies of refused requests, as one SSE
    ``error`` message, since a stream that starts is a ``StreamingHttpResponse``."""

    media_type = "text/event-stream"
    format = "sse"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: Any = None, renderer_context: Any = None):
        return f"event: error\ndata: {json.dumps(data)}\n\n".encode()


class StreamParams(serializers.Serializer):
    since = serializers.CharField(
        required=False, default="0", max_length=MAX_CURSOR,
        help_text="resume after this event id ('0': the oldest kept; of a sharded queue, the"
        " composite cursor 's<N>:<id0>,...' its events carry); Last-Event-ID wins",
    )  # fmt: skip
    kinds = serializers.CharField(
        required=False, default="", allow_blank=True, max_length=400,
        help_text=f"comma-separated kinds to keep, of {sorted(KINDS)}; all when empty",
    )  # fmt: skip
    timeout = serializers.FloatField(
        required=False, default=60.0, min_value=0.1, max_value=300.0,
        help_text="seconds the stream stays open before it closes (the client reconnects)",
    )  # fmt: skip
    heartbeat = serializers.FloatField(
        required=False, default=15.0, min_value=0.1, max_value=60.0,
        help_text="seconds between keep-alive comments while no event comes",
    )  # fmt: skip


def message(event: Event) -> str:
    data = {"id": event.id, "queue": event.queue, "job_id": event.job_id, "kind": event.kind,
            "at": event.at, "worker": event.worker, "data": event.data}  # fmt: skip
    if event.data_omitted:
        data["data_omitted"] = True
    # default=str: a msgpack result may hold what JSON cannot (bytes); it is shown as text.
    return f"id: {event.id}\nevent: {event.kind}\ndata: {json.dumps(data, default=str)}\n\n"


def close_connections() -> None:
    """Close this thread's database connections: the stream must not keep one while idle."""
    for conn in connections.all(initialized_only=True):
        conn.close()


class Feed:
    """One stream's cursor and clock, shared by the sync and async forms. A sharded queue
    (``shards`` > 1) is read through ``MergedEvents``: its partitions merged, the cursor
    composite."""

    def __init__(self, storage: Storage, queue: str, since: str, kinds: frozenset[str] | None,
                 timeout: float, heartbeat: float, *, asgi: bool = False,
                 shards: int = 1, allowed: Callable[[], bool] = lambda: True) -> None:  # fmt: skip
        self.storage, self.queue, self.cursor, self.kinds = storage, queue, since, kinds
        self.allowed = allowed
        self.next_check = time.monotonic() + RECHECK
        self.merged = (
            MergedEvents(storage, queue, partition_names(queue, shards)) if shards > 1 else None
        )
        self.heartbeat = heartbeat
        self.deadline = time.monotonic() + timeout
        self.next_beat = time.monotonic() + heartbeat
        self.database = hasattr(storage, "using")  # a database backend
        # Polled (a read that answers at once, then a sleep) on the database backends, and on
        # every backend under ASGI: a blocking read there would hold one of the event loop's
        # few executor threads per idle stream.
        self.polled = self.database or asgi

    def read(self) -> list[Event]:
        """One page after the cursor. Polled: answered at once (a database backend's connection
        closed after it); otherwise it blocks until an event, the next heartbeat or the end."""
        if self.polled:
            try:
                return self._read(None)
            finally:
                if self.database:
                    close_connections()
        wait = min(self.next_beat, self.deadline) - time.monotonic()
        block = min(max(wait, 0.01), BLOCK)  # never 0: Redis reads a block of 0 as "forever"
        return self._read(block)

    def _read(self, block: float | None) -> list[Event]:
        if self.merged is not None:
            return self.merged.read(self.cursor, PAGE, block)
        return self.storage.read_events(self.queue, self.cursor, PAGE, block=block)

    def lines(self, page: list[Event]) -> str:
        """The messages of a page (only the kinds asked for), advancing the cursor."""
        out = []
        for event in page:
            self.cursor = event.id
            if self.kinds is None or event.kind in self.kinds:
                out.append(message(event))
        if out:
            self.next_beat = time.monotonic() + self.heartbeat
        return "".join(out)

    def beat(self) -> str:
        """A keep-alive comment when one is due, else nothing."""
        if time.monotonic() < self.next_beat:
            return ""
        self.next_beat = time.monotonic() + self.heartbeat
        return ": keep-alive\n\n"

    def idle(self) -> float:
        """How long to sleep after an empty read of a polled backend."""
        now = time.monotonic()
        return max(0.0, min(POLL, self.deadline - now, self.next_beat - now))

    def end(self) -> str:
        """The last message: an id-only message (no event fires, but a client's last event id
        moves past events the ``kinds`` filter skipped) and a comment saying why it closed."""
        return f"id: {self.cursor}\n\n: timeout, resume with Last-Event-ID\n\n"

    def done(self) -> bool:
        return time.monotonic() >= self.deadline

    def revoked(self) -> str:
        """Every ``RECHECK`` seconds: an ``error`` message if the credential may no longer read
        the queue (a key revoked or rescoped, a user deactivated or stripped of the
        permission), which ends the stream; its reconnect is then refused. Else nothing."""
        if time.monotonic() < self.next_check:
            return ""
        self.next_check = time.monotonic() + RECHECK
        try:
            if self.allowed():
                return ""
        finally:
            close_connections()
        body = json.dumps({"detail": "this credential may no longer read this queue"})
        return f"event: error\ndata: {body}\n\n"

    def lost(self, exc: EventsLost) -> str:
        """The cursor's events are gone (trimmed, retention, obliterated): say so in a ``lost``
        message, and go on from the oldest event kept. The message carries that new place
        as its id, so a client that reconnects goes on from there too, not into the gap."""
        logger.info("event stream of %s: %s", self.queue, exc)
        self.cursor = "0"
        body = json.dumps({"detail": str(exc), "since": exc.since, "queue": exc.queue})
        return f"id: 0\nevent: lost\ndata: {body}\n\n"

    def failed(self, exc: Exception) -> str:
        """A storage error mid-stream: the status line is long sent, so the client is told in
        an ``error`` message, and the stream ends (it resumes from its last id)."""
        logger.warning("event stream of %s: storage not readable: %s", self.queue, exc)
        body = json.dumps({"detail": "the job storage is unreachable; resume shortly"})
        return f"event: error\ndata: {body}\n\n"

    def stream(self) -> Iterator[str]:
        close_connections()  # what the middleware opened after the view (sessions)
        yield f"retry: {RETRY_MS}\n\n"
        while not self.done():
            if refused := self.revoked():
                yield refused
                return
            try:
                page = self.read()
            except EventsLost as exc:
                yield self.lost(exc)
                continue
            except Exception as exc:
                yield self.failed(exc)
                break
            if text := self.lines(page):
                yield text
            elif beat := self.beat():
                yield beat
            elif self.polled and len(page) < PAGE:
                time.sleep(self.idle())
        yield self.end()

    async def astream(self) -> AsyncIterator[str]:
        # The view ran in the request's sync thread: close what it (and the middleware) opened.
        await sync_to_async(close_connections)()
        yield f"retry: {RETRY_MS}\n\n"
        while not self.done():
            if refused := await sync_to_async(self.revoked)():
                yield refused
                return
            try:
                page = await asyncio.to_thread(self.read)
            except EventsLost as exc:
                yield self.lost(exc)
                continue
            except Exception as exc:
                yield self.failed(exc)
                break
            if text := self.lines(page):
                yield text
            elif beat := self.beat():
                yield beat
            elif self.polled and len(page) < PAGE:
                await asyncio.sleep(self.idle())
        yield self.end()


def still_allowed(request: Request, queue: str) -> Callable[[], bool]:
    """Whether the request's credential, read again from the database, may still read
    ``queue``: a stream lasts minutes, and a revoked key must not go on reading."""
    key = request_key(request)
    if key is not None:
        pk = key.pk

        def key_allowed() -> bool:
            fresh = ApiKey.objects.filter(pk=pk, revoked_at__isnull=True).first()
            if fresh is None:
                return False
            return bool(fresh.allows_action(API_ACTIONS[ops.READ]) and fresh.allows_queue(queue))

        return key_allowed
    user_pk = request.user.pk
    model = type(request.user)

    def user_allowed() -> bool:
        fresh = model._default_manager.filter(pk=user_pk, is_active=True).first()
        return fresh is not None and user_may(fresh, ops.READ)

    return user_allowed


class EventStreamView(JobQView):
    """The queue's event feed as ``text/event-stream`` (needs the ``read`` action on the
    queue, as every read of it)."""

    jobq_operation = ops.READ
    renderer_classes = [renderers.JSONRenderer, EventStreamRenderer]

    @extend_schema(
        operation_id="queue_events",
        parameters=[StreamParams, OpenApiParameter(
            "Last-Event-ID", OpenApiTypes.STR, OpenApiParameter.HEADER,
            description="resume after this event id (what EventSource resends on reconnect)",
        )],
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                OpenApiTypes.STR, description="the queue's events as server-sent events"),
            **ERRORS,
            404: OpenApiResponse(description="unknown, or malformed, name in the path"),
        },
    )  # fmt: skip
    def get(self, request: Request, queue: str) -> Any:
        params = StreamParams(data=request.query_params)
        params.is_valid(raise_exception=True)
        values = params.validated_data
        since = request.headers.get("Last-Event-ID") or values["since"]
        shards = configured_shards(queue)
        try:
            if shards > 1:
                parse_cursor(since, shards)
            else:
                since = validate_since(since)
            names = [k.strip() for k in values["kinds"].split(",") if k.strip()]
            kinds = validate_kinds(names or None)
        except ValueError as exc:
            raise serializers.ValidationError({"since/kinds": [str(exc)]}) from None
        asgi = isinstance(request._request, ASGIRequest)
        feed = Feed(get_storage(), queue, since, kinds, values["timeout"], values["heartbeat"],
                    asgi=asgi, shards=shards, allowed=still_allowed(request, queue))  # fmt: skip
        response = StreamingHttpResponse(
            feed.astream() if asgi else feed.stream(), content_type="text/event-stream"
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass each message on as it comes
        return response
