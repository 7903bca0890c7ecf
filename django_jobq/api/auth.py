"""Authentication by API key: ``Authorization: Api-Key jobq_<prefix>_<secret>``.

It sits beside the project's own DRF authentication classes (session, token, ...): a request
authenticated another way is a Django user, checked against Django permissions instead."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from ..conf import jobq_settings
from ..models import ApiKey
from .keys import KEY_PREFIX, find_key, touch

KEYWORD = "Api-Key"


class ApiKeyUser(AnonymousUser):
    """The principal of a key-authenticated request: authenticated, but no Django user, so
    nothing in the project's own permission checks mistakes it for one."""

    def __init__(self, key: ApiKey) -> None:
        self.key = key

    @property
    def is_authenticated(self) -> bool:  # type: ignore[override]
        return True

    @property
    def is_anonymous(self) -> bool:  # type: ignore[override]
        return False

    def __str__(self) -> str:
        return f"api-key:{self.key.prefix}"


class FailedAuthentications(SimpleRateThrottle):
    """Failed key authentications per client address (``JOBQ["API"]["FAILED_AUTH_RATE"]``).

    DRF throttles only after authentication, and a wrong key fails authentication, so wrong
    keys were never throttled: anyone could try keys at the server's speed. This counts the
    failures in the cache (as DRF's throttles do) and refuses an address over the rate before
    its key is even looked up."""

    scope = "jobq-auth-failures"

    def __init__(self) -> None:
        rate = jobq_settings()["API"]["FAILED_AUTH_RATE"]
        self.rate = rate or None
        self.num_requests, self.duration = self.parse_rate(self.rate)  # type: ignore[assignment]

    def get_cache_key(self, request: Any, view: Any) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}

    def check(self, request: Request) -> None:
        """Raise ``Throttled`` while this address is over the rate of failures."""
        if self.rate is None:
            return
        self.key = self.get_cache_key(request, None)
        self.now = self.timer()
        self.history = [t for t in self.cache.get(self.key, []) if t > self.now - self.duration]
        if len(self.history) >= self.num_requests:
            raise exceptions.Throttled(self.wait(), "too many failed API-key authentications")

    def failed(self) -> None:
        if self.rate is not None:
            self.history.insert(0, self.now)
            self.cache.set(self.key, self.history, self.duration)


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, ApiKey] | None:
        parts = get_authorization_header(request).split()
        scheme = parts[0].decode(errors="replace") if parts else ""
        if parts and scheme.lower() != KEYWORD.lower():
            if len(parts) == 2 and parts[1].startswith(f"{KEY_PREFIX}_".encode()):
                # One of our keys under another scheme (Bearer, Token): say which one is
                # expected, instead of "credentials were not provided".
                raise exceptions.AuthenticationFailed(
                    f'API keys go in "Authorization: {KEYWORD} <key>", not "{scheme} <key>"'
                )
            return None  # not ours: let the next authentication class try
        if not parts:
            return None
        failures = FailedAuthentications()
        failures.check(request)
        if len(parts) != 2:
            failures.failed()
            raise exceptions.AuthenticationFailed("Api-Key header needs exactly one key")
        key = find_key(parts[1].decode(errors="replace"))
        if key is None:
            failures.failed()
            raise exceptions.AuthenticationFailed("unknown or revoked API key")
        touch(key)
        return ApiKeyUser(key), key

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (with WWW-Authenticate) rather than 403 to a missing key.
        return KEYWORD
