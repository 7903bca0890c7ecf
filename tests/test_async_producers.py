"""The async producer API (``Queue.aenqueue``, ``aenqueue_and_wait``, ``aget_status``,
``aget_result`` and the task functions' ``aenqueue*``): same outcomes as the sync API on every
backend; on Redis the waits hold no thread; and under a real ASGI server (uvicorn), an async
view enqueues a task and gets its value."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import urllib.request

import pytest
from asgiref.sync import async_to_sync
from django.db import connections

from django_jobq import EnqueueOutcome, JobFailed, JobState, Timeout
from django_jobq.errors import InvalidPayload
from django_jobq.queue import Queue
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker

from .helpers import PROCESS_START, ROOT, start_server, wait_until
from .jobsapp.jobs import proc_add
from .test_tasks import REG, add

Q = "tasks-async"


def double(job):
    if job.payload == "fail":
        raise ValueError("asked to fail")
    return {"double": job.payload * 2}


@pytest.fixture
def worker(live_storage):
    registry = HandlerRegistry()
    registry.register(Q, double)
    for t in REG.tasks():
        registry.register_task(t)
    started = []

    def start() -> Worker:
        w = Worker([Q], storage=live_storage, handlers=registry, reap_interval=0, grace=1)
        w.start()
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop(hurry=True)
        assert w.stopped.wait(30)


def test_the_async_api_gives_the_sync_outcomes(live_storage, worker):
    queue = Queue(Q, storage=live_storage)

    async def main():
        first = await queue.aenqueue("a1", 21, max_attempts=1)
        again = await queue.aenqueue("a1", 5)
        assert (first.outcome, again.outcome) == (EnqueueOutcome.QUEUED, EnqueueOutcome.DUPLICATE)
        assert (await queue.aget_status("a1")).state is JobState.QUEUED
        assert await queue.aget_status("nope") is None and await queue.aget_result("nope") is None
        with pytest.raises(InvalidPayload):
            await queue.aenqueue("bad", {1, 2})
        with pytest.raises(Timeout):  # nothing serves the queue yet
            await queue.aenqueue_and_wait("early", 1, timeout=0.2)
        worker()
        assert await queue.aenqueue_and_wait("a2", 4, timeout=30) == {"double": 8}
        assert (await queue.aget_result("a2")).value == {"double": 8}
        with pytest.raises(JobFailed) as failed:
            await queue.aenqueue_and_wait("a3", "fail", timeout=30, max_attempts=1)
        assert failed.value.error["message"] == "asked to fail"
        assert await add.using(queue=queue).aenqueue_and_wait(2, 3, wait_timeout=30) == 5
        queued = await add.using(queue=queue).aenqueue(7, job_id="t-async")
        assert queued.job_id == "t-async"

    # As an ASGI server runs it: thread-sensitive calls on this (the main) thread, whose
    # database connections the test run closes.
    async_to_sync(main)()
    assert wait_until(lambda: queue.get_status("t-async").state is JobState.COMPLETED)
    assert queue.get_status("bad") is None  # refused before anything was stored
    assert queue.get_result("a1").value == {"double": 42}


@pytest.mark.redis
def test_redis_waits_hold_no_thread_each(redis_client, redis_prefix):
    from django_jobq.storage.redis.storage import RedisStorage

    storage = RedisStorage(redis_client, prefix=redis_prefix)
    queue = Queue(Q, storage=storage)
    registry = HandlerRegistry()
    registry.register(Q, double)
    runner = Worker([Q], storage=storage, handlers=registry, reap_interval=0, grace=1)

    async def main():
        before = threading.active_count()
        waits = [asyncio.create_task(queue.aenqueue_and_wait(f"w{i}", i, timeout=60))
                 for i in range(40)]  # fmt: skip
        while storage.counts(Q)[JobState.QUEUED] < 40:
            await asyncio.sleep(0.01)
        # 40 callers are waiting now; a thread per wait would show here.
        assert threading.active_count() <= before + 1
        runner.start()
        return await asyncio.gather(*waits)

    try:
        assert asyncio.run(main()) == [{"double": 2 * i} for i in range(40)]
    finally:
        runner.stop(hurry=True)
        assert runner.stopped.wait(30)


@pytest.fixture
def asgi_server(backend, request, tmp_path, live_storage):
    """uvicorn serving tests.asgi on this test's storage (a port of the range given to this
    suite's helpers), and a worker serving the tasks' queue."""
    if backend == "memory":
        pytest.skip("the memory backend lives in one process")
    if backend == "redis":
        env = {"JOBQ_TEST_PREFIX": request.getfixturevalue("redis_prefix")}
    elif backend == "redis-cluster":  # the server takes the thread path there (aio.native)
        env = {"JOBQ_TEST_REDIS_URL": request.getfixturevalue("redis_cluster").url,
               "JOBQ_TEST_PREFIX": request.getfixturevalue("cluster_prefix")}  # fmt: skip
    else:
        env = {
            "JOBQ_TEST_BACKEND": "database",
            "JOBQ_TEST_DB_ALIAS": {"sqlite": "default", "postgres": "pg"}[backend],
            "JOBQ_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
            "JOBQ_TEST_PG_DB": connections["pg"].settings_dict["NAME"],
        }
    import os

    logs = []

    def start(port: int) -> subprocess.Popen:
        log = (tmp_path / f"uvicorn-{port}.log").open("w")
        logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "tests.asgi:application", "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env}, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        proc.log_path = log.name  # type: ignore[attr-defined]
        return proc

    server, port = start_server(start, "uvicorn")
    registry = HandlerRegistry()
    registry.register_task(proc_add)
    runner = Worker(["tests-tasks"], storage=live_storage, handlers=registry, reap_interval=0,
                    grace=1)  # fmt: skip
    runner.start()
    yield f"http://127.0.0.1:{port}", Queue("tests-tasks", storage=live_storage)
    runner.stop(hurry=True)
    runner.stopped.wait(30)
    server.terminate()
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)
    for log in logs:
        log.close()


def get(url):
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - loopback test
        return json.loads(response.read())


def reachable(url):
    try:
        get(url)
    except OSError:
        return False
    return True


def test_an_async_view_under_uvicorn_enqueues_a_task_and_gets_its_value(asgi_server):
    url, queue = asgi_server
    assert wait_until(lambda: reachable(url + "/async/enqueue/probe/"), PROCESS_START)
    assert get(url + "/async/add/20/22/") == {"sum": 42}
    body = get(url + "/async/enqueue/asgi-1/")
    assert body["outcome"] == "queued" and body["state"] in ("queued", "active", "completed")
    assert wait_until(lambda: queue.get_status("asgi-1").state is JobState.COMPLETED)
    assert queue.get_result("asgi-1").value["sum"] == 3


@pytest.mark.redis
def test_an_async_client_belongs_to_its_storage_and_goes_with_it(redis_client, redis_prefix):
    """The async client of a storage that was let go is dropped, and a later storage gets a
    client of its own: keyed by ``id(storage)``, entries were never dropped and a new storage
    that reused a collected one's id was handed that storage's client (its server and
    database, not the new one's)."""
    import gc

    from django_jobq.storage.redis import aio
    from django_jobq.storage.redis.connection import client_from_url
    from django_jobq.storage.redis.storage import RedisStorage

    url = redis_client.connection_pool.connection_kwargs
    other_db = client_from_url(f"redis://{url['host']}:{url['port']}/{(url['db'] + 1) % 16}")

    async def main():
        first = RedisStorage(redis_client, prefix=redis_prefix)
        assert await Queue(Q, storage=first).aenqueue("a1", 1) is not None
        per_loop = aio._CLIENTS[asyncio.get_running_loop()]
        assert list(per_loop.keys()) == [first]
        del first
        gc.collect()
        assert len(per_loop) == 0  # the int-keyed map kept it for the loop's lifetime
        second = RedisStorage(other_db, prefix=redis_prefix)
        assert await Queue(Q, storage=second).aenqueue("b1", 1) is not None
        client = per_loop[second]
        assert client.connection_pool.connection_kwargs["db"] == (url["db"] + 1) % 16
        await client.aclose()

    try:
        asyncio.run(main())
    finally:
        keys = list(other_db.scan_iter(match="{" + redis_prefix + "*", count=1000))
        if keys:
            other_db.delete(*keys)
        other_db.close()
