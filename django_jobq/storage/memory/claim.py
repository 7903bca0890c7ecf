"""Claim and acknowledgement (the worker's hot path), flow control as a claim applies it, and the
reaper. A run's end, its singleton successor's start and the retention trim are one step."""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Sequence

from ...job import LOG_LINES, AckOutcome, ClaimedJob, FinalOutcome, final_outcome
from ...states import GROUP_SCAN, PROMOTE_LIMIT, STALLED_ERROR, JobState
from ..base import ClaimBatch, ReapReport, token_base
from .core import _Queue, _Rec, _step
from .enqueue import Enqueue


class ClaimAck(Enqueue):
    def _end_run(self, queue: str, q: _Queue, rec: _Rec, state: JobState, now: int) -> None:
        """An active run reached a final state: record it, tell waiters, and let a blocked
        singleton successor take over the id in the same step."""
        self._finish(q, rec, state, now)
        data = rec.result if state is JobState.COMPLETED else rec.error
        self._event(queue, q, rec, state.value, now, data)
        if state is JobState.FAILED and q.failure_hook:  # before a successor takes the id
            self._record_failure_call(queue, q, rec, now)
        if (succ := rec.successor) is not None:
            rec.successor = None
            succ.created_at = now
            succ.token = rec.token  # fencing goes on: the old run's token never fits the new run
            q.jobs[succ.job_id] = succ
            self._due_at(q, succ, succ.run_at or 0, now)
            self._event(queue, q, succ, succ.state.value, now)
        self._keep(queue, q, rec, now)
        self._cond.notify_all()

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

    @_step()
    def claim(self, q: _Queue, now: int, /,
              queue: str, worker_id: str, count: int, lease_ms: int) -> ClaimBatch:  # fmt: skip
        batch = ClaimBatch()
        if q.paused:
            return batch  # before promoting: due jobs stay scheduled while paused
        if q.hold_until > now:
            batch.next_due_in = q.hold_until - now
            return batch
        self._promote_due(queue, q, now, PROMOTE_LIMIT)
        lim = q.limits
        budget = count
        if lim.concurrency is not None:
            budget = min(budget, lim.concurrency - len(q.active))
            if budget <= 0 and self._has_queued(q):
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
        else:
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
                if (q := self._peek(name)).queued and not self._blocked_from_claiming(q, now):
                    return
            self._cond.wait(timeout)
            if worker_id is not None:
                self._interrupted.pop(worker_id, None)

    def interrupt_wait(self, queues: Sequence[str], worker_id: str) -> None:
        with self._cond:
            self._interrupted[worker_id] = True
            self._cond.notify_all()

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

    @_step()
    def heartbeat(
        self, q: _Queue, now: int, /, queue: str, worker_id: str,
        leases: Sequence[tuple[str, int]], lease_ms: int,
    ) -> list[tuple[str, int]]:  # fmt: skip
        lost = []
        for job_id, token in leases:
            if (rec := self._owned(q, job_id, token)) is None or rec.worker != worker_id:
                lost.append((job_id, token))
            else:
                rec.deadline = now + lease_ms
        return lost

    @_step(AckOutcome.LEASE_LOST, lease=True)
    def complete(self, q: _Queue, rec: _Rec, now: int, /,
                 queue: str, job_id: str, token: int, result: bytes) -> AckOutcome:  # fmt: skip
        rec.result = result
        self._end_run(queue, q, rec, JobState.COMPLETED, now)
        return AckOutcome.COMPLETED

    @_step(AckOutcome.LEASE_LOST, lease=True)
    def fail(self, q: _Queue, rec: _Rec, now: int, /,
             queue: str, job_id: str, token: int, error: bytes, *, retry_in: int | None = None,
             permanent: bool = False, final: JobState = JobState.FAILED) -> AckOutcome:  # fmt: skip
        """``final`` CANCELLED is ``cancel_active``: the same ending, in another state."""
        rec.error = error
        if permanent or rec.attempts >= rec.options.max_attempts:
            self._end_run(queue, q, rec, final, now)
            return AckOutcome(final.value)
        q.active.pop(job_id, None)
        self._index_scheduled(q, rec, JobState.RETRYING, now + (retry_in or 0))
        self._event(queue, q, rec, "retrying", now, error)
        self._cond.notify_all()
        return AckOutcome.RETRYING

    @_step(False, lease=True)
    def report(self, q: _Queue, rec: _Rec, now: int, /,
               queue: str, job_id: str, token: int, *, progress: bytes | None = None,
               log: str | None = None) -> bool:  # fmt: skip
        if progress is not None:
            rec.progress = progress
            self._event(queue, q, rec, "progress", now, progress)
        if log is not None:
            rec.logs.append((now, log))
            del rec.logs[:-LOG_LINES]
            self._event(queue, q, rec, "log", now)
        return True

    def cancel_requests(
        self, queue: str, leases: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], bool]:
        with self._cond:
            q = self._peek(queue)
            out = {}
            for job_id, token in leases:
                if (rec := self._owned(q, job_id, token)) is not None and rec.cancel:
                    out[(job_id, token)] = rec.cancel == "force"
            return out

    def cancel_active(self, queue: str, job_id: str, token: int, error: bytes) -> AckOutcome:
        return self.fail(queue, job_id, token, error, permanent=True, final=JobState.CANCELLED)

    @_step(AckOutcome.LEASE_LOST, lease=True)
    def release(self, q: _Queue, rec: _Rec, now: int, /,
                queue: str, job_id: str, token: int) -> AckOutcome:  # fmt: skip
        q.active.pop(job_id, None)
        rec.attempts -= 1  # a released run never reached a verdict: it costs no attempt
        self._index_queued(q, rec)
        self._event(queue, q, rec, "released", now)
        self._cond.notify_all()
        return AckOutcome.RELEASED

    @_step(AckOutcome.LEASE_LOST, lease=True)
    def postpone(self, q: _Queue, rec: _Rec, now: int, /,
                 queue: str, job_id: str, token: int, delay_ms: int, *,
                 queue_wide: bool = False) -> AckOutcome:  # fmt: skip
        q.active.pop(job_id, None)
        rec.attempts -= 1  # rate limited before doing its work: it costs no attempt
        self._index_scheduled(q, rec, JobState.SCHEDULED, now + delay_ms)
        if queue_wide:
            # The latest deadline holds: an earlier one must not cut a longer wait short.
            q.hold_until = max(q.hold_until, now + delay_ms)
        self._event(queue, q, rec, "postponed", now)
        self._cond.notify_all()  # a freed concurrency slot
        return AckOutcome.POSTPONED

    @_step()
    def reap(self, q: _Queue, now: int, /, queue: str, limit: int = 1000) -> ReapReport:
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
