"""Redis clients: from a django-redis cache alias when the project has one, else from a URL;
a ``redis+cluster://`` URL or a ``RedisCluster`` client takes the cluster's path
(``cluster.py``), any other the single server's (``node.py``)."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigurationError
from .cluster import CLUSTER_SCHEMES, check_cluster_url, cluster_blocking, cluster_client_from_url
from .node import node_client_from_url, single_node_blocking

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
