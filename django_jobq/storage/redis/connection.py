"""Redis clients: from a django-redis cache alias when the project has one, else from a URL."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigurationError

# Blocking calls (BLPOP) wait at most this long per call, so a socket timeout above it never
# fires on a healthy connection and a dead one is noticed within one interval.
MAX_BLOCK_SECONDS = 5.0


def client_from_url(url: str, **options: Any) -> Any:
    import redis
    from redis.backoff import ExponentialWithJitterBackoff
    from redis.exceptions import ConnectionError, TimeoutError
    from redis.retry import Retry

    options.setdefault("socket_timeout", MAX_BLOCK_SECONDS + 10)
    options.setdefault("socket_connect_timeout", 5)
    options.setdefault("socket_keepalive", True)
    options.setdefault("health_check_interval", 30)
    options.setdefault("retry", Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), 3))
    options.setdefault("retry_on_error", [ConnectionError, TimeoutError])
    try:
        return redis.Redis.from_url(url, **options)
    except ValueError as exc:
        raise ConfigurationError(f"invalid Redis URL {url!r}: {exc}") from exc


def client_from_cache_alias(alias: str) -> Any:
    try:
        from django_redis import get_redis_connection
    except ImportError as exc:  # pragma: no cover - django-redis is a dependency
        raise ConfigurationError("REDIS_CACHE_ALIAS needs django-redis installed") from exc
    try:
        return get_redis_connection(alias)
    except Exception as exc:  # django-redis raises NotImplementedError / KeyError variants
        raise ConfigurationError(
            f"cache alias {alias!r} is not a django-redis cache: {exc}"
        ) from exc
