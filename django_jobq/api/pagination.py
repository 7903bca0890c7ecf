"""Keyset ("cursor") pagination of job rows on (created_at, id), newest first.

A page starts strictly after the last row of the previous one, so a deep page costs what the
first does (an index range, no OFFSET) and rows inserted meanwhile, which are newer, never
shift or repeat what a client is paging through."""

from __future__ import annotations

import base64
import datetime as dt
import json

from django.db.models import Q, QuerySet
from rest_framework.exceptions import ValidationError


def encode_cursor(created_at: dt.datetime, pk: int) -> str:
    raw = json.dumps([created_at.isoformat(), pk]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[dt.datetime, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, pk = json.loads(raw)
        at = dt.datetime.fromisoformat(created)
        if at.tzinfo is None or isinstance(pk, bool) or not isinstance(pk, int):
            raise ValueError(cursor)
        if not 0 < pk < 2**63:  # a primary key column's range; beyond it SQLite overflows
            raise ValueError(cursor)
        return at, pk
    except (ValueError, TypeError, UnicodeDecodeError):
        raise ValidationError({"cursor": ["not a cursor this API returned"]}) from None


def page(queryset: QuerySet, cursor: str | None, size: int) -> tuple[list, str | None]:
    """One page of ``queryset`` after ``cursor`` and the cursor of the next page (or None)."""
    ordered = queryset.order_by("-created_at", "-id")
    if cursor:
        at, pk = decode_cursor(cursor)
        ordered = ordered.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=pk))
    rows = list(ordered[: size + 1])
    if len(rows) <= size:
        return rows, None
    last = rows[size - 1]
    return rows[:size], encode_cursor(last.created_at, last.pk)
