"""Request throttling per API key (its own ``throttle_rate``) or per user.

The rate of a key without one, and of users, is DRF's ``DEFAULT_THROTTLE_RATES["jobq"]``;
no rate there means no throttling. Counters live in Django's default cache, as for every DRF
throttle: give it a shared cache (Redis, Memcached, database) when several processes serve."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from .permissions import request_key


class JobQRateThrottle(SimpleRateThrottle):
    scope = "jobq"

    def __init__(self) -> None:
        # The rate depends on the request (the key's own), so it is resolved in allow_request.
        self.rate: str | None = None
        self.num_requests = self.duration = None  # type: ignore[assignment]

    def allow_request(self, request: Request, view: Any) -> bool:
        key = request_key(request)
        self.rate = (key.throttle_rate if key is not None else "") or self.get_rate()
        if not self.rate:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_rate(self) -> str | None:
        # Read per request, not at import, so a changed setting applies at once.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        key = request_key(request)
        if key is not None:
            ident = f"key-{key.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user-{request.user.pk}"
        else:
            ident = self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}
