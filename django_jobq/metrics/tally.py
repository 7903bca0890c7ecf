"""The process's job counts and run-time histogram, kept as plain numbers.

Why not ``prometheus_client`` counters: a worker drains tens of thousands of jobs a second, and
a labelled Prometheus increment (label lookup, a lock, a value object) or a Django signal send
costs a few microseconds, a visible share of a job's ~40 µs. The worker adds to this tally
directly, under the lock it already holds for each verdict (a dict increment and a bisect);
the Prometheus families are built from a snapshot only when scraped (``collectors.py``).
Producers (enqueue, cancel) and the reaper feed it through the job signals instead: a round
trip to storage dwarfs a signal there. No ``prometheus_client`` import here: the worker loads
this module whether or not the extra is installed.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import defaultdict
from typing import Any

from .. import signals

# Run time buckets (seconds): from a no-op handler's few ms up to an hour-long batch job.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
               300.0, 900.0, 3600.0)  # fmt: skip
# A verdict's outcome -> the counter it adds to (besides the run-time histogram).
OUTCOME_COUNTER = {"completed": "completed", "failed": "failed", "retrying": "retried",
                   "cancelled": "cancelled"}  # fmt: skip
_UID = "django_jobq.metrics.tally"


class Tally:
    """Counters keyed by (name, labels) and per-(queue, outcome) run-time buckets."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: defaultdict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
        # (queue, outcome) -> [count per bucket (last: above the largest), sum of seconds]
        self.runs: dict[tuple[str, str], list[Any]] = {}

    def add(self, name: str, labels: tuple[str, ...], n: int = 1) -> None:
        with self._lock:
            self.counters[(name, labels)] += n

    def started(self, queue: str, n: int) -> None:
        with self._lock:
            self.counters[("started", (queue,))] += n

    def finished(self, queue: str, outcome: str, seconds: float) -> None:
        """One verdict: its counter and its run time."""
        with self._lock:
            counter = OUTCOME_COUNTER.get(outcome)
            if counter is not None:
                self.counters[(counter, (queue,))] += 1
            run = self.runs.get((queue, outcome))
            if run is None:
                run = self.runs[(queue, outcome)] = [[0] * (len(RUN_BUCKETS) + 1), 0.0]
            run[0][bisect_left(RUN_BUCKETS, seconds)] += 1
            run[1] += seconds

    def snapshot(self) -> tuple[dict[tuple[str, tuple[str, ...]], int], dict[Any, Any]]:
        with self._lock:
            runs = {key: [list(buckets), total] for key, (buckets, total) in self.runs.items()}
            return dict(self.counters), runs

    # -- signal receivers: producers and the reaper (the worker calls the methods above) ------

    def on_enqueued(self, sender: Any, *, queue: str, outcome: str, **_: Any) -> None:
        self.add("enqueued", (queue, outcome))

    def on_cancelled(self, sender: Any, *, queue: str, worker_id: Any = None, **_: Any) -> None:
        if worker_id is None:  # a waiting job; running ones are counted by their worker
            self.add("cancelled", (queue,))

    def on_stalled(self, sender: Any, *, queue: str, failed: bool, **_: Any) -> None:
        self.add("stalled", (queue, "failed" if failed else "requeued"))


_lock = threading.Lock()
_tally: Tally | None = None


def current() -> Tally | None:
    """This process's tally if metrics were installed, else None (nothing is counted)."""
    return _tally


def install() -> Tally:
    """Create this process's tally and connect its receivers (idempotent)."""
    global _tally
    with _lock:
        if _tally is None:
            _tally = Tally()
            signals.job_enqueued.connect(_tally.on_enqueued, weak=False, dispatch_uid=_UID)
            signals.job_cancelled.connect(_tally.on_cancelled, weak=False, dispatch_uid=_UID)
            signals.job_stalled.connect(_tally.on_stalled, weak=False, dispatch_uid=_UID)
        return _tally


def uninstall() -> None:
    """Disconnect and forget the tally (tests; a process that stops exporting)."""
    global _tally
    with _lock:
        for signal in (signals.job_enqueued, signals.job_cancelled, signals.job_stalled):
            signal.disconnect(dispatch_uid=_UID)
        _tally = None
