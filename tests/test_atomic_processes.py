"""Exactly-once effects under SIGKILL (issue 38): worker processes killed again and again
mid-drain, at the chosen point (right after a handler's write, before its completion) and at
arbitrary ones, a reaper running. With ``atomic=True`` every job completes and the effect
count equals the job count exactly; without it the same run leaves duplicates, so the test
can fail. SQLite and PostgreSQL, the database backend."""

from __future__ import annotations

import signal

import pytest
from django.db import connections

from django_jobq import JobState
from django_jobq.queue import Queue

from .helpers import PROCESS_START, wait_until
from .test_database_processes import ALIASES, backend, spawn  # noqa: F401 - fixtures

pytestmark = [
    pytest.mark.slow, pytest.mark.django_db(databases=["default", "pg"], transaction=True)
]  # fmt: skip
JOBS = 32


@pytest.fixture
def effects_table(backend):  # noqa: F811 - the imported fixture
    alias = ALIASES[backend]
    with connections[alias].cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS jobq_test_effects")
        cursor.execute("CREATE TABLE jobq_test_effects (job_id varchar(160) NOT NULL)")
    yield alias
    with connections[alias].cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS jobq_test_effects")


def effect_rows(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM jobq_test_effects")
        return int(cursor.fetchone()[0])


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "plain"])
def test_killed_workers_leave_one_effect_per_job_exactly_when_atomic(
    live_storage,
    spawn,  # noqa: F811 - the imported fixture
    effects_table,
    tmp_path,
    atomic,
):
    alias = effects_table
    name = "tests-atomic" if atomic else "tests-effect"
    q = Queue(name, storage=live_storage)
    die = tmp_path / "die"
    die.mkdir()
    q.enqueue_many([
        {"id": f"e{i}", "max_stalls": 100,
         "payload": {"alias": alias, "seconds": 0.05, "die": str(die) if i % 8 == 3 else None}}
        for i in range(JOBS)
    ])  # fmt: skip
    spawn("runreaper", "--interval", "0.2", log="reaper")
    args = ("runworker", name, "-c", "4", "--lease", "1500", "--reap-interval", "0.2")

    def completed() -> int:
        return q.counts()[JobState.COMPLETED]

    kills = 0
    while completed() < JOBS:
        assert kills < 80, f"{kills} kills and {completed()} of {JOBS} completed"
        worker = spawn(*args, log="worker")
        seen = effect_rows(alias)
        # A kill from outside after a few more effects (at whatever point the worker is), unless
        # the worker died at a chosen point by itself first, or the drain ended.
        wait_until(
            lambda w=worker, seen=seen: (
                w.poll() is not None or effect_rows(alias) >= seen + 5 or completed() >= JOBS
            ),
            PROCESS_START,
        )
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        kills += 1
    assert [q.get_status(f"e{i}").state for i in range(JOBS)] == [JobState.COMPLETED] * JOBS
    died = len(list(die.iterdir()))
    assert died == JOBS // 8 and kills >= died
    if atomic:
        assert effect_rows(alias) == JOBS  # exactly once, whatever was killed where
    else:
        # at least the chosen crash points' writes twice: at-least-once, as documented
        assert effect_rows(alias) >= JOBS + died
