"""Fault 8: workers whose wall clocks are 60 s ahead and 60 s behind (an injected clock,
skewed.py) reclaim nothing extra: leases are measured on the Redis server's clock."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .conftest import events_of, sized
from .support import enqueue_recorded, wait_all_completed

SKEWED = [sys.executable, str(Path(__file__).with_name("skewed.py"))]
LEASE_MS = 2000


def test_workers_with_skewed_clocks_cause_no_extra_reclaims(
    scale, supervise, ledger, queue_of, report
):
    n = sized(scale, 400, 4000)
    queue = queue_of("chaos-ledger")
    ids = [f"skew-{i}" for i in range(n)]
    enqueue_recorded(queue, ledger, ids, {"seconds": 0.25}, max_stalls=5)
    started = time.time()
    args = ["runworker", "chaos-ledger", "-c", "8", "--lease", str(LEASE_MS),
            "--reap-interval", "0.5"]  # fmt: skip
    ahead = supervise(args, 1, launcher=SKEWED, JOBQ_CHAOS_SKEW="60")
    behind = supervise(args, 1, launcher=SKEWED, JOBQ_CHAOS_SKEW="-60")
    supervise(["runreaper", "--interval", "0.2"], 1, launcher=SKEWED, JOBQ_CHAOS_SKEW="60")
    done = wait_all_completed(queue, ids, sized(scale, 120, 900))
    tally = ledger.tally(done)
    stalled = events_of(queue, "stalled")
    # The skew is real: each worker's handlers stamped their runs with its own clock, so every
    # stamp of the one ahead is past the test's start + 60 s and every stamp of the one behind
    # is before now - 60 s, however long the workers took to start (a loaded machine).
    first = dict(ledger.query("SELECT pid, min(started) FROM executions GROUP BY pid"))
    last = dict(ledger.query("SELECT pid, max(started) FROM executions GROUP BY pid"))
    ended = time.time()
    report(
        fault="8. worker clocks skewed +60 s and −60 s (injected clock)",
        load=f"{n} jobs of 250 ms, 2 workers × 8, lease {LEASE_MS} ms",
        lost=tally.lost, duplicated=tally.duplicated,
        recovery=f"{len(stalled)} reclaims (0 expected)",
    )  # fmt: skip
    assert first[ahead.pids()[0]] >= started + 59
    assert last[behind.pids()[0]] <= ended - 59
    assert tally.lost == 0
    assert stalled == []
    assert tally.duplicated == 0
