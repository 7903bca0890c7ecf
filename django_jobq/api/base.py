"""What every API view shares: authentication, permission, throttling, and the mapping of
core exceptions to HTTP answers (never a 500 for a refused input or an unreachable store)."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError
from drf_spectacular.openapi import AutoSchema
from rest_framework import parsers, renderers, status
from rest_framework.exceptions import APIException, NotFound, ParseError, PermissionDenied
from rest_framework.exceptions import ValidationError as DRFValidationError
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from .. import permissions as ops
from ..backend import get_storage
from ..conf import jobq_settings
from ..errors import (
    InvalidJobId,
    InvalidQueueName,
    PayloadTooLarge,
    QueueBusy,
    StorageFull,
    StorageUnavailable,
)
from ..errors import ValidationError as JobQValidationError
from ..queue.sharding import collapse
from ..tasks.registry import registry
from ..validation import validate_job_id, validate_queue_name
from .auth import ApiKeyAuthentication
from .permissions import JobQPermission
from .throttling import JobQRateThrottle

logger = logging.getLogger("django_jobq.api")


class ServiceUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "the job storage is unreachable; try again shortly"
    default_code = "storage_unavailable"


class ServiceFull(ServiceUnavailable):
    """Redis refuses writes at ``maxmemory`` (policy ``noeviction``, the one a queue needs): the
    request wrote nothing (a script's first write is the one refused), so a retry is safe."""

    default_detail = "the job storage is full (Redis maxmemory); try again later"
    default_code = "storage_full"


class PayloadTooLargeError(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"


class LengthRequired(APIException):
    status_code = status.HTTP_411_LENGTH_REQUIRED
    default_code = "length_required"


class Conflict(APIException):
    """A job is in the wrong state for the action; the body says which state it is in."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "wrong_state"

    def __init__(self, detail: str, state: str) -> None:
        super().__init__({"detail": detail, "state": state})


# The storage raises StorageUnavailable for itself; the database errors are those of the views'
# own reads of the models (job lists, the mirror), which do not go through the storage.
STORAGE_ERRORS = (StorageUnavailable, OperationalError, InterfaceError)


def translate(exc: Exception) -> Exception:
    """The HTTP exception a core exception stands for (or ``exc`` itself when none)."""
    if isinstance(exc, PayloadTooLarge):
        return PayloadTooLargeError(str(exc))
    if isinstance(exc, InvalidQueueName):
        return NotFound(str(exc))  # no queue can be named so: an unknown resource
    if isinstance(exc, InvalidJobId):
        return DRFValidationError({"id": [str(exc)]})
    if isinstance(exc, JobQValidationError):
        return DRFValidationError({"non_field_errors": [str(exc)]})
    if isinstance(exc, QueueBusy):
        return Conflict(str(exc), "active")
    if isinstance(exc, StorageFull):
        logger.error("storage full: %s", exc)
        return ServiceFull()
    if isinstance(exc, STORAGE_ERRORS) or (
        isinstance(exc, DatabaseError) and "connection" in str(exc).lower()
    ):
        logger.warning("storage unreachable: %s", exc)
        return ServiceUnavailable()
    return exc


def check_path(kwargs: dict[str, Any]) -> None:
    """A queue name or job id in the path that breaks the core's rules names nothing: 404,
    with the same JSON body as any other unknown job or queue."""
    for name, validate in (("queue", validate_queue_name), ("job_id", validate_job_id)):
        if name in kwargs:
            try:
                validate(kwargs[name])
            except JobQValidationError as exc:
                raise NotFound(str(exc)) from None


def check_body(request: Any, required: bool) -> None:
    """Refuse a body that would be read as nothing, or is too big to parse, before reading it.

    Django and DRF read a request body by its ``Content-Length``: a chunked one without it
    (``Transfer-Encoding: chunked``) is read as empty under WSGI and ASGI alike, and an empty
    body would be an enqueue with a random id and no payload, the client's silently dropped.
    So such a request is a 411, and an empty body where a view needs one (``body_required``)
    a 400. DRF parses JSON from the stream, where Django's DATA_UPLOAD_MAX_MEMORY_SIZE is not
    applied, so the same bound is applied here (raised to fit one payload of
    MAX_PAYLOAD_BYTES, for queues configured above it)."""
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if request.method in ("POST", "PUT", "PATCH") and declared == "0":
        if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
            raise LengthRequired(
                "send the body with a Content-Length: a chunked body is not read here"
            )
        if required:
            raise ParseError("the request has no body: send the JSON document to store")
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is None or not declared.isdigit():
        return
    limit = max(limit, jobq_settings()["MAX_PAYLOAD_BYTES"] + 65536)
    if int(declared) > limit:
        raise PayloadTooLargeError(
            f"request body is {declared} bytes, over the limit of {limit} bytes"
            " (DATA_UPLOAD_MAX_MEMORY_SIZE)"
        )


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, except that a document nested deeper than Python's recursion limit
    (``[[[[…]]]]``, a few hundred kB) is a 400 like any other unreadable body: the stdlib
    decoder raises RecursionError there, which DRF lets through as a 500."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None


def _parsers() -> list[type[parsers.BaseParser]]:
    """The project's parser classes, with DRF's JSON parser replaced by ours."""
    return [
        JSONParser if cls is parsers.JSONParser else cls
        for cls in api_settings.DEFAULT_PARSER_CLASSES
    ]


def _spell_non_finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by its JavaScript spelling."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _spell_non_finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_spell_non_finite(item) for item in value]
    return value


class JSONRenderer(renderers.JSONRenderer):
    """DRF's strict JSON renderer, except that a stored NaN or infinity is answered as the
    string ``"NaN"``/``"Infinity"``/``"-Infinity"`` instead of a 500. New values cannot hold
    them (the serde refuses them where they enter), but a job written by an older version or
    through a project's own serde still can, and one such value must not make every read of
    its job fail. Strict JSON stays strict: a client's parser never sees a bare ``NaN``."""

    def render(self, data: Any, media_type: Any = None, renderer_context: Any = None) -> Any:
        try:
            return super().render(data, media_type, renderer_context)
        except ValueError as exc:
            if "float" not in str(exc):  # "Out of range float values are not JSON compliant"
                raise
            return super().render(_spell_non_finite(data), media_type, renderer_context)


def _renderers() -> list[type[renderers.BaseRenderer]]:
    """The project's renderer classes, with DRF's JSON renderer replaced by ours."""
    return [
        JSONRenderer if cls is renderers.JSONRenderer else cls
        for cls in api_settings.DEFAULT_RENDERER_CLASSES
    ]


class JobQView(APIView):
    """Base of the API's views. ``jobq_operation`` names what a request does (one of
    ``django_jobq.permissions``): the API key action and the Django permission it needs."""

    jobq_operation: str = ops.READ
    # Whether a POST/PUT/PATCH must carry a body (an enqueue, a publish): an empty one is a 400.
    body_required = False
    # The project's own authentication classes still apply; an API key is one more way in.
    authentication_classes = [ApiKeyAuthentication, *api_settings.DEFAULT_AUTHENTICATION_CLASSES]
    permission_classes = [JobQPermission]
    parser_classes = _parsers()
    renderer_classes = _renderers()
    throttle_classes = [JobQRateThrottle]
    # Our own, whatever DEFAULT_SCHEMA_CLASS the project has: the schema stays complete.
    schema = AutoSchema()

    def initial(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        check_path(kwargs)
        check_body(request, self.body_required)

    def handle_exception(self, exc: Exception) -> Response:
        response = super().handle_exception(translate(exc))
        if response is not None and response.status_code == status.HTTP_503_SERVICE_UNAVAILABLE:
            response["Retry-After"] = "5"
        return response


def physical_queues() -> list[str]:
    """Queues the storage has seen, plus those with a handler or settings (maybe still empty)."""
    names = set(get_storage().list_queues()) | set(registry.queues())
    return sorted(names | set(jobq_settings()["QUEUES"]))


_known: list[Any] = [0.0, frozenset()]  # (monotonic time read, logical names): this process's


def check_queue_budget(name: str) -> None:
    """Refuse an API enqueue that would create a queue past ``JOBQ["API"]["MAX_QUEUES"]``:
    every queue costs each worker's and reaper's sweep and each scrape a little, so a key
    allowed ``*`` must not create them without end (issue 36, item 12). A known name costs
    a set lookup; an unknown one a fresh read of the names at most once a second per
    process (so the bound is approximate across processes, never far off)."""
    limit = jobq_settings()["API"]["MAX_QUEUES"]
    if not limit or name in _known[1]:
        return
    if time.monotonic() - _known[0] >= 1.0:
        try:
            names = frozenset(collapse(physical_queues()))
        except StorageUnavailable:  # the enqueue decides (journal mode keeps it: pending)
            return
        _known[:] = [time.monotonic(), names]
        if name in _known[1]:
            return
    if len(_known[1]) >= limit:
        raise PermissionDenied(
            f"queue {name!r} does not exist and {len(_known[1])} queues do: the API creates "
            f"no more than JOBQ['API']['MAX_QUEUES'] ({limit})"
        )
    _known[1] = _known[1] | {name}
