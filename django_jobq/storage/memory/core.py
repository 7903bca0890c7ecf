"""The base of the in-memory backend: the records and queues, the one lock, the clock, ``_step``
and the helpers shared by the transitions (which live in the modules layered on it)."""

from __future__ import annotations

import functools
import heapq
import inspect
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Concatenate, overload

from ...job import (
    EVENT_DATA_MAX,
    DedupMode,
    Event,
    FailureCall,
    JobOptions,
    QueueLimits,
    Retention,
    event_data,
)
from ...states import JobState
from ..base import Clock, Storage, WorkerRecord
from .broadcast import MemoryBroadcasts

# Waiting to run: the states an update, a debounce, a change or a drain still moves.
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


def _event_key(event_id: str) -> tuple[int, int]:
    """An event id ``<ms>-<seq>`` (or ``<ms>``) as a sortable pair, as Redis orders them."""
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(slots=True)
class _Queue:
    jobs: dict[str, _Rec] = field(default_factory=dict)
    # (priority, tier, order, version, id)
    queued: list[tuple[int, int, int, int, str]] = field(default_factory=list)
    scheduled: list[tuple[int, int, str]] = field(default_factory=list)  # (run_at, version, id)
    active: dict[str, _Rec] = field(default_factory=dict)
    events: deque = field(default_factory=lambda: deque(maxlen=10_000))
    # The newest event id gone from ``events`` (dropped by the cap, or of the queue this one
    # replaced after an obliterate): a reader positioned before it lost events.
    events_gone: tuple[int, int] = (0, 0)
    seq: itertools.count = field(default_factory=lambda: itertools.count(1))
    finished: dict[str, int] = field(
        default_factory=lambda: {"completed": 0, "failed": 0, "cancelled": 0}
    )
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
    # (expires at, version, state, id) per entry there: an expired record counts no more.
    expiring: list[tuple[int, int, str, str]] = field(default_factory=list)


type _OnQueue[S, **P, R] = Callable[Concatenate[S, _Queue, int, P], R]
type _OnJob[S, **P, R] = Callable[Concatenate[S, _Queue, _Rec, int, P], R]


@overload
def _step[S, **P, R]() -> Callable[[_OnQueue[S, P, R]], Callable[Concatenate[S, P], R]]: ...
@overload
def _step[S, **P, R, M](
    missing: M, *, lease: bool = False
) -> Callable[[_OnJob[S, P, R]], Callable[Concatenate[S, P], R | M]]: ...
def _step(missing: Any = ..., *, lease: bool = False) -> Any:
    """Each call being one atomic step is the rule this backend stands on, and most transitions
    opened with the same lines to keep it: take the lock, read the clock, find the queue (first
    argument) and, given ``missing``, the job (second; with ``lease``, the run the third one's
    token holds), else answer ``missing``. The method gets what was found before its ``/``; the
    rest is its public signature (to mypy, callers and ``inspect``) as ``Storage`` declares it."""

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        def on_queue(self: MemoryCore, queue: str, *args: Any, **kwargs: Any) -> Any:
            with self._cond:
                return method(self, self._peek(queue), self._now(), queue, *args, **kwargs)

        def on_job(self: MemoryCore, queue: str, job_id: str, *args: Any, **kwargs: Any) -> Any:
            with self._cond:
                now, q = self._now(), self._peek(queue)
                if (rec := self._live(q, job_id, now)) is None:
                    return missing
                return method(self, q, rec, now, queue, job_id, *args, **kwargs)

        def on_lease(self: MemoryCore, queue: str, job_id: str, token: int,
                     *args: Any, **kwargs: Any) -> Any:  # fmt: skip
            with self._cond:
                now, q = self._now(), self._peek(queue)
                if (rec := self._owned(q, job_id, token)) is None:
                    return missing
                return method(self, q, rec, now, queue, job_id, token, *args, **kwargs)

        run: Any = on_queue if missing is ... else on_lease if lease else on_job
        functools.update_wrapper(run, method)
        sig = inspect.signature(method)
        this, *rest = sig.parameters.values()
        public = [p for p in rest if p.kind is not p.POSITIONAL_ONLY]
        run.__signature__ = sig.replace(parameters=[this.replace(kind=public[0].kind), *public])
        return run

    return wrap


class MemoryCore(Storage):
    def __init__(self, clock: Clock | None = None, events_maxlen: int = 10_000) -> None:
        self.clock = clock
        self._events_maxlen = events_maxlen
        self._cond = threading.Condition()
        self._queues: dict[str, _Queue] = {}
        self._events_gone: dict[str, tuple[int, int]] = {}  # of obliterated queues
        self._workers: dict[str, tuple[WorkerRecord, int]] = {}  # id -> (record, expires at)
        self._worker_commands: dict[str, dict] = {}  # id -> a command not taken yet
        self._event_seq = itertools.count(1)
        self._versions = itertools.count(1)
        self._last_token = 0  # the last fencing token handed out (see _lease)
        self._interrupted: dict[str, bool] = {}
        self._broadcasts: MemoryBroadcasts | None = None

    def _now(self) -> int:
        return self.clock() if self.clock else int(time.time() * 1000)

    def _q(self, name: str) -> _Queue:
        if (q := self._queues.get(name)) is None:
            q = self._queues[name] = _Queue(
                events=deque(maxlen=self._events_maxlen),
                events_gone=self._events_gone.get(name, (0, 0)),
            )
        return q

    def _peek(self, name: str) -> _Queue:
        """The queue, or an empty stand-in that is not stored: reads and refused writes must
        not bring a queue into existence (``list_queues``, ``obliterate``)."""
        return self._queues.get(name) or _Queue(events_gone=self._events_gone.get(name, (0, 0)))

    def _live(self, q: _Queue, job_id: str, now: int) -> _Rec | None:
        rec = q.jobs.get(job_id)
        if rec is not None and rec.expires_at is not None and rec.expires_at <= now:
            del q.jobs[job_id]
            return None
        return rec

    def _owned(self, q: _Queue, job_id: str, token: int) -> _Rec | None:
        rec = q.jobs.get(job_id)
        if rec is None or rec.state is not JobState.ACTIVE or rec.token != token:
            return None
        return rec

    def _event(
        self, queue: str, q: _Queue, rec: _Rec, kind: str, now: int, data: bytes | None = None
    ) -> None:
        event_id = f"{now}-{next(self._event_seq)}"
        if len(q.events) == q.events.maxlen:
            q.events_gone = _event_key(q.events[0].id)
        omitted = data is not None and len(data) > EVENT_DATA_MAX
        value = None if omitted else event_data(kind, data, rec.content_type)
        q.events.append(Event(event_id, queue, rec.job_id, kind, now, rec.worker, value, omitted))

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

    def _due_at(self, q: _Queue, rec: _Rec, due: int, now: int) -> bool:
        """Give a waiting job a new due time: queued when due, else scheduled (a retrying job
        stays retrying). A queued job keeps its order key, so it keeps its place. Returns
        whether the job moved (then its event is due): a queued job made due now did not."""
        moved = due > now or rec.state is not JobState.QUEUED
        if due <= now:
            self._index_queued(q, rec)
            self._cond.notify_all()
        else:
            state = JobState.RETRYING if rec.state is JobState.RETRYING else JobState.SCHEDULED
            self._index_scheduled(q, rec, state, due)
        return moved

    def _finish(self, q: _Queue, rec: _Rec, state: JobState, now: int) -> None:
        rec.state = state
        rec.finished_at = now
        rec.expires_at = now + rec.options.result_ttl
        rec.version = next(self._versions)
        q.active.pop(rec.job_id, None)
        if state.value in q.finished:
            q.finished[state.value] += 1

    def _keep(self, queue: str, q: _Queue, rec: _Rec, now: int) -> None:
        """Index a record that is final (not one a successor replaced) and trim its state's
        index to the policy's count at once (a dict pop per record: nothing to bound). The
        rules of retention are those of ``includes/retain.lua``."""
        state = rec.state.value
        keep = getattr(q.retention, state)
        if keep is None or q.jobs.get(rec.job_id) is not rec:
            return
        index = q.kept.setdefault(state, {})
        index.pop(rec.job_id, None)
        index[rec.job_id] = rec
        heapq.heappush(q.expiring, (rec.expires_at or 0, rec.version, state, rec.job_id))
        self._trim(queue, q, state, now, len(index))

    @staticmethod
    def _delete(q: _Queue, rec: _Rec) -> None:
        """Delete a finished record, and its retention entry: it counts toward no count."""
        del q.jobs[rec.job_id]
        q.kept.get(rec.state.value, {}).pop(rec.job_id, None)

    def _trim(self, queue: str, q: _Queue, state: str, now: int, limit: int) -> int:
        """Drop the oldest entries of ``state``'s index past the count or the age (their
        records with them, each with a 'removed' event) and stale entries met on the way.
        Entries of expired records go first, unreported: they count toward no count."""
        if len(q.expiring) > 64 + 2 * sum(map(len, q.kept.values())):  # most entries gone
            q.expiring = [(r.expires_at or 0, r.version, s, i)
                          for s, kept in q.kept.items() for i, r in kept.items()]  # fmt: skip
            heapq.heapify(q.expiring)
        while q.expiring and q.expiring[0][0] <= now:
            _, version, of, job_id = heapq.heappop(q.expiring)
            if (entry := q.kept.get(of, {}).get(job_id)) is not None and entry.version == version:
                del q.kept[of][job_id]
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
