"""A runworker process killed while its failure handler runs: the call runs again, on Redis and
on the database backend (SQLite, PostgreSQL) with real worker processes."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from django.db import connections

from django_jobq.queue import Queue

from .helpers import Spawner, wait_until

pytestmark = pytest.mark.slow
Q = "tests-onfail"
LEASE_MS = 2000  # the failure call's lease: how long a killed worker's call waits
ALIASES = {"sqlite": "default", "postgres": "pg"}


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "sqlite",
                        pytest.param("postgres", marks=pytest.mark.postgres)])  # fmt: skip
def backend(request):
    return request.param


@pytest.fixture
def spawn(backend, request, tmp_path):
    if backend == "redis":
        env = {
            "JOBQ_TEST_PREFIX": request.getfixturevalue("redis_prefix"),
            "JOBQ_TEST_SQLITE": str(tmp_path / "sub.sqlite3"),
        }
    else:  # the test databases, not the ones the settings name outside tests
        env = {
            "JOBQ_TEST_BACKEND": "database",
            "JOBQ_TEST_DB_ALIAS": ALIASES[backend],
            "JOBQ_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
            "JOBQ_TEST_PG_DB": connections["pg"].settings_dict["NAME"],
        }
    spawner = Spawner(tmp_path, env)
    yield spawner
    spawner.stop_all()


def lines(path: Path, kind: str) -> list[list[str]]:
    text = path.read_text() if path.exists() else ""
    return [line.split()[1:] for line in text.splitlines() if line.startswith(kind + " ")]


def test_a_worker_killed_during_the_failure_handler_leaves_the_call_to_run_again(
    spawn, live_storage, tmp_path
):
    queue = Queue(Q, storage=live_storage)
    ledger = tmp_path / "ledger.txt"
    args = ("runworker", Q, "--failure-lease", str(LEASE_MS), "--reap-interval", "0")
    victim = spawn(*args, log="victim")
    queue.enqueue("doomed", {"ledger": str(ledger), "first_call_seconds": 60})
    assert wait_until(lambda: len(lines(ledger, "start")) == 1, 30), "failure handler never ran"
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    assert lines(ledger, "end") == []  # killed inside the failure handler
    assert queue.count_failure_calls() == 1  # the call survived its worker

    spawn(*args, log="heir")
    assert wait_until(lambda: len(lines(ledger, "end")) == 1, 30), "the call never ran again"
    [first, second] = lines(ledger, "start")
    assert first[0] == second[0] == "doomed" and first[1] != second[1]  # two processes
    assert (first[2], second[2]) == ("1", "2")  # the second call knows it is a repeat
    assert second[3] == "django_jobq.errors.PermanentError"
    assert wait_until(lambda: queue.count_failure_calls() == 0)
