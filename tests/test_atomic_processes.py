"""Exactly-once effects under SIGKILL (issue 38): worker processes killed again and again
mid-drain, at a chosen point and at arbitrary ones, a reaper running. With ``atomic=True`` every
job completes and the effect count equals the job count exactly; without it the same run leaves
duplicates, so the test can fail.

The database backend on SQLite and PostgreSQL (chosen point: right after the handler's write,
before its completion), and Redis with the outcome ledger on either database (chosen points:
after the write, before the commit; and after the commit, before the Redis acknowledgement)."""

from __future__ import annotations

import signal

import pytest
from django.db import connections

from django_jobq import JobState
from django_jobq.queue import Queue
from django_jobq.storage.redis import RedisStorage

from .helpers import PROCESS_START, Spawner, wait_until

pytestmark = [
    pytest.mark.slow, pytest.mark.django_db(databases=["default", "pg"], transaction=True)
]  # fmt: skip
JOBS = 32
ALIASES = {"sqlite": "default", "postgres": "pg"}
SETUPS = [
    ("database", "sqlite"),
    pytest.param(("database", "postgres"), marks=pytest.mark.postgres),
    pytest.param(("redis", "sqlite"), marks=pytest.mark.redis),
    pytest.param(("redis", "postgres"), marks=[pytest.mark.redis, pytest.mark.postgres]),
]
SETUP_IDS = ["database-sqlite", "database-postgres", "redis-sqlite", "redis-postgres"]


@pytest.fixture(params=SETUPS, ids=SETUP_IDS)
def setup(request, tmp_path):
    """(storage, spawner, alias): the jobs' storage, ``manage.py`` processes on it, and the
    database the effects (and on Redis the outcome ledger) are written to."""
    backend, db = request.param
    alias = ALIASES[db]
    env = {
        "JOBQ_TEST_BACKEND": backend,
        "JOBQ_TEST_DB_ALIAS": alias,
        "JOBQ_TEST_ATOMIC": "1",
        "JOBQ_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
        "JOBQ_TEST_PG_DB": connections["pg"].settings_dict["NAME"],
    }
    if backend == "redis":
        prefix = request.getfixturevalue("redis_prefix")
        storage = RedisStorage(request.getfixturevalue("redis_client"), prefix=prefix)
        env["JOBQ_TEST_PREFIX"] = prefix
    else:
        from django_jobq.storage.database import DatabaseStorage

        storage = DatabaseStorage(alias)
    with connections[alias].cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS jobq_test_effects")
        cursor.execute("CREATE TABLE jobq_test_effects (job_id varchar(160) NOT NULL)")
    spawner = Spawner(tmp_path, env)
    yield storage, spawner, alias, backend
    spawner.stop_all()
    with connections[alias].cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS jobq_test_effects")


def effect_rows(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM jobq_test_effects")
        return int(cursor.fetchone()[0])


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "plain"])
def test_killed_workers_leave_one_effect_per_job_exactly_when_atomic(setup, tmp_path, atomic):
    storage, spawn, alias, backend = setup
    name = "tests-atomic" if atomic else "tests-effect"
    q = Queue(name, storage=storage)
    die = tmp_path / "die"
    die.mkdir()
    # Every 8th job's first run kills its worker at a chosen point: after its write (before
    # the commit), or on Redis for every other one of them after the commit (before Redis is
    # told: the ledger's case).
    q.enqueue_many([
        {"id": f"e{i}", "max_stalls": 100,
         "payload": {"alias": alias, "seconds": 0.05, "die": str(die) if i % 8 == 3 else None,
                     "die_after_commit": backend == "redis" and i % 16 == 3}}
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
    if atomic and backend == "redis":  # every job's outcome in the ledger, once
        from django_jobq.models import JobOutcome

        assert JobOutcome.objects.using(alias).filter(queue=name).count() == JOBS
