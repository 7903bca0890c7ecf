"""A django-redis connection factory for a Redis Cluster, so that ``REDIS_CACHE_ALIAS`` can name
a cache on the cluster and django_jobq share its client::

    CACHES = {"jobs": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis+cluster://10.0.0.1:6379",
        "OPTIONS": {"CONNECTION_FACTORY":
                    "django_jobq.storage.redis.cluster_cache.ClusterConnectionFactory"},
    }}
    JOBQ = {"REDIS_CACHE_ALIAS": "jobs"}

django-redis builds a ``Redis`` over one connection pool; a cluster needs a ``RedisCluster``
(a pool per node), built here from a ``redis+cluster://`` URL as ``JOBQ['REDIS_URL']`` accepts,
with one seed node: django-redis splits ``LOCATION`` at commas (into a primary and read
replicas), so a list of seeds cannot be written there; the client learns every other node from
the seed. One client per URL and process, as django-redis keeps one pool per URL. The cache's
own multi-key calls (``get_many``/``set_many``) span slots and are the cache's concern: keep
such a cache for django_jobq, or use keys with a common hash tag.
"""

from __future__ import annotations

import threading
from typing import Any

from django_redis.pool import ConnectionFactory

from ...errors import ConfigurationError
from .connection import cluster_client_from_url, is_cluster_url

_clients: dict[str, Any] = {}
_lock = threading.Lock()


class ClusterConnectionFactory(ConnectionFactory):
    def connect(self, url: str) -> Any:
        if not is_cluster_url(url):
            raise ConfigurationError(
                f"cache LOCATION {url!r}: ClusterConnectionFactory needs one redis+cluster:// "
                "URL with a single seed node (django-redis splits LOCATION at commas)"
            )
        with _lock:
            client = _clients.get(url)
            if client is None:
                options: dict[str, Any] = {}
                for name, key in (("SOCKET_TIMEOUT", "socket_timeout"),
                                  ("SOCKET_CONNECT_TIMEOUT", "socket_connect_timeout"),
                                  ("PASSWORD", "password"), ("USERNAME", "username")):  # fmt: skip
                    if self.options.get(name) is not None:
                        options[key] = self.options[name]
                client = _clients[url] = cluster_client_from_url(url, **options)
            return client

    def disconnect(self, connection: Any) -> None:
        """django-redis closes its clients' pools on ``cache.close()`` (at the end of each
        request): the cluster client is shared by the process and stays open, as a pool does."""
