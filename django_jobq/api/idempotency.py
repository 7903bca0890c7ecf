"""``Idempotency-Key`` on POST: the first response to a key is stored for 24 hours and replayed
for the same key and body; the same key with another body is refused (422).

A row is claimed *before* the request runs, so two concurrent requests with one key cannot both
enqueue: the second sees the claim and gets 409 until the first has answered. Only successful
answers are kept; after a refusal (400, 413, ...) the client may fix the body and reuse the key.
Keys are per credential: two clients choosing the same key never see each other's answers.

A claim is a lease (``JOBQ["API"]["IDEMPOTENCY_LEASE"]``, 30 s): a web process killed inside
the request leaves its claim behind and never answers, and without a lease every retry would
get 409 for the whole day the key lives. After the lease a retry takes the claim over and runs;
the job id keeps that one job: the client's, or the one generated for the request and stored
in the claim *before* it runs (``fresh_ids``), so a retry of a request that died after its
enqueue reuses the dead request's id and finds its job, instead of enqueueing a second one. The
claim's ``created_at`` is its stamp: only the request holding the current stamp stores its
answer, so a slow first request that lost its lease cannot overwrite the retry's."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework import status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from ..conf import jobq_settings
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


def idempotent(
    request: Request, run: Callable[[list[str] | None], Response], fresh_ids: int = 0
) -> Response:
    """Answer ``request`` with ``run(ids)``, or with the stored answer of its Idempotency-Key.

    ``ids``: ``fresh_ids`` job ids for the jobs the body leaves without one, the same on every
    retry of the key (None without a key: the queue generates them as usual)."""
    key = request.headers.get(HEADER)
    if key is None:
        return run(None)
    if not 1 <= len(key) <= 255 or not key.isprintable():
        raise ValidationError({HEADER: ["must be 1-255 printable characters"]})
    owner, fingerprint = _owner(request), _fingerprint(request)
    claim = _claim(owner, key, fingerprint, min(fresh_ids, MAX_FRESH_IDS))
    if isinstance(claim, Response):
        return claim
    stamp, ids = claim
    ours = IdempotencyRecord.objects.filter(owner=owner, key=key, created_at=stamp,
                                            status_code=IN_FLIGHT)  # fmt: skip
    try:
        response = run(ids)
    except BaseException:
        ours.delete()
        raise
    if status.is_success(response.status_code):
        ours.update(status_code=response.status_code, response=response.data)
    else:
        ours.delete()
    return response


def lease() -> dt.timedelta:
    return dt.timedelta(seconds=jobq_settings()["API"]["IDEMPOTENCY_LEASE"])


#: A bulk enqueue takes at most 1,000 jobs (its serializer refuses more): no body makes the
#: claim generate more ids than that.
MAX_FRESH_IDS = 1000


def new_ids(count: int) -> list[str]:
    """Job ids as ``Queue.enqueue`` generates them (128 random bits, 32 hex characters)."""
    return [os.urandom(16).hex() for _ in range(count)]


def _claim(
    owner: str, key: str, fingerprint: str, fresh_ids: int
) -> Response | tuple[dt.datetime, list[str]]:
    """Claim the key (its stamp and the request's generated ids: go ahead) or answer from
    what is stored under it."""
    now = timezone.now()
    for _ in range(2):
        ids = new_ids(fresh_ids)
        try:
            with transaction.atomic():
                IdempotencyRecord.objects.create(
                    owner=owner, key=key, request_hash=fingerprint, status_code=IN_FLIGHT,
                    response={"ids": ids}, created_at=now, expires_at=now + TTL,
                )  # fmt: skip
            _forget_expired(now)
            return now, ids
        except IntegrityError:
            row = IdempotencyRecord.objects.filter(owner=owner, key=key).first()
            if row is None:
                continue  # deleted in between: claim again
            if row.expires_at <= now:
                IdempotencyRecord.objects.filter(pk=row.pk).delete()
                continue
            if _abandoned(row, fingerprint, now) and _take_over(row, now):
                stored = row.response.get("ids") if isinstance(row.response, dict) else None
                if not isinstance(stored, list) or len(stored) != fresh_ids:
                    stored = ids  # a claim written before ids were stored: nothing to reuse
                return now, stored
            return _stored_answer(row, fingerprint)
    raise KeyInFlight()


def _abandoned(row: IdempotencyRecord, fingerprint: str, now: dt.datetime) -> bool:
    """A claim of this very request whose lease ran out: its request died without answering."""
    return (
        row.status_code == IN_FLIGHT
        and row.request_hash == fingerprint
        and row.created_at + lease() <= now
    )


def _take_over(row: IdempotencyRecord, now: dt.datetime) -> bool:
    """Move the claim's stamp to now, if no other retry did first (one UPDATE decides)."""
    taken = IdempotencyRecord.objects.filter(
        pk=row.pk, status_code=IN_FLIGHT, created_at=row.created_at
    ).update(created_at=now)
    return taken == 1


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
