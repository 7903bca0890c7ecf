"""The process's job counts and run-time histogram, kept as plain numbers.

Why not ``prometheus_client`` counters: a worker drains tens of thousands of jobs a second, and
a labelled Prometheus increment (label lookup, a lock, a value object) or a Django signal send
costs a few microseconds, a visible share of a no-op job's ~25 µs of worker CPU. The worker
adds to this tally directly, once per batch of verdicts (per verdict: a bisect into the
buckets and two additions; the verdict counters are the histogram's totals); the Prometheus
families are built from a snapshot only when scraped (``collectors.py``).
Producers (enqueue, cancel) and the reaper feed it through the job signals instead: a round
trip to storage dwarfs a signal there. No ``prometheus_client`` import here: the worker loads
this module whether or not the extra is installed.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import defaultdict
from typing import Any

from ... import signals

# Run time buckets (seconds): from a no-op handler's few ms up to an hour-long batch job.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
               300.0, 900.0, 3600.0)  # fmt: skip
# Wait buckets (seconds from enqueue, or due time, to claim): an idle queue's few ms up to a
# backlog of hours.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0, 900.0, 3600.0, 14400.0)  # fmt: skip
# A verdict's outcome -> the counter it adds to (besides the run-time histogram).
OUTCOME_COUNTER = {"completed": "completed", "failed": "failed", "retrying": "retried",
                   "cancelled": "cancelled"}  # fmt: skip
_UID = "django_jobq.metrics.tally"


class Tally:
    """Counters keyed by (name, labels), and run-time buckets per queue and verdict outcome
    (whose totals are also the completed / failed / retried / cancelled counts)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: defaultdict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
        # queue -> outcome -> [count per bucket (last: above the largest), sum of seconds]
        self.runs: dict[str, dict[str, list[Any]]] = {}
        # queue -> [count per wait bucket (last: above the largest), sum of seconds]
        self.waits: dict[str, list[Any]] = {}
        # (broadcast, group, outcome) -> verdicts of subscriber deliveries sent from here
        self.deliveries: defaultdict[tuple[str, str, str], int] = defaultdict(int)

    def add(self, name: str, labels: tuple[str, ...], n: int = 1) -> None:
        with self._lock:
            self.counters[(name, labels)] += n

    def delivered(self, broadcast: str, group: str, outcome: str, n: int) -> None:
        with self._lock:
            self.deliveries[(broadcast, group, outcome)] += n

    def started(self, queue: str, n: int, waited_ms: list[int | None] | None = None) -> None:
        """A claim of ``n`` jobs of one queue, with how long each waited (ms, as the storage
        measured it; None when it does not say): one lock and a bisect per job."""
        with self._lock:
            self.counters[("started", (queue,))] += n
            if not waited_ms:
                return
            wait = self.waits.get(queue)
            if wait is None:
                wait = self.waits[queue] = [[0] * (len(WAIT_BUCKETS) + 1), 0.0]
            buckets = wait[0]
            for ms in waited_ms:
                if ms is not None:
                    seconds = ms / 1000
                    buckets[bisect_left(WAIT_BUCKETS, seconds)] += 1
                    wait[1] += seconds

    def verdicts(self, queue: str, now: float, timed: list[tuple[str, float]]) -> None:
        """A batch of verdicts of one queue: (outcome, monotonic claim time) each, ``now``
        the time they were sent. One lock and a bisect per verdict: this is the hot path."""
        with self._lock:
            by_outcome = self.runs.get(queue)
            if by_outcome is None:
                by_outcome = self.runs[queue] = {}
            for outcome, since in timed:
                run = by_outcome.get(outcome)
                if run is None:
                    run = by_outcome[outcome] = [[0] * (len(RUN_BUCKETS) + 1), 0.0]
                seconds = now - since
                run[0][bisect_left(RUN_BUCKETS, seconds)] += 1
                run[1] += seconds

    def wait_snapshot(self) -> dict[str, list[Any]]:
        """queue -> [bucket counts, sum of seconds] of the waits, copied under the lock."""
        with self._lock:
            return {queue: [list(buckets), total] for queue, (buckets, total) in self.waits.items()}

    def snapshot(self) -> tuple[dict[tuple[str, tuple[str, ...]], int], dict[Any, Any]]:
        """(counters, runs) copied under the lock; the verdict counters are added from the
        run-time totals, so each verdict is counted once on the hot path."""
        with self._lock:
            counters = dict(self.counters)
            runs = {(queue, outcome): [list(buckets), total]
                    for queue, by_outcome in self.runs.items()
                    for outcome, (buckets, total) in by_outcome.items()}  # fmt: skip
        for (queue, outcome), (buckets, _) in runs.items():
            counter = OUTCOME_COUNTER.get(outcome)
            if counter is not None:
                key = (counter, (queue,))
                counters[key] = counters.get(key, 0) + sum(buckets)
        return counters, runs

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
