"""Authentication by API key: ``Authorization: Api-Key jobq_<prefix>_<secret>``.

It sits beside the project's own DRF authentication classes (session, token, ...): a request
authenticated another way is a Django user, checked against Django permissions instead."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from ..models import ApiKey
from .keys import find_key, touch

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


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, ApiKey] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].decode(errors="replace").lower() != KEYWORD.lower():
            return None  # not ours: let the next authentication class try
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Api-Key header needs exactly one key")
        key = find_key(parts[1].decode(errors="replace"))
        if key is None:
            raise exceptions.AuthenticationFailed("unknown or revoked API key")
        touch(key)
        return ApiKeyUser(key), key

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (with WWW-Authenticate) rather than 403 to a missing key.
        return KEYWORD
