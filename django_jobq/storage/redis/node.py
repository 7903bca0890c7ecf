"""One Redis server: the client of a plain URL, and the blocking command read with its own
deadline. The cluster variants (``cluster.py``) are made of these, and ``connection.py``
chooses between the two for a client or URL of either kind."""

from __future__ import annotations

import functools
from typing import Any

from ...errors import ConfigurationError

# Blocking calls (BLPOP, XREAD BLOCK) wait at most this long per call.
MAX_BLOCK_SECONDS = 5.0
# How long an ordinary command (or a connect) may go unanswered before the storage reports
# Redis unreachable. Redis runs one command at a time, so a healthy server answers in
# milliseconds; a longer default would let one partitioned server hang every API request and
# worker step for as long (the API promises a 503 within 2 s). Blocking calls read with their
# own wait plus this (``blocking_command``). A URL's ``?socket_timeout=`` overrides it.
COMMAND_TIMEOUT = 1.0


def node_client_from_url(url: str, **options: Any) -> Any:
    """A client of the one server at ``url`` (redis://, rediss://, unix://)."""
    import redis
    from redis.exceptions import ConnectionError
    from redis.retry import Retry

    options.setdefault("socket_timeout", COMMAND_TIMEOUT)
    options.setdefault("socket_connect_timeout", COMMAND_TIMEOUT)
    options.setdefault("socket_keepalive", True)
    options.setdefault("health_check_interval", 30)
    # Retried: a refused or reset connection (the command most likely never ran, and scripts
    # are fenced or deduplicated if it did). Not retried: a timeout, which means the server is
    # not answering; four more waits would only make the caller's error four times later.
    options.setdefault(
        "retry",
        Retry(_backoff(), 3, supported_errors=(ConnectionError,)),
    )
    options.setdefault("retry_on_error", [ConnectionError])
    try:
        return redis.Redis.from_url(url, **options)
    except ValueError as exc:
        raise ConfigurationError(f"invalid Redis URL {url!r}: {exc}") from exc


def _backoff() -> Any:
    """Exponential backoff with jitter, capped at 1 s. redis-py 6 names it
    ``ExponentialWithJitterBackoff``; 5.2 (the lowest version we support) has only the
    equal-jitter variant, which differs in how much of each wait is random."""
    try:
        from redis.backoff import ExponentialWithJitterBackoff

        return ExponentialWithJitterBackoff(cap=1.0, base=0.05)
    except ImportError:
        from redis.backoff import EqualJitterBackoff

        return EqualJitterBackoff(cap=1.0, base=0.05)


def single_node_blocking(client: Any, wait: float, *args: Any, **options: Any) -> Any:
    """``blocking_command`` on a client of one server. ``raw_reply=True``: the reply as the
    parser gave it, without the client's callback (the mirror parses stream entries itself:
    the callback's dict per entry was a fifth of its stream reads)."""
    from redis.exceptions import ConnectionError

    raw = options.pop("raw_reply", False)

    pool = client.connection_pool
    for attempt in (1, 2):
        conn = pooled_connection(pool, args[0])
        try:
            conn.send_command(*args)
            response = _read_response(conn, wait + COMMAND_TIMEOUT)
            break
        except ConnectionError:
            conn.disconnect()
            if attempt == 2:
                raise
        finally:
            pool.release(conn)
    callback = None if raw else client.response_callbacks.get(args[0])
    return callback(response, **options) if callback else response


def pooled_connection(pool: Any, command: str) -> Any:
    """redis-py before 6 requires the command's name here; later versions deprecate it."""
    if _modern_client():
        return pool.get_connection()
    return pool.get_connection(command)


def _read_response(conn: Any, timeout: float) -> Any:
    """Read one reply, waiting at most ``timeout``. redis-py 8 takes the timeout itself; before
    it, wait for the reply to be readable first, then read it with the socket's own timeout."""
    if _modern_client():
        return conn.read_response(timeout=timeout)
    from redis.exceptions import TimeoutError

    if not conn.can_read(timeout=timeout):
        raise TimeoutError(f"no reply within {timeout:.1f} s")
    return conn.read_response()


@functools.cache
def _modern_client() -> bool:
    import inspect

    from redis.connection import AbstractConnection

    return "timeout" in inspect.signature(AbstractConnection.read_response).parameters
