"""Enqueue and scheduling: ids that exist (duplicate, update, singleton successor), dedup keys, due
jobs. A singleton successor waits in the active run's record and takes the id as that run ends."""

from __future__ import annotations

import heapq
from dataclasses import replace

from ...job import DedupMode, EnqueueOutcome, NewJob, RunAtUpdate, StoredEnqueue
from ...states import TERMINAL_STATES, JobState
from .core import WAITING, _Key, _Queue, _Rec
from .failures import FailureCalls


class Enqueue(FailureCalls):
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
        that changed anything and the due time to move the job to (None: keep it); if neither,
        the enqueue is a plain duplicate. ``current_due`` is the job's due time, now for a
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
        return changed, new_due if move else None

    def enqueue(self, queue: str, job: NewJob) -> StoredEnqueue:
        with self._cond:
            now = self._now()
            q = self._q(queue)
            if (rec := self._live(q, job.job_id, now)) is not None:
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
                        if self._due_at(q, holder, self._due(job, now), now):
                            self._event(queue, q, holder, holder.state.value, now)
                        key.until = now + (job.dedup.ttl or 0)
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
            moved = due is not None and self._due_at(q, rec, due, now)
            if moved:  # an event only for a move (of the due time): none for data alone
                self._event(queue, q, rec, rec.state.value, now)
            if changed or moved:
                return StoredEnqueue(EnqueueOutcome.UPDATED, rec.job_id, rec.state)
        elif rec.state is JobState.ACTIVE and job.singleton:
            if (succ := rec.successor) is None:
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
                if changed or due is not None:  # still blocked: no event
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

    def _cancel_successor(self, queue: str, q: _Queue, rec: _Rec, now: int) -> None:
        succ = rec.successor
        assert succ is not None
        rec.successor = None
        succ.state = JobState.CANCELLED
        succ.finished_at = now
        self._event(queue, q, succ, "cancelled", now)

    def _promote_due(self, queue: str, q: _Queue, now: int, limit: int) -> int:
        promoted = 0
        while q.scheduled and q.scheduled[0][0] <= now and promoted < limit:
            _, version, job_id = heapq.heappop(q.scheduled)
            if (rec := q.jobs.get(job_id)) is None or rec.version != version:
                continue
            self._index_queued(q, rec)
            self._event(queue, q, rec, "queued", now)
            promoted += 1
        if promoted:
            self._cond.notify_all()
        return promoted

    def _has_queued(self, q: _Queue) -> bool:
        while q.queued:
            *_, version, job_id = q.queued[0]
            rec = q.jobs.get(job_id)
            if rec is not None and rec.version == version and rec.state is JobState.QUEUED:
                return True
            heapq.heappop(q.queued)  # a stale entry
        return False

    def _next_due(self, q: _Queue) -> int | None:
        while q.scheduled:
            run_at, version, job_id = q.scheduled[0]
            if (rec := q.jobs.get(job_id)) is not None and rec.version == version:
                return run_at
            heapq.heappop(q.scheduled)
        return None
