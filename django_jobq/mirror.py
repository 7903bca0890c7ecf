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

If the stream cap trimmed events the group never read (the mirror was down too long), the
queue is re-synchronised from its live records (a SCAN); jobs that finished *and* expired while
the mirror was away keep their last mirrored state. ``EVENTS_MAXLEN`` bounds that window.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction

from .conf import get_storage, jobq_settings
from .job import Event, JobRecord, decode_progress
from .registry import handler_name, registry
from .states import TERMINAL_STATES, JobState

logger = logging.getLogger("django_jobq.mirror")

GROUP = "jobq-mirror"
JOB_FIELDS = (
    "state", "handler", "payload", "content_type", "result", "error", "attempts",
    "max_attempts", "stalls", "max_stalls", "priority", "result_ttl", "run_at", "created_at",
    "started_at", "finished_at", "expires_at", "worker", "progress", "logs",
)  # fmt: skip
# Column order of the raw upsert (see ``upsert``): JOB_FIELDS plus the key and model defaults.
JOB_COLUMNS = (
    "queue", "job_id", *JOB_FIELDS, "min_backoff", "max_backoff", "token", "waiters",
)  # fmt: skip
MAX_PARAMS = 30_000  # bound parameters per SQLite statement (its limit is 32,766)
EVENT_COLUMNS = ("job", "queue", "kind", "at", "worker", "detail", "stream_id")
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


def _dt(ms: int | None) -> dt.datetime | None:
    return None if ms is None else dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _error(raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"type": "Unreadable", "message": raw.decode("utf-8", "replace")}


def _converter(field: Any, conn: Any) -> Any:
    """How a Python value becomes a query parameter for ``field``, exactly as the ORM does it
    (``get_db_prep_save``), or None where that is the identity: skipping the call for plain
    ints and strings matters at tens of thousands of values per second."""
    kind = field.get_internal_type()
    if kind in ("CharField", "IntegerField", "PositiveIntegerField", "PositiveBigIntegerField",
                "BigIntegerField", "ForeignKey", "BinaryField"):  # fmt: skip
        return None
    if kind == "DateTimeField" and conn.vendor == "postgresql":
        return None  # psycopg sends aware datetimes as they are
    return lambda value: field.get_db_prep_save(value, conn)


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


class Mirror:
    """Copies job state from a ``RedisStorage`` into the models, batch by batch.

    Args:
        queues: queues to mirror (default: every known queue, re-discovered every few seconds).
        using: database alias the rows are written to.
        batch: events per read; each batch is one transaction.
        block: seconds a read waits for new events.
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
        stale_ms: int = 60_000,
        worker_sync_interval: float = 2.0,
    ) -> None:
        conf = jobq_settings()["MIRROR"]
        self.storage = storage if storage is not None else get_storage()
        if not hasattr(self.storage, "read_group"):
            raise TypeError("the mirror reads Redis event streams: use it with RedisStorage")
        from .models import Job, JobEvent, WorkerInfo

        self.Job, self.JobEvent, self.WorkerInfo = Job, JobEvent, WorkerInfo
        self.fixed_queues = list(queues) if queues else None
        self.using = using or conf["DATABASE_ALIAS"]
        self.group = group
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.batch = batch or conf["BATCH"]
        self.block = block
        self.stale_ms = stale_ms
        self.worker_sync_interval = worker_sync_interval
        self.lag = LagStats()
        self._queues: list[str] = []
        self._queues_checked = 0.0
        self._workers_synced = 0.0
        self._stop = threading.Event()

    # -- discovery --------------------------------------------------------------------------

    def queues(self) -> list[str]:
        if time.monotonic() - self._queues_checked < 5 and self._queues:
            return self._queues
        if self.fixed_queues:
            wanted = self.fixed_queues
        else:
            known = set(self.storage.list_queues()) | set(registry.queues())
            wanted = sorted(known | set(jobq_settings()["QUEUES"]))
        for name in set(wanted) - set(self._queues):
            self.storage.ensure_group(name, self.group)
            if self.storage.events_lost(name, self.group):
                logger.warning(
                    "%s: events were trimmed before the mirror read them; resyncing", name
                )
                self.resync(name)
            # Events this consumer read before a restart but never acknowledged come first.
            self._apply(self._read_pending(name))
        self._queues = sorted(wanted)
        self._queues_checked = time.monotonic()
        return self._queues

    def _read_pending(self, queue: str) -> list[Event]:
        events = self.storage.read_group([queue], self.group, self.consumer, pending=True)
        events += self.storage.claim_stale_events(queue, self.group, self.consumer, self.stale_ms)
        return events

    # -- the loop ---------------------------------------------------------------------------

    def run_once(self, block: float | None = None) -> int:
        """Read one batch (waiting up to ``block`` seconds for it) and write it; returns the
        number of events mirrored."""
        queues = self.queues()
        if time.monotonic() - self._workers_synced >= self.worker_sync_interval:
            self.sync_workers()
        if not queues:
            self._stop.wait(block or 0)
            return 0
        events = self.storage.read_group(
            queues, self.group, self.consumer, count=self.batch, block=block
        )
        self._apply(events)
        return len(events)

    def drain(self) -> int:
        """Mirror everything there is now, then return (tests, ``runmirror --once``)."""
        total = 0
        while n := self.run_once(block=None):
            total += n
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
                    logger.warning("mirror batch failed (%s); retrying", exc)
                    self._queues_checked = 0.0
                    # Re-create the groups too: an obliterated queue's stream (and group) is
                    # gone, and reading it would fail every batch of every queue.
                    self._queues = []
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
        by_queue: dict[str, list[Event]] = defaultdict(list)
        for event in events:
            by_queue[event.queue].append(event)
        with transaction.atomic(using=self.using):
            for queue, queue_events in by_queue.items():
                self._write_queue(queue, queue_events)
        now = int(time.time() * 1000)
        self.lag.add([now - e.at for e in events])
        # Acknowledge only after the commit: a crash in between re-delivers, never loses.
        for queue, queue_events in by_queue.items():
            self.storage.ack_events(queue, self.group, [e.id for e in queue_events])

    def _write_queue(self, queue: str, events: Sequence[Event]) -> None:
        last: dict[str, Event] = {}
        for event in events:
            last[event.job_id] = event
        records = self.storage.get_records(queue, list(last))
        live = [r for r in records.values() if r is not None]
        self.upsert(queue, live)
        gone = [last[job_id] for job_id, r in records.items() if r is None]
        for event in gone:  # expired already: the event is all that is left to go by
            state = KIND_STATE.get(event.kind)
            if state is not None:
                fields: dict[str, Any] = {"state": state}
                if state in TERMINAL_STATES:
                    fields["finished_at"] = _dt(event.at)
                self.Job.objects.using(self.using).filter(queue=queue, job_id=event.job_id).update(
                    **fields
                )
        pks = dict(
            self.Job.objects.using(self.using)
            .filter(queue=queue, job_id__in=list(last))
            .values_list("job_id", "id")
        )
        rows = [
            (pks[e.job_id], queue, e.kind, _dt(e.at), e.worker or "", None, e.id)
            for e in events
            if e.job_id in pks
        ]
        # A redelivered event hits the (queue, stream_id) unique index and is skipped.
        self._execute_many(self.JobEvent, EVENT_COLUMNS, rows, "ON CONFLICT DO NOTHING")

    def upsert(self, queue: str, records: Sequence[JobRecord]) -> None:
        """Insert or update one row per record, in one multi-row statement.

        Raw SQL because this is the mirror's hot loop: the ORM's ``bulk_create`` spends most
        of its time compiling the statement (measured: 3,800 events/s with it, below the
        6,000/s a 2,000 jobs/s worker produces). Values still go through each field's
        ``get_db_prep_save``, so every backend stores them exactly as the ORM would."""
        if not records:
            return
        name = handler_name(queue)
        rows = [
            (
                queue, r.job_id, r.state.value, name, r.payload or b"", r.content_type,
                r.result, _error(r.error), r.attempts, r.max_attempts, r.stalls, r.max_stalls,
                r.priority, r.result_ttl, _dt(r.run_at), _dt(r.created_at), _dt(r.started_at),
                _dt(r.finished_at), _dt(r.expires_at), r.worker or "", decode_progress(r.progress),
                [list(line) for line in r.logs] or None,
                # columns the mirror does not know: the model's defaults
                1000, 3_600_000, 0, 0,
            )
            for r in records
        ]  # fmt: skip
        q = connections[self.using].ops.quote_name
        updates = ", ".join(f"{q(c)} = excluded.{q(c)}" for c in JOB_FIELDS)
        self._execute_many(
            self.Job, JOB_COLUMNS, rows, f"ON CONFLICT (queue, job_id) DO UPDATE SET {updates}"
        )

    def _execute_many(
        self, model: Any, columns: Sequence[str], rows: list[tuple], tail: str
    ) -> None:
        if not rows:
            return
        conn = connections[self.using]
        fields = [model._meta.get_field(c) for c in columns]
        convert = [_converter(f, conn) for f in fields]
        prepared = [
            tuple(c(v) if c else v for c, v in zip(convert, row, strict=True)) for row in rows
        ]
        q = conn.ops.quote_name
        table = q(model._meta.db_table)
        names = ", ".join(q(f.column) for f in fields)
        if conn.vendor == "postgresql":
            # One statement, one array per column: the query text stays short, so the driver
            # does not re-parse thousands of placeholders per batch (that parse was most of
            # the time with a VALUES list), and PostgreSQL plans it once.
            casts = ", ".join(f"%s::{f.db_type(conn)}[]" for f in fields)
            arrays = [list(col) for col in zip(*prepared, strict=True)]
            with conn.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {table} ({names}) SELECT * FROM unnest({casts}) {tail}",
                    arrays,
                )
            return
        head = f"INSERT INTO {table} ({names}) VALUES "
        one = "(" + ", ".join(["%s"] * len(fields)) + ")"
        # SQLite: one multi-row statement per chunk, under its bound-parameter limit.
        per_chunk = max(1, MAX_PARAMS // len(fields))
        with conn.cursor() as cursor:
            for start in range(0, len(prepared), per_chunk):
                chunk = prepared[start : start + per_chunk]
                params = [value for row in chunk for value in row]
                cursor.execute(head + ", ".join([one] * len(chunk)) + f" {tail}", params)

    def resync(self, queue: str, chunk: int = 500) -> int:
        """Rewrite every live record of ``queue`` (after a gap in the stream)."""
        ids: list[str] = []
        total = 0
        for job_id in self.storage.scan_job_ids(queue):
            ids.append(job_id)
            if len(ids) >= chunk:
                total += self._resync_chunk(queue, ids)
                ids = []
        if ids:
            total += self._resync_chunk(queue, ids)
        return total

    def _resync_chunk(self, queue: str, ids: list[str]) -> int:
        live = [r for r in self.storage.get_records(queue, ids).values() if r is not None]
        with transaction.atomic(using=self.using):
            self.upsert(queue, live)
        return len(live)

    def sync_workers(self) -> None:
        """Live workers as rows; rows of workers that are gone are deleted."""
        self._workers_synced = time.monotonic()
        records = self.storage.list_workers()
        model = self.WorkerInfo.objects.using(self.using)
        with transaction.atomic(using=self.using):
            for rec in records:
                info = rec.info
                seen = _dt(rec.last_seen)
                fields = {
                    "host": info.get("host", ""), "pid": info.get("pid"),
                    "queues": info.get("queues", []), "concurrency": info.get("concurrency", 0),
                    "last_heartbeat": seen, "jobs_done": info.get("completed", 0),
                    "jobs_failed": info.get("failed", 0), "info": info,
                }  # fmt: skip
                model.update_or_create(
                    worker_id=rec.worker_id,
                    defaults=fields,
                    create_defaults={**fields, "started_at": _dt(info.get("started"))},
                )
            model.exclude(worker_id__in=[r.worker_id for r in records]).delete()


def purge_finished(days: float, *, using: str = "default", batch: int = 1000) -> int:
    """Delete rows of jobs that finished more than ``days`` ago, ``batch`` rows per statement
    (so a large purge never holds a long lock). Rows whose dedup window (``expires_at``) is
    still open are kept: on the database backend they *are* the deduplication."""
    from .models import Job

    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=days)
    now = dt.datetime.now(dt.UTC)
    total = 0
    while True:
        pks = list(
            Job.objects.using(using)
            .filter(state__in=[s.value for s in TERMINAL_STATES], finished_at__lt=cutoff)
            .exclude(expires_at__gt=now)
            .values_list("pk", flat=True)[:batch]
        )
        if not pks:
            return total
        with transaction.atomic(using=using):
            Job.objects.using(using).filter(pk__in=pks).delete()
        total += len(pks)
