"""The storage of the test mode: the in-memory backend on a clock the test moves, recording
every job it stores so a test can assert on what its code enqueued."""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..job import PARKED_FLOOR, EnqueueOutcome, JobOptions, NewJob, StoredEnqueue, ms_to_datetime
from ..serde import serde_for, unwrap
from ..states import TERMINAL_STATES, JobState
from ..storage.memory import MemoryStorage


class TestClock:
    """Epoch milliseconds: real time plus however far the test moved it.

    Real time underneath, not a frozen instant, because code under test computes due times
    from the real clock (``timezone.now() + timedelta(hours=1)``, a schedule's next tick): on
    this clock such a time is never behind "now", and moving the clock by the same hour always
    makes it due."""

    __test__ = False  # not a test class, whatever pytest's name pattern says

    def __init__(self) -> None:
        self._offset_ms = 0
        self._lock = threading.Lock()

    def __call__(self) -> int:
        return int(time.time() * 1000) + self._offset_ms

    def now(self) -> dt.datetime:
        """The clock's time as an aware datetime (UTC)."""
        return dt.datetime.fromtimestamp(self() / 1000, tz=dt.UTC)

    def advance(self, by: float | dt.timedelta) -> dt.datetime:
        """Move the clock forward by ``by`` (seconds or a timedelta); returns the new time."""
        ms = by.total_seconds() * 1000 if isinstance(by, dt.timedelta) else by * 1000
        if isinstance(by, bool) or ms < 0:
            raise ValueError(f"the test clock only moves forward, not by {by!r}")
        with self._lock:
            self._offset_ms += int(ms)
        return self.now()

    def advance_to(self, when: dt.datetime | int) -> dt.datetime:
        """Move the clock to ``when`` (aware datetime or epoch ms) if it is later than now."""
        if isinstance(when, dt.datetime):
            if when.tzinfo is None:
                raise ValueError("advance_to needs a timezone-aware datetime")
            when = int(when.timestamp() * 1000)
        with self._lock:
            self._offset_ms += max(0, when - self())
        return self.now()


@dataclass(frozen=True)
class EnqueuedJob:
    """A job the code under test stored: as the handler will see it, and how it was asked.

    ``payload`` went through the queue's serialiser and back (a tuple arrives as a list, as
    in production). ``state`` is the job's state when ``enqueued()`` was called (None once
    its record is gone: its ``result_ttl`` passed on the test clock, or it was deleted)."""

    queue: str
    id: str
    payload: Any
    options: JobOptions
    run_at: dt.datetime | None  # when it becomes runnable; None: at once
    state: JobState | None
    meta: dict[str, Any] = field(default_factory=dict)  # per-job timeout, flow links
    group: str | None = None
    lifo: bool = False
    dedup_key: str | None = None

    @property
    def priority(self) -> int:
        return self.options.priority


@dataclass(frozen=True, slots=True)
class _Captured:
    queue: str
    job: NewJob
    run_at: int | None


class CapturingStorage(MemoryStorage):
    """``MemoryStorage`` on a ``TestClock``, keeping a record of every job it stored.

    Only jobs that were stored count (outcome ``queued``): a duplicate id stores nothing in
    production, so it adds nothing here either."""

    supports_multiprocess = False

    def __init__(self, clock: TestClock) -> None:
        super().__init__(clock=clock)
        self.test_clock = clock
        self._captured: list[_Captured] = []

    def enqueue(self, queue: str, job: NewJob) -> StoredEnqueue:
        stored = super().enqueue(queue, job)
        if stored.outcome is EnqueueOutcome.QUEUED:
            record = self.get_record(queue, stored.job_id)
            run_at = record.run_at if record is not None else None
            if run_at is not None and not self.test_clock() < run_at < PARKED_FLOOR:
                run_at = None  # runnable at once, or a flow parent waiting for its children
            with self._cond:
                self._captured.append(_Captured(queue, job, run_at))
        return stored

    def forget_captured(self) -> None:
        with self._cond:
            self._captured.clear()

    def captured(self, queue: str | None = None) -> list[EnqueuedJob]:
        with self._cond:
            entries = [c for c in self._captured if queue is None or c.queue == queue]
        return [self._describe(c) for c in entries]

    def _describe(self, entry: _Captured) -> EnqueuedJob:
        job = entry.job
        value = serde_for(job.content_type).loads(job.payload)
        payload, meta = unwrap(job.content_type, value)
        record = self.get_record(entry.queue, job.job_id)
        state = record.state if record is not None else None
        return EnqueuedJob(
            queue=entry.queue, id=job.job_id, payload=payload, options=job.options,
            run_at=ms_to_datetime(entry.run_at), state=state, meta=meta, group=job.group,
            lifo=job.lifo, dedup_key=job.dedup.key if job.dedup else None,
        )  # fmt: skip

    def unfinished(self, queue: str) -> int:
        """Jobs of ``queue`` that have not finished (waiting, blocked or running)."""
        counts = self.counts(queue)
        return sum(n for state, n in counts.items() if state not in TERMINAL_STATES)
