"""``Idempotency-Key`` on POST: the first response to a key is stored for 24 hours and replayed
for the same key and body; the same key with another body is refused (422).

A row is claimed *before* the request runs, so two concurrent requests with one key cannot both
enqueue: the second sees the claim and gets 409 until the first has answered. Only successful
answers are kept; after a refusal (400, 413, ...) the client may fix the body and reuse the key.
Keys are per credential: two clients choosing the same key never see each other's answers."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework import status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from ..models import IdempotencyRecord
from .permissions import request_key

HEADER = "Idempotency-Key"
TTL = dt.timedelta(hours=24)
IN_FLIGHT = 0  # status_code of a claimed key whose request has not answered yet


class KeyReused(APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = "this Idempotency-Key was used with a different request body"
    default_code = "idempotency_key_reused"


class KeyInFlight(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "a request with this Idempotency-Key is still being processed"
    default_code = "idempotency_key_in_flight"


def _owner(request: Request) -> str:
    key = request_key(request)
    return f"key:{key.pk}" if key is not None else f"user:{request.user.pk}"


def _fingerprint(request: Request) -> str:
    body = json.dumps(request.data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{request.path}\n{body}".encode()).hexdigest()


def idempotent(request: Request, run: Callable[[], Response]) -> Response:
    """Answer ``request`` with ``run()``, or with the stored answer of its Idempotency-Key."""
    key = request.headers.get(HEADER)
    if key is None:
        return run()
    if not 1 <= len(key) <= 255 or not key.isprintable():
        raise ValidationError({HEADER: ["must be 1-255 printable characters"]})
    owner, fingerprint = _owner(request), _fingerprint(request)
    replay = _claim(owner, key, fingerprint)
    if replay is not None:
        return replay
    try:
        response = run()
    except BaseException:
        IdempotencyRecord.objects.filter(owner=owner, key=key).delete()
        raise
    if status.is_success(response.status_code):
        IdempotencyRecord.objects.filter(owner=owner, key=key).update(
            status_code=response.status_code, response=response.data
        )
    else:
        IdempotencyRecord.objects.filter(owner=owner, key=key).delete()
    return response


def _claim(owner: str, key: str, fingerprint: str) -> Response | None:
    """Claim the key (None: go ahead) or answer from what is stored under it."""
    now = timezone.now()
    for _ in range(2):
        try:
            with transaction.atomic():
                IdempotencyRecord.objects.create(
                    owner=owner, key=key, request_hash=fingerprint, status_code=IN_FLIGHT,
                    response={}, created_at=now, expires_at=now + TTL,
                )  # fmt: skip
            _forget_expired(now)
            return None
        except IntegrityError:
            row = IdempotencyRecord.objects.filter(owner=owner, key=key).first()
            if row is None:
                continue  # deleted in between: claim again
            if row.expires_at <= now:
                IdempotencyRecord.objects.filter(pk=row.pk).delete()
                continue
            return _stored_answer(row, fingerprint)
    raise KeyInFlight()


def _stored_answer(row: IdempotencyRecord, fingerprint: str) -> Response:
    if row.request_hash != fingerprint:
        raise KeyReused()
    if row.status_code == IN_FLIGHT:
        raise KeyInFlight()
    response = Response(row.response, status=row.status_code)
    response["Idempotent-Replayed"] = "true"
    return response


def _forget_expired(now: Any, batch: int = 100) -> None:
    """Each new key deletes a few expired ones: the table stays at about a day of keys without
    a periodic job."""
    stale = IdempotencyRecord.objects.filter(expires_at__lte=now).values_list("pk", flat=True)
    pks = list(stale[:batch])
    if pks:
        IdempotencyRecord.objects.filter(pk__in=pks).delete()
