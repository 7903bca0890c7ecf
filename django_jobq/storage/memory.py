"""In-process storage: the same contract as Redis, for single-process apps and fast unit tests.

One lock guards everything, so each method is trivially one atomic step. Heaps use lazy
deletion: a cancelled or re-indexed job leaves a stale entry that is skipped when popped, which
keeps cancel O(log n) without a sorted-set implementation.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..job import (
    AckOutcome,
    CancelOutcome,
    ClaimedJob,
    EnqueueOutcome,
    Event,
    FinalOutcome,
    JobOptions,
    JobRecord,
    NewJob,
    StoredEnqueue,
)
from ..states import TERMINAL_STATES, JobState
from .base import ClaimBatch, Clock, ReapReport, Storage, WorkerRecord

PRIORITY_SHIFT = 2**42  # same ordering rule as the Redis backend: (priority, sequence)


@dataclass(slots=True)
class _Rec:
    job_id: str
    payload: bytes
    options: JobOptions
    content_type: str
    created_at: int
    seq: int
    state: JobState = JobState.QUEUED
    attempts: int = 0
    stalls: int = 0
    token: int = 0
    run_at: int | None = None
    started_at: int | None = None
    finished_at: int | None = None
    deadline: int = 0
    worker: str | None = None
    result: bytes | None = None
    error: bytes | None = None
    expires_at: int | None = None
    version: int = 0  # bumped on each re-index; stale heap entries carry an older one


@dataclass(slots=True)
class _Queue:
    jobs: dict[str, _Rec] = field(default_factory=dict)
    queued: list[tuple[int, int, str]] = field(default_factory=list)  # (score, version, id)
    scheduled: list[tuple[int, int, str]] = field(default_factory=list)  # (run_at, version, id)
    active: dict[str, _Rec] = field(default_factory=dict)
    events: deque = field(default_factory=lambda: deque(maxlen=10_000))
    seq: itertools.count = field(default_factory=lambda: itertools.count(1))
    finished: dict[str, int] = field(default_factory=lambda: {"completed": 0, "failed": 0})


class MemoryStorage(Storage):
    supports_multiprocess = False

    def __init__(self, clock: Clock | None = None, events_maxlen: int = 10_000) -> None:
        self.clock = clock
        self._events_maxlen = events_maxlen
        self._cond = threading.Condition()
        self._queues: dict[str, _Queue] = {}
        self._workers: dict[str, tuple[WorkerRecord, int]] = {}  # id -> (record, expires at)
        self._event_seq = itertools.count(1)
        self._interrupted: dict[str, bool] = {}

    # -- helpers ----------------------------------------------------------------------------

    def _now(self) -> int:
        return self.clock() if self.clock else int(time.time() * 1000)

    def _q(self, name: str) -> _Queue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = _Queue(events=deque(maxlen=self._events_maxlen))
        return q

    def _event(self, queue: str, q: _Queue, rec: _Rec, kind: str, now: int) -> None:
        event_id = f"{now}-{next(self._event_seq)}"
        q.events.append(Event(event_id, queue, rec.job_id, kind, now, rec.worker))

    def _index_queued(self, q: _Queue, rec: _Rec) -> None:
        rec.state = JobState.QUEUED
        rec.version += 1
        score = rec.options.priority * PRIORITY_SHIFT + rec.seq
        heapq.heappush(q.queued, (score, rec.version, rec.job_id))

    def _index_scheduled(self, q: _Queue, rec: _Rec, state: JobState, run_at: int) -> None:
        rec.state = state
        rec.run_at = run_at
        rec.version += 1
        heapq.heappush(q.scheduled, (run_at, rec.version, rec.job_id))

    def _finish(self, q: _Queue, rec: _Rec, state: JobState, now: int) -> None:
        rec.state = state
        rec.finished_at = now
        rec.expires_at = now + rec.options.result_ttl
        rec.version += 1
        q.active.pop(rec.job_id, None)
        if state in (JobState.COMPLETED, JobState.FAILED):
            q.finished[state.value] += 1

    def _live(self, q: _Queue, job_id: str, now: int) -> _Rec | None:
        rec = q.jobs.get(job_id)
        if rec is not None and rec.expires_at is not None and rec.expires_at <= now:
            del q.jobs[job_id]
            return None
        return rec

    def _promote_due(self, queue: str, q: _Queue, now: int, limit: int) -> int:
        promoted = 0
        while q.scheduled and q.scheduled[0][0] <= now and promoted < limit:
            _, version, job_id = heapq.heappop(q.scheduled)
            rec = q.jobs.get(job_id)
            if rec is None or rec.version != version:
                continue
            self._index_queued(q, rec)
            self._event(queue, q, rec, "queued", now)
            promoted += 1
        if promoted:
            self._cond.notify_all()
        return promoted

    def _next_due(self, q: _Queue) -> int | None:
        while q.scheduled:
            run_at, version, job_id = q.scheduled[0]
            rec = q.jobs.get(job_id)
            if rec is not None and rec.version == version:
                return run_at
            heapq.heappop(q.scheduled)
        return None

    # -- producer ---------------------------------------------------------------------------

    def enqueue(self, queue: str, job: NewJob) -> StoredEnqueue:
        with self._cond:
            now = self._now()
            q = self._q(queue)
            rec = self._live(q, job.job_id, now)
            if rec is not None:
                outcome = (
                    EnqueueOutcome.COMPLETED
                    if rec.state is JobState.COMPLETED
                    else EnqueueOutcome.DUPLICATE
                )
                return StoredEnqueue(outcome, job.job_id, rec.state, rec.result, rec.error)
            rec = _Rec(job.job_id, job.payload, job.options, job.content_type, now, next(q.seq))
            q.jobs[job.job_id] = rec
            due = max(job.run_at or 0, now + job.delay)
            if due > now:
                self._index_scheduled(q, rec, JobState.SCHEDULED, due)
            else:
                self._index_queued(q, rec)
                self._cond.notify_all()
            self._event(queue, q, rec, rec.state.value, now)
            return StoredEnqueue(EnqueueOutcome.QUEUED, job.job_id, rec.state)

    # -- worker -----------------------------------------------------------------------------

    def claim(self, queue: str, worker_id: str, count: int, lease_ms: int) -> ClaimBatch:
        with self._cond:
            now = self._now()
            q = self._q(queue)
            self._promote_due(queue, q, now, 1000)
            batch = ClaimBatch()
            while q.queued and len(batch.jobs) < count:
                _, version, job_id = heapq.heappop(q.queued)
                rec = q.jobs.get(job_id)
                if rec is None or rec.version != version or rec.state is not JobState.QUEUED:
                    continue
                rec.state = JobState.ACTIVE
                rec.attempts += 1
                rec.token += 1
                rec.started_at = now
                rec.deadline = now + lease_ms
                rec.worker = worker_id
                rec.version += 1
                q.active[job_id] = rec
                self._event(queue, q, rec, "active", now)
                batch.jobs.append(
                    ClaimedJob(
                        queue,
                        job_id,
                        rec.payload,
                        rec.token,
                        rec.attempts,
                        rec.options.max_attempts,
                        rec.options.min_backoff,
                        rec.options.max_backoff,
                        rec.content_type,
                    )
                )
            due = self._next_due(q)
            batch.next_due_in = None if due is None else max(due - now, 0)
            return batch

    def wait_for_jobs(
        self, queues: Sequence[str], timeout: float, worker_id: str | None = None
    ) -> None:
        with self._cond:
            if worker_id is not None and self._interrupted.pop(worker_id, False):
                return
            if any(self._q(name).queued for name in queues):
                return
            self._cond.wait(timeout)
            if worker_id is not None:
                self._interrupted.pop(worker_id, None)

    def interrupt_wait(self, queues: Sequence[str], worker_id: str) -> None:
        with self._cond:
            self._interrupted[worker_id] = True
            self._cond.notify_all()

    def _owned(self, q: _Queue, job_id: str, token: int) -> _Rec | None:
        rec = q.jobs.get(job_id)
        if rec is None or rec.state is not JobState.ACTIVE or rec.token != token:
            return None
        return rec

    def heartbeat(
        self, queue: str, worker_id: str, leases: Sequence[tuple[str, int]], lease_ms: int
    ) -> list[tuple[str, int]]:
        with self._cond:
            now = self._now()
            q = self._q(queue)
            lost = []
            for job_id, token in leases:
                rec = self._owned(q, job_id, token)
                if rec is None or rec.worker != worker_id:
                    lost.append((job_id, token))
                else:
                    rec.deadline = now + lease_ms
            return lost

    def complete(self, queue: str, job_id: str, token: int, result: bytes) -> AckOutcome:
        with self._cond:
            now = self._now()
            q = self._q(queue)
            rec = self._owned(q, job_id, token)
            if rec is None:
                return AckOutcome.LEASE_LOST
            rec.result = result
            self._finish(q, rec, JobState.COMPLETED, now)
            self._event(queue, q, rec, "completed", now)
            self._cond.notify_all()
            return AckOutcome.COMPLETED

    def fail(
        self,
        queue: str,
        job_id: str,
        token: int,
        error: bytes,
        *,
        retry_in: int | None = None,
        permanent: bool = False,
    ) -> AckOutcome:
        with self._cond:
            now = self._now()
            q = self._q(queue)
            rec = self._owned(q, job_id, token)
            if rec is None:
                return AckOutcome.LEASE_LOST
            rec.error = error
            if permanent or rec.attempts >= rec.options.max_attempts:
                self._finish(q, rec, JobState.FAILED, now)
                self._event(queue, q, rec, "failed", now)
                self._cond.notify_all()
                return AckOutcome.FAILED
            q.active.pop(job_id, None)
            due = now + (retry_in or 0)
            self._index_scheduled(q, rec, JobState.RETRYING, due)
            self._event(queue, q, rec, "retrying", now)
            self._cond.notify_all()
            return AckOutcome.RETRYING

    def release(self, queue: str, job_id: str, token: int) -> AckOutcome:
        with self._cond:
            now = self._now()
            q = self._q(queue)
            rec = self._owned(q, job_id, token)
            if rec is None:
                return AckOutcome.LEASE_LOST
            q.active.pop(job_id, None)
            rec.attempts -= 1  # a released run never reached a verdict: it costs no attempt
            self._index_queued(q, rec)
            self._event(queue, q, rec, "released", now)
            self._cond.notify_all()
            return AckOutcome.RELEASED

    # -- management -------------------------------------------------------------------------

    def cancel(self, queue: str, job_id: str) -> CancelOutcome:
        with self._cond:
            now = self._now()
            q = self._q(queue)
            rec = self._live(q, job_id, now)
            if rec is None:
                return CancelOutcome.NOT_FOUND
            if rec.state is JobState.ACTIVE:
                return CancelOutcome.ACTIVE
            if rec.state in TERMINAL_STATES:
                return CancelOutcome(rec.state.value)
            self._finish(q, rec, JobState.CANCELLED, now)
            self._event(queue, q, rec, "cancelled", now)
            self._cond.notify_all()
            return CancelOutcome.CANCELLED

    def get_record(self, queue: str, job_id: str) -> JobRecord | None:
        with self._cond:
            rec = self._live(self._q(queue), job_id, self._now())
            return None if rec is None else self._record(queue, rec)

    @staticmethod
    def _record(queue: str, rec: _Rec) -> JobRecord:
        o = rec.options
        return JobRecord(
            queue=queue,
            job_id=rec.job_id,
            state=rec.state,
            attempts=rec.attempts,
            max_attempts=o.max_attempts,
            stalls=rec.stalls,
            max_stalls=o.max_stalls,
            priority=o.priority,
            created_at=rec.created_at,
            run_at=rec.run_at,
            started_at=rec.started_at,
            finished_at=rec.finished_at,
            worker=rec.worker,
            result_ttl=o.result_ttl,
            content_type=rec.content_type,
            payload=rec.payload,
            result=rec.result,
            error=rec.error,
            expires_at=rec.expires_at,
        )

    def wait_for_outcome(self, queue: str, job_id: str, timeout: float) -> FinalOutcome | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                rec = self._q(queue).jobs.get(job_id)
                if rec is not None and rec.state in TERMINAL_STATES:
                    return FinalOutcome(rec.state, rec.result, rec.error)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def reap(self, queue: str, limit: int = 1000) -> ReapReport:
        with self._cond:
            now = self._now()
            q = self._q(queue)
            report = ReapReport()
            expired = [r for r in q.active.values() if r.deadline <= now][:limit]
            for rec in expired:
                rec.stalls += 1
                if rec.stalls > rec.options.max_stalls:
                    rec.error = b'{"type":"Stalled","message":"lease expired too many times"}'
                    self._finish(q, rec, JobState.FAILED, now)
                    self._event(queue, q, rec, "failed", now)
                    report.failed.append(rec.job_id)
                else:
                    q.active.pop(rec.job_id, None)
                    rec.attempts -= 1  # a stalled run reached no verdict: stalls count it
                    self._index_queued(q, rec)
                    self._event(queue, q, rec, "stalled", now)
                    report.requeued.append(rec.job_id)
            report.promoted = self._promote_due(queue, q, now, limit)
            for job_id in [j for j, r in q.jobs.items() if r.expires_at and r.expires_at <= now]:
                del q.jobs[job_id]
                report.expired += 1
            if expired:
                self._cond.notify_all()
            return report

    def counts(self, queue: str) -> dict[JobState, int]:
        with self._cond:
            q = self._q(queue)
            out = dict.fromkeys(
                (JobState.SCHEDULED, JobState.QUEUED, JobState.ACTIVE, JobState.RETRYING), 0
            )
            for rec in q.jobs.values():
                if rec.state in out:
                    out[rec.state] += 1
            out[JobState.COMPLETED] = q.finished["completed"]
            out[JobState.FAILED] = q.finished["failed"]
            return out

    def read_events(
        self, queue: str, after: str = "0", count: int = 1000, block: float | None = None
    ) -> list[Event]:
        def key(event_id: str) -> tuple[int, int]:
            ms, _, seq = event_id.partition("-")
            return int(ms), int(seq or 0)

        floor = key(after)
        deadline = time.monotonic() + (block or 0)
        with self._cond:
            while True:
                events = [e for e in self._q(queue).events if key(e.id) > floor][:count]
                remaining = deadline - time.monotonic()
                if events or not block or remaining <= 0:
                    return events
                self._cond.wait(remaining)

    def register_queue(self, queue: str) -> None:
        with self._cond:
            self._q(queue)

    def list_queues(self) -> list[str]:
        with self._cond:
            return sorted(self._queues)

    # -- worker registry --------------------------------------------------------------------

    def register_worker(self, worker_id: str, info: dict, ttl_ms: int) -> None:
        with self._cond:
            now = self._now()
            self._workers[worker_id] = (WorkerRecord(worker_id, dict(info), now), now + ttl_ms)

    def deregister_worker(self, worker_id: str) -> None:
        with self._cond:
            self._workers.pop(worker_id, None)

    def list_workers(self) -> list[WorkerRecord]:
        with self._cond:
            now = self._now()
            return [rec for rec, expires in self._workers.values() if expires > now]
