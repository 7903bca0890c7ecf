"""The database backend with several worker *processes* sharing one database, and a worker
surviving a dropped connection: the situations SQLite locking and PostgreSQL SKIP LOCKED exist for.
"""

from __future__ import annotations

import signal

import pytest
from django.db import connections

from django_jobq import JobState
from django_jobq.queue import Queue

from .helpers import PROCESS_START, Spawner, wait_until

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
