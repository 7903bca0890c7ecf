"""The base of the database backend: connections, transactions, raw SQL and the helpers every
transition shares. The transitions live in the modules layered on it (see the package docstring)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import connections, transaction

from ...errors import ConfigurationError, StorageUnavailable
from ...job import RunAtUpdate
from ...states import JobState
from ..base import Clock, Storage

logger = logging.getLogger("django_jobq.storage")
BULK_CHUNK = 500  # jobs per enqueue_many transaction
PG_BULK_CHUNK = 1000  # PostgreSQL: jobs per INSERT … FROM unnest (bench.db_enqueue --sweep)
IN_CHUNK = 500  # ids per "IN (...)" list: SQLite bounds the parameters of a statement
SCHEDULED_STATES = (JobState.SCHEDULED, JobState.RETRYING)
UPDATABLE_STATES = (JobState.SCHEDULED, JobState.QUEUED, JobState.RETRYING)
MARK = "~"  # never part of a valid job id (validation.py): it marks reserved row names
SUCCESSOR = MARK + "next"
ORDER = "ORDER BY priority, order_key, id"  # claim order (index jobq_job_order)
RETURNING = (
    "RETURNING id, job_id, payload, token, attempts, max_attempts, min_backoff, max_backoff, "
    "content_type, priority, order_key, job_group, created_at, run_at"
)
# SQLite raises OperationalError for these too; they are errors of the schema, not outages.
SQLITE_SCHEMA_ERRORS = ("no such table", "no such column", "table ", "near ")
CONFIG_COLUMNS = (
    "paused, postponed_until, concurrency, rate_max, rate_window, group_rate_max, group_rate_window"
)


def prepare_problem(value: Any) -> str | None:
    """What is wrong with a ``prepare`` (``DATABASE_PREPARE``) value (None: nothing). Not 1 or
    0, which would read as psycopg's threshold: only "auto", True or False."""
    if value == "auto" or isinstance(value, bool):
        return None
    return f"{value!r}: use 'auto', True or False"


def _no_handler(queue: str) -> str:
    return ""


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


def not_before(now: int, stamp: Any) -> int:
    """``now``, or ``stamp`` (a datetime column as the ORM or raw SQL read it; None: none) when
    that is later. A claim is stamped no earlier than the row's creation and a verdict no
    earlier than the run's start: ``_greatest`` says why the clocks may disagree."""
    at = _raw_ms(stamp)
    return now if at is None else max(now, at)


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


class DatabaseCore(Storage):
    """Connections, transactions and raw SQL shared by every transition."""

    connection_per_thread = True

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
        self,
        using: str = "default",
        *,
        clock: Clock | None = None,
        poll_interval: float = 0.01,
        prepare: bool | str | None = "auto",
        handler_names: Callable[[str], str] | None = None,
    ) -> None:
        from ...models import (
            ClaimLog,
            DedupKey,
            EventFloor,
            Job,
            JobEvent,
            QueueConfig,
            StateCount,
            WorkerInfo,
        )
        from ...models import FailureCall as FailureCallRow

        prepare = "auto" if prepare is None else prepare  # None: the default
        if (problem := prepare_problem(prepare)) is not None:
            raise ConfigurationError(f"prepare {problem}")
        self.using = using
        # What a plain job's ``handler`` column shows: the dotted path of its queue's handler
        # (a task function's job shows its task's name, read from the job's envelope). Given by
        # the caller (``backend.py``: the registry's), since storage knows no handlers.
        self.handler_names = handler_names or _no_handler
        # PostgreSQL: whether the hot statements are prepared (``BulkInsert._pg_sql``).
        self.prepare: bool | str = prepare
        self.clock = clock
        self.poll_interval = poll_interval
        self.Job, self.JobEvent, self.QueueConfig, self.WorkerInfo = (
            Job, JobEvent, QueueConfig, WorkerInfo,
        )  # fmt: skip
        self.DedupKey, self.ClaimLog = DedupKey, ClaimLog
        self.FailureCallRow = FailureCallRow
        self.EventFloor, self.StateCount = EventFloor, StateCount
        self._wal_checked = False

    @property
    def vendor(self) -> str:
        return connections[self.using].vendor

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
    def _greatest(self) -> str:
        """The larger-of-two function (SQLite's two-argument ``MAX``; its datetimes are ISO
        text, which orders as the times do). A claim stamps ``started_at`` no earlier than
        ``created_at``, a completion ``finished_at`` no earlier than ``started_at``: the
        stamps come from each process's clock, taken just before its statement, so a job
        committed between an idle worker's stamp and its claim statement (a loaded machine),
        or created on a host whose clock runs ahead, would otherwise start before it was
        created."""
        return "GREATEST" if self.vendor == "postgresql" else "MAX"

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

    def _finish_fields(self, row: Any, state: JobState, now: int) -> dict[str, Any]:
        return {
            "state": state,
            "finished_at": _dt(now),
            "expires_at": _dt(now + row["result_ttl"]),
            "lease_deadline": None,
            "waiters": 0,
        }

    def _locked_row(self, queue: str, job_id: str) -> Any:
        """The row stored under ``job_id`` (a reserved name too), locked on PostgreSQL."""
        qs = self._jobs().filter(queue=queue, job_id=job_id)
        if self.vendor == "postgresql":
            qs = qs.select_for_update()
        return qs.order_by().first()

    def _existing(self, queue: str, job_id: str, now: int) -> Any:
        row = self._locked_row(queue, job_id)
        if row is not None and row.expires_at is not None and _ms(row.expires_at) <= now:
            self._delete_rows([row.pk])  # its TTL passed: the id is free again
            return None
        return row

    @staticmethod
    def _records(rows: Any, now: int) -> Any:
        """Of ``rows``, the job records ``get_record`` would show: not expired, and not a
        successor or a replaced run under a reserved name (they count as no record of their
        own, as in the other backends)."""
        return rows.exclude(job_id__contains=MARK).exclude(expires_at__lte=_dt(now))

    def _delete_rows(self, pks: Sequence[int]) -> None:
        """Delete job rows and what hangs off them (the dedup keys they hold, their events).

        The events go last, in a statement of their own: an event is written by a transaction
        that holds its job row (``JobEvent.job`` has no database constraint to refuse an
        orphan), so once the rows are deleted here (after waiting for any such holder) every
        event of theirs is committed or ours, and this statement sees it."""
        marks = ", ".join(["%s"] * len(pks))
        self._sql(
            f"DELETE FROM {self._quoted(self.DedupKey)} WHERE job_id IN ({marks})", pks, fetch=False
        )
        self._sql(f"DELETE FROM {self._table} WHERE id IN ({marks})", pks, fetch=False)
        self._forget_events(f"job_id IN ({marks})", pks)

    def _forget_events(self, where: str, params: Sequence[Any]) -> None:
        """Delete the events ``where`` selects, first raising each queue's ``EventFloor`` to
        the newest of them: in this transaction, so a feed reader sees both or neither."""
        table = self._event_table
        tops = self._sql(f"SELECT queue, MAX(id) FROM {table} WHERE {where} GROUP BY queue", params)
        floors = self.EventFloor.objects.using(self.using)
        for queue, top in tops:
            floors.bulk_create([self.EventFloor(queue=queue, gone=top)], ignore_conflicts=True)
            floors.filter(queue=queue, gone__lt=top).update(gone=top)
        if tops:
            self._sql(f"DELETE FROM {table} WHERE {where}", params, fetch=False)
