"""Redis clients and the blocking commands read with their own deadline: one server, a
Redis Cluster, and the choice between them for a URL or client of either kind (a django-redis
cache alias is taken as it is).

On a cluster every key of a queue carries the hash tag ``{prefix:queue}`` (``keys.py``), so
each script call runs in one slot and redis-py's ``RedisCluster`` routes it by its first key;
what needs this module are the commands that name keys of *several* queues at once, which a
cluster refuses as CROSSSLOT, made of per-slot steps here: a worker serving queues of
different slots waits on each slot's wake keys at once (one blocking BLPOP per slot, each on
its own node connection, in threads; the first to answer ends the others with ``CLIENT
UNBLOCK``, so a wait never polls and never outlives its wake-up), and the mirror's reads over
many queues' streams block the same way (``cluster.py``: the storage's cluster variant).
A blocking command goes to the node that owns its key's slot. When the slot moved (MOVED/ASK
after a reshard) or the node went away (a failover), the topology is refreshed and the
command sent once more to the new owner; a second failure is the caller's
(``StorageUnavailable``).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

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


CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
# URL query options passed on to every node connection, and how to read them.
_URL_OPTIONS: dict[str, Callable[[str], Any]] = {
    "socket_timeout": float,
    "socket_connect_timeout": float,
    "health_check_interval": int,
    "client_name": str,
}


def is_cluster_url(url: object) -> bool:
    return isinstance(url, str) and url.startswith(CLUSTER_SCHEMES)


def is_cluster_client(client: Any) -> bool:
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def cluster_client_from_url(url: str, **options: Any) -> Any:
    """A ``RedisCluster`` from ``redis+cluster://[user:password@]host:port[,host:port...]``
    (``rediss+cluster://`` for TLS). Several seed nodes let the client start while one of them
    is down; it learns the rest of the topology from any seed. A cluster has database 0 only,
    so a path naming another database is refused rather than silently ignored."""
    from redis.cluster import ClusterNode, RedisCluster
    from redis.exceptions import ConnectionError, RedisClusterException
    from redis.retry import Retry

    tls = url.startswith("rediss+")
    rest = url.split("://", 1)[1]
    netloc, _, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    if "?" in netloc:
        netloc, _, query = netloc.partition("?")
    if path not in ("", "0"):
        raise ConfigurationError(f"invalid Redis URL {url!r}: a cluster has only database 0")
    auth, _, hosts = netloc.rpartition("@")
    nodes = []
    for hostport in hosts.split(","):
        host, _, port = hostport.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigurationError(
                f"invalid Redis URL {url!r}: {hostport!r} is not host:port "
                "(a cluster URL lists its seed nodes as host:port,host:port)"
            )
        nodes.append(ClusterNode(host, int(port)))
    if auth:
        user, _, password = auth.partition(":")
        if user:
            options.setdefault("username", unquote(user))
        if password:
            options.setdefault("password", unquote(password))
    for name, value in parse_qsl(query):
        if name not in _URL_OPTIONS:
            raise ConfigurationError(f"invalid Redis URL {url!r}: unknown option {name!r}")
        try:
            options.setdefault(name, _URL_OPTIONS[name](value))
        except ValueError as exc:
            raise ConfigurationError(f"invalid Redis URL {url!r}: {name}: {exc}") from exc
    if tls:
        options.setdefault("ssl", True)
    options.setdefault("socket_timeout", COMMAND_TIMEOUT)
    options.setdefault("socket_connect_timeout", COMMAND_TIMEOUT)
    options.setdefault("socket_keepalive", True)
    # A failover takes the cluster's node timeout plus an election: retry a refused
    # connection for about as long, re-reading the topology between tries (redis-py does).
    options.setdefault("retry", Retry(_backoff(), 6, supported_errors=(ConnectionError,)))
    try:
        return RedisCluster(startup_nodes=nodes, **options)
    except RedisClusterException as exc:
        raise ConfigurationError(f"Redis Cluster at {url!r} is not usable: {exc}") from exc
    except ConnectionError:
        raise


def check_cluster_url(url: str) -> str | None:
    """The problem with a cluster URL's form (no connection is made), or None."""
    rest = url.split("://", 1)[1]
    netloc = rest.partition("/")[0].partition("?")[0].rpartition("@")[2]
    for hostport in netloc.split(","):
        host, _, port = hostport.strip().rpartition(":")
        if not host or not port.isdigit():
            return f"{hostport!r} is not host:port"
    path = urlsplit("redis://x/" + rest.partition("/")[2]).path.strip("/")
    if path not in ("", "0"):
        return "a cluster has only database 0"
    return None


def key_slot(key: str) -> int:
    """The cluster slot of ``key`` (CRC16 of its hash tag, mod 16384), as Redis computes it."""
    from redis.crc import key_slot as crc_slot

    return int(crc_slot(key.encode()))


def node_client(client: Any, key: str) -> Any:
    """The plain ``Redis`` client of the master that owns ``key``'s slot."""
    node = client.get_node_from_key(key)
    conn = client.get_redis_connection(node)
    return conn


def refresh_topology(client: Any) -> None:
    """Re-read the slot map (after MOVED/ASK or a dead node). A failure is left to the retried
    command, which reports the cluster unreachable if it still is."""
    from redis.exceptions import RedisError

    try:
        client.nodes_manager.initialize()
    except RedisError:
        pass


def cluster_blocking(client: Any, key: str, wait: float, *args: Any, **options: Any) -> Any:
    """One blocking command on the node owning ``key``; once more on the new owner when the
    slot moved or its node is gone. While the slot is being migrated (ASK, TRYAGAIN: its keys
    are split between two nodes) the reply is empty, as if the wait had timed out at once:
    every caller re-reads after a wait, and a migration lasts seconds."""
    from redis.exceptions import AskError, ConnectionError, MovedError, TimeoutError, TryAgainError

    for attempt in (1, 2):
        try:
            return single_node_blocking(node_client(client, key), wait, *args, **options)
        except (AskError, TryAgainError):
            return None
        except (MovedError, ConnectionError, TimeoutError):
            refresh_topology(client)
            if attempt == 2:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


class _Waits:
    """Blocking commands on several nodes at once, ended together: the first to answer wakes
    the others with ``CLIENT UNBLOCK`` (their reply is then empty, so nothing they would have
    taken is lost), and every reply that did arrive is returned."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool

    def run(
        self, client: Any, wait: float, commands: Sequence[tuple[str, tuple[Any, ...]]]
    ) -> list[Any]:
        first = threading.Event()
        lock = threading.Lock()
        blocked: dict[int, tuple[Any, int]] = {}  # index -> (node client, CLIENT ID)
        finished: set[int] = set()

        def one(index: int, key: str, args: tuple[Any, ...]) -> Any:
            from redis.exceptions import AskError, ConnectionError, MovedError, TryAgainError

            try:
                node = node_client(client, key)
                conn = pooled_connection(node.connection_pool, args[0])
                try:
                    conn.send_command("CLIENT", "ID")
                    client_id = int(conn.read_response())
                    with lock:
                        if first.is_set():
                            return None  # woken before it blocked: nothing to wait for
                        blocked[index] = (node, client_id)
                    conn.send_command(*args)
                    response = _read(conn, wait + COMMAND_TIMEOUT)
                    callback = node.response_callbacks.get(args[0])
                    return callback(response) if callback and response else response
                except BaseException:
                    conn.disconnect()
                    raise
                finally:
                    node.connection_pool.release(conn)
            except (MovedError, ConnectionError):
                refresh_topology(client)  # the caller re-claims, finding the new owner
                return None
            except (AskError, TryAgainError):  # a migration: the caller re-claims
                return None
            finally:
                with lock:
                    finished.add(index)
                first.set()

        futures = [self.pool.submit(one, i, key, args) for i, (key, args) in enumerate(commands)]
        first.wait(wait + 2 * COMMAND_TIMEOUT)
        with lock:
            first.set()
        # CLIENT UNBLOCK misses a command not yet read by its server: repeat until every
        # wait has ended (each try is one round trip; a blocked command ends at the first).
        while True:
            with lock:
                pending = [(i, blocked[i]) for i in blocked if i not in finished]
            if not pending:
                break
            for _, (node, client_id) in pending:
                with contextlib.suppress(Exception):  # that wait then ends by its own timeout
                    node.execute_command("CLIENT", "UNBLOCK", client_id)
            for i, _ in pending:
                with contextlib.suppress(Exception):  # its result is read below
                    futures[i].result(timeout=0.05)
        return [f.result() for f in futures]


def _read(conn: Any, timeout: float) -> Any:
    return _read_response(conn, timeout)


URL_SCHEMES = ("redis://", "rediss://", "unix://", *CLUSTER_SCHEMES)


def client_from_url(url: str, **options: Any) -> Any:
    """A client of the server at ``url``; a ``redis+cluster://`` URL gives a ``RedisCluster``."""
    if isinstance(url, str) and url.startswith(CLUSTER_SCHEMES):
        return cluster_client_from_url(url, **options)
    return node_client_from_url(url, **options)


def url_problem(url: object) -> str | None:
    """What is wrong with a ``REDIS_URL`` (None: nothing), said before any connection."""
    if not isinstance(url, str) or not url.startswith(URL_SCHEMES):
        return f"{url!r} is not a redis://, rediss://, unix:// or redis+cluster:// URL"
    if url.startswith(CLUSTER_SCHEMES) and (problem := check_cluster_url(url)):
        return f"{url!r}: {problem}"
    return None


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


def blocking_command(client: Any, wait: float, *args: Any, **options: Any) -> Any:
    """Run one blocking command that may take ``wait`` seconds to answer (BLPOP, XREAD BLOCK),
    reading its reply with a timeout of ``wait`` plus ``COMMAND_TIMEOUT``: the client's socket
    timeout is sized for ordinary commands, and a partitioned server must not hold a caller
    much past its own deadline either. A stale pooled connection (refused, reset) is replaced
    once, as the client's retry would for an ordinary command. On a Redis Cluster the command
    goes to the node owning its (first) key, see ``cluster.cluster_blocking``."""
    if not hasattr(client, "connection_pool"):  # a RedisCluster: one pool per node
        return cluster_blocking(client, _first_key(args), wait, *args, **options)
    return single_node_blocking(client, wait, *args, **options)


def _first_key(args: tuple[Any, ...]) -> str:
    """The first key of BLPOP, XREAD or XREADGROUP (the commands ``blocking_command`` runs)."""
    if args[0] == "BLPOP":
        return str(args[1])
    return str(args[list(args).index("STREAMS") + 1])
