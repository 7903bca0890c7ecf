"""Fault 4: a handler running 5 × its lease keeps it by heartbeats; a worker whose heartbeats
stop (SIGSTOP) loses its job once its lease has run out, never before."""

from __future__ import annotations

import signal
import time

from django_jobq import JobState

from ..helpers import wait_until
from .conftest import events_of

LEASE_MS = 2000


def test_heartbeats_hold_a_long_job_and_silence_loses_it_at_the_lease(
    supervise, ledger, queue_of, report
):
    queue = queue_of("chaos-ledger")
    supervise(["runreaper", "--interval", "0.2"], 1)
    # The silent one: takes its job, then is stopped (its heartbeat thread with it).
    silent = supervise(
        ["runworker", "chaos-ledger", "-c", "1", "--lease", str(LEASE_MS)], 1
    )  # fmt: skip
    queue.enqueue("silenced", {"seconds": 4}, max_stalls=3)
    assert wait_until(lambda: ledger.runs_per_job().get("silenced"), 30)
    silent.kill(0, signal.SIGSTOP)
    stopped_ms = time.time() * 1000
    # The healthy one runs a job for 5 × lease, heart-beating every lease / 3.
    supervise(["runworker", "chaos-ledger", "-c", "2", "--lease", str(LEASE_MS)], 1)
    queue.enqueue("long", {"seconds": 5 * LEASE_MS / 1000}, max_stalls=3)
    ledger.record_enqueued(["silenced", "long"])

    def stalled_at() -> int | None:
        return next((e.at for e in events_of(queue, "stalled") if e.job_id == "silenced"), None)

    assert wait_until(lambda: stalled_at() is not None, 60)
    reclaim_after = (stalled_at() - stopped_ms) / 1000
    assert wait_until(lambda: queue.get_status("long").state is JobState.COMPLETED, 30)
    assert wait_until(lambda: queue.get_status("silenced").state is JobState.COMPLETED)
    long_status = queue.get_status("long")
    report(
        fault="4. handler 5 × lease with heartbeats; worker stopped (no heartbeats)",
        load=f"1 job of 10 s, lease {LEASE_MS} ms; 1 job on a SIGSTOPped worker",
        lost=0, duplicated=sum(ledger.runs_per_job().values()) - 2,
        recovery=f"heart-beaten job: {long_status.stalls} reclaims; silent job reclaimed "
        f"{reclaim_after:.2f} s after the stop (lease {LEASE_MS / 1000:g} s)",
    )  # fmt: skip
    assert (long_status.stalls, long_status.attempts) == (0, 1)
    assert len(ledger.executions_of("long")) == 1
    assert not [e for e in events_of(queue, "stalled") if e.job_id == "long"]
    # Never reclaimed while its lease held: the last heartbeat before the stop was at most a
    # third of a lease earlier. How late after the lease it was reclaimed is the report's.
    assert reclaim_after >= (LEASE_MS * 2 / 3 - 50) / 1000, reclaim_after
