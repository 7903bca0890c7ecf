"""A runworker process killed while its failure handler runs: the call runs again (Redis)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from django_jobq.queue import Queue
from django_jobq.storage.redis.storage import RedisStorage

from .helpers import Spawner, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.slow]
Q = "tests-onfail"
LEASE_MS = 2000  # the failure call's lease: how long a killed worker's call waits


@pytest.fixture
def spawn(redis_prefix, tmp_path):
    spawner = Spawner(
        tmp_path,
        {"JOBQ_TEST_PREFIX": redis_prefix, "JOBQ_TEST_SQLITE": str(tmp_path / "sub.sqlite3")},
    )
    yield spawner
    spawner.stop_all()


def lines(path: Path, kind: str) -> list[list[str]]:
    text = path.read_text() if path.exists() else ""
    return [line.split()[1:] for line in text.splitlines() if line.startswith(kind + " ")]


def test_a_worker_killed_during_the_failure_handler_leaves_the_call_to_run_again(
    spawn, redis_client, redis_prefix, tmp_path
):
    queue = Queue(Q, storage=RedisStorage(redis_client, prefix=redis_prefix))
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
    assert wait_until(lambda: queue.count_failure_calls() == 0, 10)
