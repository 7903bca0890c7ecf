"""The model mirror: Redis event streams → ``Job`` / ``JobEvent`` / ``WorkerInfo`` rows.

With the Redis backend the rows are a read model for the admin, the API and analytics. The hot
path never waits on them: workers only append events to the per-queue streams (inside their Lua
scripts), and this loop catches up in batches.

Why a consumer group: it remembers, in Redis, what was delivered and what was acknowledged. A
mirror that dies between writing rows and acking re-reads its pending events on restart, and
rows are written idempotently (upsert by (queue, job id); events unique by stream id), so
nothing is missed and nothing is doubled. Several mirrors (one per reaper) share the work.

Why rows are rebuilt from the job record rather than replayed from events: an event carries
only (job, kind, time, worker). Reading the current record of every job a batch touches (one
pipelined round trip) gives the full row, and re-reading is always correct, whatever order
batches land in. When a record has already expired, the batch's last event still sets the state.

Gaps heal while the mirror runs, not only at start-up: every few seconds it checks each
queue's stream for entries the cap trimmed before the group read them, a group that is gone
(the stream was flushed or obliterated) and a Redis server that restarted; any of these
re-synchronises the affected queues from their live records (a SCAN, written in creation
order) and moves the group past what that re-read covered. Jobs that finished *and* expired
inside such a gap keep their last mirrored state; ``EVENTS_MAXLEN`` bounds that window.

A job whose row the database refuses (a non-finite float in its progress, a malformed entry
written into the stream by hand) is set aside as a ``MirrorReject`` row, found by bisecting
the failed batch, so it never holds back the others.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DataError, IntegrityError, connections, transaction

from ..backend import get_storage
from ..conf import jobq_settings, queue_durability
from ..job import Event, JobRecord
from ..queue.sharding import served_queues
from ..serde import is_enveloped
from ..states import TERMINAL_STATES, WAITING_STATES, JobState
from ..tasks.registry import handler_name, job_handler_name, registry
from ..validation import logical_name
from . import sample as mirror_sample
from .rollup import reopen as reopen_rollup
from .sql import (
    insert_events,
    job_row,
    make_durable,
    ms_dt,
    stream_seq,
    take_write_lock,
    upsert_jobs,
    write_transaction,
)

logger = logging.getLogger("django_jobq.mirror")

GROUP = "jobq-mirror"
# Rows a lost job can leave behind (``mark_lost``): a job that had not finished.
UNFINISHED = (*WAITING_STATES, JobState.ACTIVE)
#: The event of a finished record that the queue's retention deleted (includes/retain.lua).
REMOVED = "removed"
KIND_STATE = {
    "queued": JobState.QUEUED,
    "retried": JobState.QUEUED,
    "scheduled": JobState.SCHEDULED,
    "active": JobState.ACTIVE,
    "retrying": JobState.RETRYING,
    "released": JobState.QUEUED,
    "stalled": JobState.QUEUED,
    "postponed": JobState.SCHEDULED,
    "completed": JobState.COMPLETED,
    "failed": JobState.FAILED,
    "cancelled": JobState.CANCELLED,
}
#: Errors that belong to the data of some job in a batch, not to the database or Redis being
#: unavailable: the batch is split to find the job, which is set aside. Anything else (a lost
#: connection, "database is locked") fails the batch, which is read again later.
RECORD_ERRORS = (DataError, IntegrityError, ValueError, TypeError, OverflowError, KeyError)
REJECT_ERROR_CHARS = 2000
READ_AHEAD = 8  # a mirror that is behind reads up to this many batches at once
CLAIM_COUNT = 1000  # entries claimed from a dead consumer per XAUTOCLAIM (its default count)
PROGRESS_EVERY = 30.0  # seconds between progress lines of a long resync
FINAL_ROWS_KEPT = 200_000  # jobs remembered as written final (FinalRows: ~25 MB at most, measured)
#: Kinds an event at the very millisecond a job finished may have and still be covered by its
#: final row (the claim and the finish of a fast job can share a millisecond; an enqueue or a
#: retry at that time starts a new life and is read).
FINISHING_KINDS = frozenset({"active", "completed", "failed", "cancelled"})


class LagStats:
    """Event time → row committed, in ms, over a sliding window (for the bench and health)."""

    def __init__(self, keep: int = 100_000) -> None:
        self.keep = keep
        self.samples: list[int] = []
        self.last_ms: int | None = None
        self.written = 0
        self._lock = threading.Lock()

    def add(self, lags: Sequence[int]) -> None:
        with self._lock:
            self.samples.extend(lags)
            if len(self.samples) > self.keep:
                del self.samples[: len(self.samples) - self.keep]
            if lags:
                self.last_ms = lags[-1]
            self.written += len(lags)

    def percentile(self, p: float) -> float | None:
        with self._lock:
            if not self.samples:
                return None
            ordered = sorted(self.samples)
        return float(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))])

    def reset(self) -> None:
        with self._lock:
            self.samples.clear()
            self.written = 0


class FinalRows:
    """Jobs whose rows this mirror wrote in a final state, with the time they finished.

    A mirror that is behind reads a job's ``queued`` event long after the job finished: the
    record it reads then is final, and the row it writes already says everything the job's
    later ``active`` and ``completed`` events could. Those events then need only their own
    rows, not another record read and row upsert (which were half the work of a drain). An
    event is covered when it happened before the job finished (same Redis clock: the script
    that finishes a job stamps both); an event at or after that time (a retry of a failed
    job, an id enqueued again after its record went) is read and written as always.
    Bounded (oldest entries dropped first), per process, and forgotten for a queue that is
    resynced: a miss only costs the read it would have cost anyway.
    """

    def __init__(self, keep: int = FINAL_ROWS_KEPT) -> None:
        self.keep = keep
        self._rows: dict[str, dict[str, int]] = defaultdict(dict)
        self._size = 0

    def covers(self, queue: str, event: Event) -> bool:
        finished = self._rows[queue].get(event.job_id) if queue in self._rows else None
        if finished is None:
            return False
        return event.at < finished or (event.at == finished and event.kind in FINISHING_KINDS)

    def remember(self, queue: str, records: Sequence[JobRecord]) -> None:
        rows = self._rows[queue]
        for r in records:
            if r.state in TERMINAL_STATES and r.finished_at is not None:
                if r.job_id not in rows:
                    self._size += 1
                rows[r.job_id] = r.finished_at
        while self._size > self.keep:  # oldest first: dicts keep insertion order
            fullest = max(self._rows.values(), key=len)
            del fullest[next(iter(fullest))]
            self._size -= 1

    def forget(self, queue: str) -> None:
        self._size -= len(self._rows.pop(queue, {}))


class Mirror:
    """Copies job state from a ``RedisStorage`` into the models, batch by batch.

    Args:
        queues: queues to mirror (default: every known queue, re-discovered every few seconds).
        using: database alias the rows are written to.
        batch: events per read; each batch is one transaction.
        block: seconds a read waits for new events.
        gap_check_interval: seconds between checks for gaps (trimmed entries, a lost group,
            a restarted Redis) while running, and for events a dead consumer left unacked.
        stale_ms: how long such events must have been left before they are taken over
            (default ``MIRROR["CLAIM_IDLE"]``).
        sample_above: a gap on a queue with more waiting and running jobs than this is
            healed with counts and a sample (``mirror_sample``; default
            ``MIRROR["SAMPLE_ABOVE"]``); ``sample_size`` records per state (``SAMPLE``).
        clock: monotonic seconds, for the streams' event rates (tests inject one).
    """

    def __init__(
        self,
        storage: Any = None,
        *,
        queues: Sequence[str] | None = None,
        using: str | None = None,
        group: str = GROUP,
        consumer: str | None = None,
        batch: int | None = None,
        block: float = 1.0,
        stale_ms: int | None = None,
        worker_sync_interval: float = 2.0,
        gap_check_interval: float = 5.0,
        sample_above: int | None = None,
        sample_size: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        conf = jobq_settings()["MIRROR"]
        self.storage = storage if storage is not None else get_storage()
        if not hasattr(self.storage, "read_group"):
            raise TypeError("the mirror reads Redis event streams: use it with RedisStorage")
        from ..models import Job, JobEvent, MirrorReject, WorkerInfo

        self.Job, self.JobEvent, self.WorkerInfo = Job, JobEvent, WorkerInfo
        self.Reject = MirrorReject
        self.fixed_queues = list(queues) if queues else None
        self.using = using or conf["DATABASE_ALIAS"]
        self.group = group
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.batch = batch or conf["BATCH"]
        self.block = block
        self.stale_ms = stale_ms if stale_ms is not None else int(conf["CLAIM_IDLE"] * 1000)
        self.worker_sync_interval = worker_sync_interval
        self.gap_check_interval = gap_check_interval
        self.lag = LagStats()
        self.final = FinalRows()
        self.sample_above = conf["SAMPLE_ABOVE"] if sample_above is None else sample_above
        self.sample_size = sample_size or conf["SAMPLE"]
        self.rates = mirror_sample.StreamRates(clock)
        self.seconds_per_record = mirror_sample.SECONDS_PER_RECORD  # measured by each resync
        self.sampled: dict[str, dict[str, Any]] = {}  # queue -> mode (counts and a sample)
        self.rejected = 0  # jobs set aside since start (MirrorReject rows hold the detail)
        self.resyncs = 0  # queues re-read from their records since start
        self._queues: list[str] = []
        self._queues_checked = 0.0
        self._gaps_checked = time.monotonic()
        self._workers_synced = 0.0
        self._server_id: str | None = None
        self._read_count = self.batch
        self._unsynced = False  # a lazy commit since the last durable one (_apply)
        self._durable = True  # whether the write being made is a read's last (_apply)
        self._stop = threading.Event()

    # -- discovery and gaps -----------------------------------------------------------------

    def queues(self) -> list[str]:
        if time.monotonic() - self._queues_checked < 5 and self._queues:
            return self._queues
        if self.fixed_queues:
            # A sharded queue named here is mirrored as its partitions (old ones included).
            wanted = served_queues(self.fixed_queues, self.storage.list_queues())
        else:
            known = set(self.storage.list_queues()) | set(registry.queues())
            wanted = sorted(known | set(jobq_settings()["QUEUES"]))
        if self._server_id is None:
            self._server_id = self.storage.server_id()
            # Another mirror (or this one before a restart) may have put a queue in the
            # counts-and-sample mode: it stays there until a full re-read fits.
            self.sampled = self.storage.mirror_sampled()
        for name in set(wanted) - set(self._queues):
            self._join(name)
        self._queues = sorted(wanted)
        self._queues_checked = time.monotonic()
        return self._queues

    def _join(self, name: str) -> None:
        """Start mirroring a queue: its group, a gap left while nobody read it, and the
        events this consumer read before a restart but never acknowledged (first)."""
        created = self.storage.ensure_group(name, self.group)
        if self.storage.events_lost(name, self.group):
            self.heal(name, "events were trimmed before the mirror read them")
        elif created and self._unfinished_rows(name):
            # No group, yet rows of jobs that have not finished: the stream went while no
            # mirror ran (Redis restarted or was flushed), a restart this process never saw.
            self.heal(name, "the event stream was lost")
        lost: list[str] = []
        events = self.storage.read_group([name], self.group, self.consumer, pending=True, lost=lost)
        events += self.storage.claim_stale_events(name, self.group, self.consumer, self.stale_ms)
        self._apply(events)
        if lost:
            self.storage.ack_events(name, self.group, lost)
            self.heal(name, f"{len(lost)} events read but not written were trimmed")

    def _unfinished_rows(self, queue: str) -> bool:
        rows = self.Job.objects.using(self.using).filter(queue=queue)
        return rows.filter(state__in=[s.value for s in UNFINISHED]).exists()

    def check_gaps(self) -> list[str]:
        """Heal every queue that has a gap now: a restarted Redis (all of them), a group that
        is gone (its stream was flushed or obliterated), or entries trimmed unread. Returns
        the queues healed."""
        self._gaps_checked = time.monotonic()
        server = self.storage.server_id()
        restarted = self._server_id is not None and server != self._server_id
        self._server_id = server
        healed = []
        for name in self._queues:
            why = "Redis restarted" if restarted else None
            if self.storage.ensure_group(name, self.group):
                why = why or "the event stream was lost"
            elif self.storage.events_lost(name, self.group):
                why = why or "events were trimmed before the mirror read them"
            if why:
                self.heal(name, why)
                healed.append(name)
            self._take_over(name)
            self.rates.observe(name, self.storage.stream_position(name)[1])
            if name in self.sampled and name not in healed:
                mirror_sample.back_to_exact(self, name)
        return healed

    def _take_over(self, queue: str) -> None:
        """Write the events another consumer read and left unacknowledged for ``stale_ms``:
        it died mid-batch (a killed process), and a mirror restarted under another name (a
        new pid) would otherwise never see them, leaving the lag up for good."""
        while events := self.storage.claim_stale_events(
            queue, self.group, self.consumer, self.stale_ms
        ):
            self._apply(events)
            if len(events) < CLAIM_COUNT:
                return

    def heal(self, queue: str, why: str) -> int:
        """Bring ``queue``'s rows back after a gap: every live record re-read
        (``heal_exact``), or on a big queue counts and a sample (``mirror_sample``).
        Returns the rows written.

        Until the re-read ends the queue's rows may be stale: that is said first (a gap
        record marked ``healing``, which the end of the heal replaces), so the admin warns on
        that queue's pages for exactly that long, and a mirror killed mid-heal leaves the
        warning up until one finishes."""
        self.storage.record_mirror_gap(queue, {
            "at": round(time.time(), 3), "why": why, "healing": True, "consumer": self.consumer,
        })  # fmt: skip
        if mirror_sample.wants_sample(self, queue):
            return mirror_sample.heal_sampled(self, queue, why)
        return self.heal_exact(queue, why)

    def heal_exact(self, queue: str, why: str) -> int:
        """Re-read every live record of ``queue``, then move the group past what the re-read
        covered (the stream position is taken first, so no later event is skipped)."""
        logger.warning("%s: %s; resyncing from the job records", queue, why)
        started = time.time()
        position = self.storage.stream_position(queue)
        self.final.forget(queue)  # after a restart an id may start a new life at any time
        n, scanned, lost = self.resync(queue, why=why)
        self.storage.set_group_position(queue, self.group, position)
        self.resyncs += 1
        seconds = time.time() - started
        if scanned >= 1000:  # enough to measure what a full re-read costs per record
            self.seconds_per_record = seconds / scanned
        logger.warning("%s: resynced %d of %d jobs in %.1f s", queue, n, scanned, seconds)
        if lost:
            logger.error(
                "%s: %d accepted jobs are gone from Redis before they finished (%s); their "
                "rows are marked lost. With durability='journal' jobq_reconcile would have "
                "re-created them (docs/durability.md).", queue, lost, why,
            )  # fmt: skip
        # Said where health and the admin look, whichever process this mirror runs in.
        self.storage.record_mirror_gap(queue, {
            "at": round(started, 3), "why": why, "rows": n, "lost": lost,
            "seconds": round(seconds, 3), "consumer": self.consumer,
        })  # fmt: skip
        return n

    # -- the loop ---------------------------------------------------------------------------

    def run_once(self, block: float | None = None) -> int:
        """Read one batch (waiting up to ``block`` seconds for it) and write it; returns the
        number of events mirrored."""
        queues = self.queues()
        if time.monotonic() - self._gaps_checked >= self.gap_check_interval:
            self.check_gaps()
        if time.monotonic() - self._workers_synced >= self.worker_sync_interval:
            self.sync_workers()
        if not queues:
            self._stop.wait(block or 0)
            return 0
        events = self.storage.read_group(
            queues, self.group, self.consumer, count=self._read_count, block=block
        )
        self._apply(events)
        # Behind (a full read): read more at once. A job's events (queued, active,
        # completed) then share one batch, so its record is read and written once, not
        # three times; the writes stay at ``batch`` jobs per transaction.
        full = len(events) >= self._read_count
        grown = min(self._read_count * 2, READ_AHEAD * self.batch)
        self._read_count = grown if full else self.batch
        return len(events)

    def drain(self) -> int:
        """Mirror everything there is now, then return (tests, ``runmirror --once``).

        Gaps are checked before the first read and after the last, whatever the interval of
        the running loop: a drain is meant to leave rows equal to Redis, and a stream the cap
        trimmed (found only after a read skipped the entries, see ``check_gaps``) would
        otherwise leave stale rows until a running mirror's next check."""
        total = 0
        self.queues()
        self.check_gaps()
        while True:
            while n := self.run_once(block=None):
                total += n
            if not self.check_gaps():
                break
        return total

    def run(self) -> None:
        logger.info("mirror %s reading group %s", self.consumer, self.group)
        failures = 0
        try:
            while not self._stop.is_set():
                try:
                    self.run_once(block=self.block)
                    failures = 0
                except Exception as exc:  # Redis or database blip: the group keeps our place
                    failures += 1
                    logger.warning(
                        "mirror batch failed (%s: %s); retrying", type(exc).__name__, exc
                    )
                    self._queues_checked = 0.0
                    # Re-join every queue: a flushed or obliterated stream (and group) is
                    # gone, and reading it would fail every batch of every queue.
                    self._queues = []
                    try:
                        connections[self.using].close_if_unusable_or_obsolete()
                    except Exception as close_exc:  # the thread must outlive a bad connection
                        logger.warning("mirror connection not reset (%s)", close_exc)
                    self._stop.wait(min(5.0, 0.1 * 2**failures))
        finally:
            connections.close_all()

    def stop(self) -> None:
        self._stop.set()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="jobq-mirror", daemon=True)
        thread.start()
        return thread

    # -- writing ----------------------------------------------------------------------------

    def _apply(self, events: Sequence[Event]) -> None:
        if not events:
            return
        by_job: dict[tuple[str, str], list[Event]] = defaultdict(list)
        for event in events:
            if event.job_id:
                by_job[(event.queue, event.job_id)].append(event)
            else:
                self._reject(event.queue, "", [event], "the stream entry names no job")
        jobs = list(by_job.items())
        size = self._jobs_per_transaction()
        for start in range(0, len(jobs), size):
            # One wait for the disk per read: the last transaction's commit (the logs are
            # appended in order, so it makes the earlier ones durable too).
            self._durable = start + size >= len(jobs)
            self._bisect(jobs[start : start + size], self._write_jobs)
        if self._unsynced:  # the last write failed after a lazy one: flush before the acks
            make_durable(self.using)
            self._unsynced = False
        now = int(time.time() * 1000)
        self.lag.add([now - e.at for e in events])
        # Acknowledge only after the commit: a crash in between re-delivers, never loses.
        by_queue: dict[str, list[str]] = defaultdict(list)
        for event in events:
            by_queue[event.queue].append(event.id)
        for queue, ids in by_queue.items():
            self.storage.ack_events(queue, self.group, ids)

    def _jobs_per_transaction(self) -> int:
        """SQLite: ``batch`` jobs, short transactions: its one write lock makes the project's
        own writes wait (busy timeout) while the mirror holds it. PostgreSQL locks rows, and
        only the mirror writes these: a read's jobs (up to ``READ_AHEAD`` batches) in one
        transaction, so its temporary tables, upserts and commit are paid once per read
        instead of once per batch (the per-transaction share of a PostgreSQL write)."""
        if connections[self.using].vendor == "postgresql":
            return READ_AHEAD * self.batch
        return self.batch

    def _bisect(
        self, jobs: list[tuple[tuple[str, str], Any]], write: Callable[[list], None]
    ) -> None:
        """Write ``jobs`` in one go; if the data of some job is refused, split the batch in
        halves until that job is alone, and set it aside. A batch of n jobs with one bad job
        costs about 2·log2(n) extra writes, only when it fails."""
        try:
            write(jobs)
        except RECORD_ERRORS as exc:
            if len(jobs) == 1:
                (queue, job_id), item = jobs[0]
                self._reject(queue, job_id, item if isinstance(item, list) else [], exc)
                return
            half = len(jobs) // 2
            self._bisect(jobs[:half], write)
            self._bisect(jobs[half:], write)

    def _write_jobs(self, jobs: list[tuple[tuple[str, str], list[Event]]]) -> None:
        """One transaction for the rows and events of ``jobs``. The records are read from
        Redis before it starts, so the write lock (SQLite) is held only while writing."""
        by_queue: dict[str, list[Event]] = defaultdict(list)
        for (queue, _), job_events in jobs:
            by_queue[queue].extend(job_events)
        reads = {q: self._read_records(q, evs) for q, evs in by_queue.items()}
        # All but a read's last transaction commit without waiting for the disk; _apply
        # acknowledges only after a durable commit (or make_durable) followed them.
        durable = self._durable
        self._unsynced = self._unsynced or not durable
        with write_transaction(self.Job, self.using, durable=durable):
            for queue, (live, gone, seqs) in reads.items():
                self._store(queue, live, gone, by_queue[queue], seqs)
        if durable:
            self._unsynced = False
        for queue, (live, _, _) in reads.items():  # committed: these rows are final now
            self.final.remember(queue, live)

    def _read_records(
        self, queue: str, events: Sequence[Event]
    ) -> tuple[list[JobRecord], list[Event], dict[str, int]]:
        """The records of the jobs whose rows these events may change: a job whose row was
        already written in its final state, by a record read after all of these events
        happened, needs only its event rows (``FinalRows``). With each record, by job id,
        its newest event's ``stream_seq`` (``Job.mirror_seq``: the row's guard against an
        older write)."""
        covered = self.final.covers
        last = {event.job_id: event for event in events if not covered(queue, event)}
        records = self.storage.get_records(queue, list(last))
        live = [r for r in records.values() if r is not None]
        seqs = {r.job_id: stream_seq(last[r.job_id].id) for r in live}
        return live, [last[job_id] for job_id, r in records.items() if r is None], seqs

    def _store(
        self, queue: str, live: list[JobRecord], gone: list[Event], events: Sequence[Event],
        seqs: dict[str, int],
    ) -> None:  # fmt: skip
        self.upsert(queue, live, seqs)
        # Removed by the queue's retention (its last word): the row goes too, with its events
        # (cascade), so the admin never lists a job Redis no longer has.
        removed = [e for e in gone if e.kind == REMOVED]
        if removed:
            forget_removed(queue, removed)
            ids = [e.job_id for e in removed]
            self.Job.objects.using(self.using).filter(queue=queue, job_id__in=ids).delete()
        for event in gone:  # expired already: the event is all that is left to go by
            state = KIND_STATE.get(event.kind)
            if state is not None:
                fields: dict[str, Any] = {"state": state}
                if state in TERMINAL_STATES:
                    fields["finished_at"] = ms_dt(event.at)
                self.Job.objects.using(self.using).filter(queue=queue, job_id=event.job_id).update(
                    **fields
                )
        rows = [(e.job_id, queue, e.kind, e.at, e.worker or "", error_detail(e), e.id)
                for e in events]  # fmt: skip
        # A redelivered event hits the (queue, stream_id) unique index and is skipped.
        insert_events(self.JobEvent, self.Job, self.using, rows)

    def upsert(
        self, queue: str, records: Sequence[JobRecord], seqs: dict[str, int] | None = None
    ) -> None:
        """Insert or update one row per record, in one multi-row statement. ``seqs``: each
        record's event position (``_read_records``); none for a re-read (``resync``)."""
        if records:
            name = handler_name(queue)
            seqs = seqs or {}
            # A task function's job shows its task's name (envelope.py: only enveloped jobs
            # pay for the decode).
            upsert_jobs(self.Job, self.using, [
                job_row(queue, (is_enveloped(r.content_type)
                                and job_handler_name(queue, r.content_type, r.payload)) or name,
                        r, seqs.get(r.job_id, 0))
                for r in records
            ])  # fmt: skip
            reopen_rollup(self.using, [r.finished_at for r in records])  # charts: refold late rows

    def _reject(
        self, queue: str, job_id: str, events: Sequence[Event], error: Exception | str
    ) -> None:
        """Set a job aside: log it, count it, and keep a ``MirrorReject`` row for the admin.
        Recording it must not block the others either: if even that fails, the log line is
        all that is left."""
        self.rejected += 1
        message = (f"{type(error).__name__}: {error}" if isinstance(error, Exception)
                   else error)[:REJECT_ERROR_CHARS]  # fmt: skip
        first = events[0] if events else None
        logger.error("[%s/%s] not mirrored, set aside: %s", queue, job_id, message)
        now = dt.datetime.now(dt.UTC)
        try:
            with transaction.atomic(using=self.using):
                take_write_lock(self.Job, self.using)
                row, created = self.Reject.objects.using(self.using).get_or_create(
                    queue=queue[:64], job_id=job_id[:160],
                    defaults={"stream_id": first.id if first else "", "kind": "",
                              "error": message, "events": len(events), "first_seen": now,
                              "last_seen": now},
                )  # fmt: skip
                if first is not None:
                    row.kind = first.kind[:16]
                if not created:
                    row.events += len(events)
                    row.error, row.last_seen = message, now
                row.save(using=self.using)
        except Exception as exc:  # the database refuses even this: the log line stays
            logger.error("[%s/%s] reject not recorded: %s", queue, job_id, exc)

    # -- resync -----------------------------------------------------------------------------

    def resync(self, queue: str, chunk: int = 2000, why: str = "") -> tuple[int, int, int]:
        """Rewrite the rows of ``queue`` that differ from its live records (after a gap in
        the stream), oldest first, and mark lost the unfinished rows whose job Redis no
        longer holds (``mark_lost``); returns (rows rewritten, live records, rows lost).

        Every live record is compared by its (state, attempts, finish time), a few bytes
        each: the row of an unfinished job, a missing row, or a finished job's row from
        another run is rewritten from the full record; the row of a run that ended the same
        way is right already (a finished run changes no more), which is most of a big
        drained queue. SCAN returns ids in hash order; rows it creates are written in
        creation order instead, so that their primary keys (the admin's default order, and
        the tie-break of the lists' keyset pages) keep the order the jobs were created in.
        ``chunk`` rows per transaction: a re-read of a quarter of a million rows spent a
        third of its time committing 500-row transactions (SQLite's sync per commit); 2,000
        rows still hold SQLite's write lock for a fraction of its busy timeout."""
        ids = list(self.storage.scan_job_ids(queue))
        states = self.storage.record_states(queue, ids)
        stale: list[tuple[int, str]] = []
        rows = self.Job.objects.using(self.using).filter(queue=queue)
        for start in range(0, len(ids), 5000):
            part = ids[start : start + 5000]
            have = {
                job_id: (state, attempts, finished and round(finished.timestamp() * 1000))
                for job_id, state, attempts, finished in rows.filter(job_id__in=part)
                .values_list("job_id", "state", "attempts", "finished_at")
                .iterator()
            }  # fmt: skip
            for job_id, now in zip(part, states[start : start + 5000], strict=True):
                if now is not None and mirror_sample.differs(have.get(job_id), now[:3]):
                    stale.append((now[3], job_id))
        ordered = [job_id for _, job_id in sorted(stale)]
        logger.info("%s: %d of %d rows differ from their records", queue, len(ordered), len(ids))
        total = 0
        said = time.monotonic()
        for start in range(0, len(ordered), chunk):
            if time.monotonic() - said >= PROGRESS_EVERY:  # a long re-read says how far it got
                said = time.monotonic()
                logger.warning("%s: resync rewrote %d of %d rows", queue, start, len(ordered))
            part = ordered[start : start + chunk]
            live = [r for r in self.storage.get_records(queue, part).values() if r is not None]
            total += len(live)
            self._bisect([((queue, r.job_id), r) for r in live], self._write_records)
        return total, len(ids), self.mark_lost(queue, set(ids), why)

    def mark_lost(self, queue: str, live: set[str], why: str) -> int:
        """Rows of jobs that were waiting or running and that Redis no longer holds: Redis
        restarted or was flushed without them (or their removal's event was trimmed). No
        event will ever end such a row, so it would show a job as queued for good (issue
        36, item 13): it ends as ``lost`` instead, keeping what it knew (payload,
        attempts), for an operator to count and re-enqueue. Each candidate is looked up once
        more first: a job enqueued since the SCAN has a record now, and keeps its row. Not
        on a journal queue: ``jobq_reconcile`` re-creates its jobs, and their events
        rewrite the rows."""
        if queue_durability(logical_name(queue)) == "journal":
            return 0
        rows = self.Job.objects.using(self.using).filter(queue=queue)
        unfinished = [s.value for s in UNFINISHED]
        ghosts = [
            (pk, job_id)
            for pk, job_id in rows.filter(state__in=unfinished).values_list("pk", "job_id")
            if job_id not in live
        ]
        marked = 0
        for start in range(0, len(ghosts), 1000):
            part = ghosts[start : start + 1000]
            states = self.storage.job_states(queue, [job_id for _, job_id in part])
            gone = [pk for (pk, _), state in zip(part, states, strict=True) if state is None]
            error = {"type": "JobLost", "message": f"Redis no longer holds this job ({why})"}
            with transaction.atomic(using=self.using):
                take_write_lock(self.Job, self.using)
                marked += rows.filter(pk__in=gone, state__in=unfinished).update(
                    state=JobState.LOST, error=error, finished_at=dt.datetime.now(dt.UTC),
                    lease_deadline=None, expires_at=None,
                )  # fmt: skip
        return marked

    def _write_records(self, items: list[tuple[tuple[str, str], JobRecord]]) -> None:
        with transaction.atomic(using=self.using):
            take_write_lock(self.Job, self.using)
            self.upsert(items[0][0][0], [record for _, record in items])

    def sync_workers(self) -> None:
        """Live workers as rows; rows of workers that are gone are deleted."""
        self._workers_synced = time.monotonic()
        records = self.storage.list_workers()
        model = self.WorkerInfo.objects.using(self.using)
        with transaction.atomic(using=self.using):
            take_write_lock(self.Job, self.using)
            for rec in records:
                info = rec.info
                seen = ms_dt(rec.last_seen)
                fields = {
                    "host": info.get("host", ""), "pid": info.get("pid"),
                    "queues": info.get("queues", []), "concurrency": info.get("concurrency", 0),
                    "last_heartbeat": seen, "jobs_done": info.get("completed", 0),
                    "jobs_failed": info.get("failed", 0), "info": info,
                }  # fmt: skip
                model.update_or_create(
                    worker_id=rec.worker_id,
                    defaults=fields,
                    create_defaults={**fields, "started_at": ms_dt(info.get("started"))},
                )
            model.exclude(worker_id__in=[r.worker_id for r in records]).delete()


#: Event kinds whose error the rows keep: the job page lists every attempt's error from them.
ERROR_KINDS = frozenset({"retrying", "failed"})


def error_detail(event: Event) -> dict[str, Any] | None:
    """The ``detail`` of an event row carrying an attempt's error, in the database backend's
    shape (``{"raw": base64 of the error's JSON, "ct": "json"}``, or ``{"omitted": true}``
    over ``EVENT_DATA_MAX``): the job page reads both backends' rows alike. None otherwise."""
    if event.kind not in ERROR_KINDS:
        return None
    if event.data_omitted:
        return {"omitted": True}
    if event.data is None:
        return None
    raw = json.dumps(event.data).encode()
    return {"raw": base64.b64encode(raw).decode(), "ct": "json"}


def forget_removed(queue: str, removed: Sequence[Event]) -> None:
    """A journal-mode queue: drop the journal entries of jobs retention removed, or the
    reconcile, finding neither the record in Redis nor a finished row (deleted here), would
    send them again. Only entries accepted before the removal go (``journal.forget``)."""
    if queue_durability(queue) != "journal":
        return
    from ..queue.journal import forget

    forget(queue, max(e.at for e in removed), [e.job_id for e in removed])


def purge_finished(days: float, *, using: str = "default", batch: int = 1000) -> int:
    """Delete rows of jobs that finished more than ``days`` ago, ``batch`` rows per statement
    (so a large purge never holds a long lock). Rows whose dedup window (``expires_at``) is
    still open are kept: on the database backend they *are* the deduplication."""
    from ..models import Job

    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=days)
    now = dt.datetime.now(dt.UTC)
    total = 0
    while True:
        pks = list(
            Job.objects.using(using)
            .filter(
                state__in=[s.value for s in (*TERMINAL_STATES, JobState.LOST)],
                finished_at__lt=cutoff,
            )
            .exclude(expires_at__gt=now)
            .values_list("pk", flat=True)[:batch]
        )
        if not pks:
            return total
        with transaction.atomic(using=using):
            Job.objects.using(using).filter(pk__in=pks).delete()
        total += len(pks)
