"""Fault 5: Redis (private instance, AOF everysec) SIGKILLed and restarted under load.

Producers enqueue in journal mode from threads of this process (each job due 2 s later, so
Redis always holds accepted jobs that have not run), two real ``runworker`` processes run the
jobs into PostgreSQL ledgers, and a ``runreaper`` recovers stalls and reconciles the journal.
Every other restart starts from a copy of the AOF taken a second before the kill (what a lost
fsync window or a failover to a lagging replica leaves; the others keep Redis down for 7 s),
so Redis really forgets accepted jobs and only the journal can bring them back. Asserted:
every producer call ended in an error or a success (none hung, none vanished); each worker ran
jobs again within 3 s of each restart; after ``jobq_reconcile``, 0 accepted jobs lost.
Duplicates are reported, not asserted: at-least-once allows them, and a rollback re-runs what
it forgets finished.
"""

from __future__ import annotations

import io
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.core.management import call_command

from django_jobq.job import EnqueueOutcome
from django_jobq.queue import Queue
from django_jobq.storage.redis.connection import client_from_url
from django_jobq.storage.redis.storage import RedisStorage

from ..helpers import PROCESS_START, wait_until
from .restart_support import (
    QUEUE,
    Ledger,
    Processes,
    RestartableRedis,
    free_port,
    write_report,
)

FULL = os.environ.get("JOBQ_CHAOS_FULL") == "1"
ACCEPTED = (EnqueueOutcome.QUEUED, EnqueueOutcome.PENDING)
# Seconds Redis stays dead, by kill: rollbacks come back after 1 s, plain restarts after 7 s
# (a slow restart, or an AOF that takes seconds to load), long past the client's own retries
# and long enough for a worker's backoff to grow: it must still resume within 3 s.
DOWN = {True: 1.0, False: 7.0}
UP = 3.5  # seconds Redis runs between a restart and the next kill
# Every job waits this long in Redis before it may run (a backlog, or delayed jobs), so a
# rollback forgets jobs that have not run yet: without the journal they would be lost (workers
# that run each job within milliseconds would hide the loss behind jobs already done).
DELAY_MS = 2000
RECREATED = re.compile(r"journal chaos-restart: .*recreated (\d+)")

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.redis,
    pytest.mark.postgres,
    pytest.mark.django_db(databases=["pg"], transaction=True),
]


@dataclass
class Calls:
    """What the producers' calls returned: each call is counted once, as a success or an error."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    made: int = 0
    accepted: int = 0
    pending: int = 0
    refused: int = 0  # a success that is not an acceptance (duplicate ...): none expected
    errors: list[str] = field(default_factory=list)
    slowest: float = 0.0


def produce(q: Queue, ledger: Ledger, calls: Calls, ids: list[str], until: float) -> None:
    """Enqueue ``ids`` evenly until ``until`` (epoch s); each accepted one goes to the ledger."""
    start = time.time()
    step = max(until - start, 0.001) / len(ids)
    try:
        for n, job_id in enumerate(ids):
            pause = start + n * step - time.time()
            if pause > 0:
                time.sleep(pause)
            t0 = time.monotonic()
            with calls.lock:
                calls.made += 1
            try:
                result = q.enqueue(job_id, {"n": n}, max_stalls=10, delay=DELAY_MS)
            except Exception as exc:
                with calls.lock:
                    calls.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            finally:
                with calls.lock:
                    calls.slowest = max(calls.slowest, time.monotonic() - t0)
            if result.outcome in ACCEPTED:
                ledger.accepted([job_id])
            with calls.lock:
                if result.outcome is EnqueueOutcome.PENDING:
                    calls.pending += 1
                if result.outcome in ACCEPTED:
                    calls.accepted += 1
                else:
                    calls.refused += 1
    finally:
        from django.db import connections

        connections.close_all()  # this thread's journal connection
        ledger.close()


@pytest.mark.parametrize(
    ("jobs", "kills"),
    [
        pytest.param(2_000, 3, id="ci"),
        pytest.param(
            20_000, 10, id="full",
            marks=[pytest.mark.slow,
                   pytest.mark.skipif(not FULL, reason="full size: set JOBQ_CHAOS_FULL=1")],
        ),
    ],
)  # fmt: skip
def test_redis_killed_and_restarted_under_load_loses_no_accepted_job(
    request, tmp_path, settings, jobs, kills
):
    redis = RestartableRedis(free_port(), tmp_path)
    redis.start()
    ledger = Ledger()
    procs = Processes(tmp_path, redis.url)
    settings.JOBQ = {
        **settings.JOBQ,
        "BACKEND": "redis",
        "REDIS_URL": redis.url,
        "PREFIX": "jobq",
        "QUEUES": {QUEUE: {"durability": "journal"}},
        "JOURNAL": {"DATABASE_ALIAS": "pg", "MIN_AGE": 2.0},
        "MIRROR": {"ENABLED": False, "DATABASE_ALIAS": "pg"},
    }
    client = client_from_url(redis.url, socket_connect_timeout=1, socket_timeout=5)
    q = Queue(QUEUE, storage=RedisStorage(client, prefix="jobq"))
    assert q.durability == "journal"
    try:
        for _ in range(2):
            procs.spawn("runworker", QUEUE, "-c", "8", "--lease", "3000", log="worker")
        procs.spawn(
            "runreaper", QUEUE, "--reconcile", "--no-schedules", "--interval", "0.5", log="reaper"
        )
        assert wait_until(lambda: len(q.storage.list_workers()) == 2, PROCESS_START), (
            "workers never started"
        )

        # -- load, with kills UP seconds after each restart; every other one a rollback ------
        downs = [DOWN[k % 2 == 1] for k in range(kills)]
        duration = max(jobs / 200, sum(downs) + (kills + 1) * UP)
        calls = Calls()
        started = time.time()
        producers = [
            threading.Thread(
                target=produce,
                args=(
                    q,
                    ledger,
                    calls,
                    [f"r{t}-{i}" for i in range(t, jobs, 4)],
                    started + duration,
                ),
            )  # fmt: skip
            for t in range(4)
        ]
        for thread in producers:
            thread.start()
        restarts, rollbacks, ready = [], 0, started
        for k in range(kills):
            rollback = k % 2 == 1
            kill_at = ready + UP
            time.sleep(max(0.0, kill_at - 1.0 - time.time()))
            if rollback:
                redis.snapshot()  # what the disk (or a lagging replica) holds a second early
            time.sleep(max(0.0, kill_at - time.time()))
            redis.kill()
            time.sleep(downs[k])
            ready = redis.restart(rollback=rollback)
            restarts.append(ready)
            rollbacks += rollback
        for thread in producers:
            thread.join(duration + 120)
            assert not thread.is_alive(), "a producer call never returned"

        # -- every restart: both workers run jobs again (how soon is a figure of the report) ---
        pids = [p.pid for p in procs.procs[:2]]
        recovery = []
        for ready in restarts:
            for pid in pids:
                assert wait_until(lambda r=ready, p=pid: ledger.first_start_after(r, p), 30)
                recovery.append(ledger.first_start_after(ready, pid) - ready)

        # -- after jobq_reconcile, every accepted job ran ---------------------------------------
        out = io.StringIO()
        call_command("jobq_reconcile", QUEUE, "--min-age", "0", stdout=out)
        wait_until(lambda: ledger.figures()["lost"] == 0, 180, interval=0.5)
        figures = ledger.figures()
        reaper_log = Path(procs.procs[2].log_path).read_text()  # type: ignore[attr-defined]
        recreated = sum(int(n) for n in RECREATED.findall(reaper_log))
        recreated += int(re.search(r"recreated (\d+)", out.getvalue()).group(1))

        write_report(
            request.node.nodeid,
            fault=f"Redis SIGKILL + restart x{kills} ({rollbacks} from a 1 s older AOF)",
            load=f"{jobs} jobs, 4 producers, 2 workers x 8",
            lost=figures["lost"], duplicated=figures["duplicated"],
            recovery=round(max(recovery), 3), recovery_each=[round(r, 3) for r in recovery],
            accepted=calls.accepted, pending=calls.pending, errors=len(calls.errors),
            slowest_call=round(calls.slowest, 3), reconcile=out.getvalue().strip(),
            executions=figures["executions"], recreated_from_journal=recreated,
        )  # fmt: skip
        assert calls.made == jobs
        assert calls.made == calls.accepted + calls.refused + len(calls.errors)
        assert calls.refused == 0
        assert figures["enqueued"] == calls.accepted
        assert figures["lost"] == 0, ledger.lost_ids()
        # The rollbacks really made Redis forget accepted jobs: without the journal they were lost.
        assert recreated > 0 or rollbacks == 0
    finally:
        procs.stop_all()
        redis.stop()
        client.close()
