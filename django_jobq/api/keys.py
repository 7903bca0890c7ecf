"""API key secrets: generation, hashing and lookup. No DRF here: the admin and the
``jobq_apikey`` command use it in projects without the API extra too.

A key reads ``jobq_<prefix>_<secret>``. The secret carries 256 random bits, so one SHA-256 is
enough (a slow password hash defends guessable secrets, which these are not) and keeps every
authenticated request cheap."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable

from django.utils import timezone

from ..models import ApiKey

KEY_PREFIX = "jobq"
ACTIONS = tuple(ApiKey.Action.values)
_RATE_RE = re.compile(r"[1-9][0-9]{0,8}/(s|sec|second|m|min|minute|h|hour|d|day)")


def validate_rate(rate: str) -> str:
    """A throttle rate as DRF reads it ("100/min"); "" means the API default."""
    if rate and not _RATE_RE.fullmatch(rate):
        raise ValueError(f'throttle rate {rate!r} must look like "100/min" (s, min, hour, day)')
    return rate


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_key(raw: str) -> tuple[str, str] | None:
    """``(prefix, secret)`` of a presented key, or None when it is not shaped like one."""
    head, sep, rest = raw.partition("_")
    prefix, sep2, secret = rest.partition("_")
    if head != KEY_PREFIX or not sep or not sep2 or not prefix or not secret:
        return None
    if len(prefix) > 16 or len(secret) > 128:
        return None
    return prefix, secret


def new_secret() -> tuple[str, str]:
    """A fresh ``(prefix, secret)``: 32 bits of lookup prefix, 256 bits of secret."""
    return secrets.token_hex(4), secrets.token_urlsafe(32)


def create_key(
    name: str,
    *,
    queues: Iterable[str],
    actions: Iterable[str],
    throttle_rate: str = "",
) -> tuple[ApiKey, str]:
    """Store a new key and return it with its full text, which is shown once and never again."""
    chosen = sorted(set(actions))
    unknown = set(chosen) - set(ACTIONS)
    if unknown:
        raise ValueError(f"unknown action(s) {sorted(unknown)}: choose from {list(ACTIONS)}")
    validate_rate(throttle_rate)
    prefix, secret = new_secret()
    key = ApiKey.objects.create(
        name=name,
        prefix=prefix,
        hashed_secret=hash_secret(secret),
        queues=sorted(set(queues)),
        actions=chosen,
        throttle_rate=throttle_rate,
    )
    return key, f"{KEY_PREFIX}_{prefix}_{secret}"


def find_key(raw: str) -> ApiKey | None:
    """The live key matching ``raw``, or None (unknown, malformed, wrong secret or revoked)."""
    parsed = parse_key(raw)
    if parsed is None:
        return None
    prefix, secret = parsed
    key = ApiKey.objects.filter(prefix=prefix, revoked_at__isnull=True).first()
    if key is None or not hmac.compare_digest(key.hashed_secret, hash_secret(secret)):
        return None
    return key


def touch(key: ApiKey) -> None:
    """Record use at most once a minute: a write per request would serialise SQLite."""
    now = timezone.now()
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() >= 60:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now


def revoke(key: ApiKey) -> None:
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
