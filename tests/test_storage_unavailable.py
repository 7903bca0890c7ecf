"""An unreachable or full store raises ``django_jobq.StorageUnavailable`` / ``StorageFull``
from every backend, with the client's own error as ``__cause__``; never redis-py's or the
database driver's exceptions. Real servers: a private redis-server that is stopped, one on a
port nothing listens on, one with a tiny ``maxmemory``; a PostgreSQL connection terminated
by the server."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from django.db import (
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
    connections,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ResponseError

import django_jobq
from django_jobq.errors import JobQError, StorageFull, StorageUnavailable
from django_jobq.queue import Queue
from django_jobq.states import JobState
from django_jobq.storage.database import DatabaseStorage
from django_jobq.storage.redis.connection import client_from_url
from django_jobq.storage.redis.storage import RedisStorage

from .helpers import running_workers, wait_until
from .private_redis import PrivateRedis, closed_port, keep_full

Q = "outage-q"


def test_the_errors_are_exported_and_one_is_a_kind_of_the_other():
    assert django_jobq.StorageUnavailable is StorageUnavailable
    assert django_jobq.StorageFull is StorageFull
    assert issubclass(StorageFull, StorageUnavailable)
    assert issubclass(StorageUnavailable, JobQError)


# -- Redis ----------------------------------------------------------------------------------------


@pytest.fixture
def private_redis(tmp_path: Path):
    server = PrivateRedis(tmp_path / "redis")
    yield server
    server.stop()


def queue_on(url: str) -> Queue:
    client = client_from_url(url, socket_connect_timeout=0.2)
    return Queue(Q, storage=RedisStorage(client, prefix="outage"))


def assert_unavailable(excinfo, cause: type[BaseException] = RedisConnectionError) -> None:
    assert type(excinfo.value) is StorageUnavailable
    assert isinstance(excinfo.value.__cause__, cause)


@pytest.mark.redis
def test_a_redis_nothing_listens_on_raises_storage_unavailable_everywhere():
    q = queue_on(f"redis://127.0.0.1:{closed_port()}/0")
    with pytest.raises(StorageUnavailable) as excinfo:
        q.enqueue("a", {"n": 1})
    assert_unavailable(excinfo)
    with pytest.raises(StorageUnavailable) as excinfo:
        q.get_status("a")
    assert_unavailable(excinfo)
    with pytest.raises(StorageUnavailable) as excinfo:
        q.enqueue_and_wait("a", {"n": 1}, timeout=1)
    assert_unavailable(excinfo)
    with pytest.raises(StorageUnavailable):
        q.enqueue_many([("b", 1), ("c", 2)])


@pytest.mark.redis
def test_a_redis_that_stopped_raises_storage_unavailable(private_redis):
    q = queue_on(private_redis.url)
    assert q.enqueue("a", {"n": 1}).state is JobState.QUEUED
    private_redis.stop()
    for call in (lambda: q.enqueue("b", 1), lambda: q.get_status("a"),
                 lambda: q.enqueue_and_wait("c", 1, timeout=1), q.counts):  # fmt: skip
        with pytest.raises(StorageUnavailable) as excinfo:
            call()
        assert_unavailable(excinfo)


@pytest.fixture
def full_redis(tmp_path: Path):
    server = PrivateRedis(tmp_path / "full", "--maxmemory", "3mb", "--maxmemory-policy",
                          "noeviction")  # fmt: skip
    yield server
    server.stop()


def fill(q: Queue) -> int:
    """Enqueue 50 kB jobs until Redis refuses one; returns how many it took. Then keeps it
    full (``keep_full``)."""
    blob = "x" * 50_000
    for n in range(1000):
        try:
            q.enqueue(f"fill-{n}", {"blob": blob})
        except StorageFull:
            keep_full(q.storage.client)
            return n
    raise AssertionError("Redis never refused a write at its maxmemory")


@pytest.mark.redis
def test_a_full_redis_raises_storage_full_and_keeps_every_record_whole(full_redis):
    q = queue_on(full_redis.url)
    stored = fill(q)
    with pytest.raises(StorageFull) as excinfo:
        q.enqueue("one-more", {"blob": "y" * 50_000})
    assert isinstance(excinfo.value, StorageUnavailable)  # one except clause catches both
    assert isinstance(excinfo.value.__cause__, OutOfMemoryError)
    with pytest.raises(StorageFull):
        q.enqueue_and_wait("waited", {"blob": "y" * 50_000}, timeout=1)
    # Reads still work, and nothing of the refused writes is there.
    assert q.get_status("one-more") is None and q.get_status("waited") is None
    assert q.counts()[JobState.QUEUED] == stored


@pytest.mark.redis
def test_other_redis_errors_are_not_called_unavailable(private_redis):
    storage = RedisStorage(private_redis.client, prefix="outage")
    assert storage.unavailable(ResponseError("WRONGTYPE Operation against a key")) is None
    assert storage.unavailable(ValueError("bad")) is None


@pytest.mark.redis
def test_the_worker_keeps_running_through_a_redis_outage(private_redis, tmp_path):
    """The worker catches the new error like the old ones: it backs off and serves again
    once Redis is back (on the same port, empty)."""
    storage = RedisStorage(client_from_url(private_redis.url), prefix="outage")
    q = Queue("tests-echo", storage=storage)
    with running_workers(storage) as start:
        worker = start(["tests-echo"])
        assert q.enqueue_and_wait("before", {"n": 1}, timeout=10)["echo"] == {"n": 1}
        port = private_redis.port
        private_redis.stop()
        with pytest.raises(StorageUnavailable):
            q.get_status("before")
        restarted = PrivateRedis.on_port(tmp_path / "again", port)
        try:
            assert not worker.stopped.is_set()
            assert wait_until(lambda: _answers(q), 10)
            assert q.enqueue_and_wait("after", {"n": 2}, timeout=10)["echo"] == {"n": 2}
        finally:
            restarted.stop()


def _answers(q: Queue) -> bool:
    try:
        q.counts()
    except StorageUnavailable:
        return False
    return True


# -- database backends ----------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(databases=["pg"], transaction=True)
def test_a_postgresql_connection_the_server_ended_raises_storage_unavailable():
    q = Queue(Q, storage=DatabaseStorage("pg"))
    q.enqueue("a", {"n": 1})
    pid = connections["pg"].connection.info.backend_pid
    params = connections["pg"].get_connection_params()
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    try:
        with pytest.raises(StorageUnavailable) as excinfo:
            q.get_status("a")
        assert isinstance(excinfo.value.__cause__, OperationalError | InterfaceError)
    finally:
        connections["pg"].close()
    assert q.get_status("a").state is JobState.QUEUED  # a new connection: all is well again


@pytest.mark.parametrize(
    ("error", "unavailable"),
    [
        (OperationalError("database is locked"), True),
        (OperationalError("server closed the connection unexpectedly"), True),
        (InterfaceError("connection already closed"), True),
        (OperationalError("no such table: django_jobq_job"), False),
        (IntegrityError("UNIQUE constraint failed"), False),
        (ProgrammingError("syntax error at or near"), False),
        (ValueError("not a database error"), False),
    ],
)
def test_database_errors_that_mean_unavailable(error, unavailable):
    translated = DatabaseStorage("default").unavailable(error)
    assert (translated is not None) is unavailable
    if unavailable:
        assert type(translated) is StorageUnavailable
