"""The database backend with several worker *processes* sharing one database, and a worker
surviving a dropped connection: the situations SQLite locking and PostgreSQL SKIP LOCKED exist for.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from django.db import connections

from django_jobq import JobState
from django_jobq.queue import Queue

from .helpers import PROCESS_START, Spawner, log_tail, wait_until

pytestmark = pytest.mark.slow
ALIASES = {"sqlite": "default", "postgres": "pg"}


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request):
    return request.param


@pytest.fixture
def spawn(backend, tmp_path):
    spawner = Spawner(
        tmp_path,
        {
            "JOBQ_TEST_BACKEND": "database",
            "JOBQ_TEST_DB_ALIAS": ALIASES[backend],
            # The test databases, not the ones the settings name outside tests.
            "JOBQ_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
            "JOBQ_TEST_PG_DB": connections["pg"].settings_dict["NAME"],
        },
    )
    yield spawner
    spawner.stop_all()


def test_two_worker_processes_share_the_queue_and_survive_a_sigkill(live_storage, spawn, tmp_path):
    q = Queue("tests-slow", storage=live_storage)
    ledger = tmp_path / "ledger.txt"
    ids = [f"p{i}" for i in range(120)]
    # A lease of 5 s: only the killed worker loses its jobs. With a lease of a second or two, a
    # loaded machine delays the survivor's heartbeats past it, and its jobs run twice too.
    args = ("runworker", "tests-slow", "-c", "4", "--lease", "5000", "--reap-interval", "0")
    victim = spawn(*args, log="victim")
    spawn(*args, log="survivor")
    assert wait_until(lambda: len(live_storage.list_workers()) == 2, PROCESS_START), (
        "workers never started"
    )
    q.enqueue_many(
        [{"id": i, "payload": {"seconds": 0.03, "ledger": str(ledger)}, "max_stalls": 3}
         for i in ids]
    )  # fmt: skip
    assert wait_until(lambda: q.counts()[JobState.COMPLETED] >= 30, 60), "workers never ran"
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    spawn("runreaper", "--interval", "0.2", log="reaper")
    assert wait_until(lambda: q.counts()[JobState.COMPLETED] == len(ids), 90), q.counts()

    lines = ledger.read_text().split()
    runs, pids = lines[::2], set(lines[1::2])
    assert set(runs) == set(ids)  # every job ran to the end
    assert len(runs) - len(ids) <= 4  # only the killed worker's in-flight jobs may run twice
    assert len(pids) == 2  # both processes took jobs
    assert sum(q.get_status(i).stalls for i in ids) <= 4


class TestPostgresOnly:
    @pytest.fixture(params=["postgres"])
    def backend(self, request):
        return request.param

    def test_storage_reconnects_after_the_server_drops_its_connection(self, live_storage):
        q = Queue("tests-echo", storage=live_storage)
        q.enqueue("before", 1)
        conn = connections[live_storage.using]
        pid = conn.cursor().connection.info.backend_pid
        import psycopg

        params = conn.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        with psycopg.connect(**params, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        with pytest.raises(Exception):  # noqa: B017 - the driver's error class varies by moment
            live_storage.get_record("tests-echo", "before")  # a read outside any transaction
        assert live_storage.get_record("tests-echo", "before").state is JobState.QUEUED
        claimed = live_storage.claim("tests-echo", "w", 1, 1000)  # reconnected
        assert [j.job_id for j in claimed.jobs] == ["before"]

    def test_a_worker_at_concurrency_128_holds_a_few_connections(self, live_storage, spawn):
        """Issue 36, item 3: the worker's own storage calls (claims, verdicts, heartbeats, the
        LISTEN) go through a few threads, so ``-c 128`` of a handler that never touches the
        ORM holds a handful of the server's ``max_connections`` (100), not one per thread."""
        q = Queue("tests-slow", storage=live_storage)
        db = connections["pg"].settings_dict["NAME"]
        worker = spawn("runworker", "tests-slow", "-c", "128", "--reap-interval", "0", log="w")
        assert wait_until(lambda: len(live_storage.list_workers()) == 1, PROCESS_START)
        # Bursts of jobs that each keep a handler busy: every handler thread runs some, idle
        # waits and quiet verdicts come and go, as in a day of traffic.
        for burst in range(4):
            q.enqueue_many([{"id": f"c{burst}-{i}", "payload": {"seconds": 0.05}}
                            for i in range(300)])  # fmt: skip
            done = 305 * burst + 300
            assert wait_until(lambda done=done: q.counts()[JobState.COMPLETED] == done, 120)
            for i in range(5):  # a quiet queue: one job at a time, answered directly
                q.enqueue_and_wait(f"rr{burst}-{i}", {"seconds": 0}, timeout=30)
        own = connections["pg"].cursor().connection.info.backend_pid

        def held() -> int:
            with connections["pg"].cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
                    [db, own],
                )
                return cursor.fetchone()[0]

        assert worker.poll() is None
        assert held() <= 10, held()
        # At start it said that 128 ORM-using threads could exceed the server's limit.
        assert "the server allows" in Path(worker.log_path).read_text()

    def test_django_s_connection_pool_serves_orm_handlers_beyond_its_size(
        self, live_storage, spawn, tmp_path
    ):
        """Issue 36, item 3: with ``OPTIONS["pool"]`` (Django 5.1+), 32 handler threads that use
        the ORM share a pool of 8: each thread's connection goes back to the pool after its
        job (as after a request), so none waits out the pool's timeout."""
        pooled = Spawner(tmp_path, {**spawn.env, "JOBQ_TEST_PG_POOL": "8"})
        try:
            q = Queue("tests-orm", storage=live_storage)
            pooled("runworker", "tests-orm", "-c", "32", "--reap-interval", "0", log="pooled")
            assert wait_until(lambda: len(live_storage.list_workers()) == 1, PROCESS_START)
            ids = [f"o{i}" for i in range(400)]
            q.enqueue_many([{"id": i, "payload": {"alias": "pg", "seconds": 0.02}} for i in ids])
            assert wait_until(lambda: q.counts()[JobState.COMPLETED] == len(ids), 120), (
                q.counts(), log_tail(pooled.procs[0].log_path),
            )  # fmt: skip
            assert {q.get_status(i).attempts for i in ids} == {1}  # no attempt timed out
            assert q.enqueue_and_wait("rr", {"alias": "pg"}, timeout=30) == "rr"
        finally:
            pooled.stop_all()
