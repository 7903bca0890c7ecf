"""runworker and runreaper as real processes against real Redis: crash recovery and shutdown."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from django_jobq import JobState
from django_jobq.queue import Queue
from django_jobq.storage.redis.storage import RedisStorage

from .helpers import PROCESS_START, Spawner, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def spawn(redis_prefix, tmp_path):
    spawner = Spawner(
        tmp_path,
        {
            "JOBQ_TEST_PREFIX": redis_prefix,
            "JOBQ_TEST_SQLITE": str(tmp_path / "subprocess.sqlite3"),  # no litter in /tmp
        },
    )
    yield spawner
    spawner.stop_all()


@pytest.fixture
def slow_queue(redis_client, redis_prefix) -> Queue:
    return Queue("tests-slow", storage=RedisStorage(redis_client, prefix=redis_prefix))


def ledger_lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_sigkilled_worker_loses_no_job(spawn, slow_queue, tmp_path):
    ledger = tmp_path / "ledger.txt"
    ids = [f"crash-{i}" for i in range(30)]
    slow_queue.enqueue_many(
        [{"id": i, "payload": {"seconds": 0.3, "ledger": str(ledger)}, "max_stalls": 3}
         for i in ids]
    )  # fmt: skip
    victim = spawn("runworker", "tests-slow", "-c", "4", "--lease", "1000", "--reap-interval", "0")
    assert wait_until(lambda: slow_queue.counts()[JobState.ACTIVE] == 4), "worker never ran"
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    held = slow_queue.counts()[JobState.ACTIVE]
    assert held > 0  # it died holding leases

    spawn("runworker", "tests-slow", "-c", "4", "--lease", "1000", "--reap-interval", "0")
    spawn("runreaper", "--interval", "0.2", "-v", "2")
    assert wait_until(lambda: slow_queue.counts()[JobState.COMPLETED] == len(ids), 60)

    statuses = {i: slow_queue.get_status(i) for i in ids}
    assert {s.state for s in statuses.values()} == {JobState.COMPLETED}
    assert sum(s.stalls for s in statuses.values()) == held  # each orphan recovered once
    runs = ledger_lines(ledger)[::2]
    assert set(runs) == set(ids)  # every job ran to the end at least once
    assert len(runs) - len(ids) <= held  # only the killed in-flight ones may have run twice


def test_sigterm_lets_the_running_job_finish_and_exits_cleanly(
    spawn, redis_client, redis_prefix, tmp_path
):
    # The tests-ledger handler writes "start" when it runs: SIGTERM goes only once the job is
    # running, not merely claimed (a claimed job whose handler has not started is handed back
    # at shutdown, which is another test's behaviour).
    queue = Queue("tests-ledger", storage=RedisStorage(redis_client, prefix=redis_prefix))
    ledger = tmp_path / "ledger.txt"
    queue.enqueue("graceful", {"seconds": 1.5, "ledger": str(ledger)})
    worker = spawn("runworker", "tests-ledger", "--grace", "60", "-v", "2", log="graceful")
    assert wait_until(lambda: ledger_lines(ledger)[:2] == ["start", "graceful"], PROCESS_START)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(90) == 0
    status = queue.get_status("graceful")
    assert (status.state, status.attempts) == (JobState.COMPLETED, 1)
    lines = [line.split()[:2] for line in ledger.read_text().splitlines()]
    assert lines == [["start", "graceful"], ["end", "graceful"]]
    log = Path(worker.log_path).read_text()
    assert "[tests-ledger/graceful]" in log  # job id on the job's log lines
    assert "stopped" in log


def test_sigterm_past_grace_releases_the_job_for_another_worker(spawn, slow_queue, tmp_path):
    slow_queue.enqueue("too-slow", {"seconds": 5})
    worker = spawn("runworker", "tests-slow", "--grace", "0.3")
    assert wait_until(lambda: slow_queue.get_status("too-slow").state is JobState.ACTIVE)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    status = slow_queue.get_status("too-slow")
    assert (status.state, status.attempts) == (JobState.QUEUED, 0)


def test_runreaper_once_reports_per_queue(spawn, slow_queue):
    slow_queue.enqueue("idle", {})
    proc = spawn("runreaper", "--once", "tests-slow", log="reaper")
    assert proc.wait(30) == 0
    assert "tests-slow: requeued 0, failed 0, promoted 0" in Path(proc.log_path).read_text()


def test_runworker_refuses_a_queue_without_handler(spawn):
    proc = spawn("runworker", "no-such-queue", log="refuse")
    assert proc.wait(30) != 0
    assert "no handler registered" in Path(proc.log_path).read_text()
