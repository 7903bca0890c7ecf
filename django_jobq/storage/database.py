"""Database backend: the Django models are the state, changed in short transactions.

Why it exists: an enqueue inside the caller's ``transaction.atomic()`` commits or rolls back
with the caller's own writes (the transactional-outbox guarantee Redis cannot give), and it needs
no server beyond the project's database: on SQLite it is the embedded default.

Concurrency rules:
- PostgreSQL: claims lock candidate rows with ``FOR UPDATE SKIP LOCKED``, so workers never wait
  on each other; wake-ups travel by ``LISTEN/NOTIFY``, sent inside the transaction so a worker is
  woken only once the job is committed. A claim on a queue with limits first locks the queue's
  ``QueueConfig`` row, so limits are counted by one claimer at a time; a queue without limits
  takes no such lock.
- SQLite: one writer at a time. A transaction that reads and then writes fails at once with
  "database is locked" if another connection committed in between (WAL snapshot), so every write
  transaction here *starts* with a write (``_write_lock``), which waits on the busy timeout
  instead. SQLite has no cross-process signal; a watcher thread reads ``PRAGMA data_version``
  (which changes when any other connection commits, and costs no disk read) every
  ``poll_interval`` and wakes this process's waiters, so an idle worker neither runs claim
  queries in a loop nor sleeps through a new job.

Singleton successors are rows of their own under reserved ids (valid ids never contain ``~``):
a blocked successor waits under ``<id>~next``. When the run before it finishes, in the same
transaction that finished row is renamed ``<id>~<pk>`` and the successor takes ``<id>``; a
waiter of the finished run reads it by primary key, so it still gets that run's outcome.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Count, F, OuterRef, Q, Subquery

from ..errors import QueueBusy, StorageError, StorageUnavailable
from ..job import (
    LOG_LINES,
    PARKED_FLOOR,
    AckOutcome,
    CancelOutcome,
    ChangeOutcome,
    ClaimedJob,
    DedupMode,
    EnqueueOutcome,
    Event,
    FailureCall,
    FinalOutcome,
    JobRecord,
    NewJob,
    QueueLimits,
    RetryOutcome,
    RunAtUpdate,
    StoredEnqueue,
)
from ..registry import handler_name
from ..states import TERMINAL_STATES, WAITING_STATES, JobState
from .base import Ack, ClaimBatch, Clock, ReapReport, Storage, WorkerRecord, token_base

logger = logging.getLogger("django_jobq.storage")
CHANNEL = "django_jobq"
BULK_CHUNK = 500  # jobs per enqueue_many transaction
IN_CHUNK = 500  # ids per "IN (...)" list: SQLite bounds the parameters of a statement
RECHECK = 2.0  # seconds: longest wait without re-reading the database (see _wait)
GROUP_SCAN = 100  # claim: candidates looked at beyond ``count`` when group limits defer some
WAITED_MEMO = 10_000  # remembered (queue, id) -> row of enqueues with a waiter (per process)
STALLED_ERROR = {"type": "Stalled", "message": "lease expired more than max_stalls times"}
SCHEDULED_STATES = (JobState.SCHEDULED, JobState.RETRYING)
UPDATABLE_STATES = (JobState.SCHEDULED, JobState.QUEUED, JobState.RETRYING)
MARK = "~"  # never part of a valid job id (validation.py): it marks reserved row names
SUCCESSOR = MARK + "next"
ORDER = "ORDER BY priority, order_key, id"  # claim order (index jobq_job_order)
RETURNING = (
    "RETURNING id, job_id, payload, token, attempts, max_attempts, min_backoff, max_backoff, "
    "content_type, priority, order_key, job_group"
)
# SQLite raises OperationalError for these too; they are errors of the schema, not outages.
SQLITE_SCHEMA_ERRORS = ("no such table", "no such column", "table ", "near ")
CONFIG_COLUMNS = (
    "paused, postponed_until, concurrency, rate_max, rate_window, group_rate_max, group_rate_window"
)


def _dt(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _ms(value: dt.datetime) -> int:
    return round(value.timestamp() * 1000)


def _ms_or_none(value: dt.datetime | None) -> int | None:
    return None if value is None else _ms(value)


def _raw_ms(value: Any) -> int | None:
    """A datetime column read by raw SQL: PostgreSQL gives datetimes, SQLite UTC text."""
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return _ms(value)


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _json_bytes(value: Any) -> bytes | None:
    return None if value is None else json.dumps(value).encode()


# What PostgreSQL's jsonb refuses inside a string: NUL, and lone UTF-16 surrogates (json.dumps
# writes both as \u escapes, which jsonb rejects on input). A str that json.loads made holds
# a surrogate only when it is lone: an escaped pair decodes to one character.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _clean_text(text: str) -> str:
    return _UNSTORABLE.sub("\ufffd", text)


def _storable_json(raw: bytes, vendor: str) -> Any:
    """The JSON value of ``raw`` (an error record, a progress value) as this database can
    store it. An exception message or a progress line may hold any text; on PostgreSQL a NUL
    or a lone surrogate would make the whole verdict fail with a DataError (the job would
    then run again when its lease expires, its error lost), so those characters become
    U+FFFD, the replacement character, and the rest of the value is kept as it is."""
    value = json.loads(raw)
    if vendor != "postgresql":
        return value
    root = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:  # iterative: a progress value may be nested deeper than the stack allows
        parent, key = stack.pop()
        item = parent[key]
        if isinstance(item, str):
            parent[key] = _clean_text(item)
        elif isinstance(item, list):
            stack.extend((item, i) for i in range(len(item)))
        elif isinstance(item, dict):
            cleaned = {_clean_text(k): v for k, v in item.items()}
            parent[key] = cleaned
            stack.extend((cleaned, k) for k in cleaned)
    return root[0]


def _public_id(stored: str) -> str:
    """The job id of a row, also of a successor or a replaced run (see the module docstring)."""
    return stored.split(MARK, 1)[0]


def _chunks(items: Sequence[Any], size: int = IN_CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _moves(mode: RunAtUpdate, current: int, due: int) -> bool:
    """Whether an ``update_run_at`` mode moves a due time of ``current`` to ``due``."""
    if mode is RunAtUpdate.YES:
        return due != current
    if mode is RunAtUpdate.IF_LATER:
        return due > current
    if mode is RunAtUpdate.IF_EARLIER:
        return due < current
    return False


@dataclass(slots=True)
class _Flow:
    """A queue's flow control as one claim sees it (from its ``QueueConfig`` row, if any)."""

    paused: bool = False
    postponed_until: int | None = None  # epoch ms
    concurrency: int | None = None
    rate_max: int | None = None
    rate_window: int | None = None
    group_rate_max: int | None = None
    group_rate_window: int | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any] | None) -> _Flow:
        if row is None or row[0] is None:  # no config row: no flow control
            return cls()
        return cls(bool(row[0]), _raw_ms(row[1]), *row[2:7])

    @property
    def rate(self) -> bool:
        return bool(self.rate_max is not None and self.rate_window)

    @property
    def group_rate(self) -> bool:
        return bool(self.group_rate_max is not None and self.group_rate_window)

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.rate or self.group_rate

    def held(self, now: int) -> ClaimBatch | None:
        """The empty answer of a claim while the whole queue waits, else None."""
        if self.paused:
            return ClaimBatch()  # resume() wakes the workers
        if self.postponed_until is not None and self.postponed_until > now:
            return ClaimBatch(next_due_in=self.postponed_until - now)
        return None


class DatabaseStorage(Storage):
    supports_transactional_enqueue = True

    def unavailable(self, exc: Exception) -> StorageUnavailable | None:
        """A lost or refused connection, a server shutting down, SQLite locked past its busy
        timeout: ``OperationalError`` / ``InterfaceError``. Not integrity or programming
        errors, nor SQLite's schema complaints, which share its ``OperationalError`` class
        (a missing table is a missing ``migrate``, not an outage)."""
        from django.db import InterfaceError, OperationalError

        if isinstance(exc, OperationalError) and str(exc).startswith(SQLITE_SCHEMA_ERRORS):
            return None
        if isinstance(exc, OperationalError | InterfaceError):
            return StorageUnavailable(
                f"database {self.using!r} did not answer: {type(exc).__name__}: {exc}"
            )
        return None

    def __init__(
        self, using: str = "default", *, clock: Clock | None = None, poll_interval: float = 0.01
    ) -> None:
        from ..models import ClaimLog, DedupKey, Job, JobEvent, QueueConfig, WorkerInfo
        from ..models import FailureCall as FailureCallRow

        self.using = using
        self.clock = clock
        self.poll_interval = poll_interval
        self.Job, self.JobEvent, self.QueueConfig, self.WorkerInfo = (
            Job, JobEvent, QueueConfig, WorkerInfo,
        )  # fmt: skip
        self.DedupKey, self.ClaimLog = DedupKey, ClaimLog
        self.FailureCallRow = FailureCallRow
        # Wake-ups: every signal bumps a generation number. A waiter compares it with the value
        # it saw *before* reading the database, so a signal that lands between its read and its
        # wait is never lost (the classic missed wake-up of condition variables).
        self._cond = threading.Condition()
        self._generation = 0
        self._claim_seen: dict[str, int] = {}
        self._interrupted: set[str] = set()
        self._listener: _PgListener | _SqliteWatcher | None = None
        self._wal_checked = False
        # The row each enqueue with a waiter joined, so that wait_for_outcome follows that row
        # even once a singleton successor has taken over the id.
        self._waited: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._waited_lock = threading.Lock()

    # -- helpers ----------------------------------------------------------------------------

    @property
    def vendor(self) -> str:
        return connections[self.using].vendor

    @property
    def supports_blocking_wait(self) -> bool:  # type: ignore[override]
        return self.vendor == "postgresql"

    def _now(self) -> int:
        return self.clock() if self.clock else int(time.time() * 1000)

    def _jobs(self):
        self._drop_broken_connection()
        return self.Job.objects.using(self.using)

    def _configs(self):
        return self.QueueConfig.objects.using(self.using)

    def _atomic(self):
        self._drop_broken_connection()
        return transaction.atomic(using=self.using)

    def _drop_broken_connection(self) -> None:
        """Workers hold their connections for hours, outside any request cycle, so nothing
        else closes one the server dropped (restart, failover): after an error, test it and
        reconnect on the next call instead of failing every call from then on."""
        conn = connections[self.using]
        if conn.connection is None or not conn.errors_occurred or conn.in_atomic_block:
            return
        if conn.is_usable():
            conn.errors_occurred = False
        else:
            conn.close()

    def _write_lock(self) -> None:
        """SQLite: take the database write lock before any read (see the module docstring)."""
        if self.vendor == "sqlite":
            if not self._wal_checked:
                self._use_wal()
            with connections[self.using].cursor() as cursor:
                cursor.execute(f"DELETE FROM {self.Job._meta.db_table} WHERE id = -1")

    def _use_wal(self) -> None:
        """WAL lets readers run while one connection writes; it persists in the file, so this
        runs once per process. In-memory databases cannot use it and need not."""
        self._wal_checked = True
        conn = connections[self.using]
        if conn.in_atomic_block or conn.settings_dict["NAME"] in ("", ":memory:"):
            self._wal_checked = False
            return
        with conn.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")

    def _events(self, rows: Sequence[tuple[int, str, str]], kind: str, now: int, worker="") -> None:
        """Append one event per (pk, queue, job_id) in this transaction (one statement)."""
        if not rows:
            return
        at = self._param_dt(now)
        table = self._event_table
        for chunk in _chunks(rows):
            values = ", ".join(["(%s, %s, %s, %s, %s, '')"] * len(chunk))
            params: list[Any] = []
            for pk, q, _ in chunk:
                params += [pk, q, kind, at, worker or ""]
            self._sql(
                f"INSERT INTO {table} (job_id, queue, kind, at, worker, stream_id) VALUES {values}",
                params,
                fetch=False,
            )

    # Raw SQL for the hot paths. Table names come from the models' meta; values are always
    # parameters.
    def _quoted(self, model: Any) -> str:
        return connections[self.using].ops.quote_name(model._meta.db_table)

    @property
    def _table(self) -> str:
        return self._quoted(self.Job)

    @property
    def _event_table(self) -> str:
        return self._quoted(self.JobEvent)

    @property
    def _skip_locked(self) -> str:
        return " FOR UPDATE SKIP LOCKED" if self.vendor == "postgresql" else ""

    @property
    def _for_update(self) -> str:
        return " FOR UPDATE" if self.vendor == "postgresql" else ""

    def _param_dt(self, ms: int) -> Any:
        """A datetime parameter as the ORM would store it (SQLite keeps text)."""
        return connections[self.using].ops.adapt_datetimefield_value(_dt(ms))

    def _sql(self, query: str, params: Sequence[Any], *, fetch: bool = True) -> list[Any]:
        self._drop_broken_connection()
        with connections[self.using].cursor() as cursor:
            cursor.execute(query, params)
            return [list(r) for r in cursor.fetchall()] if fetch else []

    def _signal(self, message: str) -> None:
        """Wake waiters once this transaction commits: NOTIFY for other processes (PostgreSQL),
        the condition for this one."""
        if self.vendor == "postgresql":
            with connections[self.using].cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, message])
        transaction.on_commit(self._wake_local, using=self.using)

    def _wake_local(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def _snapshot(self) -> int:
        """The generation to hand to ``_wait`` afterwards; take it before reading the database.
        It also starts the cross-process listener, so that no commit after it is missed."""
        self._ensure_listener()
        with self._cond:
            return self._generation

    def _wait(self, timeout: float, since: int, worker_id: str | None = None) -> None:
        """Sleep until a signal newer than generation ``since`` (PostgreSQL: from any process;
        SQLite: from this process), an interrupt of ``worker_id``, or ``timeout``.

        Waits are capped at ``RECHECK`` seconds as a safety net for signals lost while a
        listener was reconnecting; an in-memory SQLite database (no watcher possible) re-reads
        every ``poll_interval``."""
        cap = RECHECK if self._listener is not None else self.poll_interval
        deadline = time.monotonic() + min(timeout, cap)
        with self._cond:
            while self._generation == since:
                if worker_id is not None and worker_id in self._interrupted:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if worker_id is not None:
                self._interrupted.discard(worker_id)

    def _ensure_listener(self) -> None:
        if self._listener is None:
            with self._cond:
                if self._listener is None:
                    if self.vendor == "postgresql":
                        self._listener = _PgListener(self.using, self._wake_local)
                    else:
                        path = connections[self.using].settings_dict["NAME"]
                        if not path or str(path) == ":memory:" or "mode=memory" in str(path):
                            return  # nothing another process could commit to
                        self._listener = _SqliteWatcher(
                            str(path), self._wake_local, self.poll_interval
                        )
                    self._listener.start()
        self._listener.ready.wait(5)

    def _finish_fields(self, row: Any, state: JobState, now: int) -> dict[str, Any]:
        return {
            "state": state,
            "finished_at": _dt(now),
            "expires_at": _dt(now + row["result_ttl"]),
            "lease_deadline": None,
            "waiters": 0,
        }

    def _remember_waiter(self, queue: str, job_id: str, pk: int) -> None:
        with self._waited_lock:
            self._waited[(queue, job_id)] = pk
            self._waited.move_to_end((queue, job_id))
            while len(self._waited) > WAITED_MEMO:
                self._waited.popitem(last=False)

    def _locked_row(self, queue: str, job_id: str) -> Any:
        """The row stored under ``job_id`` (a reserved name too), locked on PostgreSQL."""
        qs = self._jobs().filter(queue=queue, job_id=job_id)
        if self.vendor == "postgresql":
            qs = qs.select_for_update()
        return qs.order_by().first()

    # -- producer ---------------------------------------------------------------------------

    def enqueue(self, queue: str, job: NewJob) -> StoredEnqueue:
        with self._atomic():
            self._write_lock()
            now = self._now()  # after the lock: no earlier than the commit we waited for
            return self._enqueue_one(queue, job, now)

    def enqueue_many(self, queue: str, jobs: Sequence[NewJob]) -> list[StoredEnqueue]:
        """All of ``jobs`` in one transaction per chunk: one commit instead of one per job."""
        out: list[StoredEnqueue] = []
        for chunk in _chunks(jobs, BULK_CHUNK):
            out += self._enqueue_chunk(queue, chunk)
        return out

    def _enqueue_one(self, queue: str, job: NewJob, now: int) -> StoredEnqueue:
        """The rules of ``Storage.enqueue``, inside the caller's transaction."""
        if job.dedup is None:
            # The common case first: a new id is one INSERT … ON CONFLICT DO NOTHING (the
            # unique (queue, job_id) index decides races, also between processes).
            created = self._create(queue, job, now)
            if created is not None:
                return created
        for _ in range(2):  # a second round only after a concurrent insert of the same id
            existing = self._existing(queue, job.job_id, now)
            if existing is not None:
                return self._on_existing(queue, existing, job, now)
            if job.dedup is not None:
                held = self._dedup_holder(queue, job, now)
                if held is not None:
                    return held
            created = self._create(queue, job, now)
            if created is not None:
                return created
        raise StorageError(f"job {job.job_id} neither inserted nor found")

    def _enqueue_chunk(self, queue: str, jobs: Sequence[NewJob]) -> list[StoredEnqueue]:
        with self._atomic():
            self._write_lock()
            now = self._now()  # after the lock: no earlier than the commit we waited for
            if any(
                job.dedup is not None
                or job.singleton
                or (job.update is not None and job.update.any)
                for job in jobs
            ):  # rules that depend on what each earlier job of the chunk did: one by one
                return [self._enqueue_one(queue, job, now) for job in jobs]
            ids = list(dict.fromkeys(job.job_id for job in jobs))
            qs = self._jobs().filter(queue=queue, job_id__in=ids)
            if self.vendor == "postgresql":
                qs = qs.select_for_update()
            existing = {row.job_id: row for row in qs}
            expired = [r.pk for r in existing.values() if r.expires_at and _ms(r.expires_at) <= now]
            if expired:  # their TTL passed: the ids are free again
                self._jobs().filter(pk__in=expired).delete()
                existing = {k: r for k, r in existing.items() if r.pk not in expired}
            fresh: dict[str, NewJob] = {}
            for job in jobs:
                if job.job_id not in existing and job.job_id not in fresh:
                    fresh[job.job_id] = job
            rows = [self._new_row(queue, job, now) for job in fresh.values()]
            try:
                with transaction.atomic(using=self.using):  # a concurrent insert of an id
                    self._jobs().bulk_create(rows)
            except IntegrityError:  # ... sends this chunk down the one-by-one path
                return [self._enqueue_one(queue, job, now) for job in jobs]
            lifo = [r.pk for r in rows if r.lifo]
            if lifo:
                self._jobs().filter(pk__in=lifo).update(order_key=-F("id"))
            for kind in (JobState.QUEUED, JobState.SCHEDULED):
                of_kind = [(r.pk, queue, r.job_id) for r in rows if r.state == kind]
                self._events(of_kind, kind.value, now)
            if any(r.state == JobState.QUEUED for r in rows):
                self._signal(f"w {queue}")
            created = {r.job_id: r for r in rows}
            out = []
            for job in jobs:
                row = created.pop(job.job_id, None)
                if row is not None:
                    if job.waiter:
                        self._remember_waiter(queue, job.job_id, row.pk)
                    out.append(
                        StoredEnqueue(EnqueueOutcome.QUEUED, job.job_id, JobState(row.state))
                    )
                    continue
                prior = existing.get(job.job_id)
                if prior is None:  # a repeat, within this batch, of an id created above
                    prior = next(r for r in rows if r.job_id == job.job_id)
                out.append(self._duplicate(queue, prior, job))
            return out

    @staticmethod
    def _due(job: NewJob, now: int) -> int:
        due = max(job.run_at or 0, now + job.delay)
        if job.dedup is not None and job.dedup.mode is DedupMode.DEBOUNCE:
            due = max(due, now + (job.dedup.ttl or 0))
        return due

    def _new_row(self, queue: str, job: NewJob, now: int) -> Any:
        o = job.options
        due = self._due(job, now)
        state = JobState.SCHEDULED if due > now else JobState.QUEUED
        return self.Job(
            queue=queue, job_id=job.job_id, handler=handler_name(queue), state=state,
            payload=job.payload, content_type=job.content_type, max_attempts=o.max_attempts,
            max_stalls=o.max_stalls, priority=o.priority, min_backoff=o.min_backoff,
            max_backoff=o.max_backoff, result_ttl=o.result_ttl,
            run_at=_dt(due) if state is JobState.SCHEDULED else None,
            created_at=_dt(now), waiters=1 if job.waiter else 0, lifo=job.lifo,
            group=job.group or "", dedup_key="", order_key=0,
        )  # fmt: skip

    def _existing(self, queue: str, job_id: str, now: int) -> Any:
        row = self._locked_row(queue, job_id)
        if row is not None and row.expires_at is not None and _ms(row.expires_at) <= now:
            row.delete()  # its TTL passed: the id is free again
            return None
        return row

    def _insert(
        self, queue: str, job: NewJob, now: int, *, successor: bool = False
    ) -> tuple[int, JobState] | None:
        """Insert the job unless its id exists; None when it does. Raw SQL: enqueue is a hot
        path and this is one statement where the ORM needed a read and a savepoint.

        A ``successor`` is stored blocked under its reserved name, with its own due time
        (None when already due) applied once it is released."""
        o = job.options
        due = self._due(job, now)
        if successor:
            state, run_at = JobState.BLOCKED, due if due > now else None
        else:
            state = JobState.SCHEDULED if due > now else JobState.QUEUED
            run_at = due if state is JobState.SCHEDULED else None
        rows = self._sql(
            f"INSERT INTO {self._table} (queue, job_id, handler, state, payload, content_type, "
            "attempts, max_attempts, stalls, max_stalls, priority, min_backoff, max_backoff, "
            "result_ttl, run_at, created_at, worker, token, waiters, lifo, job_group, dedup_key, "
            "order_key, has_successor) VALUES (%s, %s, %s, %s, %s, %s, 0, %s, 0, %s, %s, %s, %s, "
            "%s, %s, %s, '', 0, %s, %s, %s, %s, 0, %s) "
            "ON CONFLICT (queue, job_id) DO NOTHING RETURNING id",
            [
                queue, job.job_id + SUCCESSOR if successor else job.job_id, handler_name(queue),
                state.value, job.payload, job.content_type, o.max_attempts,
                o.max_stalls, o.priority, o.min_backoff, o.max_backoff, o.result_ttl,
                None if run_at is None else self._param_dt(run_at),
                self._param_dt(now), 1 if job.waiter and not successor else 0, job.lifo,
                job.group or "", job.dedup.key if job.dedup and not successor else "", False,
            ],
        )  # fmt: skip
        if not rows:
            return None
        pk = rows[0][0]
        if job.lifo:  # newest LIFO job first: its key is below every earlier one's
            self._sql(f"UPDATE {self._table} SET order_key = -id WHERE id = %s", [pk], fetch=False)
        self._events([(pk, queue, job.job_id)], state.value, now)
        if state is JobState.QUEUED:
            self._signal(f"w {queue}")
        return pk, state

    def _create(self, queue: str, job: NewJob, now: int) -> StoredEnqueue | None:
        inserted = self._insert(queue, job, now)
        if inserted is None:
            return None
        pk, state = inserted
        if job.dedup is not None:
            self._take_key(queue, job, pk, now)
        if job.waiter:
            self._remember_waiter(queue, job.job_id, pk)
        return StoredEnqueue(EnqueueOutcome.QUEUED, job.job_id, state)

    def _on_existing(self, queue: str, row: Any, job: NewJob, now: int) -> StoredEnqueue:
        """Rules 1-4 of ``Storage.enqueue`` for an id that exists (``row``, locked)."""
        state = JobState(row.state)
        update = job.update is not None and job.update.any
        if update and state in UPDATABLE_STATES:
            updated = self._apply_update(queue, row, job, now)
            if updated is not None:
                self._join(queue, row, job)
                return StoredEnqueue(EnqueueOutcome.UPDATED, job.job_id, updated)
        elif state is JobState.ACTIVE and job.singleton:
            return self._singleton(queue, row, job, now)
        return self._duplicate(queue, row, job)

    def _singleton(self, queue: str, row: Any, job: NewJob, now: int) -> StoredEnqueue:
        """Rule 3: the id is active; store ``job`` as its blocked successor or update it."""
        blocked = JobState.BLOCKED
        if not row.has_successor:
            if self._insert(queue, job, now, successor=True) is None:
                raise StorageError(f"job {job.job_id}: a successor row exists unannounced")
            self._jobs().filter(pk=row.pk).update(has_successor=True)
            return StoredEnqueue(EnqueueOutcome.QUEUED, job.job_id, blocked)
        successor = self._locked_row(queue, job.job_id + SUCCESSOR)
        if job.update is not None and job.update.any and successor is not None:
            if self._apply_update(queue, successor, job, now) is not None:
                return StoredEnqueue(EnqueueOutcome.UPDATED, job.job_id, blocked)
        return StoredEnqueue(EnqueueOutcome.DUPLICATE, job.job_id, blocked)

    def _apply_update(self, queue: str, row: Any, job: NewJob, now: int) -> JobState | None:
        """Apply ``job.update`` to a waiting row (or a blocked successor); its new state, or
        None when every field already holds the new value (then nothing is written)."""
        u, o = job.update, job.options
        assert u is not None
        fields: dict[str, Any] = {}
        if u.data and (bytes(row.payload) != job.payload or row.content_type != job.content_type):
            fields.update(payload=job.payload, content_type=job.content_type)
        if u.max_attempts and row.max_attempts != o.max_attempts:
            fields["max_attempts"] = o.max_attempts
        if u.backoff and (row.min_backoff, row.max_backoff) != (o.min_backoff, o.max_backoff):
            fields.update(min_backoff=o.min_backoff, max_backoff=o.max_backoff)
        if u.reset_counts and (row.attempts or row.stalls):
            fields.update(attempts=0, stalls=0)
        state, kind = JobState(row.state), None
        if u.run_at is not RunAtUpdate.NO:
            due = max(job.run_at or 0, now + job.delay)
            queued = state is JobState.QUEUED or row.run_at is None
            if _moves(u.run_at, now if queued else _ms(row.run_at), due):
                state, kind = self._retime(fields, state, due, now)
        if not fields:
            return None
        self._jobs().filter(pk=row.pk).update(**fields)
        self._retimed(queue, row.pk, row.job_id, state, kind, now)
        return state

    @staticmethod
    def _retime(
        fields: dict[str, Any], state: JobState, due: int, now: int
    ) -> tuple[JobState, str | None]:
        """Add to ``fields`` what moves a waiting job (state ``state``) to be due at ``due``;
        its new state and the event to emit (None: none)."""
        if state is JobState.BLOCKED:  # applies when the successor is released
            fields["run_at"] = _dt(due) if due > now else None
            return state, None
        if due <= now:
            if state is JobState.QUEUED:
                return state, None
            fields.update(state=JobState.QUEUED, run_at=None)
            return JobState.QUEUED, "queued"
        fields["run_at"] = _dt(due)
        if state is JobState.RETRYING:  # its backoff moved; it stays a retry
            return state, "retrying"
        fields["state"] = JobState.SCHEDULED
        return JobState.SCHEDULED, "scheduled"

    def _retimed(
        self, queue: str, pk: int, job_id: str, state: JobState, kind: str | None, now: int
    ) -> None:
        if kind is not None:
            self._events([(pk, queue, job_id)], kind, now)
            if state is JobState.QUEUED:
                self._signal(f"w {queue}")

    def _join(self, queue: str, row: Any, job: NewJob) -> None:
        """Register ``job``'s waiter on the row it joined (see ``Storage.enqueue``)."""
        if job.waiter and JobState(row.state) not in TERMINAL_STATES:
            self._jobs().filter(pk=row.pk).update(waiters=F("waiters") + 1)
        if job.waiter:
            self._remember_waiter(queue, job.job_id, row.pk)

    def _duplicate(self, queue: str, row: Any, job: NewJob) -> StoredEnqueue:
        self._join(queue, row, job)
        state = JobState(row.state)
        done = state is JobState.COMPLETED
        outcome = EnqueueOutcome.COMPLETED if done else EnqueueOutcome.DUPLICATE
        return StoredEnqueue(outcome, job.job_id, state, _bytes(row.result), _json_bytes(row.error))

    # -- deduplication keys -------------------------------------------------------------------

    def _dedup_holder(self, queue: str, job: NewJob, now: int) -> StoredEnqueue | None:
        """For a new id with a dedup key: the answer when the key is held (DUPLICATE of the
        holder, or UPDATED for a debounced repeat), None when the key is free.

        The key's row is created if missing and locked first: it serialises the enqueues of
        one key (PostgreSQL: the unique index makes a concurrent creator wait for us)."""
        d = job.dedup
        assert d is not None
        self._sql(
            f"INSERT INTO {self._quoted(self.DedupKey)} (queue, dedup_key, mode) "
            "VALUES (%s, %s, %s) ON CONFLICT (queue, dedup_key) DO NOTHING",
            [queue, d.key, d.mode.value],
            fetch=False,
        )
        keys = self.DedupKey.objects.using(self.using).filter(queue=queue, key=d.key)
        if self.vendor == "postgresql":
            keys = keys.select_for_update()
        key = keys.get()
        holder = self._jobs().filter(pk=key.job_id).first() if key.job_id else None
        if holder is None or (holder.expires_at is not None and _ms(holder.expires_at) <= now):
            return None  # never held, or its holder is gone: free
        state, until = JobState(holder.state), _ms_or_none(key.held_until)
        if key.mode == DedupMode.SIMPLE:
            held = state not in TERMINAL_STATES and (until is None or until > now)
        else:
            held = until is not None and until > now
        if not held:
            return None
        holder_id = _public_id(holder.job_id)
        if key.mode == DedupMode.DEBOUNCE:
            if state not in UPDATABLE_STATES:
                return None  # running or finished: the repeat is a new job and takes the key
            fields: dict[str, Any] = {"payload": job.payload, "content_type": job.content_type}
            due = max(self._due(job, now), now + (d.ttl or 0))
            state, kind = self._retime(fields, state, due, now)
            self._jobs().filter(pk=holder.pk).update(**fields)
            self._retimed(queue, holder.pk, holder.job_id, state, kind, now)
            keys.update(held_until=_dt(now + (d.ttl or 0)))
            self._join(queue, holder, job)
            return StoredEnqueue(EnqueueOutcome.UPDATED, holder_id, state)
        self._join(queue, holder, job)
        return StoredEnqueue(
            EnqueueOutcome.DUPLICATE, holder_id, state, _bytes(holder.result),
            _json_bytes(holder.error),
        )  # fmt: skip

    def _take_key(self, queue: str, job: NewJob, pk: int, now: int) -> None:
        d = job.dedup
        assert d is not None
        until = now + d.ttl if d.ttl else None
        self.DedupKey.objects.using(self.using).filter(queue=queue, key=d.key).update(
            job_id=pk, mode=d.mode.value, held_until=None if until is None else _dt(until)
        )

    # -- worker -----------------------------------------------------------------------------

    def claim(self, queue: str, worker_id: str, count: int, lease_ms: int) -> ClaimBatch:
        # The first claim since the worker's last wait fixes the generation that wait compares
        # with: a job committed after this point wakes it even if this claim missed the job.
        since = self._snapshot()
        with self._cond:
            self._claim_seen.setdefault(worker_id, since)
        now = self._now()
        flow, claimable = self._gate(queue, now)
        held = flow.held(now)
        if held is not None:
            return held
        if not claimable:
            # Nothing to take: answer from a read, without queueing for SQLite's single write
            # lock (idle workers on several queues would otherwise serialise every writer).
            return ClaimBatch(next_due_in=self._next_due_in(queue, now))
        with self._atomic():
            self._write_lock()
            now = self._now()  # after the lock: no earlier than the commit we waited for
            if flow.limited:
                # Re-read under the row lock: limits are counted by one claimer at a time.
                flow = self._flow(queue, lock=True)
                held = flow.held(now)
                if held is not None:
                    return held
                return self._claim_limited(queue, worker_id, count, lease_ms, flow, now)
            self._promote_due(queue, now, 1000)
            rows = self._activate(queue, worker_id, now, lease_ms, limit=count)
            jobs = self._claimed(queue, rows, worker_id, now)
            return ClaimBatch(jobs, self._next_due_in(queue, now))

    def _gate(self, queue: str, now: int) -> tuple[_Flow, bool]:
        """The queue's flow control and whether any job is claimable, in one read."""
        row = self._sql(
            f"SELECT c.paused, c.postponed_until, c.concurrency, c.rate_max, c.rate_window, "
            f"c.group_rate_max, c.group_rate_window, EXISTS (SELECT 1 FROM {self._table} j "
            "WHERE j.queue = %s AND (j.state = 'queued' OR (j.state IN ('scheduled', "
            "'retrying') AND j.run_at <= %s))) FROM (SELECT 1 AS one) d "
            f"LEFT JOIN {self._quoted(self.QueueConfig)} c ON c.name = %s",
            [queue, self._param_dt(now), queue],
        )[0]
        return _Flow.from_row(row), bool(row[7])

    def _flow(self, queue: str, *, lock: bool = False) -> _Flow:
        rows = self._sql(
            f"SELECT {CONFIG_COLUMNS} FROM {self._quoted(self.QueueConfig)} WHERE name = %s"
            + (self._for_update if lock else ""),
            [queue],
        )
        return _Flow.from_row(rows[0] if rows else None)

    def _activate(
        self,
        queue: str,
        worker_id: str,
        now: int,
        lease_ms: int,
        *,
        limit: int | None = None,
        ids: Sequence[int] = (),
    ) -> list[Any]:
        """Move the best ``limit`` queued jobs (or the queued jobs ``ids``) to active in one
        UPDATE … RETURNING (SQLite ≥ 3.35 and PostgreSQL). Raw SQL: this is the worker's hot
        path, and the ORM version needed a select, an update and a re-select."""
        if limit is not None:
            where = (
                f"id IN (SELECT id FROM {self._table} WHERE queue = %s AND state = 'queued' "
                f"{ORDER} LIMIT %s{self._skip_locked})"
            )
            params: list[Any] = [queue, limit]
        else:
            where = f"state = 'queued' AND id IN ({', '.join(['%s'] * len(ids))})"
            params = list(ids)
        # The token is max(token + 1, token_base()): a row deleted and created again (expiry,
        # retention, obliterate) must not hand out a token of its previous life.
        base = token_base()
        return self._sql(
            f"UPDATE {self._table} SET state = 'active', worker = %s, "
            "token = CASE WHEN token >= %s THEN token + 1 ELSE %s END, "
            f"attempts = attempts + 1, started_at = %s, lease_deadline = %s WHERE {where} "
            + RETURNING,
            [worker_id, base, base, self._param_dt(now), self._param_dt(now + lease_ms), *params],
        )

    def _claimed(self, queue: str, rows: list[Any], worker_id: str, now: int) -> list[ClaimedJob]:
        rows.sort(key=lambda r: (r[9], r[10], r[0]))  # RETURNING has no order: claim order
        self._events([(r[0], queue, r[1]) for r in rows], "active", now, worker_id)
        return [
            ClaimedJob(queue, r[1], bytes(r[2]), r[3], r[4], r[5], r[6], r[7], r[8]) for r in rows
        ]

    def _claim_limited(
        self, queue: str, worker_id: str, count: int, lease_ms: int, flow: _Flow, now: int
    ) -> ClaimBatch:
        """A claim under ``QueueLimits`` (the caller holds the queue's config row lock)."""
        self._promote_due(queue, now, 1000)
        allowed = count
        if flow.concurrency is not None:
            active = self._sql(
                f"SELECT COUNT(*) FROM {self._table} WHERE queue = %s AND state = 'active'",
                [queue],
            )[0][0]
            allowed = min(allowed, flow.concurrency - active)
            if allowed <= 0:
                return ClaimBatch()  # the verdict that frees a slot wakes a worker
        log = self._quoted(self.ClaimLog)
        starts: list[int] = []  # claims in the queue's window, oldest first
        if flow.rate:
            assert flow.rate_max is not None and flow.rate_window is not None
            starts = [
                r[0]
                for r in self._sql(
                    f"SELECT at FROM {log} WHERE queue = %s AND at > %s ORDER BY at",
                    [queue, now - flow.rate_window],
                )
            ]
            allowed = min(allowed, flow.rate_max - len(starts))
            if allowed <= 0:
                return ClaimBatch(next_due_in=self._rate_wait(queue, starts, flow, now))
        if flow.group_rate:
            rows = self._claim_by_group(queue, worker_id, allowed, lease_ms, flow, now)
        else:
            rows = self._activate(queue, worker_id, now, lease_ms, limit=allowed)
        if rows and (flow.rate or flow.group_rate):
            windows = [w for w in (flow.rate_window, flow.group_rate_window) if w]
            self._sql(
                f"DELETE FROM {log} WHERE queue = %s AND at <= %s",
                [queue, now - max(windows)],
                fetch=False,
            )
            values = ", ".join(["(%s, %s, %s)"] * len(rows))
            params = [v for r in rows for v in (queue, r[11] or "", now)]
            self._sql(
                f"INSERT INTO {log} (queue, job_group, at) VALUES {values}", params, fetch=False
            )
        batch = ClaimBatch(self._claimed(queue, rows, worker_id, now))
        starts += [now] * len(rows)
        if flow.rate and len(starts) >= (flow.rate_max or 0):
            batch.next_due_in = self._rate_wait(queue, starts, flow, now)
        else:
            batch.next_due_in = self._next_due_in(queue, now)
        return batch

    def _rate_wait(self, queue: str, starts: list[int], flow: _Flow, now: int) -> int | None:
        """Ms until the queue's rate budget allows one more claim, when it has work for it."""
        assert flow.rate_max is not None and flow.rate_window is not None
        free_in = max(starts[len(starts) - flow.rate_max] + flow.rate_window - now, 0)
        if self._sql(
            f"SELECT 1 FROM {self._table} WHERE queue = %s AND state = 'queued' LIMIT 1", [queue]
        ):
            return free_in
        due = self._next_due_in(queue, now)
        return None if due is None else max(due, free_in)

    def _claim_by_group(
        self, queue: str, worker_id: str, allowed: int, lease_ms: int, flow: _Flow, now: int
    ) -> list[Any]:
        """Claim in order, skipping candidates whose group spent its budget: those move to
        scheduled, due when their group's window frees, and keep their order key."""
        assert flow.group_rate_max is not None and flow.group_rate_window is not None
        candidates = self._sql(
            f"SELECT id, job_id, job_group FROM {self._table} WHERE queue = %s "
            f"AND state = 'queued' {ORDER} LIMIT %s{self._skip_locked}",
            [queue, allowed + GROUP_SCAN],
        )
        starts: dict[str, list[int]] = {g: [] for _, _, g in candidates if g}
        if starts:
            groups = list(starts)
            for group, at in self._sql(
                f"SELECT job_group, at FROM {self._quoted(self.ClaimLog)} WHERE queue = %s "
                f"AND at > %s AND job_group IN ({', '.join(['%s'] * len(groups))}) ORDER BY at",
                [queue, now - flow.group_rate_window, *groups],
            ):
                starts[group].append(at)
        take: list[int] = []
        defer: dict[int, list[tuple[int, str, str]]] = {}  # due -> (pk, queue, job_id)
        for pk, job_id, group in candidates:
            if len(take) >= allowed:
                break
            if group:
                window = starts[group]
                if len(window) >= flow.group_rate_max:
                    due = window[len(window) - flow.group_rate_max] + flow.group_rate_window
                    defer.setdefault(due, []).append((pk, queue, job_id))
                    continue
                window.append(now)
            take.append(pk)
        for due, items in defer.items():
            self._jobs().filter(pk__in=[pk for pk, _, _ in items]).update(
                state=JobState.SCHEDULED, run_at=_dt(due)
            )
            self._events(items, "scheduled", now)
        return self._activate(queue, worker_id, now, lease_ms, ids=take) if take else []

    def _next_due_in(self, queue: str, now: int) -> int | None:
        due = (
            self._jobs().filter(queue=queue, state__in=SCHEDULED_STATES)
            .order_by("run_at").values_list("run_at", flat=True).first()
        )  # fmt: skip
        return None if due is None else max(_ms(due) - now, 0)

    def _promote_due(self, queue: str, now: int, limit: int) -> int:
        rows = self._sql(
            f"UPDATE {self._table} SET state = 'queued' WHERE id IN (SELECT id FROM "
            f"{self._table} WHERE queue = %s AND state IN ('scheduled', 'retrying') "
            f"AND run_at <= %s ORDER BY run_at LIMIT %s{self._skip_locked}) RETURNING id, job_id",
            [queue, self._param_dt(now), limit],
        )
        if rows:
            self._events([(r[0], queue, r[1]) for r in rows], "queued", now)
            self._signal(f"w {queue}")
        return len(rows)

    def wait_for_jobs(
        self, queues: Sequence[str], timeout: float, worker_id: str | None = None
    ) -> None:
        with self._cond:
            since = self._claim_seen.pop(worker_id or "", None)
        if since is None:
            since = self._snapshot()
        self._wait(timeout, since, worker_id)

    def interrupt_wait(self, queues: Sequence[str], worker_id: str) -> None:
        with self._cond:
            self._interrupted.add(worker_id)
            self._cond.notify_all()

    def heartbeat(
        self, queue: str, worker_id: str, leases: Sequence[tuple[str, int]], lease_ms: int
    ) -> list[tuple[str, int]]:
        if not leases:
            return []
        deadline = _dt(self._now() + lease_ms)
        lost = []
        with self._atomic():
            self._write_lock()
            for job_id, token in leases:
                n = self._jobs().filter(
                    queue=queue, job_id=job_id, state=JobState.ACTIVE, token=token,
                    worker=worker_id,
                ).update(lease_deadline=deadline)  # fmt: skip
                if n == 0:
                    lost.append((job_id, token))
        return lost

    def _take_lease(self, queue: str, job_id: str, token: int, **fields: Any) -> Any:
        """The guarded write that checks the lease and locks the row; None when lost. The row
        read back carries the queue's concurrency cap (``cap``): a verdict that frees a slot
        of a capped queue must wake a worker."""
        owned = self._jobs().filter(queue=queue, job_id=job_id, state=JobState.ACTIVE, token=token)
        if owned.update(lease_deadline=None, **fields) == 0:
            return None
        cap = self._configs().filter(name=OuterRef("queue")).values("concurrency")[:1]
        return (
            self._jobs().filter(queue=queue, job_id=job_id).annotate(cap=Subquery(cap))
            .values("id", "attempts", "max_attempts", "result_ttl", "waiters", "worker",
                    "has_successor", "cap").get()
        )  # fmt: skip

    def complete(self, queue: str, job_id: str, token: int, result: bytes) -> AckOutcome:
        now = self._now()
        with self._atomic():
            row = self._take_lease(queue, job_id, token, result=result)
            if row is None:
                return AckOutcome.LEASE_LOST
            self._jobs().filter(pk=row["id"]).update(
                **self._finish_fields(row, JobState.COMPLETED, now)
            )
            self._finished(row, queue, job_id, "completed", now)
            return AckOutcome.COMPLETED

    def _finished(self, row: Any, queue: str, job_id: str, kind: str, now: int) -> None:
        """After a row reached a final state: its event, its waiters, a freed slot, and its
        successor's release (in this same transaction)."""
        if kind == "failed":  # before a successor renames the row
            self._record_failure_call(queue, job_id, row["id"], now)
        self._events([(row["id"], queue, job_id)], kind, now, row.get("worker", ""))
        if row["waiters"]:
            self._signal(f"d {queue} {job_id}")
        if row.get("cap") is not None:
            self._signal(f"w {queue}")
        if row.get("has_successor"):
            self._release_successor(queue, job_id, row["id"], now)

    def fail(
        self,
        queue: str,
        job_id: str,
        token: int,
        error: bytes,
        *,
        retry_in: int | None = None,
        permanent: bool = False,
        final: JobState = JobState.FAILED,
    ) -> AckOutcome:
        """``final`` CANCELLED is ``cancel_active``: the same ending, in another state."""
        now = self._now()
        with self._atomic():
            row = self._take_lease(queue, job_id, token, error=_storable_json(error, self.vendor))
            if row is None:
                return AckOutcome.LEASE_LOST
            if permanent or row["attempts"] >= row["max_attempts"]:
                fields = self._finish_fields(row, final, now)
                self._jobs().filter(pk=row["id"]).update(**fields)
                self._finished(row, queue, job_id, final.value, now)
                return AckOutcome(final.value)
            due = now + max(retry_in or 0, 0)
            self._jobs().filter(pk=row["id"]).update(state=JobState.RETRYING, run_at=_dt(due))
            self._events([(row["id"], queue, job_id)], "retrying", now, row["worker"])
            self._signal(f"w {queue}")
            return AckOutcome.RETRYING

    def ack_many(self, queue: str, acks: Sequence[Ack]) -> list[AckOutcome]:
        """One transaction for the batch (each verdict is still lease-checked on its own): a
        worker's completions cost one commit per batch, not one per job."""
        with self._atomic():
            self._write_lock()
            completes = [a for a in acks if a.kind == "complete"]
            done = self._complete_many(queue, completes) if completes else {}
            out = []
            for ack in acks:
                if ack.kind == "complete":
                    out.append(done[(ack.job_id, ack.token)])
                else:
                    out.extend(super().ack_many(queue, [ack]))
            return out

    def _complete_many(self, queue: str, acks: Sequence[Ack]) -> dict[tuple[str, int], AckOutcome]:
        """Set-based ``complete`` for a batch: one locked read, one bulk update, one insert of
        events. Each job is still checked against its own lease token."""
        now = self._now()
        qs = self._jobs().filter(queue=queue, job_id__in=[a.job_id for a in acks])
        if self.vendor == "postgresql":
            qs = qs.select_for_update()
        rows = {r.job_id: r for r in qs.only("id", "job_id", "state", "token", "result_ttl",
                                              "waiters", "worker", "has_successor")}  # fmt: skip
        out: dict[tuple[str, int], AckOutcome] = {}
        changed, waited = [], []
        for ack in acks:
            row = rows.get(ack.job_id)
            if row is None or row.state != JobState.ACTIVE or row.token != ack.token:
                out[(ack.job_id, ack.token)] = AckOutcome.LEASE_LOST
                continue
            row.state, row.result = JobState.COMPLETED, ack.body
            row.finished_at, row.expires_at = _dt(now), _dt(now + row.result_ttl)
            row.lease_deadline = None
            if row.waiters:
                waited.append(row.job_id)
            row.waiters = 0
            changed.append(row)
            out[(ack.job_id, ack.token)] = AckOutcome.COMPLETED
        if changed:
            by_ttl: dict[int, list[int]] = {}
            for row in changed:
                by_ttl.setdefault(row.result_ttl, []).append(row.pk)
            for ttl, pks in by_ttl.items():
                self._jobs().filter(pk__in=pks).update(
                    state=JobState.COMPLETED, finished_at=_dt(now), expires_at=_dt(now + ttl),
                    lease_deadline=None, waiters=0,
                )  # fmt: skip
            # Results differ per job: one statement, executed many times (pipelined by the
            # driver), is far cheaper than the ORM's CASE-per-row bulk_update.
            with connections[self.using].cursor() as cursor:
                cursor.executemany(
                    f"UPDATE {self._table} SET result = %s WHERE id = %s",
                    [(row.result, row.pk) for row in changed],
                )
            by_worker: dict[str, list[tuple[int, str, str]]] = {}
            for row in changed:
                by_worker.setdefault(row.worker, []).append((row.pk, queue, row.job_id))
            for worker, items in by_worker.items():
                self._events(items, "completed", now, worker)
            for job_id in waited:
                self._signal(f"d {queue} {job_id}")
            if self._configs().filter(name=queue, concurrency__isnull=False).exists():
                self._signal(f"w {queue}")  # slots were freed
            for row in changed:
                if row.has_successor:
                    self._release_successor(queue, row.job_id, row.pk, now)
        return out

    def report(
        self,
        queue: str,
        job_id: str,
        token: int,
        *,
        progress: bytes | None = None,
        log: str | None = None,
    ) -> bool:
        with self._atomic():
            self._write_lock()
            now = self._now()
            owned = self._jobs().filter(
                queue=queue, job_id=job_id, state=JobState.ACTIVE, token=token
            )
            if self.vendor == "postgresql":
                owned = owned.select_for_update()
            row = owned.values("id", "logs", "worker").first()
            if row is None:
                return False
            fields: dict[str, Any] = {}
            if progress is not None:
                fields["progress"] = _storable_json(progress, self.vendor)
            if log is not None:
                fields["logs"] = [*(row["logs"] or []), [now, log]][-LOG_LINES:]
            self._jobs().filter(pk=row["id"]).update(**fields)
            target = [(row["id"], queue, job_id)]
            if progress is not None:
                self._events(target, "progress", now, row["worker"])
            if log is not None:
                self._events(target, "log", now, row["worker"])
            return True

    def request_cancel(self, queue: str, job_id: str, *, force: bool = False) -> CancelOutcome:
        with self._atomic():
            self._write_lock()
            row = self._existing(queue, job_id, self._now())
            if row is None or row.state != JobState.ACTIVE or row.has_successor:
                return self.cancel(queue, job_id)  # in this transaction: no job slips between
            self._jobs().filter(pk=row.pk).update(cancel_requested="force" if force else "stop")
            return CancelOutcome.REQUESTED

    def cancel_requests(
        self, queue: str, leases: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], bool]:
        wanted = dict(leases)
        rows = (
            self._jobs()
            .filter(queue=queue, job_id__in=list(wanted), state=JobState.ACTIVE)
            .exclude(cancel_requested="")
            .values_list("job_id", "token", "cancel_requested")
        )
        return {(j, t): mark == "force" for j, t, mark in rows if wanted.get(j) == t}

    def cancel_active(self, queue: str, job_id: str, token: int, error: bytes) -> AckOutcome:
        return self.fail(queue, job_id, token, error, permanent=True, final=JobState.CANCELLED)

    def release(self, queue: str, job_id: str, token: int) -> AckOutcome:
        now = self._now()
        with self._atomic():
            row = self._take_lease(
                queue, job_id, token, state=JobState.QUEUED, attempts=F("attempts") - 1
            )
            if row is None:
                return AckOutcome.LEASE_LOST
            self._events([(row["id"], queue, job_id)], "released", now, row["worker"])
            self._signal(f"w {queue}")
            return AckOutcome.RELEASED

    def postpone(
        self, queue: str, job_id: str, token: int, delay_ms: int, *, queue_wide: bool = False
    ) -> AckOutcome:
        now = self._now()
        with self._atomic():
            due = now + max(delay_ms, 0)
            row = self._take_lease(
                queue, job_id, token, state=JobState.SCHEDULED, run_at=_dt(due),
                attempts=F("attempts") - 1,
            )  # fmt: skip
            if row is None:
                return AckOutcome.LEASE_LOST
            self._events([(row["id"], queue, job_id)], "postponed", now, row["worker"])
            if queue_wide:  # the latest deadline wins: a shorter one never cuts a longer one
                self._configs().get_or_create(name=queue)
                self._configs().filter(
                    Q(postponed_until__isnull=True) | Q(postponed_until__lt=_dt(due)), name=queue
                ).update(postponed_until=_dt(due))
            if row["cap"] is not None:
                self._signal(f"w {queue}")
            return AckOutcome.POSTPONED

    # -- singleton successors -------------------------------------------------------------------

    def _release_successor(self, queue: str, job_id: str, finished_pk: int, now: int) -> None:
        """The run ``finished_pk`` of ``job_id`` reached a final state: it keeps its row under
        a reserved name (its waiters read it by primary key) and the blocked successor takes
        the id, fresh (attempts and stalls 0, created now), in the successor's own order."""
        token = self._jobs().filter(pk=finished_pk).values_list("token", flat=True).get()
        self._jobs().filter(pk=finished_pk).update(
            job_id=f"{job_id}{MARK}{finished_pk}", has_successor=False
        )
        successor = self._locked_row(queue, job_id + SUCCESSOR)
        if successor is None:
            return
        due = _ms(successor.run_at) if successor.run_at is not None else now
        state = JobState.SCHEDULED if due > now else JobState.QUEUED
        # The token continues the finished run's: a verdict of that run is refused here.
        self._jobs().filter(pk=successor.pk).update(
            job_id=job_id, state=state, run_at=_dt(due) if due > now else None,
            created_at=_dt(now), attempts=0, stalls=0, token=token,
        )  # fmt: skip
        self._events([(successor.pk, queue, job_id)], state.value, now)
        if state is JobState.QUEUED:
            self._signal(f"w {queue}")

    def _cancel_successor(self, queue: str, job_id: str, parent_pk: int, now: int) -> int:
        """Cancel the blocked successor of ``job_id`` (its record is kept under a reserved
        name until its TTL); returns how many were cancelled (0 or 1)."""
        self._jobs().filter(pk=parent_pk).update(has_successor=False)
        successor = self._locked_row(queue, job_id + SUCCESSOR)
        if successor is None:
            return 0
        row = {"id": successor.pk, "result_ttl": successor.result_ttl, "waiters": 0}
        self._jobs().filter(pk=successor.pk).update(
            job_id=f"{job_id}{MARK}{successor.pk}",
            **self._finish_fields(row, JobState.CANCELLED, now),
        )
        self._events([(successor.pk, queue, job_id)], "cancelled", now)
        return 1

    # -- management -------------------------------------------------------------------------

    def cancel(self, queue: str, job_id: str) -> CancelOutcome:
        with self._atomic():
            self._write_lock()
            now = self._now()  # after the lock: no earlier than the commit we waited for
            existing = self._existing(queue, job_id, now)
            if existing is None:
                return CancelOutcome.NOT_FOUND
            if existing.has_successor:  # the successor is what waits: the run goes on
                self._cancel_successor(queue, job_id, existing.pk, now)
                return CancelOutcome.CANCELLED
            state = JobState(existing.state)
            if state is JobState.ACTIVE:
                return CancelOutcome.ACTIVE
            if state in TERMINAL_STATES:
                return CancelOutcome(state.value)
            row = {"id": existing.pk, "result_ttl": existing.result_ttl,
                   "waiters": existing.waiters, "worker": ""}  # fmt: skip
            self._jobs().filter(pk=existing.pk, state__in=WAITING_STATES).update(
                **self._finish_fields(row, JobState.CANCELLED, now)
            )
            self._finished(row, queue, job_id, "cancelled", now)
            return CancelOutcome.CANCELLED

    def change(
        self, queue: str, job_id: str, *, run_at: int | None = None, priority: int | None = None
    ) -> ChangeOutcome:
        with self._atomic():
            self._write_lock()
            now = self._now()
            row = self._existing(queue, job_id, now)
            if row is None:
                return ChangeOutcome.NOT_FOUND
            state = JobState(row.state)
            if state not in UPDATABLE_STATES:
                successor = row.has_successor and self._locked_row(queue, job_id + SUCCESSOR)
                if not successor:
                    return ChangeOutcome(state.value)  # active, or a final state
                row, state = successor, JobState.BLOCKED
            fields: dict[str, Any] = {}
            kind = None
            if run_at is not None:
                state, kind = self._retime(fields, state, run_at, now)
            if priority is not None:
                fields["priority"] = priority  # the order key stays: FIFO/LIFO place kept
            if fields:
                self._jobs().filter(pk=row.pk).update(**fields)
            self._retimed(queue, row.pk, job_id, state, kind, now)
            return ChangeOutcome.CHANGED

    def retry(self, queue: str, job_id: str) -> RetryOutcome:
        with self._atomic():
            self._write_lock()
            now = self._now()
            row = self._existing(queue, job_id, now)
            if row is None:
                return RetryOutcome.NOT_FOUND
            state = JobState(row.state)
            if state in (JobState.ACTIVE, JobState.COMPLETED):
                return RetryOutcome(state.value)
            if state not in (JobState.FAILED, JobState.CANCELLED):
                return RetryOutcome.WAITING
            # Its place in line (priority, order key, id) is in the row: it is kept.
            self._jobs().filter(pk=row.pk).update(
                state=JobState.QUEUED, attempts=0, stalls=0, error=None, result=None, progress=None,
                cancel_requested="",
                finished_at=None, expires_at=None, run_at=None, lease_deadline=None,
            )  # fmt: skip
            # A simple-mode key was free once the job ended; the retried job does not retake it.
            self.DedupKey.objects.using(self.using).filter(
                queue=queue, job_id=row.pk, mode=DedupMode.SIMPLE
            ).update(job_id=None)
            self._events([(row.pk, queue, job_id)], "retried", now)
            self._signal(f"w {queue}")
            return RetryOutcome.RETRIED

    def _dead(self, queue: str, now: int) -> Any:
        return self._records(self._jobs().filter(queue=queue, state=JobState.FAILED), now)

    def dead_letters(self, queue: str, offset: int = 0, limit: int = 100) -> list[JobRecord]:
        now = self._now()
        ids = (
            self._dead(queue, now)
            .order_by("-finished_at", "-id")
            .values_list("job_id", flat=True)[offset : offset + limit]
        )
        records = (self.get_record(queue, job_id) for job_id in ids)
        return [r for r in records if r is not None and r.state is JobState.FAILED]

    def parked(self, queue: str, limit: int = 200) -> list[str]:
        rows = self._jobs().filter(
            queue=queue, state=JobState.SCHEDULED, run_at__gte=_dt(PARKED_FLOOR)
        )
        return list(rows.order_by("run_at", "id").values_list("job_id", flat=True)[:limit])

    def count_dead(self, queue: str) -> int:
        return self._dead(queue, self._now()).count()

    def purge_dead(self, queue: str, job_ids: Sequence[str] | None = None) -> int:
        with self._atomic():
            self._write_lock()
            rows = self._dead(queue, self._now())
            if job_ids is not None:
                rows = rows.filter(job_id__in=list(job_ids))
            pks = list(rows.values_list("id", flat=True))
            for chunk in _chunks(pks):
                self._delete_rows(chunk)
            return len(pks)

    def delete_finished(self, queue: str, job_ids: Sequence[str]) -> int:
        with self._atomic():
            self._write_lock()
            rows = self._records(
                self._jobs().filter(
                    queue=queue, job_id__in=list(job_ids), state__in=list(TERMINAL_STATES)
                ),
                self._now(),
            )
            pks = list(rows.values_list("id", flat=True))
            for chunk in _chunks(pks):
                self._delete_rows(chunk)
            return len(pks)

    def get_record(self, queue: str, job_id: str) -> JobRecord | None:
        row = self._jobs().filter(queue=queue, job_id=job_id).order_by().first()
        if row is None or (row.expires_at is not None and _ms(row.expires_at) <= self._now()):
            return None
        return JobRecord(
            queue=queue,
            job_id=job_id,
            state=JobState(row.state),
            attempts=row.attempts,
            max_attempts=row.max_attempts,
            stalls=row.stalls,
            max_stalls=row.max_stalls,
            priority=row.priority,
            created_at=_ms(row.created_at),
            run_at=_ms_or_none(row.run_at),
            started_at=_ms_or_none(row.started_at),
            finished_at=_ms_or_none(row.finished_at),
            worker=row.worker or None,
            result_ttl=row.result_ttl,
            content_type=row.content_type,
            payload=_bytes(row.payload),
            result=_bytes(row.result),
            error=_json_bytes(row.error),
            expires_at=_ms_or_none(row.expires_at),
            lifo=row.lifo,
            group=row.group or None,
            dedup_key=row.dedup_key or None,
            min_backoff=row.min_backoff,
            max_backoff=row.max_backoff,
            has_successor=row.has_successor,
            progress=None if row.progress is None else _json_bytes(row.progress),
            logs=tuple((int(at), str(line)) for at, line in row.logs or ()),
        )

    def wait_for_outcome(self, queue: str, job_id: str, timeout: float) -> FinalOutcome | None:
        """Waits on the row the caller's enqueue joined (or, failing that, the row under
        ``job_id`` when the wait starts), by primary key: a singleton successor that takes
        over the id afterwards is another run, with an outcome of its own."""
        with self._waited_lock:
            pk = self._waited.pop((queue, job_id), None)
        deadline = time.monotonic() + timeout
        fields = ("id", "state", "result", "error", "expires_at")
        while True:
            since = self._snapshot()
            if pk is None:
                row = self._jobs().filter(queue=queue, job_id=job_id).values(*fields).first()
                pk = row["id"] if row is not None else None
            else:
                row = self._jobs().filter(pk=pk).values(*fields).first()
            live = row is not None and (
                row["expires_at"] is None or _ms(row["expires_at"]) > self._now()
            )
            if live and row["state"] in TERMINAL_STATES:
                return FinalOutcome(
                    JobState(row["state"]), _bytes(row["result"]), _json_bytes(row["error"])
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._wait(remaining, since)

    def reap(self, queue: str, limit: int = 1000) -> ReapReport:
        report = ReapReport()
        with self._atomic():
            self._write_lock()
            now = self._now()
            qs = (
                self._jobs()
                .filter(queue=queue, state=JobState.ACTIVE, lease_deadline__lte=_dt(now))
                .order_by("lease_deadline")
            )
            if self.vendor == "postgresql":
                qs = qs.select_for_update(skip_locked=True)
            for row in qs.values("id", "job_id", "stalls", "max_stalls", "result_ttl",
                                 "waiters", "has_successor")[:limit]:  # fmt: skip
                row["worker"] = ""
                if row["stalls"] + 1 > row["max_stalls"]:
                    fields = self._finish_fields(row, JobState.FAILED, now)
                    self._jobs().filter(pk=row["id"]).update(
                        stalls=F("stalls") + 1, error=STALLED_ERROR, **fields
                    )
                    self._finished(row, queue, row["job_id"], "failed", now)
                    report.failed.append(row["job_id"])
                else:
                    self._jobs().filter(pk=row["id"]).update(
                        state=JobState.QUEUED, stalls=F("stalls") + 1,
                        attempts=F("attempts") - 1, lease_deadline=None,
                    )  # fmt: skip
                    self._events([(row["id"], queue, row["job_id"])], "stalled", now)
                    report.requeued.append(row["job_id"])
            if report.requeued or report.failed:  # work to do, or concurrency slots freed
                self._signal(f"w {queue}")
            report.promoted = self._promote_due(queue, now, limit)
        return report

    def counts(self, queue: str) -> dict[JobState, int]:
        out = dict.fromkeys(
            (JobState.SCHEDULED, JobState.QUEUED, JobState.ACTIVE, JobState.RETRYING,
             JobState.BLOCKED, JobState.COMPLETED, JobState.FAILED), 0
        )  # fmt: skip
        rows = self._jobs().filter(queue=queue).order_by().values("state").annotate(n=Count("id"))
        for row in rows:
            state = JobState(row["state"])
            if state in out:
                out[state] = row["n"]
        return out

    def oldest_queued(self, queue: str) -> int | None:
        """The oldest queued row by creation (index ``jobq_job_q_state_created``)."""
        row = (
            self._jobs().filter(queue=queue, state=JobState.QUEUED).order_by("created_at")
            .values_list("created_at", "run_at").first()
        )  # fmt: skip
        if row is None:
            return None
        return max(_ms(row[0]), _ms_or_none(row[1]) or 0)

    def read_events(
        self, queue: str, after: str = "0", count: int = 1000, block: float | None = None
    ) -> list[Event]:
        floor = int(after.split("-")[0] or 0)
        deadline = time.monotonic() + (block or 0)
        while True:
            since = self._snapshot()
            rows = list(
                self.JobEvent.objects.using(self.using).filter(queue=queue, id__gt=floor)
                .order_by("id").values("id", "job__job_id", "kind", "at", "worker")[:count]
            )  # fmt: skip
            if rows or not block or time.monotonic() >= deadline:
                return [
                    Event(str(r["id"]), queue, _public_id(r["job__job_id"]), r["kind"],
                          _ms(r["at"]), r["worker"] or None)
                    for r in rows
                ]  # fmt: skip
            self._wait(deadline - time.monotonic(), since)

    # -- failure handler calls --------------------------------------------------------------

    def _record_failure_call(self, queue: str, job_id: str, pk: int, now: int) -> None:
        """In the transaction that failed row ``pk`` for good: one statement copies what the
        failure handler needs into a call row, only when the queue's hook is on."""
        at = self._param_dt(now)
        self._sql(
            f"INSERT INTO {self._quoted(self.FailureCallRow)} (queue, job_id, payload,"
            " content_type, error, attempts, failed_at, due_at, tries, worker)"
            " SELECT j.queue, %s, j.payload, j.content_type, j.error, j.attempts, %s, %s, 0, ''"
            f" FROM {self._table} j JOIN {self._quoted(self.QueueConfig)} c"
            " ON c.name = j.queue AND c.failure_hook = %s WHERE j.id = %s",
            [job_id, at, at, True, pk],
            fetch=False,
        )

    def _calls(self):
        self._drop_broken_connection()  # the worker's failure thread holds its connection long
        return self.FailureCallRow.objects.using(self.using)

    def set_failure_hook(self, queue: str, enabled: bool) -> None:
        with self._atomic():
            self._write_lock()
            self._configs().get_or_create(name=queue)
            self._configs().filter(name=queue).update(failure_hook=enabled)

    def failure_hook(self, queue: str) -> bool:
        return self._configs().filter(name=queue, failure_hook=True).exists()

    @staticmethod
    def _failure_call(row: Any) -> FailureCall:
        return FailureCall(
            row.queue, str(row.pk), row.job_id, bytes(row.payload), row.content_type,
            _json_bytes(row.error) or b"", row.attempts, _ms(row.failed_at), _ms(row.due_at),
            row.tries, _json_bytes(row.last_error), row.worker or None,
        )  # fmt: skip

    def claim_failure_calls(
        self, queue: str, worker_id: str, count: int, lease_ms: int
    ) -> list[FailureCall]:
        with self._atomic():
            self._write_lock()
            now = self._now()
            qs = self._calls().filter(queue=queue, due_at__lte=_dt(now)).order_by("due_at", "id")
            if self.vendor == "postgresql":
                qs = qs.select_for_update(skip_locked=True)
            pks = list(qs.values_list("id", flat=True)[:count])
            if not pks:
                return []
            self._calls().filter(pk__in=pks).update(
                due_at=_dt(now + lease_ms), tries=F("tries") + 1, worker=worker_id
            )
            rows = self._calls().filter(pk__in=pks).order_by("due_at", "id")
            return [self._failure_call(row) for row in rows]

    def settle_failure_call(
        self,
        queue: str,
        call: FailureCall,
        *,
        ok: bool,
        retry_in_ms: int = 0,
        error: bytes | None = None,
    ) -> bool:
        held = self._calls().filter(pk=int(call.call_id), queue=queue, tries=call.tries)
        with self._atomic():
            self._write_lock()
            if ok:
                return held.delete()[0] > 0
            due = _dt(self._now() + max(retry_in_ms, 0))
            last_error = _storable_json(error, self.vendor) if error else None
            return held.update(due_at=due, last_error=last_error) > 0

    def count_failure_calls(self, queue: str) -> int:
        return self._calls().filter(queue=queue).count()

    def failure_calls(self, queue: str, offset: int = 0, limit: int = 100) -> list[FailureCall]:
        rows = self._calls().filter(queue=queue).order_by("due_at", "id")[offset : offset + limit]
        return [self._failure_call(row) for row in rows]

    # -- queue control ----------------------------------------------------------------------

    def pause(self, queue: str) -> None:
        with self._atomic():
            self._write_lock()
            self._configs().get_or_create(name=queue)
            self._configs().filter(name=queue).update(paused=True)

    def resume(self, queue: str) -> None:
        with self._atomic():
            self._write_lock()
            if self._configs().filter(name=queue, paused=True).update(paused=False):
                self._signal(f"w {queue}")

    def is_paused(self, queue: str) -> bool:
        return self._configs().filter(name=queue, paused=True).exists()

    def set_limits(self, queue: str, limits: QueueLimits) -> None:
        with self._atomic():
            self._write_lock()
            self._configs().get_or_create(name=queue)
            self._configs().filter(name=queue).update(
                concurrency=limits.concurrency, rate_max=limits.rate_max,
                rate_window=limits.rate_window, group_rate_max=limits.group_rate_max,
                group_rate_window=limits.group_rate_window,
            )  # fmt: skip
            self._signal(f"w {queue}")  # a raised limit may make jobs claimable

    def get_limits(self, queue: str) -> QueueLimits:
        flow = self._flow(queue)
        return QueueLimits(
            rate_max=flow.rate_max, rate_window=flow.rate_window,
            group_rate_max=flow.group_rate_max, group_rate_window=flow.group_rate_window,
            concurrency=flow.concurrency,
        )  # fmt: skip

    def drain(self, queue: str, *, delayed: bool = True) -> int:
        with self._atomic():
            self._write_lock()
            now = self._now()
            cancelled = 0
            if delayed:  # successors first: their runs' own cancellation must not release them
                parents = self._jobs().filter(queue=queue, has_successor=True)
                for pk, job_id in parents.values_list("id", "job_id"):
                    cancelled += self._cancel_successor(queue, job_id, pk, now)
            states = [JobState.QUEUED, *(SCHEDULED_STATES if delayed else ())]
            rows = list(
                self._jobs().filter(queue=queue, state__in=states)
                .values("id", "job_id", "result_ttl", "waiters", "has_successor")
            )  # fmt: skip
            by_ttl: dict[int, list[int]] = {}
            for row in rows:
                by_ttl.setdefault(row["result_ttl"], []).append(row["id"])
            for ttl, pks in by_ttl.items():
                for chunk in _chunks(pks):
                    self._jobs().filter(pk__in=chunk).update(
                        state=JobState.CANCELLED, finished_at=_dt(now), expires_at=_dt(now + ttl),
                        lease_deadline=None, waiters=0,
                    )  # fmt: skip
            self._events([(r["id"], queue, r["job_id"]) for r in rows], "cancelled", now)
            if any(r["waiters"] for r in rows):
                self._signal(f"d {queue}")
            for row in rows:  # a queued run with a successor (drained without ``delayed``)
                if row["has_successor"]:
                    self._release_successor(queue, row["job_id"], row["id"], now)
            return cancelled + len(rows)

    def clean(
        self,
        queue: str,
        older_than_ms: int,
        states: Sequence[JobState] = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED),
        limit: int = 10_000,
    ) -> int:
        final = [JobState(s) for s in states if JobState(s) in TERMINAL_STATES]
        if not final or limit <= 0:
            return 0
        with self._atomic():
            self._write_lock()
            now = self._now()
            cutoff = _dt(now - older_than_ms)
            doomed = self._jobs().filter(queue=queue, state__in=final, finished_at__lte=cutoff)
            rows = list(
                doomed.order_by("finished_at").values_list("id", "job_id", "expires_at")[:limit]
            )
            for chunk in _chunks([pk for pk, _, _ in rows]):
                self._delete_rows(chunk)
            # Rows get_record would not show (expired, or under a reserved name: see
            # _records) go too, but are no record of their own to count.
            return sum(
                1 for _, job_id, expires in rows
                if MARK not in job_id and (expires is None or _ms(expires) > now)
            )  # fmt: skip

    @staticmethod
    def _records(rows: Any, now: int) -> Any:
        """Of ``rows``, the job records ``get_record`` would show: not expired, and not a
        successor or a replaced run under a reserved name (they count as no record of their
        own, as in the other backends)."""
        return rows.exclude(job_id__contains=MARK).exclude(expires_at__lte=_dt(now))

    def _delete_rows(self, pks: Sequence[int]) -> None:
        """Delete job rows and what hangs off them (events, the dedup keys they hold)."""
        marks = ", ".join(["%s"] * len(pks))
        for model, column in ((self.JobEvent, "job_id"), (self.DedupKey, "job_id")):
            self._sql(
                f"DELETE FROM {self._quoted(model)} WHERE {column} IN ({marks})", pks, fetch=False
            )
        self._sql(f"DELETE FROM {self._table} WHERE id IN ({marks})", pks, fetch=False)

    def obliterate(self, queue: str, *, force: bool = False) -> int:
        with self._atomic():
            self._write_lock()
            if self.vendor == "postgresql":  # no claim may start while the queue goes
                self._configs().select_for_update().filter(name=queue).first()
            if not force and self._jobs().filter(queue=queue, state=JobState.ACTIVE).exists():
                raise QueueBusy(f"queue {queue} has active jobs (force=True deletes them too)")
            for model in (self.JobEvent, self.DedupKey, self.ClaimLog, self.FailureCallRow):
                self._sql(
                    f"DELETE FROM {self._quoted(model)} WHERE queue = %s", [queue], fetch=False
                )
            removed = self._records(self._jobs().filter(queue=queue), self._now()).count()
            self._sql(f"DELETE FROM {self._table} WHERE queue = %s", [queue], fetch=False)
            self._configs().filter(name=queue).delete()
            return removed

    def register_queue(self, queue: str) -> None:
        qs = self._configs()
        if qs.filter(name=queue).exists():  # the common case: no write, no write lock
            return
        with self._atomic():
            self._write_lock()
            qs.get_or_create(name=queue)

    def list_queues(self) -> list[str]:
        return sorted(self._configs().values_list("name", flat=True))

    # -- worker registry --------------------------------------------------------------------

    def register_worker(self, worker_id: str, info: dict, ttl_ms: int) -> None:
        now = self._now()
        fields = {
            "host": info.get("host", ""), "pid": info.get("pid"),
            "queues": info.get("queues", []), "concurrency": info.get("concurrency", 0),
            "last_heartbeat": _dt(now), "expires_at": _dt(now + ttl_ms),
            "jobs_done": info.get("completed", 0), "jobs_failed": info.get("failed", 0),
            "info": info,
        }  # fmt: skip
        # create_defaults replaces defaults on insert (it does not extend them).
        with self._atomic():
            self._write_lock()
            self.WorkerInfo.objects.using(self.using).update_or_create(
                worker_id=worker_id,
                defaults=fields,
                create_defaults={**fields, "started_at": _dt(now)},
            )

    def deregister_worker(self, worker_id: str) -> None:
        with self._atomic():
            self._write_lock()
            self.WorkerInfo.objects.using(self.using).filter(worker_id=worker_id).delete()

    def list_workers(self) -> list[WorkerRecord]:
        rows = self.WorkerInfo.objects.using(self.using).filter(expires_at__gt=_dt(self._now()))
        return [
            WorkerRecord(
                w.worker_id, dict(w.info), _ms(w.last_heartbeat) if w.last_heartbeat else 0
            )
            for w in rows
        ]

    def broadcasts(self) -> Any:
        from .broadcast_database import DatabaseBroadcasts  # its models load with the app

        if getattr(self, "_broadcasts", None) is None:
            self._broadcasts = DatabaseBroadcasts(self.using, clock=self.clock)
        return self._broadcasts

    def close(self) -> None:
        if self._listener is not None:
            self._listener.stop()
            self._listener = None


class _PgListener(threading.Thread):
    """One LISTEN connection per storage, outside Django's pool, that turns NOTIFYs from any
    process into wake-ups of this process's waiters."""

    def __init__(self, using: str, wake: Callable[[], None]) -> None:
        super().__init__(name="jobq-pg-listener", daemon=True)
        self.using = using
        self.wake = wake
        self.ready = threading.Event()
        self._stop = threading.Event()

    def run(self) -> None:
        import psycopg

        params = connections[self.using].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        while not self._stop.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.ready.set()
                    # Whatever was sent while (re)connecting is unknown: let waiters re-read.
                    self.wake()
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=64):
                            self.wake()
            except Exception as exc:  # database restart: reconnect; waiters re-read meanwhile
                logger.warning("LISTEN connection lost (%s); reconnecting", exc)
                self._stop.wait(1.0)
        self.ready.set()

    def stop(self) -> None:
        self._stop.set()


class _SqliteWatcher(threading.Thread):
    """Turns commits of other connections (any process) into wake-ups: ``data_version`` is
    read from the WAL index in shared memory, so the check is cheap enough to run often."""

    def __init__(self, path: str, wake: Callable[[], None], interval: float) -> None:
        super().__init__(name="jobq-sqlite-watcher", daemon=True)
        self.path = path
        self.wake = wake
        self.interval = interval
        self.ready = threading.Event()
        self._stop = threading.Event()

    def run(self) -> None:
        import sqlite3

        while not self._stop.is_set():
            try:
                conn = sqlite3.connect(self.path, timeout=5, check_same_thread=False)
                try:
                    seen = conn.execute("PRAGMA data_version").fetchone()[0]
                    self.ready.set()
                    self.wake()
                    while not self._stop.wait(self.interval):
                        version = conn.execute("PRAGMA data_version").fetchone()[0]
                        if version != seen:
                            seen = version
                            self.wake()
                finally:
                    conn.close()
            except Exception as exc:  # file replaced or locked for long: start over
                logger.warning("SQLite watcher error (%s); restarting", exc)
                self._stop.wait(1.0)
        self.ready.set()

    def stop(self) -> None:
        self._stop.set()
