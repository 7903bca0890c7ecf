"""The storage contract: one method per atomic transition, shared by every backend.

Each method documents the single atomic step it performs. A backend may take any route inside
(one Lua script, one SQL transaction, one lock) but must never expose an intermediate state: no
instant at which a crash can lose a job or let two workers own it. ``tests/contract/`` holds the
suite that every backend passes.

Times are epoch milliseconds. ``now`` comes from ``self.clock`` when one is injected (tests), else
from the backend's own clock (Redis: server ``TIME``, so workers' clocks never decide a lease).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..job import (
    AckOutcome,
    CancelOutcome,
    ClaimedJob,
    Event,
    FinalOutcome,
    JobRecord,
    NewJob,
    StoredEnqueue,
)
from ..states import JobState

Clock = Callable[[], int]


@dataclass(frozen=True, slots=True)
class Ack:
    """One worker verdict on a claimed job, for ``ack_many`` batches."""

    kind: str  # "complete" | "fail" | "release"
    job_id: str
    token: int
    body: bytes = b""  # result (complete) or JSON error (fail)
    retry_in: int | None = None  # fail only: ms from now (storage clock) to the next attempt
    permanent: bool = False  # fail only: no further attempts


@dataclass(slots=True)
class ClaimBatch:
    jobs: list[ClaimedJob] = field(default_factory=list)
    # Ms until the earliest scheduled job is due, by the storage's clock (None: none), so an
    # idle worker blocks exactly until then and no worker clock skew can make it spin.
    next_due_in: int | None = None


@dataclass(slots=True)
class ReapReport:
    requeued: list[str] = field(default_factory=list)  # stalled, back to queued (stalls + 1)
    failed: list[str] = field(default_factory=list)  # stalled more than max_stalls
    promoted: int = 0  # scheduled / retrying jobs that became due
    expired: int = 0  # finished records dropped (backends without native expiry)


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    worker_id: str
    info: dict
    last_seen: int


class Storage(abc.ABC):
    """Interface of a storage backend. Capability flags tell the core what it may rely on."""

    #: Workers can block on a wake-up signal instead of polling.
    supports_blocking_wait: bool = True
    #: Several processes can share this storage (false for the in-memory backend).
    supports_multiprocess: bool = True
    #: enqueue joins the caller's database transaction (database backend only).
    supports_transactional_enqueue: bool = False

    clock: Clock | None = None

    # -- producer ---------------------------------------------------------------------------

    @abc.abstractmethod
    def enqueue(self, queue: str, job: NewJob) -> StoredEnqueue:
        """Store a job unless its id exists, in one atomic step.

        New id: store the record, index it as queued (or scheduled when ``run_at`` is in the
        future), append a ``queued``/``scheduled`` event and wake one blocked worker.
        Existing id: write nothing and return ``DUPLICATE`` with its state, or ``COMPLETED``
        with its cached result. With ``job.waiter`` the caller is registered (atomically, in the
        same step) to be told the job's final outcome through ``wait_for_outcome``.
        """

    def enqueue_many(self, queue: str, jobs: Sequence[NewJob]) -> list[StoredEnqueue]:
        """Enqueue each job with the same rules; backends batch the round trips."""
        return [self.enqueue(queue, job) for job in jobs]

    # -- worker -----------------------------------------------------------------------------

    @abc.abstractmethod
    def claim(self, queue: str, worker_id: str, count: int, lease_ms: int) -> ClaimBatch:
        """Lease up to ``count`` runnable jobs to ``worker_id`` in one atomic step.

        First promotes due scheduled/retrying jobs, then moves the best jobs (lowest priority,
        then FIFO) from queued to active with a lease deadline ``now + lease_ms``, a new fencing
        token, ``attempts + 1``, and an ``active`` event each. Never blocks.
        """

    @abc.abstractmethod
    def wait_for_jobs(
        self, queues: Sequence[str], timeout: float, worker_id: str | None = None
    ) -> None:
        """Block until a job may be claimable on one of ``queues``, ``interrupt_wait`` is called
        for ``worker_id``, or ``timeout`` seconds pass."""

    @abc.abstractmethod
    def interrupt_wait(self, queues: Sequence[str], worker_id: str) -> None:
        """Wake ``worker_id`` out of ``wait_for_jobs`` at once (used by shutdown)."""

    @abc.abstractmethod
    def heartbeat(
        self, queue: str, worker_id: str, leases: Sequence[tuple[str, int]], lease_ms: int
    ) -> list[tuple[str, int]]:
        """Extend every lease in ``(job_id, token)`` pairs still held by this worker to
        ``now + lease_ms``, in one call. Returns the pairs whose lease was lost (reclaimed,
        finished or gone); the token tells an old attempt from a newer one of the same job."""

    @abc.abstractmethod
    def complete(self, queue: str, job_id: str, token: int, result: bytes) -> AckOutcome:
        """active → completed, only if ``token`` is still the job's lease. Stores the result,
        sets the record to expire after ``result_ttl``, tells waiters, emits ``completed``."""

    @abc.abstractmethod
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
        """active → retrying (due ``retry_in`` ms from now) while attempts remain and the error is
        not permanent, else → failed (error kept for ``result_ttl``, waiters told). Lease-checked
        like ``complete``."""

    @abc.abstractmethod
    def release(self, queue: str, job_id: str, token: int) -> AckOutcome:
        """active → queued without using an attempt (graceful shutdown). Lease-checked."""

    def ack_many(self, queue: str, acks: Sequence[Ack]) -> list[AckOutcome]:
        """Apply several verdicts; each stays its own atomic step. Backends batch round trips."""
        out = []
        for ack in acks:
            if ack.kind == "complete":
                out.append(self.complete(queue, ack.job_id, ack.token, ack.body))
            elif ack.kind == "fail":
                out.append(
                    self.fail(
                        queue,
                        ack.job_id,
                        ack.token,
                        ack.body,
                        retry_in=ack.retry_in,
                        permanent=ack.permanent,
                    )
                )
            else:
                out.append(self.release(queue, ack.job_id, ack.token))
        return out

    # -- management -------------------------------------------------------------------------

    @abc.abstractmethod
    def cancel(self, queue: str, job_id: str) -> CancelOutcome:
        """scheduled/queued/retrying/blocked → cancelled in O(log n): the job will never run;
        its record (and so its id's deduplication) stays for ``result_ttl``; waiters are told.
        An active or finished job is left alone and its state returned."""

    @abc.abstractmethod
    def get_record(self, queue: str, job_id: str) -> JobRecord | None:
        """The job's record, or None when unknown or expired."""

    @abc.abstractmethod
    def wait_for_outcome(self, queue: str, job_id: str, timeout: float) -> FinalOutcome | None:
        """Block until a job enqueued with ``waiter=True`` reaches a final state (completed,
        failed, cancelled); return it, or None after ``timeout`` seconds."""

    @abc.abstractmethod
    def reap(self, queue: str, limit: int = 1000) -> ReapReport:
        """Recover stalled work in one atomic step per batch: active jobs whose lease expired go
        back to queued (stalls + 1) or to failed past ``max_stalls``; due scheduled jobs are
        promoted; finished records past their TTL are dropped where expiry is not native."""

    @abc.abstractmethod
    def counts(self, queue: str) -> dict[JobState, int]:
        """Jobs per live state (scheduled, queued, active, retrying) and finished totals."""

    @abc.abstractmethod
    def read_events(
        self, queue: str, after: str = "0", count: int = 1000, block: float | None = None
    ) -> list[Event]:
        """Events after id ``after`` in order, optionally blocking ``block`` seconds for one."""

    @abc.abstractmethod
    def register_queue(self, queue: str) -> None:
        """Remember that ``queue`` exists, so the reaper and dashboards find it unconfigured."""

    @abc.abstractmethod
    def list_queues(self) -> list[str]: ...

    # -- worker registry --------------------------------------------------------------------

    @abc.abstractmethod
    def register_worker(self, worker_id: str, info: dict, ttl_ms: int) -> None:
        """Record (or refresh) a live worker; it disappears ``ttl_ms`` after its last refresh."""

    @abc.abstractmethod
    def deregister_worker(self, worker_id: str) -> None: ...

    @abc.abstractmethod
    def list_workers(self) -> list[WorkerRecord]: ...

    def close(self) -> None:  # noqa: B027 - optional hook: most backends hold nothing to close
        """Release connections; the storage is not used afterwards."""
