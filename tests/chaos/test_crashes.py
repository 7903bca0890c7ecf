"""Fault 2: a worker process dies right after a claim, or right after a handler but before its
``complete`` (tests.chaos.faults injects both with ``os._exit``)."""

from __future__ import annotations

import random

from ..helpers import wait_until
from .conftest import sized
from .faults import CRASH_CODE
from .support import enqueue_recorded, wait_all_completed


def test_crash_after_claim_and_before_complete(scale, supervise, ledger, queue_of, report):
    crash_claim = sized(scale, 8, 100)
    crash_ack = sized(scale, 8, 100)
    healthy = sized(scale, 40, 1000)
    ids = (
        [f"claimcrash-{i}" for i in range(crash_claim)]
        + [f"ackcrash-{i}" for i in range(crash_ack)]
        + [f"ok-{i}" for i in range(healthy)]
    )
    random.Random(2).shuffle(ids)
    queue = queue_of("chaos-ledger")
    enqueue_recorded(queue, ledger, ids, {"seconds": 0.01}, max_stalls=5)
    # One job in flight per process: a crash orphans exactly the job it is injected into.
    workers = supervise(
        ["runworker", "chaos-ledger", "-c", "1", "--batch", "1", "--lease", "1000",
         "--reap-interval", "0.5"], 3,
        JOBQ_CHAOS_BACKEND="tests.chaos.faults.crashing_storage",
    )  # fmt: skip
    supervise(["runreaper", "--interval", "0.2"], 1)
    done = wait_all_completed(queue, ids, sized(scale, 240, 1500))
    crashes = crash_claim + crash_ack
    assert wait_until(lambda: workers.exits.count(CRASH_CODE) >= crashes)
    tally = ledger.tally(done)
    runs = ledger.runs_per_job()
    # Crash before complete: from the end of the run whose verdict died to the rerun's start.
    gaps = []
    for job_id in (i for i in ids if i.startswith("ackcrash-")):
        first, second = ledger.executions_of(job_id)[:2]
        gaps.append(second[3] - first[4])
    report(
        fault="2. crash right after claim / after handler, before complete",
        load=f"{len(ids)} jobs: {crash_claim} crash after claim, {crash_ack} before complete",
        lost=tally.lost, duplicated=tally.duplicated,
        recovery=f"rerun {min(gaps):.1f}-{max(gaps):.1f} s after the lost complete "
        "(lease 1 s, reaper every 0.2 s, restart of the crashed worker)",
    )  # fmt: skip
    assert workers.exits.count(CRASH_CODE) == crashes
    assert tally.lost == 0
    assert tally.duplicated == crash_ack  # the effect was done once before each such crash
    assert all(runs[i] == 2 for i in ids if i.startswith("ackcrash-"))
    assert all(runs[i] == 1 for i in ids if not i.startswith("ackcrash-"))
    for job_id in ids:
        status = queue.get_status(job_id)
        assert status.stalls == (0 if job_id.startswith("ok-") else 1), job_id
