"""The worker: a claim loop feeding a thread pool, one acker batching verdicts, one heartbeat.

Threads and why:
- fetcher (the caller's thread): claims up to the free slots in one call per queue and, when
  nothing is claimable, blocks on the storage's wake-up signal (no sleep-polling). A worker
  of one queue on the thread pool hands that blocking wait to an idle handler thread
  (``_IdleWait``), which runs the first job the wait claims itself: no thread hop between
  the wake-up and the job;
- N handler threads: run jobs; daemon threads, so a hung handler cannot keep the process alive
  after shutdown has released its job;
- acker: sends finished jobs' verdicts in batches (one round trip for many), then frees slots;
- heartbeat: extends all leases in one call per queue, refreshes the worker record, and sweeps
  stalled jobs every ``reap_interval`` so recovery does not depend on a separate reaper;
- onfail (only with a failure handler): runs failure-handler calls (``failures.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue as stdqueue
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .. import signals
from ..backend import get_storage
from ..conf import configured_limits, configured_shards, jobq_settings
from ..errors import ConfigurationError, JobCancelled
from ..job import AckOutcome, ClaimedJob, Job, QueueLimits, Reporter
from ..observability import logs, tracing
from ..observability.metrics.tally import Tally
from ..observability.metrics.tally import current as metrics_tally
from ..queue import flows
from ..queue.sharding import served_queues, split_limits
from ..states import TERMINAL_STATES
from ..storage.base import Ack, Storage
from ..tasks.registry import HandlerRegistry, registry
from ..validation import logical_name, validate_physical_queue_name
from .autoscale import Autoscaler
from .execution import envelope_meta, error_body, job_timeouts, ledger_alias, make_job
from .failures import FailureCaller
from .lifecycle import RECONNECT_MAX, ServingLoop, apply_configured_retention
from .pools import POOLS, AsyncRunner, ProcessRunner, ThreadRunner, Watchdog

logger = logging.getLogger("django_jobq.worker")
CANCEL_POLL = 1.0  # s between looks for operators' cancel requests of running jobs
# A quiet worker's idle wait that claimed one job alone runs it before waiting again while
# such jobs have been ending within INLINE_UNDER s (Worker._idle_wait). While such runs happen,
# the watchdog looks every PASS_ON_AFTER s; a run it finds going on for PASS_ON_AFTER or more
# has its wait passed to another handler thread. So a job arriving meanwhile waits at most
# twice this for its claim beyond the usual, and a busy worker pays one watchdog wake-up per
# this, not one per job (measured: the per-job deadlines' wake-ups cost ~25 µs of CPU a job).
INLINE_UNDER = 0.0005
PASS_ON_AFTER = 0.005


# Verdicts after which a flow child's parents may be released.
_FINAL = frozenset({AckOutcome.COMPLETED, AckOutcome.FAILED, AckOutcome.CANCELLED})
# The signal of each outcome that has one, besides job_finished (sent for every verdict).
_OUTCOME_SIGNALS = {AckOutcome.FAILED: signals.job_failed,
                    AckOutcome.RETRYING: signals.job_retrying,
                    AckOutcome.CANCELLED: signals.job_cancelled}  # fmt: skip


@dataclass(slots=True)
class _InFlight:
    claimed: ClaimedJob
    job: Job
    running: bool = False  # a handler thread picked it up (shutdown releases the others at once)
    finished: bool = False  # the handler returned; its verdict is on the way to storage
    cancelled: bool = False  # an operator cancelled it: it ends cancelled whatever it returns
    since: float = 0.0  # monotonic time it was handed to the pool (run time, autoscale)
    span: Any = None  # the attempt's OpenTelemetry span, when tracing is on (tracing.py)


@dataclass(slots=True)
class _IdleWait:
    """The fetcher's idle ``wait_and_claim``, handed to an idle handler thread. Why: a job
    claimed by the fetcher reaches a handler thread through a queue, a thread wake-up that
    was the largest leg of a request/response (~0.1 ms, more under load). The handler
    thread that waits runs the first claimed job itself and passes the rest on; the fetcher
    still decides when and how much to claim, and waits for ``done`` before its next step;
    a handler thread may pass the wait on to the next one in the fetcher's stead
    (``Worker._wait_again``). So there is never more than one claim in flight (the
    free-slot count sizes it exactly)."""

    queue: str
    wait: float
    want: int
    done: threading.Event = field(default_factory=threading.Event)
    due: float | None = None  # the next wait, as ``_idle`` returns it
    error: Exception | None = None  # the wait failed: raised in the fetcher's thread


class Worker(ServingLoop):
    thread_name = "jobq-worker"

    def __init__(
        self,
        queues: Sequence[str],
        *,
        storage: Storage | None = None,
        handlers: HandlerRegistry = registry,
        concurrency: int | None = None,
        lease: int | None = None,
        grace: float | None = None,
        batch: int | None = None,
        reap_interval: float | None = None,
        worker_id: str | None = None,
        idle_timeout: float = 1.0,
        pool: str = "thread",
        autoscale: tuple[int, int] | None = None,
        autoscale_interval: float = 5.0,
        failure_poll: float | None = None,
        failure_lease: int | None = None,
        failure_backoff: tuple[int, int] | None = None,
    ) -> None:
        conf = jobq_settings()["WORKER"]
        if not queues:
            raise ConfigurationError("a worker needs at least one queue")
        # The queues as named (logical); ``queues`` is what is claimed from: a sharded queue's
        # partitions, plus old partitions while they hold jobs (``_refresh_queues``).
        self.logical_queues = [validate_physical_queue_name(q) for q in queues]
        self.queues = served_queues(self.logical_queues, ())
        self.storage = storage if storage is not None else get_storage()
        self.handlers = handlers
        self.autoscaler: Autoscaler | None = None
        if autoscale is not None:
            try:
                self.autoscaler = Autoscaler(*autoscale, interval=autoscale_interval)
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(str(exc)) from exc
            concurrency = autoscale[1]  # threads / children for the maximum; the limit moves
        self.concurrency = concurrency or conf["concurrency"]
        self.lease = lease or conf["lease"]
        self._init_loop(worker_id, conf["grace"] if grace is None else grace)
        self.batch = batch or self.concurrency
        self.reap_interval = conf["reap_interval"] if reap_interval is None else reap_interval
        self.idle_timeout = idle_timeout
        self.idle_claim = 0  # jobs the pending claim-on-wake-up asks for (one queue only)
        if pool not in POOLS:
            raise ConfigurationError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
        self.pool = pool
        runners: dict[str, type[ThreadRunner | ProcessRunner | AsyncRunner]] = {
            "thread": ThreadRunner, "process": ProcessRunner, "async": AsyncRunner,
        }  # fmt: skip
        self._runner = runners[pool](handlers)
        if isinstance(self._runner, ThreadRunner):
            self._runner.storage = self.storage
        self._failures = FailureCaller.configured(
            self.storage, handlers, self.queues, self.worker_id, conf,
            lease_ms=failure_lease, backoff=failure_backoff, poll=failure_poll,
        )  # fmt: skip
        self._watchdog = Watchdog()
        # Whether the last job an idle wait claimed alone ended within INLINE_UNDER.
        self._lone_jobs_short = True
        # The run of such a job going on now, before its wait: (request, mark, started). The
        # mark is the run's own: whoever clears it (_take), that thread or the watchdog, owns
        # the next wait, so there is one wait at a time, and a thread whose wait was passed
        # on never clears a later run's. With the watchdog's looks (all under self._cond;
        # see _start_lone and _look_at_lone): a look is scheduled; a run began since the last.
        self._lone: tuple[_IdleWait, object, float] | None = None
        self._looking = False
        self._lone_since_look = False
        self.heartbeat_interval = self.lease / 3000
        self._started_ms = int(time.time() * 1000)
        self.stats = {
            "completed": 0, "failed": 0, "retried": 0, "lost": 0, "released": 0, "postponed": 0,
            "cancelled": 0,
        }  # fmt: skip
        self._limit = self.autoscaler.limit if self.autoscaler else self.concurrency
        self._free = self._limit
        self._acker_busy = False  # the acker thread is sending a batch (see _handler_loop)
        # Keyed by (queue, id, token): a stalled attempt still running here and a newer claim of
        # the same job are two entries, each freeing its own slot when its verdict is sent.
        self._inflight: dict[tuple[str, str, int], _InFlight] = {}
        # One job, or a list of jobs for a batch handler.
        self._work: stdqueue.SimpleQueue[ClaimedJob | list[ClaimedJob] | _IdleWait | None] = (
            stdqueue.SimpleQueue()
        )
        self._acks: stdqueue.SimpleQueue[tuple[str, Ack] | None] = stdqueue.SimpleQueue()
        self._beat_at: float | None = None  # monotonic time of the last successful heartbeat
        self._tally: Tally | None = None  # this process's metrics, when installed (run())

    # -- lifecycle --------------------------------------------------------------------------

    def check(self) -> None:
        missing = [q for q in self.queues if self.handlers.get(q) is None]
        if missing:
            raise ConfigurationError(
                f"no handler registered for queue(s) {missing}; known: {self.handlers.queues()}"
            )
        hard = [q for q in self.queues if self.handlers.options(q).hard_timeout is not None]
        batched = [q for q in self.queues if self.handlers.options(q).batch]
        if batched and self.pool == "async":
            raise ConfigurationError(
                f"queue(s) {batched} have batch handlers, which run on the thread or process"
                " pool, not the async pool"
            )
        if atomic := self.handlers.atomic_queues(self.queues):
            if self.pool != "thread":
                raise ConfigurationError(
                    f"queue(s) {atomic} have atomic=True handlers or tasks, which run on the"
                    f" thread pool only (the handler's transaction and the job's completion"
                    f" share the handler thread's connection), not the {self.pool} pool"
                )
            if not self.storage.supports_multiprocess:
                raise ConfigurationError(
                    f"queue(s) {atomic} have atomic=True handlers or tasks, which need the"
                    f" database or the Redis backend; this worker's storage is"
                    f" {type(self.storage).__name__}"
                )
            from django.db import connections

            # The database backend's own alias; on Redis the ledger's (execution.ledger_alias).
            using = getattr(self.storage, "using", None) or ledger_alias(True)
            pooled = connections[using].settings_dict.get("OPTIONS", {}).get("pool")
            if isinstance(self._runner, ThreadRunner) and not pooled:
                # Each atomic job needs the handler thread's connection: kept between jobs
                # (with Django's pool a close hands it back cheaply instead).
                self._runner.keep_alias = using
        if hard and not self._runner.supports_hard_timeout:
            raise ConfigurationError(
                f"queue(s) {hard} have a hard_timeout, which the {self.pool} pool cannot enforce"
                " (a thread cannot be stopped from outside): run them with --pool process or"
                " --pool async"
            )

    def run(self) -> None:
        """Work until ``stop()``; then finish or release in-flight jobs and deregister."""
        self.check()
        self._tally = metrics_tally()
        try:
            self._refresh_queues()
        except Exception as exc:  # storage blip at start: the sweep refreshes them later
            logger.warning("could not look for old partitions yet: %s", exc)
        self._apply_configured_limits()
        self._failures.apply_hooks()
        self._start_threads()
        try:
            self._register()
            self._beat_at = time.monotonic()
        except Exception as exc:  # storage blip at start: the heartbeat registers us later
            logger.warning("could not register worker %s yet: %s", self.worker_id, exc)
        logger.info(
            "worker %s serving %s (concurrency %d, lease %d ms)",
            self.worker_id, self.queues, self.concurrency, self.lease,
        )  # fmt: skip
        self.started.set()
        try:
            self._fetch_loop()
        finally:
            self._shutdown()
            self.stopped.set()

    def _apply_configured_limits(self) -> None:
        """Limits in JOBQ['QUEUES'] are written to storage (shared by every worker) at start,
        so a deploy that changes them takes effect without an operator step."""
        for name in self.queues:
            logical = logical_name(name)
            limits = configured_limits(logical)
            if limits is None:
                continue
            try:
                # A partition enforces its share of a queue-wide limit (sharding.py).
                share = split_limits(QueueLimits(**limits), configured_shards(logical))
                self.storage.set_limits(name, share)
            except Exception as exc:  # storage blip: the limits stored earlier still hold
                logger.warning("could not apply the limits of queue %s: %s", name, exc)
        apply_configured_retention(self.storage, self.queues)  # likewise, for retention

    def _refresh_queues(self) -> None:
        """Serve the registered partitions a change of shard count left behind (the plain
        queue before sharding, ``*of<m>`` before a change) while they hold jobs, so no job
        is stranded; a partition found empty is dropped from the round (a producer that
        still sends there is noticed at the next sweep). One registry read per sweep."""
        known = self.storage.list_queues()
        current = set(served_queues(self.logical_queues, ()))
        waiting = {
            name: self._holds_jobs(name)
            for name in served_queues(self.logical_queues, known)
            if name not in current
        }
        queues = served_queues(self.logical_queues, known, waiting)
        if queues != self.queues:
            logger.info("worker %s now serving %s", self.worker_id, queues)
            self.queues = queues  # one assignment: readers copy the list before use
            self._failures.queues = list(queues)  # their failure-handler calls too

    def _holds_jobs(self, name: str) -> bool:
        return any(n for state, n in self.storage.counts(name).items()
                   if state not in TERMINAL_STATES)  # fmt: skip

    def _interrupt(self) -> None:
        self.storage.interrupt_wait(self.queues, self.worker_id)

    def metrics_snapshot(self) -> dict[str, float]:
        """Slots, busy slots and heartbeat age (s; -1 before the first), for metrics."""
        with self._cond:
            busy = len(self._inflight)
        beat = self._beat_at
        age = -1.0 if beat is None else time.monotonic() - beat
        return {"slots": self._limit, "busy": busy, "heartbeat_age": age}

    def _start_threads(self) -> None:
        self._runner.start(self.concurrency)
        if self.pool != "async":  # the async pool runs jobs on its own loop thread
            for i in range(self.concurrency):
                self._spawn(partial(self._handler_loop, i), f"jobq-handler-{i}")
        self._spawn(self._ack_loop, "jobq-acker")
        self._spawn(self._heartbeat_loop, "jobq-heartbeat")
        if self._failures.served:  # off the job path: failure handlers never hold a slot
            self._spawn(lambda: self._failures.run(self._stopping), "jobq-onfail")

    # -- claiming ---------------------------------------------------------------------------

    def _idle(self, wait: float) -> float | None:
        """A worker of one queue claims as it wakes (``Storage.wait_and_claim``: on Redis the
        claim rides behind the blocking read, one round trip less between a job's enqueue and
        its start). On the thread pool the wait itself runs on an idle handler thread, which
        then runs the first claimed job without a hop (``_IdleWait``). A worker of several
        queues waits on all of them and claims afterwards."""
        queues = self.queues  # the heartbeat thread may replace the list (_refresh_queues)
        if len(queues) == 1:
            with self._cond:
                want = min(self._free, self.batch)
            # Sized now: a slot freed during the wait is used by the next round (observable
            # for tests and debugging as ``idle_claim``).
            self.idle_claim = want
            if want > 0 and self._delegates_wait:
                request = _IdleWait(queues[0], wait, want)
                self._work.put(request)
                request.done.wait()
                if request.error is not None:
                    raise request.error
                return request.due
            if want > 0:
                return self._claim_on_wake(queues[0], wait, want, hold=False)[0]
        self.storage.wait_for_jobs(queues, wait, self.worker_id)
        return None

    @property
    def _delegates_wait(self) -> bool:
        """Whether an idle wait goes to a handler thread: on the thread pool (a process
        pool's child or the async loop cannot take over a blocking storage call), and only
        where the storage claims on wake-up (otherwise the job would hop all the same). Not
        where each calling thread holds a database connection: the waits would pass through
        every handler thread in turn, and ``-c 128`` would hold 128 connections."""
        return (
            self.pool == "thread"
            and not self.storage.connection_per_thread
            and type(self.storage).wait_and_claim is not Storage.wait_and_claim
        )

    def _claim_on_wake(
        self, queue: str, wait: float, want: int, *, hold: bool
    ) -> tuple[float | None, ClaimedJob | None, bool]:
        """``wait_and_claim`` and dispatch what it claimed; returns the next wait (None: only
        waited, claim next), with ``hold`` the job kept back for the calling handler thread to
        run, and whether that job was all the claim brought (the queue was left empty)."""
        batch = self.storage.wait_and_claim(queue, self.worker_id, want, self.lease, wait)
        if batch is None:
            return None, None, False
        held = None
        if batch.jobs and not self.stopping:
            held = self._dispatch(batch.jobs, hold=hold)
        elif batch.jobs:  # claimed while stop() ran: hand them back now
            for claimed in batch.jobs:
                self._release(claimed)
        due = self.idle_timeout
        if batch.next_due_in is not None:
            due = min(due, max(batch.next_due_in / 1000, 0.001))
        return due, held, len(batch.jobs) == 1

    def _idle_wait(self, slot: int, request: _IdleWait) -> None:
        """On a handler thread: the fetcher's idle wait, and the job it claimed.

        A wait that brought one job alone (a quiet queue) runs it first and waits again
        itself afterwards, on this thread, while such jobs are short (``INLINE_UNDER``):
        passing the next wait to another handler thread first costs a thread wake-up per
        job, on the path of every request/response, while nothing is left in the queue to
        claim. So that a job that turns out long never holds up claiming, the watchdog passes
        the wait on (``_look_at_lone``) once the job has run ``PASS_ON_AFTER``. A wait that
        brought several jobs (a busy queue), or one job while such jobs are not short, passes
        the next wait on before running its job, as the fetcher would. Either way the thread
        that ends the chain (an error, stopping, no free slot) wakes the fetcher (``done``)."""
        while True:
            held, alone, request.due = None, False, None
            try:
                request.due, held, alone = self._claim_on_wake(
                    request.queue, request.wait, request.want, hold=True
                )
            except Exception as exc:  # raised in the fetcher, which backs off as for its own wait
                request.error = exc
            if held is None or not alone or not self._lone_jobs_short:
                if not self._wait_again(request):
                    request.done.set()
                if held is not None:
                    (self._run_lone if alone else self._run_one)(slot, held)
                return
            mark = self._start_lone(request)
            self._run_lone(slot, held)
            if not self._take(mark):
                return  # the watchdog passed the wait on while the job ran
            if not self._wait_again(request, queued=False):
                request.done.set()
                return

    def _run_lone(self, slot: int, held: ClaimedJob) -> None:
        """``_run_one`` for a job a wait claimed alone, noting whether it was short."""
        started = time.monotonic()
        self._run_one(slot, held)
        self._lone_jobs_short = time.monotonic() - started < INLINE_UNDER

    def _start_lone(self, request: _IdleWait) -> object:
        """Mark the run of a lone job before its wait (its mark returned) and make sure the
        watchdog will look at it. Not a timer per job: one look every ``PASS_ON_AFTER``
        while such runs go on (``_look_at_lone``), so a stream of short jobs costs no
        watchdog wake-up per job; a quiet worker's watchdog sleeps."""
        mark = object()
        with self._cond:
            self._lone = (request, mark, time.monotonic())
            self._lone_since_look = True
            if self._looking:
                return mark
            self._looking = True
        self._watchdog.schedule(PASS_ON_AFTER, self._look_at_lone)
        return mark

    def _look_at_lone(self) -> None:
        """On the watchdog thread: pass the wait of a lone job's run on when the run has gone
        on for ``PASS_ON_AFTER``; look again later while such runs go on, else stop looking."""
        with self._cond:
            lone = self._lone
            busy = lone is not None or self._lone_since_look
            self._lone_since_look = False
            self._looking = busy
        if busy:
            self._watchdog.schedule(PASS_ON_AFTER, self._look_at_lone)
        if lone is not None and time.monotonic() - lone[2] >= PASS_ON_AFTER:
            request, mark, _ = lone
            if self._take(mark) and not self._wait_again(request):
                request.done.set()

    def _take(self, mark: object) -> bool:
        """Whether the caller now owns the wait of the lone run marked ``mark``: that run was
        still pending (neither the watchdog nor the running thread had taken its wait)."""
        with self._cond:
            if self._lone is None or self._lone[1] is not mark:
                return False
            self._lone = None
            return True

    def _wait_again(self, request: _IdleWait, *, queued: bool = True) -> bool:
        """Ready ``request`` as the next idle wait when the fetcher's next step would be
        exactly that: the wait claimed or timed out (``due`` set), no error, not stopping,
        free slots left, still one queue and the same one. With ``queued`` it is put back on
        the work queue, and after this returns True it belongs to the thread that takes it;
        without, the calling thread waits again itself."""
        if request.due is None or request.error is not None or self.stopping:
            return False
        queues = self.queues
        if len(queues) != 1 or queues[0] != request.queue:
            return False
        with self._cond:
            want = min(self._free, self.batch)
        if want <= 0:
            return False
        self.idle_claim = want
        request.wait, request.want = request.due, want
        if queued:
            self._work.put(request)
        return True

    def _claim_round(self, rotation: int) -> tuple[int, float]:
        """One claim per queue (rotating which goes first); returns (claimed, idle wait)."""
        claimed, wait = 0, self.idle_timeout
        queues = self.queues  # the heartbeat thread may replace the list (_refresh_queues)
        for i in range(len(queues)):
            # Rotating the first queue makes partitions (and queues) take turns: with fewer
            # free slots than queues, each is first once every len(queues) rounds.
            name = queues[(rotation + i) % len(queues)]
            with self._cond:
                want = min(self._free, self.batch)
            if want <= 0:
                break
            batch = self.storage.claim(name, self.worker_id, want, self.lease)
            if batch.next_due_in is not None:
                wait = min(wait, max(batch.next_due_in / 1000, 0.001))
            if batch.jobs:
                self._dispatch(batch.jobs)
                claimed += len(batch.jobs)
        return claimed, wait

    def _dispatch(self, jobs: list[ClaimedJob], *, hold: bool = False) -> ClaimedJob | None:
        """Hand claimed jobs to the pool; with ``hold`` (the caller is a handler thread) the
        first single job is kept back and returned for the caller to run itself."""
        now = time.monotonic()
        metas = [envelope_meta(claimed) for claimed in jobs]
        # The attempts' spans, one per job, started before the jobs are visible to the pool
        # (so no handler thread and no shutdown release sees an entry without its span).
        spans = tracing.start_consumers(jobs, metas, self.worker_id) if tracing.active() else None
        running = isinstance(self._runner, AsyncRunner)
        with self._cond:
            self._free -= len(jobs)
            for i, claimed in enumerate(jobs):
                job = make_job(claimed, None)
                job.meta = metas[i]
                job.reporter = self._reporter(claimed)
                self._inflight[(claimed.queue, claimed.job_id, claimed.token)] = _InFlight(
                    claimed, job, running=running, since=now,
                    span=spans[i] if spans is not None else None,
                )  # fmt: skip
            if self._tally is not None:  # one claim: one queue
                self._tally.started(jobs[0].queue, len(jobs), [c.waited_ms for c in jobs])
        if signals.job_started.receivers:
            for claimed in jobs:
                signals.send(signals.job_started, Worker, queue=claimed.queue,
                             job_id=claimed.job_id, attempt=claimed.attempt,
                             worker_id=self.worker_id)  # fmt: skip
        size = self.handlers.options(jobs[0].queue).batch if jobs else None
        if size and not isinstance(self._runner, AsyncRunner):  # one claim: one queue
            for i in range(0, len(jobs), size):
                self._work.put(jobs[i : i + size])
            return None
        held = None
        for claimed in jobs:
            if isinstance(self._runner, AsyncRunner):
                entry = self._inflight[(claimed.queue, claimed.job_id, claimed.token)]
                timer = self._soft_timeout(claimed, [entry.job])
                self._runner.submit(claimed, entry.job, partial(self._finished, entry, timer=timer))
            elif hold and held is None:
                held = claimed
            else:
                self._work.put(claimed)
        return held

    def _reporter(self, claimed: ClaimedJob) -> Reporter:
        """job.set_progress / job.log of one attempt, fenced by its token."""

        def report(progress: bytes | None, line: str | None) -> bool:
            try:
                return self.storage.report(
                    claimed.queue, claimed.job_id, claimed.token, progress=progress, log=line
                )
            except Exception as exc:  # storage blip: progress is not worth failing the job for
                logger.warning("progress of %s/%s not stored: %s", claimed.queue,
                               claimed.job_id, exc)  # fmt: skip
                return True

        return report

    # -- running ----------------------------------------------------------------------------

    def _soft_timeout(self, claimed: ClaimedJob, jobs: list[Job]) -> int | None:
        timeout, hard = job_timeouts(claimed.queue, self.handlers, jobs[0].meta)
        if hard is not None and not self._runner.supports_hard_timeout:
            # A job's own hard_timeout on the thread pool (the worker refuses handler-wide
            # ones here): nothing can stop a thread, so it is asked to stop, as a soft one.
            timeout = hard if timeout is None else min(timeout, hard)
        if timeout is None:
            return None

        def expire() -> None:
            logger.warning("[%s/%s] past its %gs timeout; asking the handler to stop",
                           claimed.queue, claimed.job_id, timeout)  # fmt: skip
            for job in jobs:
                job.cancel_event.set()

        return self._watchdog.schedule(timeout, expire)

    def _start(self, claimed: ClaimedJob) -> _InFlight | None:
        """Mark a handed-over job running; None when shutdown released it before it started."""
        with self._cond:
            entry = self._inflight.get((claimed.queue, claimed.job_id, claimed.token))
            if entry is not None:
                entry.running = True
            return entry

    def _handler_loop(self, slot: int) -> None:
        runner = self._runner
        assert not isinstance(runner, AsyncRunner)  # it has no handler threads
        while True:
            if not runner.is_ready(slot):
                # Process pool: a starting child takes no job until it is up, and its slot is
                # not free meanwhile, so the fetcher claims no job that would wait for it
                # (another worker's free slot takes it instead).
                with self._cond:
                    self._free -= 1
                runner.ready(slot)
                with self._cond:
                    self._free += 1
                    self._cond.notify_all()
            if (item := self._work.get()) is None:
                if isinstance(runner, ThreadRunner):
                    runner.thread_done()
                break
            if isinstance(item, _IdleWait):
                self._idle_wait(slot, item)
                continue
            if not isinstance(item, list):  # the hot path: one job
                self._run_one(slot, item)
                continue
            live = [e for e in map(self._start, item) if e is not None]
            if not live:
                continue
            timer = self._soft_timeout(live[0].claimed, [e.job for e in live])
            acks = runner.run_batch(slot, [e.claimed for e in live], [e.job for e in live])
            for i, (entry, ack) in enumerate(zip(live, acks, strict=True)):
                self._finished(entry, ack, timer=timer if i == 0 else None)

    def _run_one(self, slot: int, item: ClaimedJob) -> None:
        """Run one job on this handler thread and send its verdict."""
        runner = self._runner
        assert not isinstance(runner, AsyncRunner)  # it has no handler threads
        entry = self._start(item)
        if entry is None:  # shutdown released it before it started
            return
        timer = self._soft_timeout(item, [entry.job])
        if entry.span is None and not logs.ENABLED:
            ack = runner.run(slot, item, entry.job)
        elif not logs.ENABLED:  # traced: no context manager per attempt
            ack = tracing.call_in(entry.span, runner.run, slot, item, entry.job)
        else:
            with self._job_context(entry):
                ack = runner.run(slot, item, entry.job)
        self._finished(entry, ack, timer=timer)

    @contextmanager
    def _job_context(self, entry: _InFlight) -> Iterator[None]:
        """While a thread-pool handler runs: its attempt's span is the current one (the
        handler's own spans nest under it) and JSON log lines name the job."""
        with ExitStack() as stack:
            if entry.span is not None:
                stack.enter_context(tracing.current(entry.span))
            if logs.ENABLED:
                c = entry.claimed
                stack.enter_context(logs.job_context(c.queue, c.job_id, c.attempt, self.worker_id))
            yield

    def _finished(self, entry: _InFlight, ack: Ack, *, timer: int | None = None) -> None:
        """A handler returned (on any pool): send its verdict. A verdict of a job that shutdown
        released meanwhile is still sent: its token no longer fits, so storage refuses it."""
        if timer is not None:
            self._watchdog.cancel(timer)
        claimed = entry.claimed
        entry.finished = True
        if self.autoscaler is not None:
            self.autoscaler.observe_run((time.monotonic() - entry.since) * 1000)
        if entry.cancelled and ack.settled is None:
            body = error_body(JobCancelled("cancelled while running"), "JobCancelled")
            ack = Ack("cancel", claimed.job_id, claimed.token, body)
        # A quiet worker (this is its only job) sends the verdict itself: handing it to the
        # acker thread costs a thread wake-up (~0.1 ms of a ~1 ms request/response). With
        # other jobs in flight, verdicts go to the acker and on to storage in batches. Never
        # from the async pool's event loop: a storage call there would block every job on the
        # loop, and Django refuses database calls from a thread running an event loop. Nor
        # where a storage call holds a connection per calling thread (the database backend):
        # the server's connections would grow with the handler threads.
        with self._cond:
            direct = (
                not self.storage.connection_per_thread
                and len(self._inflight) == 1
                and not self._acker_busy
                and self._acks.empty()
                and not self.stopping
                and asyncio._get_running_loop() is None
            )
        if direct:
            self._send_acks(claimed.queue, [ack])
        else:
            self._acks.put((claimed.queue, ack))

    def _ack_loop(self) -> None:
        done = False
        while not done:
            first = self._acks.get()
            with self._cond:
                self._acker_busy = True
            items = [first]
            while len(items) < 1000:
                try:
                    items.append(self._acks.get_nowait())
                except stdqueue.Empty:
                    break
            done = None in items
            batches: dict[str, list[Ack]] = defaultdict(list)
            for item in items:
                if item is not None:
                    batches[item[0]].append(item[1])
            for name, acks in batches.items():
                self._send_acks(name, acks)
            with self._cond:
                self._acker_busy = False

    def _send_acks(self, name: str, acks: list[Ack]) -> None:
        failures = 0
        unsent = [ack for ack in acks if ack.settled is None]  # not settled by an atomic run
        while True:
            try:
                sent = iter(self.storage.ack_many(name, unsent) if unsent else ())
                outcomes = [ack.settled or next(sent) for ack in acks]
                break
            except Exception as exc:  # keep the verdicts: the lease decides if they still count
                failures += 1
                if failures > 100:  # ~95 s of retries at RECONNECT_MAX
                    logger.error("giving up on %d verdicts for %s: %s", len(acks), name, exc)
                    outcomes = [ack.settled or AckOutcome.LEASE_LOST for ack in acks]
                    break
                logger.warning("acknowledging %d jobs failed (%s); retrying", len(acks), exc)
                time.sleep(min(RECONNECT_MAX, 0.05 * 2**failures))
        flow_children, spans = [], []
        # Only the verdicts some receiver listens for: the metrics listen to job_cancelled
        # alone, and signalling every completion for it cost a no-op job ~15 % of its CPU.
        finished = bool(signals.job_finished.receivers)
        own = {o for o, signal in _OUTCOME_SIGNALS.items() if signal.receivers}
        observed: list[tuple[Ack, AckOutcome, _InFlight]] | None = [] if finished or own else None
        tally = self._tally
        timed: list[tuple[str, float]] | None = [] if tally is not None else None
        with self._cond:
            for ack, outcome in zip(acks, outcomes, strict=True):
                entry = self._inflight.pop((name, ack.job_id, ack.token), None)
                if entry is not None:
                    self._free += 1
                    if outcome in _FINAL and "parents" in entry.job.meta:
                        flow_children.append(entry.job.meta)
                    if observed is not None and (finished or outcome in own):
                        observed.append((ack, outcome, entry))
                    if timed is not None:
                        timed.append((outcome, entry.since))
                    # A span that records nothing has nothing to end or to record an
                    # outcome on (99 % of attempts at 1 % sampling).
                    if entry.span is not None and entry.span.is_recording():
                        spans.append((ack, outcome, entry.span))
                self._count(name, ack, outcome)
            self._cond.notify_all()
        if timed and tally is not None:
            tally.verdicts(name, time.monotonic(), timed)
        for meta in flow_children:
            self._resolve_parents(meta)
        if observed:
            self._signal_verdicts(name, observed)
        for ack, outcome, span in spans:
            error = signals.decode_error(ack.body) if ack.kind in ("fail", "cancel") else None
            tracing.end_consumer(span, str(outcome), error)

    def _signal_verdicts(
        self, name: str, observed: list[tuple[Ack, AckOutcome, _InFlight]]
    ) -> None:
        """job_finished for each verdict, then the signal of its outcome (after storage
        accepted it, so a receiver never sees an outcome that did not happen)."""
        now = time.monotonic()
        for ack, outcome, entry in observed:
            base = {"queue": name, "job_id": ack.job_id, "attempt": entry.claimed.attempt,
                    "worker_id": self.worker_id}  # fmt: skip
            error = signals.decode_error(ack.body) if ack.kind in ("fail", "cancel") else None
            if signals.job_finished.receivers:
                signals.send(signals.job_finished, Worker, outcome=str(outcome),
                             duration=now - entry.since, error=error, **base)  # fmt: skip
            if outcome is AckOutcome.FAILED:
                signals.send(signals.job_failed, Worker, error=error, **base)
            elif outcome is AckOutcome.RETRYING:
                delay = (ack.retry_in or 0) / 1000
                signals.send(signals.job_retrying, Worker, error=error, delay=delay, **base)
            elif outcome is AckOutcome.CANCELLED:
                signals.send(signals.job_cancelled, Worker, queue=name, job_id=ack.job_id,
                             worker_id=self.worker_id)  # fmt: skip

    def _resolve_parents(self, meta: dict) -> None:
        """Fast path of flows: a child that finished releases its parents now, not at the
        next sweep. Errors only delay them until that sweep."""
        for queue, job_id in flows.parents_of(meta):
            try:
                flows.resolve(self.storage, queue, job_id)
            except Exception as exc:
                logger.warning("[%s/%s] flow parent not resolved yet: %s", queue, job_id, exc)

    def _count(self, name: str, ack: Ack, outcome: AckOutcome) -> None:
        key = {
            AckOutcome.COMPLETED: "completed",
            AckOutcome.FAILED: "failed",
            AckOutcome.RETRYING: "retried",
            AckOutcome.RELEASED: "released",
            AckOutcome.POSTPONED: "postponed",
            AckOutcome.CANCELLED: "cancelled",
        }.get(outcome, "lost")
        self.stats[key] += 1
        if outcome is AckOutcome.LEASE_LOST:
            logger.warning(
                "[%s/%s] verdict %s refused: lease was reclaimed (another attempt owns the job)",
                name, ack.job_id, ack.kind,
            )  # fmt: skip

    # -- heartbeat --------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        """Every ``CANCEL_POLL`` s: pending cancel requests of in-flight jobs; every
        ``heartbeat_interval``: leases, the worker record, and the stalled-job sweep."""
        last_reap = last_beat = last_scale = time.monotonic()
        tick = min(CANCEL_POLL, self.heartbeat_interval)
        if self.autoscaler is not None:
            tick = min(tick, self.autoscaler.interval / 5)
        while not self.stopped.wait(tick):
            try:
                self._poll_cancels()
                if self.autoscaler is not None:
                    self.autoscaler.observe_slots(len(self._inflight))
                    if time.monotonic() - last_scale >= self.autoscaler.interval:
                        last_scale = time.monotonic()
                        self._rescale(self.autoscaler)
                if time.monotonic() - last_beat < self.heartbeat_interval:
                    continue
                last_beat = time.monotonic()
                self._heartbeat()
                if self.reap_interval and time.monotonic() - last_reap >= self.reap_interval:
                    last_reap = time.monotonic()
                    self._refresh_queues()
                    for name in self.queues:
                        flows.resolve_parked(self.storage, name)
                        report = self.storage.reap(name)
                        if report.requeued or report.failed:
                            logger.warning(
                                "requeued stalled jobs %s, failed %s on %s",
                                report.requeued, report.failed, name,
                            )  # fmt: skip
                            if signals.job_stalled.receivers:
                                signals.stalled(Worker, name, report.requeued, report.failed,
                                                self.worker_id)  # fmt: skip
            except Exception as exc:
                logger.warning("heartbeat failed (%s); leases may lapse", exc)

    def _rescale(self, autoscaler: Autoscaler) -> None:
        pids = self._runner.pids() if isinstance(self._runner, ProcessRunner) else []
        decision = autoscaler.step(pids)
        with self._cond:
            # Slots in use above a lowered limit drain as their jobs finish.
            self._free += decision.limit - self._limit
            self._limit = decision.limit
            self._cond.notify_all()

    def _poll_cancels(self) -> None:
        with self._cond:
            by_queue: dict[str, list[tuple[str, int]]] = defaultdict(list)
            for (name, job_id, token), entry in self._inflight.items():
                if not entry.cancelled and not entry.finished:
                    by_queue[name].append((job_id, token))
        for name, leases in by_queue.items():
            for (job_id, token), force in self.storage.cancel_requests(name, leases).items():
                with self._cond:
                    found = self._inflight.get((name, job_id, token))
                if found is None or found.finished:
                    continue
                logger.warning("[%s/%s] cancelled by an operator%s", name, job_id,
                               " (forced)" if force else "")  # fmt: skip
                found.cancelled = True
                found.job.cancel_event.set()
                if force:
                    self._runner.kill((name, job_id, token))

    def _heartbeat(self) -> None:
        with self._cond:
            by_queue: dict[str, list[tuple[str, int]]] = defaultdict(list)
            for name, job_id, token in self._inflight:
                by_queue[name].append((job_id, token))
        for name, leases in by_queue.items():
            for job_id, token in self.storage.heartbeat(name, self.worker_id, leases, self.lease):
                with self._cond:
                    entry = self._inflight.get((name, job_id, token))
                # A verdict sent after this heartbeat read its leases ends the lease too: that
                # is not a loss, and there is no handler left to stop.
                if entry is not None and not entry.finished:
                    logger.warning("[%s/%s] lease lost; asking the handler to stop", name, job_id)
                    entry.job.cancel_event.set()
        self._register()
        self._beat_at = time.monotonic()
        self._obey(self.storage.take_worker_command(self.worker_id))

    def _obey(self, command: dict | None) -> None:
        """An operator's command from the admin (``send_worker_command``), taken at a
        heartbeat: ``stop`` (gracefully: in-flight jobs get the grace period) or
        ``concurrency`` (the jobs run at once, from 1 up to the pool this worker started;
        slots above a lowered limit drain as their jobs finish). Anything else is logged and
        dropped: a malformed command never stops a worker's heartbeat."""
        if command is None:
            return
        op, by = command.get("op"), command.get("by", "an operator")
        if op == "stop":
            logger.warning("worker %s: stop asked by %s; stopping gracefully", self.worker_id, by)
            self.stop()
            return
        n = command.get("n")
        if op == "concurrency" and isinstance(n, int) and not isinstance(n, bool):
            limit = max(1, min(n, self.concurrency))
            if self.autoscaler is not None:
                logger.warning("worker %s: concurrency %s asked by %s ignored: autoscaled",
                               self.worker_id, n, by)  # fmt: skip
                return
            with self._cond:
                self._free += limit - self._limit
                self._limit = limit
                self._cond.notify_all()
            logger.warning("worker %s: concurrency set to %d by %s", self.worker_id, limit, by)
            self._register()  # the admin shows the new figure now, not at the next beat
            return
        logger.warning("worker %s: unknown command %r dropped", self.worker_id, command)

    def _register(self) -> None:
        info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": self.queues,
            "concurrency": self._limit,
            "pool_size": self.concurrency,  # what the admin's Set concurrency may go up to
            "pool": self.pool,
            **({"autoscale": self.autoscaler.last} if self.autoscaler else {}),
            "in_flight": len(self._inflight),
            "started": self._started_ms,
            **self.stats,
        }
        self.storage.register_worker(self.worker_id, info, int(self.heartbeat_interval * 3000))

    # -- shutdown ---------------------------------------------------------------------------

    def _shutdown(self) -> None:
        deadline = time.monotonic() + (0 if self._hurry.is_set() else self.grace)
        with self._cond:
            # Claimed but not started: hand back now rather than start work while stopping.
            waiting = [key for key, entry in self._inflight.items() if not entry.running]
            unstarted = [self._inflight.pop(key) for key in waiting]
        for entry in unstarted:
            self._release(entry.claimed)
            self._handed_back(entry)
        for entry in self._drain(deadline):
            entry.job.cancel_event.set()
            self._release(entry.claimed)
            self._handed_back(entry)
        for _ in range(self.concurrency):
            self._work.put(None)
        self._acks.put(None)
        for thread in self._threads:
            if thread.name == "jobq-acker":
                thread.join(timeout=10)
            elif thread.name == "jobq-onfail":  # a running failure handler gets the grace too
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._runner.stop()
        self._watchdog.stop()
        try:
            self.storage.deregister_worker(self.worker_id)
        except Exception as exc:
            logger.warning("could not deregister worker %s: %s", self.worker_id, exc)
        logger.info("worker %s stopped: %s", self.worker_id, self.stats)

    def _handed_back(self, entry: _InFlight) -> None:
        """A job released at shutdown ends its attempt too: its span and ``job_finished``."""
        if entry.span is not None:
            tracing.end_consumer(entry.span, str(AckOutcome.RELEASED), None)
        if signals.job_finished.receivers:
            c = entry.claimed
            signals.send(signals.job_finished, Worker, queue=c.queue, job_id=c.job_id,
                         attempt=c.attempt, worker_id=self.worker_id,
                         outcome=str(AckOutcome.RELEASED),
                         duration=time.monotonic() - entry.since, error=None)  # fmt: skip

    def _release(self, claimed: ClaimedJob) -> None:
        try:
            outcome = self.storage.release(claimed.queue, claimed.job_id, claimed.token)
        except Exception as exc:  # the lease will expire and the reaper requeues it
            logger.warning("[%s/%s] release failed: %s", claimed.queue, claimed.job_id, exc)
            return
        self.stats["released"] += outcome is AckOutcome.RELEASED
        logger.info("[%s/%s] released back to the queue (%s)", claimed.queue, claimed.job_id,
                    outcome.value)  # fmt: skip
