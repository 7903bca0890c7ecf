"""Fixtures of the fault-injection suite (``-m chaos``).

Every test here runs a CI-sized load by default; ``JOBQ_CHAOS_FULL=1`` also runs the full-size
variants (marked ``slow``), the figures of which ``docs/reliability.md`` reports. Each test
appends its figures (fault, load, lost, duplicated, recovery time) as one JSON line to
``JOBQ_CHAOS_REPORT`` (default: ``chaos-report.jsonl`` in the system temp directory).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from django_jobq.queue import Queue
from django_jobq.storage.redis.connection import client_from_url
from django_jobq.storage.redis.keys import QueueKeys
from django_jobq.storage.redis.storage import RedisStorage

from .ledger import Ledger
from .proxy import FaultProxy
from .servers import PrivateRedis, Supervisor, free_port, worker_env

FULL = os.environ.get("JOBQ_CHAOS_FULL") == "1"
REPORT = Path(
    os.environ.get("JOBQ_CHAOS_REPORT", Path(tempfile.gettempdir()) / "chaos-report.jsonl")
)
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(str(item.fspath)).resolve().parent == HERE:
            item.add_marker(pytest.mark.chaos)
            item.add_marker(pytest.mark.redis)
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(
    params=[
        "ci",
        pytest.param(
            "full",
            marks=[
                pytest.mark.slow,
                pytest.mark.skipif(not FULL, reason="full-size run: set JOBQ_CHAOS_FULL=1"),
            ],
        ),
    ]
)
def scale(request) -> str:
    return request.param


def sized(scale: str, ci, full):
    return full if scale == "full" else ci


@pytest.fixture
def report(request):
    """``report(fault=..., load=..., lost=..., duplicated=..., recovery=..., **more)``."""

    def write(**figures) -> None:
        row = {"test": request.node.nodeid, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
               time.gmtime()), **figures}  # fmt: skip
        with REPORT.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print("chaos figures:", json.dumps(row))

    return write


@pytest.fixture
def ledger():
    book = Ledger()
    yield book
    book.drop()


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own on the shared test Redis; deleted afterwards."""
    name = f"jobqchaos-{uuid.uuid4().hex[:10]}"
    yield name
    client = client_from_url(settings.REDIS_URL)
    keys = list(client.scan_iter(match="{" + name + "*", count=1000))
    keys += list(client.scan_iter(match=name + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def private_redis(tmp_path):
    """Starts private redis-servers (own port in 7100-7199) with extra config arguments."""
    servers: list[PrivateRedis] = []

    def start(*extra: str) -> PrivateRedis:
        server = PrivateRedis(tmp_path / f"redis-{len(servers)}", *extra)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def fault_proxy():
    proxies: list[FaultProxy] = []

    def start(target_port: int) -> FaultProxy:
        proxy = FaultProxy(free_port(), target_port)
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def supervise(tmp_path, ledger, prefix):
    """``supervise(args, slots, redis_url=..., **env)`` starts supervised runworker processes."""
    started: list[Supervisor] = []

    def start(args: list[str], slots: int, *, redis_url: str | None = None,
              launcher: list[str] | None = None, **env: str) -> Supervisor:  # fmt: skip
        log_dir = tmp_path / f"workers-{len(started)}"
        log_dir.mkdir()
        environ = worker_env(prefix, redis_url or settings.REDIS_URL, ledger.dsn, tmp_path, **env)
        sup = Supervisor(args, environ, log_dir, slots, launcher=launcher)
        started.append(sup)
        return sup

    yield start
    for sup in started:
        sup.stop()


def storage_for(url: str, prefix: str, **client_options) -> RedisStorage:
    return RedisStorage(client_from_url(url, **client_options), prefix=prefix)


@pytest.fixture
def queue_of(prefix):
    """``queue_of(name, url=None)``: a Queue on this test's prefix (shared Redis by default)."""
    made: list[RedisStorage] = []

    def make(name: str, url: str | None = None, **client_options) -> Queue:
        if url is None:
            # The shared Redis is not the fault under test here, but other suites' scripts
            # run on it too: on a loaded CI machine one can hold it past the product's 1 s
            # command timeout, and the producer would fail a test about something else.
            client_options.setdefault("socket_timeout", 30)
        storage = storage_for(url or settings.REDIS_URL, prefix, **client_options)
        made.append(storage)
        return Queue(name, storage=storage)

    yield make
    for storage in made:
        storage.client.close()


def states(queue: Queue, job_ids: list[str]) -> dict[str, str | None]:
    """Each job's state, read in pipelined chunks (20,000 single reads would take seconds)."""
    storage = queue.storage
    assert isinstance(storage, RedisStorage)
    keys = QueueKeys.for_queue(storage.prefix, queue.name)
    out: dict[str, str | None] = {}
    for i in range(0, len(job_ids), 1000):
        chunk = job_ids[i : i + 1000]
        pipe = storage.client.pipeline(transaction=False)
        for job_id in chunk:
            pipe.hget(keys.job(job_id), "state")
        for job_id, value in zip(chunk, pipe.execute(), strict=True):
            out[job_id] = value.decode() if value is not None else None
    return out


def completed(queue: Queue, job_ids: list[str]) -> list[str]:
    return [job_id for job_id, state in states(queue, job_ids).items() if state == "completed"]


def events_of(queue: Queue, kind: str | None = None) -> list:
    """Every event of the queue's stream (the suite's streams stay below the cap)."""
    out, after = [], "0"
    while True:
        batch = queue.storage.read_events(queue.name, after=after, count=10_000)
        if not batch:
            return [e for e in out if kind is None or e.kind == kind]
        out.extend(batch)
        after = batch[-1].id
