"""In-process storage: the same contract as Redis, for single-process apps and fast unit tests.

One lock guards everything, so each method is trivially one atomic step. Heaps use lazy
deletion: a cancelled or re-indexed job leaves a stale entry that is skipped when popped, which
keeps cancel O(log n) without a sorted-set implementation. Entries carry a version drawn from one
counter for the whole storage, so a stale entry can never match a later record of the same id
(a singleton successor, or an id used again after its record expired).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ...errors import QueueBusy
from ...job import (
    LOG_LINES,
    PARKED_FLOOR,
    AckOutcome,
    CancelOutcome,
    ChangeOutcome,
    ClaimedJob,
    DedupMode,
    EnqueueOutcome,
    Event,
    FailureCall,
    FinalOutcome,
    JobOptions,
    JobRecord,
    NewJob,
    QueueLimits,
    Retention,
    RetryOutcome,
    RunAtUpdate,
    StoredEnqueue,
    final_outcome,
)
from ...states import (
    GROUP_SCAN,
    PROMOTE_LIMIT,
    STALLED_ERROR,
    TERMINAL_STATES,
    JobState,
)
from ..base import ClaimBatch, Clock, ReapReport, Storage, WorkerRecord, token_base
from .broadcast import MemoryBroadcasts

# Jobs a claim may look at (and, for groups over budget, move to scheduled) before it gives up,
# so that one claim's time stays bounded however many jobs wait behind a busy group.
WAITING = (JobState.SCHEDULED, JobState.QUEUED, JobState.RETRYING)


@dataclass(slots=True)
class _Rec:
    job_id: str
    payload: bytes
    options: JobOptions
    content_type: str
    created_at: int
    # Place among queued jobs of one priority, fixed at enqueue: LIFO jobs (tier 0, newest
    # first) before FIFO jobs (tier 1, oldest first).
    order: tuple[int, int]
    lifo: bool = False
    group: str | None = None
    dedup_key: str | None = None
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
    version: int = 0  # set on each re-index; stale heap entries carry an older one
    successor: _Rec | None = None  # blocked singleton run of this id (its run_at: due time)
    progress: bytes | None = None
    logs: list[tuple[int, str]] = field(default_factory=list)
    cancel: str = ""  # "" | "stop" | "force": an operator asked the running attempt to stop


@dataclass(slots=True)
class _Key:
    """A dedup key and the record holding it; the key is free once that record is gone."""

    rec: _Rec
    mode: DedupMode
    until: int | None  # held while now < until (None: until the holder finishes)


@dataclass(slots=True)
class _Queue:
    jobs: dict[str, _Rec] = field(default_factory=dict)
    # (priority, tier, order, version, id)
    queued: list[tuple[int, int, int, int, str]] = field(default_factory=list)
    scheduled: list[tuple[int, int, str]] = field(default_factory=list)  # (run_at, version, id)
    active: dict[str, _Rec] = field(default_factory=dict)
    events: deque = field(default_factory=lambda: deque(maxlen=10_000))
    seq: itertools.count = field(default_factory=lambda: itertools.count(1))
    finished: dict[str, int] = field(default_factory=lambda: {"completed": 0, "failed": 0})
    keys: dict[str, _Key] = field(default_factory=dict)
    paused: bool = False
    hold_until: int = 0  # queue-wide postponement: no claims before this time
    limits: QueueLimits = field(default_factory=QueueLimits)
    claims: deque = field(default_factory=deque)  # claim times within the rate window
    group_claims: dict[str, deque] = field(default_factory=dict)
    failure_hook: bool = False  # permanent failures record a failure call
    failure_calls: dict[str, FailureCall] = field(default_factory=dict)  # call id -> call
    retention: Retention = field(default_factory=Retention)
    # Per final state with a retention policy: id -> the finished record, oldest finish first
    # (the index Redis keeps in a ZSET). An entry whose id now holds another record is stale.
    kept: dict[str, dict[str, _Rec]] = field(default_factory=dict)


class MemoryStorage(Storage):
    supports_multiprocess = False

    def __init__(self, clock: Clock | None = None, events_maxlen: int = 10_000) -> None:
        self.clock = clock
        self._events_maxlen = events_maxlen
        self._cond = threading.Condition()
        self._queues: dict[str, _Queue] = {}
        self._workers: dict[str, tuple[WorkerRecord, int]] = {}  # id -> (record, expires at)
        self._event_seq = itertools.count(1)
        self._versions = itertools.count(1)
        self._last_token = 0  # the last fencing token handed out (see _lease)
        self._interrupted: dict[str, bool] = {}
        self._broadcasts: MemoryBroadcasts | None = None

    # -- helpers ----------------------------------------------------------------------------

    def _now(self) -> int:
        return self.clock() if self.clock else int(time.time() * 1000)

    def broadcasts(self) -> MemoryBroadcasts:
        if self._broadcasts is None:  # one per storage: its broadcasts live in this process
            self._broadcasts = MemoryBroadcasts(clock=self.clock)
        return self._broadcasts

    def _q(self, name: str) -> _Queue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = _Queue(events=deque(maxlen=self._events_maxlen))
        return q

    def _peek(self, name: str) -> _Queue:
        """The queue, or an empty stand-in that is not stored: reads and refused writes must
        not bring a queue into existence (``list_queues``, ``obliterate``)."""
        return self._queues.get(name) or _Queue()

    def _event(self, queue: str, q: _Queue, rec: _Rec, kind: str, now: int) -> None:
        event_id = f"{now}-{next(self._event_seq)}"
        q.events.append(Event(event_id, queue, rec.job_id, kind, now, rec.worker))

    def _index_queued(self, q: _Queue, rec: _Rec) -> None:
        rec.state = JobState.QUEUED
        rec.version = next(self._versions)
        tier, order = rec.order
        heapq.heappush(q.queued, (rec.options.priority, tier, order, rec.version, rec.job_id))

    def _index_scheduled(self, q: _Queue, rec: _Rec, state: JobState, run_at: int) -> None:
        rec.state = state
        rec.run_at = run_at
        rec.version = next(self._versions)
        heapq.heappush(q.scheduled, (run_at, rec.version, rec.job_id))

    def _due_at(self, q: _Queue, rec: _Rec, due: int, now: int) -> None:
        """Give a waiting job a new due time: queued when due, else scheduled (a retrying job
        stays retrying). A queued job keeps its order key, so it keeps its place."""
        if due <= now:
            self._index_queued(q, rec)
            self._cond.notify_all()
        else:
            state = JobState.RETRYING if rec.state is JobState.RETRYING else JobState.SCHEDULED
            self._index_scheduled(q, rec, state, due)

    def _finish(self, q: _Queue, rec: _Rec, state: JobState, now: int) -> None:
        rec.state = state
        rec.finished_at = now
        rec.expires_at = now + rec.options.result_ttl
        rec.version = next(self._versions)
        q.active.pop(rec.job_id, None)
        if state in (JobState.COMPLETED, JobState.FAILED):
            q.finished[state.value] += 1

    def _end_run(self, queue: str, q: _Queue, rec: _Rec, state: JobState, now: int) -> None:
        """An active run reached a final state: record it, tell waiters, and let a blocked
        singleton successor take over the id in the same step."""
        self._finish(q, rec, state, now)
        self._event(queue, q, rec, state.value, now)
        if state is JobState.FAILED and q.failure_hook:  # before a successor takes the id
            self._record_failure_call(queue, q, rec, now)
        succ = rec.successor
        if succ is not None:
            rec.successor = None
            succ.created_at = now
            succ.token = rec.token  # fencing goes on: the old run's token never fits the new run
            q.jobs[succ.job_id] = succ
            self._due_at(q, succ, succ.run_at or 0, now)
            self._event(queue, q, succ, succ.state.value, now)
        self._keep(queue, q, rec, now)
        self._cond.notify_all()

    def _record_failure_call(self, queue: str, q: _Queue, rec: _Rec, now: int) -> None:
        call_id = f"{rec.job_id}:{next(self._versions)}"
        q.failure_calls[call_id] = FailureCall(
            queue, call_id, rec.job_id, rec.payload, rec.content_type, rec.error or b"",
            rec.attempts, now, now, 0,
        )  # fmt: skip

    def _cancel(self, queue: str, q: _Queue, rec: _Rec, now: int) -> None:
        self._finish(q, rec, JobState.CANCELLED, now)
        self._event(queue, q, rec, "cancelled", now)
        self._keep(queue, q, rec, now)

    # -- retention (the same rules as includes/retain.lua) -----------------------------------

    def _keep(self, queue: str, q: _Queue, rec: _Rec, now: int) -> None:
        """Index a record that is final (not one a successor replaced) and trim its state's
        index to the policy's count at once (a dict pop per record: nothing to bound)."""
        state = rec.state.value
        keep = getattr(q.retention, state)
        if keep is None or q.jobs.get(rec.job_id) is not rec:
            return
        index = q.kept.setdefault(state, {})
        index.pop(rec.job_id, None)
        index[rec.job_id] = rec
        self._trim(queue, q, state, now, len(index))

    def _trim(self, queue: str, q: _Queue, state: str, now: int, limit: int) -> int:
        """Drop the oldest entries of ``state``'s index past the count or the age (their
        records with them, each with a 'removed' event) and stale entries met on the way."""
        index = q.kept.get(state, {})
        keep = getattr(q.retention, state)
        removed = 0
        for job_id, rec in list(index.items())[:limit]:
            live = q.jobs.get(job_id) is rec and rec.state.value == state
            over = keep is None or (keep.count is not None and len(index) > keep.count)
            over = over or (keep.age is not None and (rec.finished_at or 0) <= now - keep.age)
            if live and not over:
                break
            del index[job_id]
            if live and keep is not None:
                del q.jobs[job_id]
                self._event(queue, q, rec, "removed", now)
                removed += 1
        return removed

    def _cancel_successor(self, queue: str, q: _Queue, rec: _Rec, now: int) -> None:
        succ = rec.successor
        assert succ is not None
        rec.successor = None
        succ.state = JobState.CANCELLED
        succ.finished_at = now
        self._event(queue, q, succ, "cancelled", now)

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

    @staticmethod
    def _window(claims: deque, window: int, now: int) -> deque:
        """Drop claim times that left the sliding window ending now (a claim at ``t`` counts
        while ``now < t + window``)."""
        while claims and claims[0] <= now - window:
            claims.popleft()
        return claims

    def _rate_free_in(self, q: _Queue, now: int) -> int | None:
        """Ms until the queue's rate budget has room again, or None when it has room now."""
        lim = q.limits
        if lim.rate_max is None or lim.rate_window is None:
            return None
        claims = self._window(q.claims, lim.rate_window, now)
        if len(claims) < lim.rate_max:
            return None
        return claims[0] + lim.rate_window - now

    def _blocked_from_claiming(self, q: _Queue, now: int) -> bool:
        lim = q.limits
        return (
            q.paused
            or q.hold_until > now
            or (lim.concurrency is not None and len(q.active) >= lim.concurrency)
            or self._rate_free_in(q, now) is not None
        )

    # -- producer ---------------------------------------------------------------------------

    @staticmethod
    def _due(job: NewJob, now: int) -> int:
        due = max(job.run_at or 0, now + job.delay)
        if job.dedup is not None and job.dedup.mode is DedupMode.DEBOUNCE and job.dedup.ttl:
            due = max(due, now + job.dedup.ttl)
        return due

    def _new_rec(self, q: _Queue, job: NewJob, now: int) -> _Rec:
        seq = next(q.seq)
        return _Rec(
            job.job_id, job.payload, job.options, job.content_type, now,
            (0, -seq) if job.lifo else (1, seq),
            lifo=job.lifo, group=job.group,
        )  # fmt: skip

    @staticmethod
    def _apply_update(
        rec: _Rec, job: NewJob, current_due: int, new_due: int
    ) -> tuple[bool, int | None]:
        """Write into ``rec`` what ``job.update`` changes, except its due time. Returns whether
        anything changes at all (else the enqueue is a plain duplicate) and the due time to
        move the job to (None: keep it). ``current_due`` is the job's due time, now for a
        queued one."""
        update = job.update
        assert update is not None
        changed = False
        if update.data and (rec.payload != job.payload or rec.content_type != job.content_type):
            rec.payload, rec.content_type = job.payload, job.content_type
            changed = True
        opts, new = rec.options, job.options
        if update.max_attempts and opts.max_attempts != new.max_attempts:
            rec.options = opts = replace(opts, max_attempts=new.max_attempts)
            changed = True
        backoff = (new.min_backoff, new.max_backoff)
        if update.backoff and (opts.min_backoff, opts.max_backoff) != backoff:
            rec.options = replace(opts, min_backoff=backoff[0], max_backoff=backoff[1])
            changed = True
        if update.reset_counts and (rec.attempts or rec.stalls):
            rec.attempts = rec.stalls = 0
            changed = True
        move = {
            RunAtUpdate.NO: False,
            RunAtUpdate.YES: new_due != current_due,
            RunAtUpdate.IF_LATER: new_due > current_due,
            RunAtUpdate.IF_EARLIER: new_due < current_due,
        }[update.run_at]
        return changed or move, new_due if move else None

    def enqueue(self, queue: str, job: NewJob) -> StoredEnqueue:
        with self._cond:
            now = self._now()
            q = self._q(queue)
            rec = self._live(q, job.job_id, now)
            if rec is not None:
                return self._enqueue_existing(queue, q, rec, job, now)
            if job.dedup is not None:
                key = q.keys.get(job.dedup.key)
                if key is not None and self._held(q, key, now):
                    holder = key.rec
                    if key.mode is not DedupMode.DEBOUNCE:
                        return StoredEnqueue(
                            EnqueueOutcome.DUPLICATE, holder.job_id, holder.state,
                            holder.result, holder.error,
                        )  # fmt: skip
                    if holder.state in WAITING:
                        holder.payload, holder.content_type = job.payload, job.content_type
                        self._due_at(q, holder, self._due(job, now), now)
                        key.until = now + (job.dedup.ttl or 0)
                        self._event(queue, q, holder, holder.state.value, now)
                        return StoredEnqueue(EnqueueOutcome.UPDATED, holder.job_id, holder.state)
                    # A debounce holder that runs or finished: this repeat is a new job.
            rec = self._new_rec(q, job, now)
            q.jobs[job.job_id] = rec
            if job.dedup is not None:
                rec.dedup_key = job.dedup.key
                until = None if job.dedup.ttl is None else now + job.dedup.ttl
                q.keys[job.dedup.key] = _Key(rec, job.dedup.mode, until)
            self._due_at(q, rec, self._due(job, now), now)
            self._event(queue, q, rec, rec.state.value, now)
            return StoredEnqueue(EnqueueOutcome.QUEUED, job.job_id, rec.state)

    def _enqueue_existing(
        self, queue: str, q: _Queue, rec: _Rec, job: NewJob, now: int
    ) -> StoredEnqueue:
        if rec.state is JobState.COMPLETED:
            return StoredEnqueue(EnqueueOutcome.COMPLETED, rec.job_id, rec.state, rec.result)
        if rec.state in WAITING and job.update is not None:
            current = now if rec.state is JobState.QUEUED else (rec.run_at or now)
            changed, due = self._apply_update(rec, job, current, self._due(job, now))
            if changed:
                if due is not None:
                    self._due_at(q, rec, due, now)
                self._event(queue, q, rec, rec.state.value, now)
                return StoredEnqueue(EnqueueOutcome.UPDATED, rec.job_id, rec.state)
        elif rec.state is JobState.ACTIVE and job.singleton:
            succ = rec.successor
            if succ is None:
                succ = rec.successor = self._new_rec(q, job, now)
                succ.state = JobState.BLOCKED
                succ.run_at = self._due(job, now)
                self._event(queue, q, succ, "blocked", now)
                return StoredEnqueue(EnqueueOutcome.QUEUED, rec.job_id, JobState.BLOCKED)
            if job.update is not None:
                current = max(succ.run_at or now, now)
                changed, due = self._apply_update(succ, job, current, self._due(job, now))
                if due is not None:
                    succ.run_at = due
                if changed:
                    self._event(queue, q, succ, "blocked", now)
                    return StoredEnqueue(EnqueueOutcome.UPDATED, rec.job_id, JobState.BLOCKED)
            return StoredEnqueue(EnqueueOutcome.DUPLICATE, rec.job_id, JobState.BLOCKED)
        return StoredEnqueue(EnqueueOutcome.DUPLICATE, rec.job_id, rec.state, None, rec.error)

    def _held(self, q: _Queue, key: _Key, now: int) -> bool:
        holder = key.rec
        if self._live(q, holder.job_id, now) is not holder:
            return False  # expired, cleaned, replaced or obliterated: the key is free
        if key.until is not None and now >= key.until:
            return False
        return key.mode is not DedupMode.SIMPLE or holder.state not in TERMINAL_STATES

    # -- worker -----------------------------------------------------------------------------

    def claim(self, queue: str, worker_id: str, count: int, lease_ms: int) -> ClaimBatch:
        with self._cond:
            now = self._now()
            q = self._peek(queue)
            self._promote_due(queue, q, now, PROMOTE_LIMIT)
            batch = ClaimBatch()
            if q.paused:
                return batch
            if q.hold_until > now:
                batch.next_due_in = q.hold_until - now
                return batch
            lim = q.limits
            budget = count
            if lim.concurrency is not None:
                budget = min(budget, lim.concurrency - len(q.active))
                if budget <= 0:
                    return batch  # the verdict that frees a slot wakes a worker
            rate_limited = lim.rate_max is not None and lim.rate_window is not None
            if rate_limited:
                free_in = self._rate_free_in(q, now)
                if free_in is not None:
                    batch.next_due_in = free_in
                    return batch
                budget = min(budget, lim.rate_max - len(q.claims))  # type: ignore[operator]
            group_max, group_window = lim.group_rate_max, lim.group_rate_window
            looked = 0
            while q.queued and len(batch.jobs) < budget and looked < budget + GROUP_SCAN:
                *_, version, job_id = heapq.heappop(q.queued)
                rec = q.jobs.get(job_id)
                if rec is None or rec.version != version or rec.state is not JobState.QUEUED:
                    continue
                looked += 1
                if rec.group is not None and group_max is not None and group_window is not None:
                    window = q.group_claims.setdefault(rec.group, deque())
                    if len(self._window(window, group_window, now)) >= group_max:
                        self._index_scheduled(q, rec, JobState.SCHEDULED, window[0] + group_window)
                        self._event(queue, q, rec, "scheduled", now)
                        continue
                    window.append(now)
                if rate_limited:
                    q.claims.append(now)
                batch.jobs.append(self._lease(queue, q, rec, worker_id, now, lease_ms))
            free_in = self._rate_free_in(q, now) if rate_limited else None
            if free_in is not None:
                batch.next_due_in = free_in
            elif lim.concurrency is None or len(q.active) < lim.concurrency:
                due = self._next_due(q)
                batch.next_due_in = None if due is None else max(due - now, 0)
            for name in [g for g, w in q.group_claims.items() if not w]:
                del q.group_claims[name]  # groups with no claim in their window
            return batch

    def _lease(
        self, queue: str, q: _Queue, rec: _Rec, worker_id: str, now: int, lease_ms: int
    ) -> ClaimedJob:
        rec.state = JobState.ACTIVE
        rec.attempts += 1
        # Storage-wide and strictly increasing: no token repeats for the life of the process,
        # even for an id deleted and enqueued again (see token_base).
        self._last_token = max(self._last_token + 1, rec.token + 1, token_base())
        rec.token = self._last_token
        rec.started_at = now
        rec.deadline = now + lease_ms
        rec.worker = worker_id
        rec.version = next(self._versions)
        q.active[rec.job_id] = rec
        self._event(queue, q, rec, "active", now)
        o = rec.options
        return ClaimedJob(
            queue, rec.job_id, rec.payload, rec.token, rec.attempts, o.max_attempts,
            o.min_backoff, o.max_backoff, rec.content_type,
            max(0, now - max(rec.created_at, rec.run_at or 0)),
        )  # fmt: skip

    def wait_for_jobs(
        self, queues: Sequence[str], timeout: float, worker_id: str | None = None
    ) -> None:
        with self._cond:
            if worker_id is not None and self._interrupted.pop(worker_id, False):
                return
            now = self._now()
            for name in queues:
                q = self._peek(name)
                if q.queued and not self._blocked_from_claiming(q, now):
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
            q = self._peek(queue)
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
            q = self._peek(queue)
            rec = self._owned(q, job_id, token)
            if rec is None:
                return AckOutcome.LEASE_LOST
            rec.result = result
            self._end_run(queue, q, rec, JobState.COMPLETED, now)
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
        final: JobState = JobState.FAILED,
    ) -> AckOutcome:
        """``final`` CANCELLED is ``cancel_active``: the same ending, in another state."""
        with self._cond:
            now = self._now()
            q = self._peek(queue)
            rec = self._owned(q, job_id, token)
            if rec is None:
                return AckOutcome.LEASE_LOST
            rec.error = error
            if permanent or rec.attempts >= rec.options.max_attempts:
                self._end_run(queue, q, rec, final, now)
                return AckOutcome(final.value)
            q.active.pop(job_id, None)
            due = now + (retry_in or 0)
            self._index_scheduled(q, rec, JobState.RETRYING, due)
            self._event(queue, q, rec, "retrying", now)
            self._cond.notify_all()
            return AckOutcome.RETRYING

    def report(
        self,
        queue: str,
        job_id: str,
        token: int,
        *,
        progress: bytes | None = None,
        log: str | None = None,
    ) -> bool:
        with self._cond:
            now = self._now()
            q = self._peek(queue)
            rec = self._owned(q, job_id, token)
            if rec is None:
                return False
            if progress is not None:
                rec.progress = progress
                self._event(queue, q, rec, "progress", now)
            if log is not None:
                rec.logs.append((now, log))
                del rec.logs[:-LOG_LINES]
                self._event(queue, q, rec, "log", now)
            return True

    def request_cancel(self, queue: str, job_id: str, *, force: bool = False) -> CancelOutcome:
        with self._cond:
            rec = self._live(self._peek(queue), job_id, self._now())
            if rec is None or rec.state is not JobState.ACTIVE or rec.successor is not None:
                return self.cancel(queue, job_id)  # the condition's lock is re-entrant
            rec.cancel = "force" if force else "stop"
            return CancelOutcome.REQUESTED

    def cancel_requests(
        self, queue: str, leases: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], bool]:
        with self._cond:
            q = self._peek(queue)
            out = {}
            for job_id, token in leases:
                rec = self._owned(q, job_id, token)
                if rec is not None and rec.cancel:
                    out[(job_id, token)] = rec.cancel == "force"
            return out

    def cancel_active(self, queue: str, job_id: str, token: int, error: bytes) -> AckOutcome:
        return self.fail(queue, job_id, token, error, permanent=True, final=JobState.CANCELLED)

    def release(self, queue: str, job_id: str, token: int) -> AckOutcome:
        with self._cond:
            now = self._now()
            q = self._peek(queue)
            rec = self._owned(q, job_id, token)
            if rec is None:
                return AckOutcome.LEASE_LOST
            q.active.pop(job_id, None)
            rec.attempts -= 1  # a released run never reached a verdict: it costs no attempt
            self._index_queued(q, rec)
            self._event(queue, q, rec, "released", now)
            self._cond.notify_all()
            return AckOutcome.RELEASED

    def postpone(
        self, queue: str, job_id: str, token: int, delay_ms: int, *, queue_wide: bool = False
    ) -> AckOutcome:
        with self._cond:
            now = self._now()
            q = self._peek(queue)
            rec = self._owned(q, job_id, token)
            if rec is None:
                return AckOutcome.LEASE_LOST
            q.active.pop(job_id, None)
            rec.attempts -= 1  # rate limited before doing its work: it costs no attempt
            self._index_scheduled(q, rec, JobState.SCHEDULED, now + delay_ms)
            if queue_wide:
                # The latest deadline holds: an earlier one must not cut a longer wait short.
                q.hold_until = max(q.hold_until, now + delay_ms)
            self._event(queue, q, rec, "postponed", now)
            self._cond.notify_all()  # a freed concurrency slot
            return AckOutcome.POSTPONED

    # -- management -------------------------------------------------------------------------

    def cancel(self, queue: str, job_id: str) -> CancelOutcome:
        with self._cond:
            now = self._now()
            q = self._peek(queue)
            rec = self._live(q, job_id, now)
            if rec is None:
                return CancelOutcome.NOT_FOUND
            if rec.successor is not None:
                self._cancel_successor(queue, q, rec, now)
                return CancelOutcome.CANCELLED
            if rec.state is JobState.ACTIVE:
                return CancelOutcome.ACTIVE
            if rec.state in TERMINAL_STATES:
                return CancelOutcome(rec.state.value)
            self._cancel(queue, q, rec, now)
            self._cond.notify_all()
            return CancelOutcome.CANCELLED

    def change(
        self, queue: str, job_id: str, *, run_at: int | None = None, priority: int | None = None
    ) -> ChangeOutcome:
        with self._cond:
            now = self._now()
            q = self._peek(queue)
            rec = self._live(q, job_id, now)
            if rec is None:
                return ChangeOutcome.NOT_FOUND
            if rec.state not in WAITING:
                succ = rec.successor
                if succ is None:
                    return ChangeOutcome(rec.state.value)
                if priority is not None:
                    succ.options = replace(succ.options, priority=priority)
                if run_at is not None:
                    succ.run_at = run_at
                self._event(queue, q, succ, "blocked", now)
                return ChangeOutcome.CHANGED
            if priority is not None:
                rec.options = replace(rec.options, priority=priority)
            if run_at is not None:
                self._due_at(q, rec, run_at, now)
            elif rec.state is JobState.QUEUED:
                self._index_queued(q, rec)  # the new priority, the same order key
            self._event(queue, q, rec, rec.state.value, now)
            return ChangeOutcome.CHANGED

    def retry(self, queue: str, job_id: str) -> RetryOutcome:
        with self._cond:
            now = self._now()
            q = self._peek(queue)
            rec = self._live(q, job_id, now)
            if rec is None:
                return RetryOutcome.NOT_FOUND
            if rec.state in (JobState.ACTIVE, JobState.COMPLETED):
                return RetryOutcome(rec.state.value)
            if rec.state not in (JobState.FAILED, JobState.CANCELLED):
                return RetryOutcome.WAITING
            key = q.keys.get(rec.dedup_key or "")
            if key is not None and key.rec is rec and key.mode is DedupMode.SIMPLE:
                del q.keys[rec.dedup_key or ""]  # freed when it ended; a retry does not retake it
            q.kept.get(rec.state.value, {}).pop(rec.job_id, None)
            rec.attempts = rec.stalls = 0
            rec.error = rec.result = rec.progress = None
            rec.cancel = ""
            rec.finished_at = rec.expires_at = rec.run_at = None
            self._index_queued(q, rec)
            self._event(queue, q, rec, "retried", now)
            self._cond.notify_all()
            return RetryOutcome.RETRIED

    def _dead(self, q: _Queue, now: int) -> list[_Rec]:
        # The memory backend keeps no index: a linear scan is fine for what it holds.
        dead = [
            r
            for r in q.jobs.values()
            if r.state is JobState.FAILED and not (r.expires_at and r.expires_at <= now)
        ]
        # version is stamped at finish from a global counter: it orders failures within one
        # millisecond, which the job id would not.
        dead.sort(key=lambda r: (r.finished_at or 0, r.version), reverse=True)
        return dead

    def dead_letters(self, queue: str, offset: int = 0, limit: int = 100) -> list[JobRecord]:
        with self._cond:
            dead = self._dead(self._peek(queue), self._now())[offset : offset + limit]
            return [self._record(queue, r) for r in dead]

    def parked(self, queue: str, limit: int = 200) -> list[str]:
        with self._cond:
            q = self._peek(queue)
            ids = [
                r.job_id
                for r in q.jobs.values()
                if r.state is JobState.SCHEDULED and (r.run_at or 0) >= PARKED_FLOOR
            ]
            return sorted(ids)[:limit]

    def count_dead(self, queue: str) -> int:
        with self._cond:
            return len(self._dead(self._peek(queue), self._now()))

    def purge_dead(self, queue: str, job_ids: Sequence[str] | None = None) -> int:
        with self._cond:
            q = self._peek(queue)
            dead = self._dead(q, self._now())
            wanted = None if job_ids is None else set(job_ids)
            doomed = [r.job_id for r in dead if wanted is None or r.job_id in wanted]
            for job_id in doomed:
                del q.jobs[job_id]
            return len(doomed)

    def delete_finished(self, queue: str, job_ids: Sequence[str]) -> int:
        with self._cond:
            q = self._peek(queue)
            now = self._now()
            doomed = [
                job_id
                for job_id in dict.fromkeys(job_ids)
                if (rec := self._live(q, job_id, now)) is not None and rec.state in TERMINAL_STATES
            ]
            for job_id in doomed:
                del q.jobs[job_id]
            return len(doomed)

    def get_record(self, queue: str, job_id: str) -> JobRecord | None:
        with self._cond:
            rec = self._live(self._peek(queue), job_id, self._now())
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
            lifo=rec.lifo,
            group=rec.group,
            dedup_key=rec.dedup_key,
            min_backoff=o.min_backoff,
            max_backoff=o.max_backoff,
            has_successor=rec.successor is not None,
            progress=rec.progress,
            logs=tuple(rec.logs),
        )

    def wait_for_outcome(self, queue: str, job_id: str, timeout: float) -> FinalOutcome | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            # Hold the record itself: a singleton successor may take over the id, and this
            # caller waits for the run it joined.
            rec = self._peek(queue).jobs.get(job_id)
            while True:
                if rec is None:
                    rec = self._peek(queue).jobs.get(job_id)
                if (finished := final_outcome(rec)) is not None:
                    return finished
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def reap(self, queue: str, limit: int = 1000) -> ReapReport:
        with self._cond:
            now = self._now()
            q = self._peek(queue)
            report = ReapReport()
            expired = [r for r in q.active.values() if r.deadline <= now][:limit]
            for rec in expired:
                rec.stalls += 1
                if rec.stalls > rec.options.max_stalls:
                    rec.error = STALLED_ERROR
                    self._end_run(queue, q, rec, JobState.FAILED, now)
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
            for name in [k for k, key in q.keys.items() if not self._held(q, key, now)]:
                del q.keys[name]
            for state in list(q.kept):
                report.removed += self._trim(queue, q, state, now, limit)
            if expired:
                self._cond.notify_all()
            return report

    def counts(self, queue: str) -> dict[JobState, int]:
        with self._cond:
            q = self._peek(queue)
            now = self._now()
            live = (JobState.SCHEDULED, JobState.QUEUED, JobState.ACTIVE, JobState.RETRYING)
            out = dict.fromkeys(live, 0)
            out[JobState.BLOCKED] = 0
            for rec in q.jobs.values():
                if rec.expires_at is not None and rec.expires_at <= now:
                    continue
                if rec.state in out:
                    out[rec.state] += 1
                if rec.successor is not None:
                    out[JobState.BLOCKED] += 1
            out[JobState.COMPLETED] = q.finished["completed"]
            out[JobState.FAILED] = q.finished["failed"]
            return out

    def oldest_queued(self, queue: str) -> int | None:
        with self._cond:
            since = [max(r.created_at, r.run_at or 0) for r in self._peek(queue).jobs.values()
                     if r.state is JobState.QUEUED]  # fmt: skip
        return min(since, default=None)

    def read_events(
        self, queue: str, after: str = "0", count: int = 1000, block: float | None = None
    ) -> list[Event]:
        return self.read_events_many({queue: after}, count, block)[queue]

    def read_events_many(
        self, after: dict[str, str], count: int = 1000, block: float | None = None
    ) -> dict[str, list[Event]]:
        """One wait over every queue: each change notifies the storage's one condition."""
        floors = {queue: _event_key(position) for queue, position in after.items()}
        deadline = time.monotonic() + (block or 0)
        with self._cond:
            while True:
                out = {
                    queue: [e for e in self._peek(queue).events if _event_key(e.id) > floor][:count]
                    for queue, floor in floors.items()
                }
                remaining = deadline - time.monotonic()
                if any(out.values()) or not block or remaining <= 0:
                    return out
                self._cond.wait(remaining)

    # -- failure handler calls --------------------------------------------------------------

    def set_failure_hook(self, queue: str, enabled: bool) -> None:
        with self._cond:
            self._q(queue).failure_hook = enabled

    def failure_hook(self, queue: str) -> bool:
        with self._cond:
            return self._peek(queue).failure_hook

    def _pending_calls(self, queue: str) -> list[FailureCall]:
        calls = self._peek(queue).failure_calls.values()
        return sorted(calls, key=lambda c: (c.due_at, c.call_id))

    def claim_failure_calls(
        self, queue: str, worker_id: str, count: int, lease_ms: int
    ) -> list[FailureCall]:
        with self._cond:
            now = self._now()
            q = self._peek(queue)
            due = [c for c in self._pending_calls(queue) if c.due_at <= now][:count]
            out = []
            for call in due:
                leased = replace(
                    call, due_at=now + lease_ms, tries=call.tries + 1, worker=worker_id
                )
                q.failure_calls[call.call_id] = leased
                out.append(leased)
            return out

    def settle_failure_call(
        self,
        queue: str,
        call: FailureCall,
        *,
        ok: bool,
        retry_in_ms: int = 0,
        error: bytes | None = None,
    ) -> bool:
        with self._cond:
            q = self._peek(queue)
            held = q.failure_calls.get(call.call_id)
            if held is None or held.tries != call.tries:
                return False
            if ok:
                del q.failure_calls[call.call_id]
            else:
                due = self._now() + max(retry_in_ms, 0)
                q.failure_calls[call.call_id] = replace(held, due_at=due, last_error=error)
            return True

    def count_failure_calls(self, queue: str) -> int:
        with self._cond:
            return len(self._peek(queue).failure_calls)

    def failure_calls(self, queue: str, offset: int = 0, limit: int = 100) -> list[FailureCall]:
        with self._cond:
            return self._pending_calls(queue)[offset : offset + limit]

    # -- queue control ----------------------------------------------------------------------

    def pause(self, queue: str) -> None:
        with self._cond:
            self._q(queue).paused = True

    def resume(self, queue: str) -> None:
        with self._cond:
            q = self._queues.get(queue)
            if q is not None:
                q.paused = False
            self._cond.notify_all()

    def is_paused(self, queue: str) -> bool:
        with self._cond:
            return self._peek(queue).paused

    def set_limits(self, queue: str, limits: QueueLimits) -> None:
        with self._cond:
            self._q(queue).limits = limits
            self._cond.notify_all()

    def get_limits(self, queue: str) -> QueueLimits:
        with self._cond:
            return self._peek(queue).limits

    def set_retention(self, queue: str, retention: Retention | None) -> None:
        with self._cond:
            self._q(queue).retention = retention or Retention()

    def get_retention(self, queue: str) -> Retention:
        with self._cond:
            return self._peek(queue).retention

    def drain(self, queue: str, *, delayed: bool = True) -> int:
        with self._cond:
            now = self._now()
            q = self._peek(queue)
            states = WAITING if delayed else (JobState.QUEUED,)
            cancelled = 0
            for rec in list(q.jobs.values()):
                if rec.expires_at is not None and rec.expires_at <= now:
                    continue
                if rec.state in states:
                    self._cancel(queue, q, rec, now)
                    cancelled += 1
                # A drained run's successor goes with it: no run of a drained id survives.
                if rec.successor is not None and (delayed or rec.state is JobState.CANCELLED):
                    self._cancel_successor(queue, q, rec, now)
                    cancelled += 1
            if cancelled:
                self._cond.notify_all()
            return cancelled

    def clean(
        self,
        queue: str,
        older_than_ms: int,
        states: Sequence[JobState] = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED),
        limit: int = 10_000,
    ) -> int:
        with self._cond:
            now = self._now()
            q = self._peek(queue)
            wanted = {JobState(s) for s in states} & TERMINAL_STATES
            cutoff = now - older_than_ms
            doomed = [
                job_id
                for job_id, rec in q.jobs.items()
                if rec.state in wanted
                and rec.finished_at is not None
                and rec.finished_at <= cutoff
                and not (rec.expires_at is not None and rec.expires_at <= now)
            ][:limit]
            for job_id in doomed:
                del q.jobs[job_id]
            return len(doomed)

    def obliterate(self, queue: str, *, force: bool = False) -> int:
        with self._cond:
            now = self._now()
            q = self._queues.get(queue)
            if q is None:
                return 0
            if q.active and not force:
                raise QueueBusy(f"queue {queue!r} has {len(q.active)} active job(s)")
            removed = sum(1 for r in q.jobs.values() if r.expires_at is None or r.expires_at > now)
            del self._queues[queue]
            self._cond.notify_all()
            return removed

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


def _event_key(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)
