"""The worker: a claim loop feeding a thread pool, one acker batching verdicts, one heartbeat.

Threads and why:
- fetcher (the caller's thread): claims up to the free slots in one call per queue and, when
  nothing is claimable, blocks on the storage's wake-up signal (no sleep-polling);
- N handler threads: run jobs; daemon threads, so a hung handler cannot keep the process alive
  after shutdown has released its job;
- acker: sends finished jobs' verdicts in batches (one round trip for many), then frees slots;
- heartbeat: extends all leases in one call per queue, refreshes the worker record, and sweeps
  stalled jobs every ``reap_interval`` so recovery does not depend on a separate reaper;
- onfail (only with a failure handler): runs failure-handler calls (``failures.py``).
"""

from __future__ import annotations

import logging
import os
import queue as stdqueue
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from . import flows, logjson, signals, tracing
from .autoscale import Autoscaler
from .conf import configured_limits, get_storage, jobq_settings
from .errors import ConfigurationError, JobCancelled
from .execution import envelope_meta, error_body, job_timeouts, make_job
from .failures import FailureCaller
from .job import AckOutcome, ClaimedJob, Job, QueueLimits, Reporter
from .metrics.tally import Tally
from .metrics.tally import current as metrics_tally
from .pools import POOLS, AsyncRunner, ProcessRunner, ThreadRunner, Watchdog
from .registry import HandlerRegistry, registry
from .storage.base import Ack, Storage
from .validation import validate_job_id, validate_queue_name

logger = logging.getLogger("django_jobq.worker")
CANCEL_POLL = 1.0  # s between looks for operators' cancel requests of running jobs
# Longest pause between retries of a storage that does not answer (claims and verdicts). A
# Redis restart takes about a second: a longer cap would leave a worker idle for seconds after
# the server is back; a retry costs one refused connection, so retrying every second is cheap.
RECONNECT_MAX = 1.0


# Verdicts after which a flow child's parents may be released.
_FINAL = frozenset({AckOutcome.COMPLETED, AckOutcome.FAILED, AckOutcome.CANCELLED})
# Signals sent for a verdict; a batch is looked at only when one of them has a receiver.
_VERDICT_SIGNALS = (signals.job_finished, signals.job_failed, signals.job_retrying,
                    signals.job_cancelled)  # fmt: skip


@dataclass(slots=True)
class _InFlight:
    claimed: ClaimedJob
    job: Job
    running: bool = False  # a handler thread picked it up (shutdown releases the others at once)
    finished: bool = False  # the handler returned; its verdict is on the way to storage
    cancelled: bool = False  # an operator cancelled it: it ends cancelled whatever it returns
    since: float = 0.0  # monotonic time it was handed to the pool (run time, autoscale)
    span: Any = None  # the attempt's OpenTelemetry span, when tracing is on (tracing.py)


class Worker:
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
        self.queues = [validate_queue_name(q) for q in queues]
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
        self.grace = conf["grace"] if grace is None else grace
        self.batch = batch or self.concurrency
        self.reap_interval = conf["reap_interval"] if reap_interval is None else reap_interval
        host = socket.gethostname().replace(":", "-")
        self.worker_id = validate_job_id(
            worker_id or f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"[-128:]
        )
        self.idle_timeout = idle_timeout
        if pool not in POOLS:
            raise ConfigurationError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
        self.pool = pool
        runners: dict[str, type[ThreadRunner | ProcessRunner | AsyncRunner]] = {
            "thread": ThreadRunner, "process": ProcessRunner, "async": AsyncRunner,
        }  # fmt: skip
        self._runner = runners[pool](handlers)
        self._failures = FailureCaller.configured(
            self.storage, handlers, self.queues, self.worker_id, conf,
            lease_ms=failure_lease, backoff=failure_backoff, poll=failure_poll,
        )  # fmt: skip
        self._watchdog = Watchdog()
        self.heartbeat_interval = self.lease / 3000
        self._started_ms = int(time.time() * 1000)
        self.stats = {
            "completed": 0, "failed": 0, "retried": 0, "lost": 0, "released": 0, "postponed": 0,
            "cancelled": 0,
        }  # fmt: skip
        self._limit = self.autoscaler.limit if self.autoscaler else self.concurrency
        self._free = self._limit
        self._acker_busy = False  # the acker thread is sending a batch (see _handler_loop)
        self._cond = threading.Condition()
        # Keyed by (queue, id, token): a stalled attempt still running here and a newer claim of
        # the same job are two entries, each freeing its own slot when its verdict is sent.
        self._inflight: dict[tuple[str, str, int], _InFlight] = {}
        # One job, or a list of jobs for a batch handler.
        self._work: stdqueue.SimpleQueue[ClaimedJob | list[ClaimedJob] | None] = (
            stdqueue.SimpleQueue()
        )
        self._acks: stdqueue.SimpleQueue[tuple[str, Ack] | None] = stdqueue.SimpleQueue()
        self._stopping = threading.Event()
        self._hurry = threading.Event()  # second signal: skip the grace period
        self._threads: list[threading.Thread] = []
        self._beat_at: float | None = None  # monotonic time of the last successful heartbeat
        self._tally: Tally | None = None  # this process's metrics, when installed (run())
        self.started = threading.Event()
        self.stopped = threading.Event()

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
            limits = configured_limits(name)
            if limits is None:
                continue
            try:
                self.storage.set_limits(name, QueueLimits(**limits))
            except Exception as exc:  # storage blip: the limits stored earlier still hold
                logger.warning("could not apply the limits of queue %s: %s", name, exc)

    def start(self) -> threading.Thread:
        """Run in a background thread (embedding, tests); returns once the worker is serving."""
        thread = threading.Thread(target=self.run, name=f"jobq-worker-{self.worker_id}")
        thread.daemon = True
        thread.start()
        self.started.wait(10)
        return thread

    def stop(self, *, hurry: bool = False) -> None:
        """Stop claiming. In-flight jobs get ``grace`` seconds (none when ``hurry``)."""
        if hurry:
            self._hurry.set()
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        try:
            self.storage.interrupt_wait(self.queues, self.worker_id)
        except Exception as exc:  # storage down: the wait ends at its timeout anyway
            logger.debug("could not interrupt the claim wait: %s", exc)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

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
                self._spawn(lambda slot=i: self._handler_loop(slot), f"jobq-handler-{i}")
        self._spawn(self._ack_loop, "jobq-acker")
        self._spawn(self._heartbeat_loop, "jobq-heartbeat")
        if self._failures.served:  # off the job path: failure handlers never hold a slot
            self._spawn(lambda: self._failures.run(self._stopping), "jobq-onfail")

    def _spawn(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- claiming ---------------------------------------------------------------------------

    def _fetch_loop(self) -> None:
        rotation, failures = 0, 0
        while not self._stopping.is_set():
            with self._cond:
                while self._free <= 0 and not self._stopping.is_set():
                    self._cond.wait()
            if self._stopping.is_set():
                return
            try:
                claimed, wait = self._claim_round(rotation)
                failures = 0
            except Exception as exc:  # storage unreachable: back off, never crash
                failures += 1
                # Capped (RECONNECT_MAX, 1 s): a longer pause would delay the restart of
                # processing by as much after Redis comes back; a claim a second costs nothing.
                delay = min(RECONNECT_MAX, 0.1 * 2**failures)
                logger.warning("claim failed (%s); retrying in %.1fs", exc, delay)
                self._stopping.wait(delay)
                continue
            rotation += 1
            if not claimed:
                try:
                    self.storage.wait_for_jobs(self.queues, wait, self.worker_id)
                except Exception as exc:
                    logger.warning("wait for jobs failed (%s)", exc)
                    self._stopping.wait(0.5)

    def _claim_round(self, rotation: int) -> tuple[int, float]:
        """One claim per queue (rotating which goes first); returns (claimed, idle wait)."""
        claimed, wait = 0, self.idle_timeout
        for i in range(len(self.queues)):
            name = self.queues[(rotation + i) % len(self.queues)]
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

    def _dispatch(self, jobs: list[ClaimedJob]) -> None:
        now = time.monotonic()
        with self._cond:
            self._free -= len(jobs)
            for claimed in jobs:
                job = make_job(claimed, None)
                job.meta = envelope_meta(claimed)
                job.reporter = self._reporter(claimed)
                self._inflight[(claimed.queue, claimed.job_id, claimed.token)] = _InFlight(
                    claimed, job, running=isinstance(self._runner, AsyncRunner),
                    since=now,
                )  # fmt: skip
            if self._tally is not None:  # one claim: one queue
                self._tally.started(jobs[0].queue, len(jobs))
        if tracing.active():
            self._start_spans(jobs)
        if signals.job_started.receivers:
            for claimed in jobs:
                signals.send(signals.job_started, Worker, queue=claimed.queue,
                             job_id=claimed.job_id, attempt=claimed.attempt,
                             worker_id=self.worker_id)  # fmt: skip
        size = self.handlers.options(jobs[0].queue).batch if jobs else None
        if size and not isinstance(self._runner, AsyncRunner):  # one claim: one queue
            for i in range(0, len(jobs), size):
                self._work.put(jobs[i : i + size])
            return
        for claimed in jobs:
            if isinstance(self._runner, AsyncRunner):
                entry = self._inflight[(claimed.queue, claimed.job_id, claimed.token)]
                timer = self._soft_timeout(claimed, [entry.job])
                self._runner.submit(claimed, entry.job, partial(self._finished, entry, timer=timer))
            else:
                self._work.put(claimed)

    def _start_spans(self, jobs: list[ClaimedJob]) -> None:
        """One consumer span per attempt, child of the producer's context in its envelope."""
        with self._cond:
            entries = [self._inflight.get((c.queue, c.job_id, c.token)) for c in jobs]
        for entry in entries:
            if entry is not None:
                c = entry.claimed
                entry.span = tracing.start_consumer(c.queue, c.job_id, c.attempt,
                                                    self.worker_id, entry.job.meta)  # fmt: skip

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
                break
            if not isinstance(item, list):  # the hot path: one job
                entry = self._start(item)
                if entry is not None:
                    timer = self._soft_timeout(item, [entry.job])
                    if entry.span is None and not logjson.ENABLED:
                        ack = runner.run(slot, item, entry.job)
                    else:
                        with self._job_context(entry):
                            ack = runner.run(slot, item, entry.job)
                    self._finished(entry, ack, timer=timer)
                continue
            live = [e for e in map(self._start, item) if e is not None]
            if not live:
                continue
            timer = self._soft_timeout(live[0].claimed, [e.job for e in live])
            acks = runner.run_batch(slot, [e.claimed for e in live], [e.job for e in live])
            for i, (entry, ack) in enumerate(zip(live, acks, strict=True)):
                self._finished(entry, ack, timer=timer if i == 0 else None)

    @contextmanager
    def _job_context(self, entry: _InFlight) -> Iterator[None]:
        """While a thread-pool handler runs: its attempt's span is the current one (the
        handler's own spans nest under it) and JSON log lines name the job."""
        with ExitStack() as stack:
            if entry.span is not None:
                stack.enter_context(tracing.current(entry.span))
            if logjson.ENABLED:
                c = entry.claimed
                stack.enter_context(
                    logjson.job_context(c.queue, c.job_id, c.attempt, self.worker_id)
                )
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
        if entry.cancelled:
            body = error_body(JobCancelled("cancelled while running"), "JobCancelled")
            ack = Ack("cancel", claimed.job_id, claimed.token, body)
        # A quiet worker (this is its only job) sends the verdict itself: handing it to the
        # acker thread costs a thread wake-up (~0.1 ms of a ~1 ms request/response). With
        # other jobs in flight, verdicts go to the acker and on to storage in batches.
        with self._cond:
            direct = (
                len(self._inflight) == 1
                and not self._acker_busy
                and self._acks.empty()
                and not self.stopping
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
        while True:
            try:
                outcomes = self.storage.ack_many(name, acks)
                break
            except Exception as exc:  # keep the verdicts: the lease decides if they still count
                failures += 1
                if failures > 100:  # ~95 s of retries at RECONNECT_MAX
                    logger.error("giving up on %d verdicts for %s: %s", len(acks), name, exc)
                    outcomes = [AckOutcome.LEASE_LOST] * len(acks)
                    break
                logger.warning("acknowledging %d jobs failed (%s); retrying", len(acks), exc)
                time.sleep(min(RECONNECT_MAX, 0.05 * 2**failures))
        flow_children, spans = [], []
        observed: list[tuple[Ack, AckOutcome, _InFlight]] | None = (
            [] if any(s.receivers for s in _VERDICT_SIGNALS) else None
        )
        tally = self._tally
        timed: list[tuple[str, float]] | None = [] if tally is not None else None
        with self._cond:
            for ack, outcome in zip(acks, outcomes, strict=True):
                entry = self._inflight.pop((name, ack.job_id, ack.token), None)
                if entry is not None:
                    self._free += 1
                    if outcome in _FINAL and "parents" in entry.job.meta:
                        flow_children.append(entry.job.meta)
                    if observed is not None:
                        observed.append((ack, outcome, entry))
                    if timed is not None:
                        timed.append((outcome, entry.since))
                    if entry.span is not None:
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

    def _register(self) -> None:
        info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": self.queues,
            "concurrency": self._limit,
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
        with self._cond:
            if self._inflight:
                logger.info("waiting up to %.1fs for %d jobs", self.grace, len(self._inflight))
            while self._inflight and not self._hurry.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(min(remaining, 0.5))
            leftovers = list(self._inflight.values())
            self._inflight.clear()
        for entry in leftovers:
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
