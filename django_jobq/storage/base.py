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
import asyncio
import functools
import inspect
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async

from ..errors import StorageUnavailable
from ..job import (
    AckOutcome,
    CancelOutcome,
    ChangeOutcome,
    ClaimedJob,
    Event,
    FailureCall,
    FinalOutcome,
    JobRecord,
    NewJob,
    QueueLimits,
    Retention,
    RetryOutcome,
    StoredEnqueue,
)
from ..states import TERMINAL_STATES, JobState
from .broadcast_base import BroadcastStore

# The longest one queue is waited on by the default ``Storage.read_events_many``.
EVENTS_SLICE = 0.25

# An enqueue's answer that is already the outcome (a finished duplicate): nothing to wait for.
FINAL_ANSWERS = TERMINAL_STATES

Clock = Callable[[], int]


def token_base() -> int:
    """The least fencing token a claim made now may take: wall-clock microseconds × 1000 plus
    a random nonce 0-999.

    A claim's token is ``max(previous + 1, token_base())``. The record's own counter alone
    would restart when the record is lost and created again (a row deleted after its
    ``result_ttl``, a queue obliterated, Redis restarted empty), and a worker still running
    the old claim would then hold the new run's token. The clock makes a token of a new record
    exceed every token of an old one unless the clock stepped back to that very microsecond,
    and the nonce makes even that a 1 in 1000 chance. It ignores an injected test clock on
    purpose: that clock drives leases, not uniqueness. Redis computes the same value from its
    server ``TIME`` (``token_base`` in ``lua/includes/common.lua``).
    """
    return time.time_ns() // 1000 * 1000 + secrets.randbelow(1000)


@dataclass(frozen=True, slots=True)
class Ack:
    """One worker verdict on a claimed job, for ``ack_many`` batches."""

    kind: str  # "complete" | "fail" | "release" | "postpone" | "cancel"
    job_id: str
    token: int
    body: bytes = b""  # result (complete) or JSON error (fail)
    retry_in: int | None = None  # fail / postpone: ms from now (storage clock) to the next run
    permanent: bool = False  # fail only: no further attempts
    queue_wide: bool = False  # postpone only: the whole queue waits too
    # Already written, with this outcome: an atomic handler's completion, committed in the
    # handler's own transaction (``worker/execution.py``). The worker sends it nowhere.
    settled: AckOutcome | None = None


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
    removed: int = 0  # finished records the queue's retention removed in this sweep


@dataclass(frozen=True, slots=True)
class QueueSummary:
    """What a listing or a metrics scrape reads of each queue (``Storage.queue_summaries``)."""

    counts: dict[JobState, int]
    oldest_queued: int | None  # epoch ms (``Storage.oldest_queued``)
    dead: int
    failure_calls: int
    paused: bool


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    worker_id: str
    info: dict
    last_seen: int


def translating[F: Callable[..., Any]](method: F) -> F:
    """``method`` raising ``StorageUnavailable`` (or ``StorageFull``) where the backend's
    client raised its own "did not answer" error (see ``Storage.unavailable``), with the
    client's error as ``__cause__``. Generators are translated while they are iterated."""
    if getattr(method, "__jobq_translating__", False):
        return method
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def generator(self: Storage, *args: Any, **kwargs: Any) -> Iterator[Any]:
            try:
                yield from method(self, *args, **kwargs)
            except Exception as exc:
                error = self.unavailable(exc)
                if error is None:
                    raise
                raise error from exc

        wrapper: Any = generator
    else:

        @functools.wraps(method)
        def call(self: Storage, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:
                error = self.unavailable(exc)
                if error is None:
                    raise
                raise error from exc

        wrapper = call
    wrapper.__jobq_translating__ = True
    return wrapper  # type: ignore[no-any-return]


class Storage(abc.ABC):
    """Interface of a storage backend. Capability flags tell the core what it may rely on.

    Errors: when the store does not answer, every public method raises
    ``django_jobq.StorageUnavailable`` (``StorageFull`` when Redis is at ``maxmemory``), never
    the client library's own exception. Translating here, once, keeps redis-py and database
    driver errors out of the Queue API, the worker and the REST API, which each catch one type.
    A backend says which of its errors mean "unavailable" in ``unavailable``; every public
    method of a subclass is wrapped by ``__init_subclass__``.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, attr in list(vars(cls).items()):
            if not name.startswith("_") and inspect.isfunction(attr) and name != "unavailable":
                setattr(cls, name, translating(attr))

    def unavailable(self, exc: Exception) -> StorageUnavailable | None:
        """The ``StorageUnavailable`` that ``exc``, raised by this backend's client, stands
        for, or None when ``exc`` is not about reaching the store (a bug, bad data, a
        constraint) and must propagate as it is. The in-memory backend has none."""
        return None

    #: Workers can block on a wake-up signal instead of polling.
    supports_blocking_wait: bool = True
    #: Several processes can share this storage (false for the in-memory backend).
    supports_multiprocess: bool = True
    #: Writes join the caller's Django transaction on the storage's ``using`` alias (the
    #: database backend only): an enqueue is rolled back with it, ``enqueue_on_commit``
    #: enqueues at once, an ``atomic=True`` handler's completion commits with its writes.
    supports_transactional_enqueue: bool = False
    #: durability="journal" applies (a second copy in the database is worth keeping): Redis.
    supports_journal: bool = False
    #: Every thread that calls it holds a connection of its own (Django's per-thread database
    #: connections): the worker keeps its storage calls on a few threads of its own then, so
    #: ``--concurrency`` does not multiply the server's connections (the database backend).
    connection_per_thread: bool = False

    clock: Clock | None = None

    # -- producer ---------------------------------------------------------------------------

    @abc.abstractmethod
    def enqueue(self, queue: str, job: NewJob) -> StoredEnqueue:
        """Store a job unless its id exists, in one atomic step.

        New id: store the record, index it as queued (or scheduled when due later), append a
        ``queued``/``scheduled`` event and wake one blocked worker. The due time is the later
        of ``run_at`` and ``now + delay`` (and ``now + dedup.ttl`` in debounce mode).
        Ordering among queued jobs: lower ``priority`` first; within a priority every
        ``lifo`` job comes before every FIFO job, newest LIFO first, then FIFO by enqueue
        order. A job moved back to queued (promoted, released, stalled, reprioritised)
        keeps its place: its order key is fixed at enqueue.

        Existing id, in this order:
        1. completed: ``COMPLETED`` with its cached result (nothing written).
        2. waiting (scheduled / queued / retrying) and ``job.update`` has something to
           change: apply it (see ``JobUpdate``; a new due time <= now makes it queued, later
           makes a queued job scheduled; a retrying job stays retrying with the new due time)
           and return ``UPDATED`` with the state after the update. ``update_run_at`` modes
           compare the job's current due time (its run_at; a queued job is due "now").
        3. active and ``job.singleton``: when it has no successor yet, store this job as its
           *blocked successor* (its own payload, options, due time and order key) and return
           ``QUEUED`` with state ``blocked``; an event ``blocked`` is emitted. When a
           successor exists, rule 2 applies to the successor instead (``UPDATED`` with state
           ``blocked``), else ``DUPLICATE`` with state ``blocked``. When the active job
           reaches a final state (completed, failed for good, stalled out), in the same
           atomic step the successor replaces the record under the same id: attempts and
           stalls 0, created now, state queued (or scheduled when due later), event
           ``queued``/``scheduled``, wake-up. While a job is retrying, its successor stays
           blocked: two instances of one id never run at once. ``cancel`` of an id that has
           a successor cancels the successor (the active run continues).
        4. otherwise ``DUPLICATE`` with its state (and error when failed).
        With ``job.waiter`` the caller is registered (atomically, in the same step) to be told
        the final outcome of the record it joined through ``wait_for_outcome`` (never of a
        blocked successor: the Queue API refuses ``singleton`` with ``enqueue_and_wait``).

        Dedup key (``job.dedup``; per queue; checked after the id rules, only for an id that
        is new): the key maps to the job that holds it.
        - ``simple``: held until the holder reaches a final state (or ``ttl`` passes, when
          given). While held: ``DUPLICATE`` with the *holder's* id and state, nothing written.
        - ``throttle``: held for ``ttl`` ms from the holder's enqueue whatever the holder
          does; repeats in the window get ``DUPLICATE`` with the holder's id and state.
        - ``debounce``: held for ``ttl`` ms from the *latest* enqueue. The job is due at
          ``now + ttl`` at the earliest. A repeat within the window while the holder is still
          waiting replaces the holder's payload (and content type), moves its due time to the
          repeat's due time, restarts the window, and returns ``UPDATED`` with the holder's
          id. If the holder is no longer waiting (running, finished, gone), the repeat is
          stored as a new job and takes the key.
        A held key whose holder record is gone (expired, cleaned, obliterated) is free.
        """

    def enqueue_many(self, queue: str, jobs: Sequence[NewJob]) -> list[StoredEnqueue]:
        """Enqueue each job with the same rules; backends batch the round trips."""
        return [self.enqueue(queue, job) for job in jobs]

    # -- worker -----------------------------------------------------------------------------

    @abc.abstractmethod
    def claim(self, queue: str, worker_id: str, count: int, lease_ms: int) -> ClaimBatch:
        """Lease up to ``count`` runnable jobs to ``worker_id`` in one atomic step.

        First promotes due scheduled/retrying jobs, then moves the best jobs (see ``enqueue``
        for the order) from queued to active with a lease deadline ``now + lease_ms``, a new
        fencing token, ``attempts + 1``, and an ``active`` event each. Never blocks. A claim
        that got fewer jobs than ``count`` answers ``next_due_in``: the ms until the earliest
        scheduled job is due (None: none is), unless a limit below says otherwise.

        Flow control (``set_limits``, ``pause``, ``postpone(queue_wide=True)``), all inside
        the same atomic step so that no number of workers can exceed a limit:
        - paused queue: promotes and claims nothing; ``next_due_in`` None (``resume`` wakes
          workers).
        - queue-wide postponement until T: claims nothing before T; ``next_due_in`` T - now.
        - ``concurrency``: claims at most ``concurrency - active`` jobs. When that is 0 and
          jobs are queued, ``next_due_in`` is None and the verdict that frees a slot wakes one
          worker (with none queued, the next due time as above).
        - ``rate_max``/``rate_window``: counts claims in the sliding window ending now; at
          most ``rate_max`` in any window. When the budget is spent, ``next_due_in`` is the
          ms until the oldest claim in the window leaves it.
        - group limits: a candidate whose group spent its budget is not claimed: it moves to
          scheduled (event ``scheduled``), due when its group's oldest claim in the window
          leaves it, keeping its order key; the claim goes on to the next candidates
          (looking at no more than a bounded number of them per call).
        """

    @abc.abstractmethod
    def wait_for_jobs(
        self, queues: Sequence[str], timeout: float, worker_id: str | None = None
    ) -> None:
        """Block until a job may be claimable on one of ``queues``, ``interrupt_wait`` is called
        for ``worker_id``, or ``timeout`` seconds pass."""

    def wait_and_claim(
        self, queue: str, worker_id: str, count: int, lease_ms: int, timeout: float
    ) -> ClaimBatch | None:
        """``wait_for_jobs([queue], timeout, worker_id)``, then ``claim`` as soon as the wait
        ends (woken or timed out), in one step where the backend can: on Redis the claim is
        sent behind the blocking read, so the server runs it the moment a job wakes the
        worker and the claimed jobs come back with the wake-up, saving the claim's own round
        trip. The claim is the ordinary atomic, leased and fenced one. A worker that
        ``interrupt_wait`` woke claims nothing.

        Returns the claim's batch, or None when only the wait happened (this default): the
        caller then claims itself."""
        self.wait_for_jobs([queue], timeout, worker_id)
        return None

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

    @abc.abstractmethod
    def postpone(
        self, queue: str, job_id: str, token: int, delay_ms: int, *, queue_wide: bool = False
    ) -> AckOutcome:
        """The handler said "rate limited, retry in ``delay_ms``": active → scheduled, due
        ``now + delay_ms``, without using an attempt (attempts - 1, like release); event
        ``postponed``; ``POSTPONED``. With ``queue_wide`` the whole queue claims nothing
        until then either (an upstream API said so). Lease-checked; a job with a blocked
        successor keeps it (the job is not finished)."""

    @abc.abstractmethod
    def report(
        self,
        queue: str,
        job_id: str,
        token: int,
        *,
        progress: bytes | None = None,
        log: str | None = None,
    ) -> bool:
        """The running attempt tells how it is doing, in one atomic step, only if ``token`` is
        still the job's lease: ``progress`` (JSON) replaces the last one (event ``progress``);
        ``log`` is appended with the time (event ``log``), keeping the last ``LOG_LINES``.
        Both stay with the record (an operator ``retry`` clears the progress, not the logs).
        Returns False, writing nothing, when the lease was lost."""

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
            elif ack.kind == "cancel":
                out.append(self.cancel_active(queue, ack.job_id, ack.token, ack.body))
            elif ack.kind == "postpone":
                out.append(
                    self.postpone(
                        queue, ack.job_id, ack.token, ack.retry_in or 0, queue_wide=ack.queue_wide
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
    def request_cancel(self, queue: str, job_id: str, *, force: bool = False) -> CancelOutcome:
        """Ask the worker running an active job to stop it: mark the record (``force``: the
        worker may kill it) and return ``REQUESTED``; the worker finds the mark through
        ``cancel_requests`` and ends the attempt with ``cancel_active``. The mark stays until
        the job ends, so an attempt that starts after a stall is stopped too. A job that is
        not active (it finished or went back to waiting meanwhile) gets what ``cancel`` does."""

    @abc.abstractmethod
    def cancel_requests(
        self, queue: str, leases: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], bool]:
        """Of the ``(job_id, token)`` leases still held, those whose stop was requested, each
        with its ``force`` flag. One call for all of a worker's leases of the queue."""

    @abc.abstractmethod
    def cancel_active(self, queue: str, job_id: str, token: int, error: bytes) -> AckOutcome:
        """active → cancelled for the lease holder, as ``fail`` would end it for good but in
        state ``cancelled`` (no retry, not a dead letter; waiters told; dedup key freed;
        successor released); event ``cancelled``; ``CANCELLED`` or ``LEASE_LOST``."""

    @abc.abstractmethod
    def change(
        self, queue: str, job_id: str, *, run_at: int | None = None, priority: int | None = None
    ) -> ChangeOutcome:
        """Change a waiting job in one atomic step: the record when it is scheduled, queued or
        retrying, else its blocked successor when it has one (changes then apply when the
        successor is released).

        ``run_at`` (epoch ms): <= now makes it queued (promote; event ``queued``), later makes
        it scheduled (event ``scheduled``; a retrying job stays retrying). ``priority``: takes
        effect at once for a queued job (its FIFO order key is kept). Returns ``CHANGED`` or
        why not (``NOT_FOUND``, ``ACTIVE``, or the final state)."""

    @abc.abstractmethod
    def retry(self, queue: str, job_id: str) -> RetryOutcome:
        """failed / cancelled → queued in one atomic step, for an operator's "run it again".

        Attempts and stalls start from 0, error, result and finish time are cleared, the
        record stops expiring, it leaves the dead-letter list and takes its old place in line
        (priority and order key as enqueued); event ``retried``; one idle worker is woken.
        A dedup key the job held is not taken again (another job may hold it by now).
        Anything else is left alone: ``NOT_FOUND``, ``WAITING``, ``ACTIVE``, ``COMPLETED``."""

    @abc.abstractmethod
    def dead_letters(self, queue: str, offset: int = 0, limit: int = 100) -> list[JobRecord]:
        """The queue's dead-letter list: records of jobs that failed for good (attempts used
        up, a permanent error, or stalled past ``max_stalls``), newest failure first. A record
        leaves it when retried, purged, cleaned, or when its ``result_ttl`` passes."""

    @abc.abstractmethod
    def count_dead(self, queue: str) -> int:
        """How many records the dead-letter list holds now."""

    @abc.abstractmethod
    def purge_dead(self, queue: str, job_ids: Sequence[str] | None = None) -> int:
        """Delete dead-letter records (those of ``job_ids`` that are failed, or all of them);
        their ids are free again. Returns how many were deleted."""

    @abc.abstractmethod
    def delete_finished(self, queue: str, job_ids: Sequence[str]) -> int:
        """Delete the records of ``job_ids`` that are finished (completed, failed, cancelled),
        at once rather than at their TTL; their ids are free again. Waiting and active jobs
        are left alone. Returns how many were deleted."""

    @abc.abstractmethod
    def parked(self, queue: str, limit: int = 200) -> list[str]:
        """Ids of up to ``limit`` scheduled jobs due after ``PARKED_FLOOR``: flow parents
        waiting for their children (``flows.py``), for the sweep that releases them."""

    @abc.abstractmethod
    def get_record(self, queue: str, job_id: str) -> JobRecord | None:
        """The job's record, or None when unknown or expired."""

    @abc.abstractmethod
    def wait_for_outcome(self, queue: str, job_id: str, timeout: float) -> FinalOutcome | None:
        """Block until a job enqueued with ``waiter=True`` reaches a final state (completed,
        failed, cancelled); return it, or None after ``timeout`` seconds."""

    def enqueue_and_wait(
        self, queue: str, job: NewJob, timeout: float
    ) -> tuple[StoredEnqueue, FinalOutcome | None]:
        """``enqueue`` a job built with ``waiter=True`` and, unless the answer is already
        final (a finished duplicate), ``wait_for_outcome``: the request/response of
        ``Queue.enqueue_and_wait``. Redis sends both in one write (the blocking read of the
        reply queued behind the enqueue), saving a round trip; this default makes the two
        calls. Returns the enqueue's answer and the outcome (None: none within ``timeout``,
        or the enqueue's answer was final)."""
        stored = self.enqueue(queue, job)
        if stored.state in FINAL_ANSWERS:
            return stored, None
        return stored, self.wait_for_outcome(queue, job.job_id, timeout)

    @abc.abstractmethod
    def reap(self, queue: str, limit: int = 1000) -> ReapReport:
        """Recover stalled work in one atomic step per batch: active jobs whose lease expired go
        back to queued (stalls + 1) or to failed past ``max_stalls``; due scheduled jobs are
        promoted; finished records past their TTL are dropped where expiry is not native;
        finished records past the queue's retention are removed (at most ``limit`` per state
        and call: ``ReapReport.removed``)."""

    @abc.abstractmethod
    def counts(self, queue: str) -> dict[JobState, int]:
        """Jobs per live state (scheduled, queued, active, retrying, blocked: the number of
        singleton successors) and per final state (completed, failed, cancelled).

        A final state counts jobs, not finishes: a job an operator retried leaves its count, so
        one failed three times over is one failed job. The database counts the rows it holds;
        Redis and memory count jobs that reached the state (Redis drops an expired record
        without telling, so records past their result TTL or retention stay counted there)."""

    def queue_summaries(self, queues: Sequence[str]) -> dict[str, QueueSummary]:
        """``counts``, ``oldest_queued``, ``count_dead``, ``count_failure_calls`` and
        ``is_paused`` of every queue named. Why one call: a scrape of 10,000 queues made six
        round trips a queue (38 s, past Prometheus's timeout); Redis answers this in two
        pipelined round trips per ``SUMMARY_CHUNK`` queues. The default asks one by one."""
        return {
            q: QueueSummary(
                self.counts(q),
                self.oldest_queued(q),
                self.count_dead(q),
                self.count_failure_calls(q),
                self.is_paused(q),
            )  # fmt: skip
            for q in queues
        }

    def oldest_queued(self, queue: str) -> int | None:
        """Epoch ms since when the job first in line has been runnable (the later of its
        creation and its due time), or None when nothing is queued: a queue's latency, read at
        metrics scrape time. FIFO queues: the oldest queued job. Backends answer with an
        indexed read; the default (unknown) is None."""
        return None

    @abc.abstractmethod
    def read_events(
        self, queue: str, after: str = "0", count: int = 1000, block: float | None = None
    ) -> list[Event]:
        """Events after id ``after`` in order, optionally blocking ``block`` seconds for one.
        Raises ``EventsLost`` when events after ``after`` were removed before this read (never
        for ``"0"``, the oldest kept): a feed must not read on past a gap."""

    def read_events_many(
        self, after: dict[str, str], count: int = 1000, block: float | None = None
    ) -> dict[str, list[Event]]:
        """Events of several queues, each after its own id (``after``: queue -> id), up to
        ``count`` per queue; with ``block``, waits up to that long for an event of any of them.
        Every queue is in the answer (an empty list when it had nothing).

        The merged feed of a sharded queue reads its partitions so. This default has no wait
        over several queues at once: it blocks on each queue in turn for a slice of at most
        ``EVENTS_SLICE`` seconds, so an event may be seen that much late; the bundled backends
        override it with one wait over them all."""
        deadline = time.monotonic() + (block or 0)
        while True:
            out = {q: self.read_events(q, a, count) for q, a in after.items()}
            remaining = deadline - time.monotonic()
            if any(out.values()) or not block or remaining <= 0:
                return out
            share = max(min(remaining, EVENTS_SLICE) / len(after), 0.001)
            for queue, position in after.items():
                page = self.read_events(queue, position, count, block=share)
                if page:
                    return {**out, queue: page}

    # -- failure handler calls --------------------------------------------------------------
    # A queue whose handler has a failure handler gets one *call* per permanent failure,
    # recorded in the atomic step that fails the job for good (``fail`` with no attempts
    # left or ``permanent``, ``reap`` past ``max_stalls``; never for a cancelled job), and
    # only while the queue's failure hook is on. Calls are leased like jobs, so a worker that
    # dies while running one leaves it to be claimed again when the lease ends.

    @abc.abstractmethod
    def set_failure_hook(self, queue: str, enabled: bool) -> None:
        """Turn recording of failure calls for ``queue`` on or off (shared by every worker).
        Calls already recorded stay either way, until a worker with a handler runs them."""

    @abc.abstractmethod
    def failure_hook(self, queue: str) -> bool:
        """Whether permanent failures of ``queue`` record a failure call now."""

    @abc.abstractmethod
    def claim_failure_calls(
        self, queue: str, worker_id: str, count: int, lease_ms: int
    ) -> list[FailureCall]:
        """Lease up to ``count`` due calls (due time <= now, oldest due first) in one atomic
        step: each one's due time becomes ``now + lease_ms``, its ``tries`` goes up by one and
        its ``worker`` becomes ``worker_id``.
        The returned calls carry the new ``tries``, the fence ``settle_failure_call`` checks."""

    @abc.abstractmethod
    def settle_failure_call(
        self,
        queue: str,
        call: FailureCall,
        *,
        ok: bool,
        retry_in_ms: int = 0,
        error: bytes | None = None,
    ) -> bool:
        """The failure handler ran for a claimed ``call``: ``ok`` deletes the call; else it is
        due again ``retry_in_ms`` from now (storage clock) with ``error`` (JSON) kept as its
        ``last_error``. Fenced: only when the call's ``tries`` still equals ``call.tries``
        (no later claim took it over); returns False, writing nothing, otherwise."""

    @abc.abstractmethod
    def count_failure_calls(self, queue: str) -> int:
        """How many failure calls of ``queue`` are pending (due, leased or backing off)."""

    @abc.abstractmethod
    def failure_calls(self, queue: str, offset: int = 0, limit: int = 100) -> list[FailureCall]:
        """Pending failure calls of ``queue`` for inspection, soonest due first."""

    # -- queue control ----------------------------------------------------------------------

    @abc.abstractmethod
    def pause(self, queue: str) -> None:
        """Workers stop claiming from ``queue`` (enqueue, cancel and verdicts still work)."""

    @abc.abstractmethod
    def resume(self, queue: str) -> None:
        """Undo ``pause`` and wake idle workers."""

    @abc.abstractmethod
    def is_paused(self, queue: str) -> bool: ...

    @abc.abstractmethod
    def set_limits(self, queue: str, limits: QueueLimits) -> None:
        """Replace the queue's flow-control limits (all of them; None fields: no limit) and
        wake idle workers, since a raised limit may make jobs claimable."""

    @abc.abstractmethod
    def get_limits(self, queue: str) -> QueueLimits: ...

    @abc.abstractmethod
    def set_retention(self, queue: str, retention: Retention | None) -> None:
        """Replace the queue's retention of finished records (None or an empty policy: keep
        them until their ``result_ttl``). The steps that finish jobs apply it from then on,
        removing a bounded few of the oldest records each; ``reap`` removes the rest (age,
        backlogs) in batches. Records finished before a state had a policy are not indexed
        on Redis and keep their TTL."""

    @abc.abstractmethod
    def get_retention(self, queue: str) -> Retention: ...

    @abc.abstractmethod
    def drain(self, queue: str, *, delayed: bool = True) -> int:
        """Cancel every queued job (and, with ``delayed``, every scheduled and retrying one
        and every blocked successor) as ``cancel`` would: waiters are told, records expire
        after their result TTL. Active jobs are left alone. Returns how many were cancelled."""

    @abc.abstractmethod
    def clean(
        self,
        queue: str,
        older_than_ms: int,
        states: Sequence[JobState] = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED),
        limit: int = 10_000,
    ) -> int:
        """Delete up to ``limit`` finished records (of ``states``, all final) that finished at
        least ``older_than_ms`` ago; their ids are free again. Returns how many."""

    @abc.abstractmethod
    def obliterate(self, queue: str, *, force: bool = False) -> int:
        """Delete the queue and everything of it: jobs in every state, successors, dedup
        keys, events, counters, pause flag and limits. Refuses (``QueueBusy``) while jobs
        are active unless ``force``. Returns how many job records were deleted."""

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

    @abc.abstractmethod
    def send_worker_command(self, worker_id: str, command: dict) -> None:
        """Leave ``command`` (JSON-able) for worker ``worker_id``, replacing one it has not
        taken yet: an operator's last word counts (the admin's Stop, Set concurrency)."""

    @abc.abstractmethod
    def take_worker_command(self, worker_id: str) -> dict | None:
        """The command left for this worker, removed as it is read (each taken once); None
        when there is none. Workers ask at each heartbeat."""

    def job_states(self, queue: str, job_ids: Sequence[str]) -> list[JobState | None]:
        """The state of each job (None: no record), in order; the journal's reconcile asks
        this of every batch, so backends answer in one round trip where they can."""
        states = []
        for job_id in job_ids:
            record = self.get_record(queue, job_id)
            states.append(None if record is None else record.state)
        return states

    # -- async twins (Django's ``a*`` convention), for ``Queue.aenqueue`` & co. ---------------
    # No native async client exists for the database backend's SQL (Django's async ORM is
    # itself a thread hop around the sync ORM), so by default the short calls run through
    # ``sync_to_async`` (thread-sensitive: on the thread where Django manages the request's
    # connection) and the long wait in a thread of its own (``in_thread``), so a wait never
    # holds the shared sync thread (which would stall every other sync view of the process).
    # The Redis backend overrides them with native async I/O (``redis/aio.py``).

    async def aregister_queue(self, queue: str) -> None:
        await sync_to_async(self.register_queue)(queue)

    async def aenqueue(self, queue: str, job: NewJob) -> StoredEnqueue:
        return await sync_to_async(self.enqueue)(queue, job)

    async def aget_record(self, queue: str, job_id: str) -> JobRecord | None:
        return await sync_to_async(self.get_record)(queue, job_id)

    async def await_for_outcome(
        self, queue: str, job_id: str, timeout: float
    ) -> FinalOutcome | None:
        return await in_thread(self.wait_for_outcome, queue, job_id, timeout)

    def close(self) -> None:  # noqa: B027 - optional hook: most backends hold nothing to close
        """Release connections; the storage is not used afterwards."""

    def broadcasts(self) -> BroadcastStore:
        """This backend's broadcast storage (``broadcast_base.py``), built once and shared."""
        raise NotImplementedError(f"{type(self).__name__} does not store broadcasts")


async def in_thread[T](func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` in a thread of its own, closing the database connections that thread
    opened: for calls that block for long (a wait), which must not hold the one thread that
    ``sync_to_async`` shares with every sync view."""

    def run() -> T:
        from django.db import connections

        try:
            return func(*args)
        finally:
            connections.close_all()

    return await asyncio.to_thread(run)
