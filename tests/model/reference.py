"""A reference model of one queue's job state machine, in plain Python.

It is deliberately naive (dicts and sorted lists, no indexes, no atomicity concerns) so that it
can be read against ``storage/base.py`` line by line; ``test_storage_model.py`` drives it and a
real backend with the same operations and compares them after every step. Each method returns
what the backend must answer, and updates the model as the backend must update itself.

What the model does not know, it records from the backend and then holds the backend to: the
value of a fencing token is the backend's choice, but a token, once seen for an id, must never
be seen again for that id (not after a re-creation either), and a verdict is accepted only
from the token of the current lease.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django_jobq.job import (
    AckOutcome,
    CancelOutcome,
    DedupMode,
    EnqueueOutcome,
    RetryOutcome,
)
from django_jobq.states import TERMINAL_STATES, JobState

WAITING = (JobState.SCHEDULED, JobState.QUEUED, JobState.RETRYING)
LIVE = (JobState.SCHEDULED, JobState.QUEUED, JobState.ACTIVE, JobState.RETRYING)


@dataclass(frozen=True)
class Spec:
    """Everything of an enqueue that decides a job's future state."""

    job_id: str
    payload: bytes
    delay: int = 0
    priority: int = 0
    max_attempts: int = 3
    max_stalls: int = 1
    min_backoff: int = 1000
    max_backoff: int = 60_000
    result_ttl: int = 3_600_000
    dedup: tuple[str, DedupMode, int | None] | None = None  # key, mode, ttl


@dataclass
class Lease:
    """A claim as a worker holds it; it stays in the worker's hands after it goes stale."""

    job_id: str
    token: int
    worker: str
    generation: int  # which incarnation of the id it was issued for


@dataclass
class Job:
    spec: Spec
    seq: int  # order key, fixed at enqueue
    generation: int
    state: JobState = JobState.QUEUED
    attempts: int = 0
    stalls: int = 0
    due: int = 0
    token: int | None = None  # of the current lease, while active
    worker: str | None = None
    deadline: int = 0
    result: bytes | None = None
    error: bool = False
    finished_at: int | None = None
    expires_at: int | None = None
    cancel_requested: bool = False
    holds_key: str | None = None  # dedup key taken at enqueue


@dataclass
class Expected:
    outcome: object
    job_id: str | None = None
    state: JobState | None = None
    result: bytes | None = None


@dataclass
class ModelQueue:
    now: int
    jobs: dict[str, Job] = field(default_factory=dict)
    seq: int = 0
    generations: int = 0
    # dedup key -> (holder id, holder generation, mode, held until or None)
    keys: dict[str, tuple[str, int, DedupMode, int | None]] = field(default_factory=dict)
    tokens_seen: dict[str, set[int]] = field(default_factory=dict)

    # -- reading -------------------------------------------------------------------------

    def live(self, job_id: str) -> Job | None:
        job = self.jobs.get(job_id)
        if job is not None and job.expires_at is not None and job.expires_at <= self.now:
            del self.jobs[job_id]
            return None
        return job

    def records(self) -> dict[str, Job]:
        for job_id in list(self.jobs):
            self.live(job_id)
        return self.jobs

    def counts(self) -> dict[JobState, int]:
        out = dict.fromkeys(LIVE, 0)
        for job in self.records().values():
            if job.state in out:
                out[job.state] += 1
        return out

    def is_current(self, lease: Lease) -> bool:
        job = self.live(lease.job_id)
        return (
            job is not None
            and job.state is JobState.ACTIVE
            and job.generation == lease.generation
            and job.token == lease.token
        )

    # -- producer ------------------------------------------------------------------------

    def _key_holder(self, key: str) -> Job | None:
        held = self.keys.get(key)
        if held is None:
            return None
        holder_id, generation, mode, until = held
        holder = self.live(holder_id)
        if holder is None or holder.generation != generation:
            return None  # the holder's record is gone: the key is free
        if until is not None and self.now >= until:
            return None
        if mode is DedupMode.SIMPLE and holder.state in TERMINAL_STATES:
            return None
        return holder

    def enqueue(self, spec: Spec) -> Expected:
        job = self.live(spec.job_id)
        if job is not None:
            if job.state is JobState.COMPLETED:
                return Expected(EnqueueOutcome.COMPLETED, job.spec.job_id, job.state, job.result)
            return Expected(EnqueueOutcome.DUPLICATE, job.spec.job_id, job.state)
        if spec.dedup is not None:
            holder = self._key_holder(spec.dedup[0])
            if holder is not None:
                return Expected(EnqueueOutcome.DUPLICATE, holder.spec.job_id, holder.state)
        self.seq += 1
        self.generations += 1
        job = Job(spec, self.seq, self.generations)
        self.jobs[spec.job_id] = job
        if spec.dedup is not None:
            key, mode, ttl = spec.dedup
            job.holds_key = key
            self.keys[key] = (
                spec.job_id,
                job.generation,
                mode,
                None if ttl is None else self.now + ttl,
            )
        self._set_due(job, self.now + spec.delay)
        return Expected(EnqueueOutcome.QUEUED, spec.job_id, job.state)

    def _set_due(self, job: Job, due: int) -> None:
        job.due = due
        if due <= self.now:
            job.state = JobState.QUEUED
        elif job.state is not JobState.RETRYING:
            job.state = JobState.SCHEDULED

    # -- worker --------------------------------------------------------------------------

    def promote(self) -> int:
        promoted = 0
        for job in self.records().values():
            if job.state in (JobState.SCHEDULED, JobState.RETRYING) and job.due <= self.now:
                job.state = JobState.QUEUED
                promoted += 1
        return promoted

    def next_due_in(self) -> int | None:
        dues = [
            j.due for j in self.records().values()
            if j.state in (JobState.SCHEDULED, JobState.RETRYING)
        ]  # fmt: skip
        return None if not dues else max(min(dues) - self.now, 0)

    def claim_order(self, count: int) -> list[Job]:
        """The jobs a claim of ``count`` takes, best first (after promoting due ones)."""
        self.promote()
        queued = [j for j in self.records().values() if j.state is JobState.QUEUED]
        queued.sort(key=lambda j: (j.spec.priority, j.seq))
        return queued[:count]

    def lease(self, job: Job, token: int, worker: str, lease_ms: int) -> Lease:
        job.state = JobState.ACTIVE
        job.attempts += 1
        job.token = token
        job.worker = worker
        job.deadline = self.now + lease_ms
        self.tokens_seen.setdefault(job.spec.job_id, set()).add(token)
        return Lease(job.spec.job_id, token, worker, job.generation)

    def heartbeat(self, lease: Lease, lease_ms: int) -> bool:
        """True: the lease is still held (and extended)."""
        job = self.live(lease.job_id)
        if not self.is_current(lease) or job is None or job.worker != lease.worker:
            return False
        job.deadline = self.now + lease_ms
        return True

    def _finish(self, job: Job, state: JobState) -> None:
        job.state = state
        job.finished_at = self.now
        job.expires_at = self.now + job.spec.result_ttl
        job.token = None
        job.cancel_requested = False

    def complete(self, lease: Lease, result: bytes) -> AckOutcome:
        if not self.is_current(lease):
            return AckOutcome.LEASE_LOST
        job = self.jobs[lease.job_id]
        job.result = result
        self._finish(job, JobState.COMPLETED)
        return AckOutcome.COMPLETED

    def fail(self, lease: Lease, retry_in: int, permanent: bool) -> AckOutcome:
        if not self.is_current(lease):
            return AckOutcome.LEASE_LOST
        job = self.jobs[lease.job_id]
        job.error = True
        if permanent or job.attempts >= job.spec.max_attempts:
            self._finish(job, JobState.FAILED)
            return AckOutcome.FAILED
        job.token = None
        job.state = JobState.RETRYING
        job.due = self.now + retry_in
        return AckOutcome.RETRYING

    def release(self, lease: Lease) -> AckOutcome:
        if not self.is_current(lease):
            return AckOutcome.LEASE_LOST
        job = self.jobs[lease.job_id]
        job.attempts -= 1
        job.token = None
        job.state = JobState.QUEUED
        return AckOutcome.RELEASED

    def cancel_active(self, lease: Lease) -> AckOutcome:
        if not self.is_current(lease):
            return AckOutcome.LEASE_LOST
        job = self.jobs[lease.job_id]
        job.error = True
        self._finish(job, JobState.CANCELLED)
        return AckOutcome.CANCELLED

    def reap(self) -> tuple[list[str], list[str], int]:
        """Expired leases back to queued (a stall, the attempt given back) or failed past
        ``max_stalls``; then due jobs promoted. Returns (requeued, failed, promoted)."""
        requeued, failed = [], []
        for job in self.records().values():
            if job.state is not JobState.ACTIVE or job.deadline > self.now:
                continue
            job.stalls += 1
            if job.stalls > job.spec.max_stalls:
                job.error = True
                self._finish(job, JobState.FAILED)
                failed.append(job.spec.job_id)
            else:
                job.attempts -= 1
                job.token = None
                job.state = JobState.QUEUED
                requeued.append(job.spec.job_id)
        return sorted(requeued), sorted(failed), self.promote()

    # -- management ----------------------------------------------------------------------

    def cancel(self, job_id: str) -> CancelOutcome:
        job = self.live(job_id)
        if job is None:
            return CancelOutcome.NOT_FOUND
        if job.state is JobState.ACTIVE:
            return CancelOutcome.ACTIVE
        if job.state in TERMINAL_STATES:
            return CancelOutcome(job.state.value)
        self._finish(job, JobState.CANCELLED)
        return CancelOutcome.CANCELLED

    def request_cancel(self, job_id: str) -> CancelOutcome:
        job = self.live(job_id)
        if job is not None and job.state is JobState.ACTIVE:
            job.cancel_requested = True
            return CancelOutcome.REQUESTED
        return self.cancel(job_id)

    def retry(self, job_id: str) -> RetryOutcome:
        job = self.live(job_id)
        if job is None:
            return RetryOutcome.NOT_FOUND
        if job.state in (JobState.ACTIVE, JobState.COMPLETED):
            return RetryOutcome(job.state.value)
        if job.state not in (JobState.FAILED, JobState.CANCELLED):
            return RetryOutcome.WAITING
        if job.holds_key is not None:
            held = self.keys.get(job.holds_key)
            if held is not None and held[:2] == (job_id, job.generation):
                if held[2] is DedupMode.SIMPLE:
                    del self.keys[job.holds_key]  # freed when it ended: a retry does not retake it
        job.attempts = job.stalls = 0
        job.error = False
        job.result = None
        job.finished_at = job.expires_at = None
        job.state = JobState.QUEUED
        return RetryOutcome.RETRIED

    def dead(self) -> list[str]:
        return sorted(j for j, job in self.records().items() if job.state is JobState.FAILED)

    def purge_dead(self, job_ids: list[str] | None) -> int:
        doomed = [j for j in self.dead() if job_ids is None or j in job_ids]
        for job_id in doomed:
            del self.jobs[job_id]
        return len(doomed)

    def delete_finished(self, job_ids: list[str]) -> int:
        doomed = [
            j for j in dict.fromkeys(job_ids)
            if (job := self.live(j)) is not None and job.state in TERMINAL_STATES
        ]  # fmt: skip
        for job_id in doomed:
            del self.jobs[job_id]
        return len(doomed)

    def has_active(self) -> bool:
        return any(j.state is JobState.ACTIVE for j in self.records().values())

    def forget_all(self) -> int:
        """Obliterate, or the backend lost the queue's data: every record and key is gone.
        The tokens seen stay: the ids' history does not restart for the workers."""
        removed = len(self.records())
        self.jobs.clear()
        self.keys.clear()
        return removed
