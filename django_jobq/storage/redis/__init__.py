"""The Redis backend (Redis and Redis Cluster): one Lua script per transition (``lua/``).

Both storage classes are imported here, so that ``RedisStorage(client)`` of a cluster client
finds its variant (``cluster.py``) whichever module was imported first.
"""

from .cluster import ClusterRedisStorage
from .storage import RedisStorage

__all__ = ["ClusterRedisStorage", "RedisStorage"]
