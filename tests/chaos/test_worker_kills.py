"""Fault 1: SIGKILL one of four supervised worker processes every 2 s while jobs run."""

from __future__ import annotations

import time

from ..helpers import wait_until
from .conftest import events_of, sized
from .support import enqueue_recorded, wait_all_completed

LEASE_MS = 3000
CONCURRENCY = 8


def test_sigkill_a_worker_every_two_seconds_loses_nothing(
    scale, supervise, ledger, queue_of, report
):
    n = sized(scale, 2000, 20_000)
    queue = queue_of("chaos-ledger")
    ids = [f"kill-{i}" for i in range(n)]
    # Stalls are the recovery path under test, not a reason to give up on a job.
    enqueue_recorded(queue, ledger, ids, {"seconds": 0.03}, max_stalls=100)
    workers = supervise(
        ["runworker", "chaos-ledger", "-c", str(CONCURRENCY), "--lease", str(LEASE_MS),
         "--reap-interval", "1"], 4,
    )  # fmt: skip
    supervise(["runreaper", "--interval", "0.2"], 1)
    started = time.monotonic()
    assert wait_until(lambda: ledger.runs_per_job(), 60), "no worker ran a job"
    next_kill = time.monotonic() + 2

    def tick() -> None:
        nonlocal next_kill
        if time.monotonic() >= next_kill:
            workers.kill(len(workers.kills) % 4)
            next_kill += 2

    done = wait_all_completed(queue, ids, sized(scale, 180, 900), tick)
    elapsed = time.monotonic() - started
    tally = ledger.tally(done)
    kills = workers.kills

    # Recovery: each run a kill cut short starts again, elsewhere (how soon after the kill is a
    # figure of the report: on a shared machine it measures the neighbours too).
    gaps = []
    for kill in kills:
        for (job_id,) in ledger.query(
            "SELECT job_id FROM executions WHERE pid = %s AND started <= %s", (kill.pid, kill.at)
        ):
            later = [r for r in ledger.executions_of(job_id) if r[3] > kill.at]
            if later:
                gaps.append(later[0][3] - kill.at)
    report(
        fault="1. SIGKILL 1 of 4 workers every 2 s (supervisor restarts)",
        load=f"{n} jobs of 30 ms, 4 × {CONCURRENCY} slots, lease {LEASE_MS} ms",
        lost=tally.lost, duplicated=tally.duplicated, kills=len(kills),
        recovery=f"max {max(gaps, default=0):.2f} s from kill to rerun ({len(gaps)} reruns)",
        seconds=round(elapsed, 1),
    )  # fmt: skip
    assert len(kills) >= 2, "the run ended before the faults it is about"
    assert tally.enqueued == n
    assert tally.lost == 0, f"{tally.lost} jobs never completed"
    assert tally.effects == n
    assert tally.duplicated <= len(kills) * CONCURRENCY
    completions = [e.job_id for e in events_of(queue, "completed")]
    assert len(completions) == len(set(completions)) == n  # one completion per job
