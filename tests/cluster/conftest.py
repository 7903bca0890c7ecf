"""Fixtures of the Redis Cluster tests: a storage on the session's local cluster, and queue
names chosen so that their slots are owned by different masters."""

from __future__ import annotations

import pytest

from django_jobq.storage.redis.storage import RedisStorage
from tests.contract.conftest import wakeups_only  # noqa: F401 - a fixture used here too

pytestmark = [pytest.mark.redis_cluster]


@pytest.fixture
def cstorage(cluster_client, cluster_prefix) -> RedisStorage:
    """A ``RedisStorage`` on the cluster client: it is the cluster variant without being told."""
    storage = RedisStorage(cluster_client, prefix=cluster_prefix)
    yield storage
    storage._pool.shutdown(wait=False, cancel_futures=True)  # type: ignore[attr-defined]


def spread_queues(cluster, storage, n: int, stem: str = "cq") -> list[str]:
    """``n`` queue names whose slots are owned by ``n`` different masters (n <= 3)."""
    chosen: dict[int, str] = {}
    for i in range(200):
        name = f"{stem}{i}"
        master = cluster.master_of(storage.keys(name).wake)
        chosen.setdefault(master, name)
        if len(chosen) == n:
            return list(chosen.values())
    raise AssertionError(f"no {n} queues on distinct masters among 200 names")


def blocked_clients(cluster) -> dict[int, int]:
    """Each master's number of clients blocked in BLPOP/XREADGROUP (INFO clients)."""
    counts = {}
    for port in cluster.masters():
        info = cluster.node_cmd(port, "INFO", "clients")
        counts[port] = int(info.split("blocked_clients:")[1].split()[0])
    return counts
