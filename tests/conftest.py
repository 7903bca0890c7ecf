"""Shared fixtures: a controllable clock and every storage backend, on the real servers.

A test that needs Redis fails (never skips) when Redis is not answering: CI must not go green
on a machine where the storage tests did not run.
"""

from __future__ import annotations

import gc
import os
import time
import uuid

import pytest
from django.conf import settings

from django_jobq.queue import Queue
from django_jobq.storage.database import DatabaseStorage
from django_jobq.storage.memory import MemoryStorage
from django_jobq.storage.redis.cluster import ClusterRedisStorage
from django_jobq.storage.redis.connection import client_from_url
from django_jobq.storage.redis.storage import RedisStorage
from django_jobq.tasks.registry import handler_name

from .redis_cluster import ClusterUnsupported, LocalCluster

# redis-cluster: a local Redis Cluster of six redis-server processes (tests/redis_cluster.py),
# started once per xdist worker when a test first asks for it.
BACKENDS = os.environ.get("JOBQ_TEST_BACKENDS", "memory,redis,redis-cluster,sqlite,postgres").split(
    ","
)
# Database backends and the Django database alias (tests/settings.py) each one runs on.
DB_ALIASES = {"sqlite": "default", "postgres": "pg"}
MARKS = {"redis": "redis", "redis-cluster": "redis_cluster", "postgres": "postgres"}


class FakeClock:
    """Epoch-ms clock that only moves when told to: backoff and lease tests need no sleeps."""

    def __init__(self, start_ms: int | None = None) -> None:
        self.now = start_ms if start_ms is not None else int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup):
    """pytest-django's, plus: before the test databases are dropped, every database
    storage still alive stops its wake-up listener. An open PostgreSQL LISTEN session makes
    DROP DATABASE refuse ("being accessed by other users", a teardown warning). A storage
    dropped unclosed (a JOBQ setting change drops the process's) now ends its listener by
    itself once collected (tests/test_dropped_storage.py); this closes the ones something
    still holds at the end of the session."""
    yield
    gc.collect()
    for obj in gc.get_objects():
        try:
            alive = isinstance(obj, DatabaseStorage)
        except ReferenceError:  # a weak proxy whose object is gone
            continue
        if alive:
            obj.close()


@pytest.fixture(scope="session")
def redis_client():
    # The product's 1 s command timeout makes a stalled server an error quickly; on a test
    # machine with both cores busy, one bulk script or a 2,000-entry stream read can take
    # longer than that without anything being wrong. The tests' own client waits longer
    # (a test decides on events, not on speed); blocking calls add their own wait as usual.
    client = client_from_url(settings.REDIS_URL, socket_timeout=30)
    try:
        client.ping()
    except Exception as exc:  # pragma: no cover - environment problem, made loud on purpose
        pytest.fail(f"Redis is not answering at {settings.REDIS_URL}: {exc}", pytrace=False)
    yield client
    client.close()


@pytest.fixture
def redis_prefix(redis_client):
    """A key prefix of this test's own; every key under it is deleted afterwards."""
    prefix = f"jobqtest-{uuid.uuid4().hex[:10]}"
    yield prefix
    keys = list(redis_client.scan_iter(match="{" + prefix + "*", count=1000))
    if keys:
        redis_client.delete(*keys)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A local Redis Cluster (3 masters, 3 replicas) for the whole session, stopped by PID."""
    try:
        cluster = LocalCluster(tmp_path_factory.mktemp("redis-cluster"))
    except ClusterUnsupported as exc:
        pytest.skip(f"no Redis Cluster tests: {exc}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def cluster_client(redis_cluster):
    client = client_from_url(redis_cluster.url)
    yield client
    client.close()


@pytest.fixture
def cluster_prefix(cluster_client):
    """A key prefix of this test's own on the cluster; every key under it is deleted after."""
    prefix = f"jobqtest-{uuid.uuid4().hex[:10]}"
    yield prefix
    for key in list(cluster_client.scan_iter(match="{" + prefix + "*", count=1000)):
        cluster_client.delete(key)


def make_storage(kind: str, request, clock=None):
    if kind == "memory":
        return MemoryStorage(clock=clock)
    if kind in DB_ALIASES:
        # The handler names of the rows, as the storage JOBQ builds gets them (backend.py).
        db_storage = DatabaseStorage(DB_ALIASES[kind], clock=clock, handler_names=handler_name)
        # Connections of finished threads are only closed when collected; PostgreSQL refuses to
        # drop the test database while any is open.
        request.addfinalizer(gc.collect)
        request.addfinalizer(db_storage.close)
        return db_storage
    if kind == "redis-cluster":
        client = request.getfixturevalue("cluster_client")
        prefix = request.getfixturevalue("cluster_prefix")
        return ClusterRedisStorage(client, prefix=prefix, clock=clock)
    client = request.getfixturevalue("redis_client")
    prefix = request.getfixturevalue("redis_prefix")
    return RedisStorage(client, prefix=prefix, clock=clock)


# Tests that share something a parallel run must not split (`pytest -n N --dist loadgroup`): the
# fault suite's private Redis port range and its fixed journal-ledger database, and one JVM for
# every Spark test (a second SparkSession per xdist worker would cost seconds and a gigabyte).
XDIST_GROUPS = (("tests/chaos/", "chaos"), ("tests/test_spark", "spark"))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the group marks
def pytest_collection_modifyitems(items):
    """A test run on a database backend gets that database, in transactional mode: workers use
    connections of their own threads, which must see committed rows (the per-test transaction of
    plain ``django_db`` would hide them); tables are flushed after each test."""
    for item in items:
        for prefix, group in XDIST_GROUPS:
            if item.nodeid.startswith(prefix):
                item.add_marker(pytest.mark.xdist_group(group))
        params = getattr(item, "callspec", None) and item.callspec.params or {}
        # `backend` names a storage backend; `db_alias` (mirror tests) a database directly.
        alias = DB_ALIASES.get(params.get("backend", "")) or params.get("db_alias")
        if alias:
            item.add_marker(pytest.mark.django_db(databases=[alias], transaction=True))


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    mark = MARKS.get(request.param)
    if mark:
        request.applymarker(getattr(pytest.mark, mark))
    return request.param


@pytest.fixture
def storage(backend, request, clock):
    """Each backend with the fake clock injected (the contract is clock-driven)."""
    return make_storage(backend, request, clock)


@pytest.fixture
def live_storage(backend, request):
    """Each backend on its real clock (Redis: server TIME), for worker and timing tests."""
    return make_storage(backend, request)


@pytest.fixture
def queue(live_storage) -> Queue:
    return Queue("tests-echo", storage=live_storage)


@pytest.fixture(scope="session")
def spark():
    """One embedded SparkSession for every Spark test of the run (starting one costs seconds):
    two cores, few shuffle partitions, no UI, loopback only."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from django_jobq.contrib.spark import get_spark

    session = get_spark("local[2]", app_name="jobq-tests", shuffle_partitions=4)
    yield session
    session.stop()
