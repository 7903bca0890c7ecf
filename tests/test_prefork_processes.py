"""``runworker --processes N`` as real processes against real Redis: the pre-fork launcher
(``prefork.py``) forks N workers after one Django set-up and supervises them.

What must hold: every child is a worker of its own (id, registration, leases); a child killed
mid-job is replaced and its job recovered; SIGTERM to the launcher lets every child finish its
running job and exit cleanly; a launcher killed outright leaves no child behind.
"""

from __future__ import annotations

import os
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
            "JOBQ_TEST_SQLITE": str(tmp_path / "subprocess.sqlite3"),
        },
    )
    yield spawner
    spawner.stop_all()


@pytest.fixture
def storage(redis_client, redis_prefix) -> RedisStorage:
    return RedisStorage(redis_client, prefix=redis_prefix)


def starts(ledger: Path) -> list[tuple[str, int]]:
    """(job id, pid) of each "start" line the tests-ledger handler wrote."""
    if not ledger.exists():
        return []
    lines = [line.split() for line in ledger.read_text().splitlines()]
    return [(parts[1], int(parts[2])) for parts in lines if parts[0] == "start"]


def worker_pids(storage: RedisStorage) -> set[int]:
    return {w.info["pid"] for w in storage.list_workers()}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_each_child_is_a_worker_of_its_own_and_sigterm_stops_them_all(spawn, storage, tmp_path):
    queue = Queue("tests-ledger", storage=storage)
    ledger = tmp_path / "ledger.txt"
    launcher = spawn("runworker", "tests-ledger", "--processes", "3", "-c", "2",
                     "--worker-id", "pf", "--grace", "60", log="prefork")  # fmt: skip
    assert wait_until(lambda: len(storage.list_workers()) == 3, PROCESS_START), "not 3 workers"
    workers = storage.list_workers()
    assert sorted(w.worker_id for w in workers) == ["pf-0", "pf-1", "pf-2"]
    pids = worker_pids(storage)
    assert launcher.pid not in pids and len(pids) == 3

    # Six jobs of 1.5 s on 3 x 2 slots: every child runs some, at the same time.
    for i in range(6):
        queue.enqueue(f"j{i}", {"seconds": 1.5, "ledger": str(ledger), "n": i})
    assert wait_until(lambda: len(starts(ledger)) == 6, 60), "the jobs did not all start"
    assert {pid for _, pid in starts(ledger)} == pids

    launcher.send_signal(signal.SIGTERM)  # while the six run: each finishes in its grace
    assert launcher.wait(90) == 0
    for i in range(6):
        status = queue.get_status(f"j{i}")
        assert (status.state, status.attempts) == (JobState.COMPLETED, 1)
    assert not any(alive(pid) for pid in pids), "a child outlived the launcher"
    assert storage.list_workers() == []  # each deregistered on its way out
    log = Path(launcher.log_path).read_text()
    assert log.count("stopped:") == 3


def test_a_child_killed_mid_job_is_replaced_and_its_job_recovered(spawn, storage, tmp_path):
    queue = Queue("tests-ledger", storage=storage)
    ledger = tmp_path / "ledger.txt"
    launcher = spawn("runworker", "tests-ledger", "--processes", "2", "-c", "1",
                     "--lease", "1000", "--reap-interval", "0.3", log="replace")  # fmt: skip
    assert wait_until(lambda: len(storage.list_workers()) == 2, PROCESS_START)
    before = worker_pids(storage)
    queue.enqueue("victim", {"seconds": 1.0, "ledger": str(ledger)}, max_stalls=3)
    assert wait_until(lambda: starts(ledger), 60), "the job did not start"
    _, victim = starts(ledger)[0]
    os.kill(victim, signal.SIGKILL)

    def replaced() -> bool:
        pids = worker_pids(storage) - {victim}
        return len(pids) == 2 and not pids <= before

    # The killed child's registration lives until its TTL; a new pid among the workers is
    # the replacement.
    assert wait_until(replaced, PROCESS_START), "the killed child was not replaced"
    assert wait_until(lambda: queue.get_status("victim").state is JobState.COMPLETED, 60)
    status = queue.get_status("victim")
    assert status.stalls == 1  # its lease expired once and a sibling's sweep requeued it
    assert [job for job, _ in starts(ledger)] == ["victim", "victim"]
    assert starts(ledger)[1][1] != victim
    assert "replacing it" in Path(launcher.log_path).read_text()


def test_a_launcher_killed_outright_leaves_no_child_behind(spawn, storage):
    launcher = spawn("runworker", "tests-ledger", "--processes", "2", log="orphans")
    assert wait_until(lambda: len(storage.list_workers()) == 2, PROCESS_START)
    pids = worker_pids(storage)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(10)
    # Each child is told (parent-death signal) to stop gracefully: it deregisters and exits.
    assert wait_until(lambda: not any(alive(pid) for pid in pids), 60), "orphans left"
    assert wait_until(lambda: storage.list_workers() == [], 30)


def test_runworker_refuses_a_bad_configuration_before_forking(spawn):
    proc = spawn("runworker", "no-such-queue", "--processes", "3", log="refuse")
    assert proc.wait(60) != 0
    log = Path(proc.log_path).read_text()
    assert log.count("no handler registered") == 1  # once, by the launcher, not per child


CRASHING_CHILD = """
import logging, os, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(message)s")
from django_jobq.worker.prefork import Prefork

def serve(index):
    with Path(sys.argv[1]).open("a") as fh:
        fh.write(f"{os.getpid()}\\n")
    return 3

sys.exit(Prefork(1, serve).run())
"""


def test_a_child_that_dies_at_once_is_replaced_after_doubling_pauses(tmp_path):
    """A worker that cannot start is not forked again in a tight loop: each replacement of
    a child that died within a second waits twice as long as the one before; SIGTERM during
    such a pause ends the launcher."""
    import subprocess
    import sys

    from .helpers import ROOT

    starts_file, log_path = tmp_path / "starts.txt", tmp_path / "launcher.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", CRASHING_CHILD, str(starts_file)],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        assert wait_until(lambda: "in 4.0s" in log_path.read_text(), 60), log_path.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    delays = [line.rsplit(" in ", 1)[1] for line in log_path.read_text().splitlines()
              if "replacing it in" in line]  # fmt: skip
    assert delays[:4] == ["0.5s", "1.0s", "2.0s", "4.0s"]
    # One fork per replacement plus the first (the last replacement may still be pending).
    assert len(starts_file.read_text().split()) <= len(delays) + 1
