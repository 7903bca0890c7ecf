"""Operator actions: cancel, change, retry, inspection (records, counts, dead letters), queue
control, the worker registry. None keeps an index: a scan is fine for what one process holds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ...errors import QueueBusy
from ...job import (
    PARKED_FLOOR,
    CancelOutcome,
    ChangeOutcome,
    DedupMode,
    JobRecord,
    QueueLimits,
    RetryOutcome,
)
from ...states import TERMINAL_STATES, JobState
from ..base import WorkerRecord
from .broadcast import MemoryBroadcasts
from .claim import ClaimAck
from .core import WAITING, _event_key, _Queue, _Rec, _step


class Operations(ClaimAck):
    def _cancel(self, queue: str, q: _Queue, rec: _Rec, now: int) -> None:
        self._finish(q, rec, JobState.CANCELLED, now)
        self._event(queue, q, rec, "cancelled", now)
        self._keep(queue, q, rec, now)

    def request_cancel(self, queue: str, job_id: str, *, force: bool = False) -> CancelOutcome:
        with self._cond:
            rec = self._live(self._peek(queue), job_id, self._now())
            if rec is None or rec.state is not JobState.ACTIVE or rec.successor is not None:
                return self.cancel(queue, job_id)  # the condition's lock is re-entrant
            rec.cancel = "force" if force else "stop"
            return CancelOutcome.REQUESTED

    @_step(CancelOutcome.NOT_FOUND)
    def cancel(self, q: _Queue, rec: _Rec, now: int, /, queue: str, job_id: str) -> CancelOutcome:
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

    @_step(ChangeOutcome.NOT_FOUND)
    def change(self, q: _Queue, rec: _Rec, now: int, /,
               queue: str, job_id: str, *, run_at: int | None = None,
               priority: int | None = None) -> ChangeOutcome:  # fmt: skip
        if rec.state not in WAITING:
            if (succ := rec.successor) is None:
                return ChangeOutcome(rec.state.value)
            if priority is not None:
                succ.options = replace(succ.options, priority=priority)
            if run_at is not None:
                succ.run_at = run_at
            return ChangeOutcome.CHANGED  # still blocked: no event
        if priority is not None:
            rec.options = replace(rec.options, priority=priority)
        if run_at is None:
            if rec.state is JobState.QUEUED:
                self._index_queued(q, rec)  # the new priority, the same order key
        elif self._due_at(q, rec, run_at, now):  # an event only when the due time moves
            self._event(queue, q, rec, rec.state.value, now)
        return ChangeOutcome.CHANGED

    @_step(RetryOutcome.NOT_FOUND)
    def retry(self, q: _Queue, rec: _Rec, now: int, /, queue: str, job_id: str) -> RetryOutcome:
        if rec.state in (JobState.ACTIVE, JobState.COMPLETED):
            return RetryOutcome(rec.state.value)
        if rec.state not in (JobState.FAILED, JobState.CANCELLED):
            return RetryOutcome.WAITING
        key = q.keys.get(rec.dedup_key or "")
        if key is not None and key.rec is rec and key.mode is DedupMode.SIMPLE:
            del q.keys[rec.dedup_key or ""]  # freed when it ended; a retry does not retake it
        q.kept.get(rec.state.value, {}).pop(rec.job_id, None)
        # The job leaves its final state's count: counts() counts jobs, not finishes.
        q.finished[rec.state.value] = max(0, q.finished[rec.state.value] - 1)
        rec.attempts = rec.stalls = 0
        rec.error = rec.result = rec.progress = None
        rec.cancel = ""
        rec.finished_at = rec.expires_at = rec.run_at = None
        self._index_queued(q, rec)
        self._event(queue, q, rec, "retried", now)
        self._cond.notify_all()
        return RetryOutcome.RETRIED

    def _dead(self, q: _Queue, now: int) -> list[_Rec]:
        dead = [r for r in q.jobs.values() if r.state is JobState.FAILED
                and not (r.expires_at and r.expires_at <= now)]  # fmt: skip
        # version is stamped at finish from a global counter: it orders failures within one
        # millisecond, which the job id would not.
        return sorted(dead, key=lambda r: (r.finished_at or 0, r.version), reverse=True)

    def dead_letters(self, queue: str, offset: int = 0, limit: int = 100) -> list[JobRecord]:
        with self._cond:
            dead = self._dead(self._peek(queue), self._now())[offset : offset + limit]
            return [self._record(queue, r) for r in dead]

    def parked(self, queue: str, limit: int = 200) -> list[str]:
        with self._cond:
            q = self._peek(queue)
            ids = [r.job_id for r in q.jobs.values() if r.state is JobState.SCHEDULED
                   and (r.run_at or 0) >= PARKED_FLOOR]  # fmt: skip
            return sorted(ids)[:limit]

    def count_dead(self, queue: str) -> int:
        with self._cond:
            return len(self._dead(self._peek(queue), self._now()))

    def purge_dead(self, queue: str, job_ids: Sequence[str] | None = None) -> int:
        with self._cond:
            q = self._peek(queue)
            dead = self._dead(q, self._now())
            wanted = None if job_ids is None else set(job_ids)
            doomed = [r for r in dead if wanted is None or r.job_id in wanted]
            for rec in doomed:
                self._delete(q, rec)
            return len(doomed)

    @_step()
    def delete_finished(self, q: _Queue, now: int, /, queue: str, job_ids: Sequence[str]) -> int:
        doomed = [rec for job_id in dict.fromkeys(job_ids)
                  if (rec := self._live(q, job_id, now)) is not None
                  and rec.state in TERMINAL_STATES]  # fmt: skip
        for rec in doomed:
            self._delete(q, rec)
        return len(doomed)

    @_step(None)
    def get_record(self, q: _Queue, rec: _Rec, now: int, /,
                   queue: str, job_id: str) -> JobRecord | None:  # fmt: skip
        return self._record(queue, rec)

    @staticmethod
    def _record(queue: str, rec: _Rec) -> JobRecord:
        o = rec.options
        return JobRecord(
            queue=queue, job_id=rec.job_id, state=rec.state, attempts=rec.attempts,
            max_attempts=o.max_attempts, stalls=rec.stalls, max_stalls=o.max_stalls,
            priority=o.priority, created_at=rec.created_at, run_at=rec.run_at,
            started_at=rec.started_at, finished_at=rec.finished_at, worker=rec.worker,
            result_ttl=o.result_ttl, content_type=rec.content_type, payload=rec.payload,
            result=rec.result, error=rec.error, expires_at=rec.expires_at, lifo=rec.lifo,
            group=rec.group, dedup_key=rec.dedup_key, min_backoff=o.min_backoff,
            max_backoff=o.max_backoff, has_successor=rec.successor is not None,
            progress=rec.progress, logs=tuple(rec.logs),
        )  # fmt: skip

    @_step()
    def counts(self, q: _Queue, now: int, /, queue: str) -> dict[JobState, int]:
        live = (JobState.SCHEDULED, JobState.QUEUED, JobState.ACTIVE, JobState.RETRYING)
        out = dict.fromkeys((*live, JobState.BLOCKED), 0)
        for rec in q.jobs.values():
            if rec.expires_at is not None and rec.expires_at <= now:
                continue
            if rec.state in out:
                out[rec.state] += 1
            if rec.successor is not None:
                out[JobState.BLOCKED] += 1
        out[JobState.COMPLETED] = q.finished["completed"]
        out[JobState.FAILED] = q.finished["failed"]
        out[JobState.CANCELLED] = q.finished["cancelled"]
        return out

    def oldest_queued(self, queue: str) -> int | None:
        with self._cond:
            since = [max(r.created_at, r.run_at or 0) for r in self._peek(queue).jobs.values()
                     if r.state is JobState.QUEUED]  # fmt: skip
        return min(since, default=None)

    def pause(self, queue: str) -> None:
        with self._cond:
            self._q(queue).paused = True

    def resume(self, queue: str) -> None:
        with self._cond:
            self._peek(queue).paused = False  # a stand-in if there is no such queue
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

    @_step()
    def drain(self, q: _Queue, now: int, /, queue: str, *, delayed: bool = True) -> int:
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

    @_step()
    def clean(
        self, q: _Queue, now: int, /, queue: str, older_than_ms: int,
        states: Sequence[JobState] = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED),
        limit: int = 10_000,
    ) -> int:  # fmt: skip
        wanted = {JobState(s) for s in states} & TERMINAL_STATES
        cutoff = now - older_than_ms
        doomed = [rec for rec in q.jobs.values()
                  if rec.state in wanted and rec.finished_at is not None
                  and rec.finished_at <= cutoff
                  and not (rec.expires_at is not None and rec.expires_at <= now)
                  ][:limit]  # fmt: skip
        for rec in doomed:
            self._delete(q, rec)
        return len(doomed)

    def obliterate(self, queue: str, *, force: bool = False) -> int:
        with self._cond:
            now = self._now()
            if (q := self._queues.get(queue)) is None:
                return 0
            if q.active and not force:
                raise QueueBusy(queue)
            removed = sum(1 for r in q.jobs.values() if r.expires_at is None or r.expires_at > now)
            if q.events:  # a reader of the old events is told they are gone
                self._events_gone[queue] = _event_key(q.events[-1].id)
            del self._queues[queue]
            self._cond.notify_all()
            return removed

    def register_queue(self, queue: str) -> None:
        with self._cond:
            self._q(queue)

    def list_queues(self) -> list[str]:
        with self._cond:
            return sorted(self._queues)

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

    def send_worker_command(self, worker_id: str, command: dict) -> None:
        with self._cond:
            self._worker_commands[worker_id] = dict(command)

    def take_worker_command(self, worker_id: str) -> dict | None:
        with self._cond:
            return self._worker_commands.pop(worker_id, None)

    def broadcasts(self) -> MemoryBroadcasts:
        if self._broadcasts is None:  # one per storage: its broadcasts live in this process
            self._broadcasts = MemoryBroadcasts(clock=self.clock)
        return self._broadcasts
