"""PostgreSQL bulk insert: the statement that stores a chunk of ``enqueue_many`` (the rows,
their events) and the fast path that tries it first.

Why a fast path: almost every chunk holds only ids that exist nowhere yet (ids made by
``Queue.build``, or an importer's fresh keys). For such a chunk the rules for an existing id
(duplicate, completed, an expired record replaced in place) have nothing to do, yet checking
for them cost a fifth of the chunk: a read of every id before the insert (expired records) and
``ON CONFLICT``'s speculative insertion (a probe of the unique index before each row and a
confirmation record in the WAL after it). So a chunk is first sent as a plain ``INSERT``; the
unique ``(queue, job_id)`` index refuses it whole if one id is taken, the chunk's transaction
(or savepoint) rolls back, and the chunk goes down the careful path (``Enqueue._insert_chunk``),
which answers every id by the rules. Nothing of the refused attempt is left: it wrote only
rows and events of its own transaction.

A queue whose chunk met a taken id goes down the careful path directly from then on, until a
careful chunk finds no id taken: a producer that re-sends the same batch (idempotent retries)
does not pay for a refused attempt on every chunk."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from django.db import IntegrityError, connections, transaction

from ...job import DedupMode, EnqueueOutcome, NewJob, StoredEnqueue
from ...serde import task_name
from ...states import JobState
from .failures import FailureCalls
from .wakeups import CHANNEL

# The unique index that decides whether an id is taken (``Job.Meta``).
ID_INDEX = "jobq_job_queue_id_uniq"

# psycopg's ``Cursor`` binds parameters on the server (Django's cursors quote them on the
# client): arrays travel in binary, and the statement can be prepared (``_pg_sql``).
_SERVER_CURSOR: Any = None

# The ``prepare_threshold`` jobq gives a connection on which Django left psycopg's default of
# None (prepare nothing) and jobq prepares its own statements: psycopg ignores ``prepare=True``
# while the threshold is None, and with this one it prepares no statement on its count of
# uses, so nothing but the statements marked ``prepare=True`` is prepared (Django's own
# cursors bind on the client, and psycopg never prepares their queries whatever the threshold).
EXPLICIT_ONLY = 2**62


def _server_cursor_class() -> Any:
    global _SERVER_CURSOR
    if _SERVER_CURSOR is None:
        import psycopg

        _SERVER_CURSOR = psycopg.Cursor
    return _SERVER_CURSOR


def _missing_statement_error() -> type[Exception]:
    import psycopg

    return psycopg.errors.InvalidSqlStatementName


def _forget_prepared(raw: Any) -> bool:
    """After "prepared statement ... does not exist": psycopg's cache of the connection named
    a statement the server no longer has. psycopg empties that cache when it sees the
    connection roll back, or run ``DEALLOCATE ALL`` / ``DISCARD ALL``, but not every time:
    a ``DEALLOCATE ALL`` whose text it has counted before (run while nothing was prepared)
    goes unseen. Empty it (the next call prepares again; psycopg also deallocates what is
    left at its next statement) and say whether the statement may simply run again: only
    when no transaction is open, since the error aborted any, the caller's included (that
    one raises; its retry prepares afresh)."""
    import psycopg

    cache = getattr(raw, "_prepared", None)  # psycopg's PrepareManager (no public API)
    if cache is None:
        return False
    cache.clear()
    return raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


# The per-job columns of a bulk insert and their SQL types, in the order of ``_chunk_columns``.
_CHUNK_COLUMNS = (
    ("job_id", "text"), ("state", "text"), ("payload", "bytea"), ("content_type", "text"),
    ("max_attempts", "integer"), ("max_stalls", "integer"), ("priority", "integer"),
    ("min_backoff", "bigint"), ("max_backoff", "bigint"), ("result_ttl", "bigint"),
    ("run_at", "timestamptz"), ("waiters", "integer"), ("lifo", "boolean"),
    ("job_group", "text"), ("handler", "text"),
)  # fmt: skip


def _id_taken(exc: IntegrityError) -> bool:
    """Whether ``exc`` is the unique ``(queue, job_id)`` index refusing a row (psycopg's
    diagnostics; any other integrity error is a real one and propagates)."""
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None) == ID_INDEX


class BulkInsert(FailureCalls):
    """The chunk statement of ``enqueue_many`` on PostgreSQL and its fast path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Queues whose last bulk chunk met a taken id: their next chunk skips the fast path.
        self._bulk_careful: set[str] = set()

    def _pg_sql(self, query: str, params: Sequence[Any]) -> list[Any]:
        """PostgreSQL: ``query`` with server-side parameter binding on this alias's connection
        (Django's own, so inside the caller's transaction when there is one), prepared once per
        connection as ``self.prepare`` says (``_prepare_flag``).

        Why not ``self._sql``: Django's psycopg cursors bind on the client, so psycopg quoted
        each element of the bulk arrays in Python (a third of a bulk enqueue's client time),
        and it never prepares their statements, so PostgreSQL planned every claim and
        completion again (~190 and ~130 µs on a 2-core machine).
        Here the parameters, arrays included, travel in binary, and the statement text holds
        no value, so a connection prepares each statement once (a bounded set: the shapes of
        the bulk insert are the most numerous; psycopg keeps at most ``prepared_max``, 100,
        deallocating the least recently used). Errors come out as Django's, as from ``_sql``
        (``unavailable`` and ``atomic`` rely on that)."""
        self._drop_broken_connection()
        conn = connections[self.using]
        conn.ensure_connection()
        prepare = self._prepare_flag(conn)
        raw = conn.connection
        with conn.wrap_database_errors, _server_cursor_class()(raw) as cursor:
            try:
                cursor.execute(query, params, prepare=prepare)
            except _missing_statement_error():
                if not _forget_prepared(raw):
                    raise
                cursor.execute(query, params, prepare=False)  # no transaction to resume
            return cursor.fetchall() if cursor.description is not None else []

    def _prepare_flag(self, conn: Any) -> bool | None:
        """psycopg's ``prepare`` for a statement of ``_pg_sql`` on ``conn`` (connected).

        ``"auto"``: when the alias's ``OPTIONS`` name a ``prepare_threshold`` (even None, as
        behind a transaction-mode PgBouncer before 1.21), that is the user's choice and psycopg
        applies it (None: let it decide). Otherwise Django's default of None means no choice
        was made, and jobq prepares its own statements: True, with the connection's threshold
        raised from None to ``EXPLICIT_ONLY`` (psycopg honours ``prepare=True`` only when the
        threshold is not None). That threshold stays for the connection's life: psycopg's
        cache of prepared names then follows what the connection does (a rollback, ``DISCARD
        ALL`` or ``DEALLOCATE ALL`` run on it empties the cache, and the next call prepares
        again), which it would not if the threshold went back to None between our calls.
        A new connection (a reconnect, a pooled one) starts with an empty cache. ``True``:
        prepared whatever ``OPTIONS`` say; ``False``: never, whatever they say."""
        mode = self.prepare
        if mode is False:
            return False
        if mode == "auto" and "prepare_threshold" in (conn.settings_dict.get("OPTIONS") or {}):
            return None
        raw = conn.connection
        if raw.prepare_threshold is None:
            raw.prepare_threshold = EXPLICIT_ONLY
        return True

    def _insert_new_chunk(self, queue: str, jobs: Sequence[NewJob]) -> list[StoredEnqueue] | None:
        """The fast path (see the module docstring): ``jobs`` (no per-job rules, no id twice)
        in one plain ``INSERT`` and their answers; None when an id is taken, and then nothing
        was written.

        Outside a transaction, and with no LIFO job (its order key is a second statement) nor
        waiter (its row is remembered), the statement is atomic on its own: rows, events and
        the workers' ``NOTIFY`` in one round trip and one commit, without ``BEGIN``/``COMMIT``
        round trips. Inside the caller's transaction it runs in a savepoint, which a refused
        attempt rolls back."""
        if queue in self._bulk_careful:
            return None
        conn = connections[self.using]
        rows_needed = any(job.waiter or job.lifo for job in jobs)  # their keys are needed
        alone = not rows_needed and conn.get_autocommit() and not conn.in_atomic_block
        try:
            with nullcontext() if alone else self._atomic():
                now = self._now()
                rows = self._insert_rows(queue, jobs, now, skip_taken=False, rows=rows_needed)
                if rows_needed:
                    self._after_insert(queue, rows)
        except IntegrityError as exc:
            if not _id_taken(exc):
                raise
            self._bulk_careful.add(queue)
            return None
        if not rows_needed:
            states = [JobState.SCHEDULED if self._due(j, now) > now else JobState.QUEUED
                      for j in jobs]  # fmt: skip
            if JobState.QUEUED in states:  # this process's waiters (others got the NOTIFY)
                transaction.on_commit(lambda: self._wake_local(f"w {queue}"), using=self.using)
            return [StoredEnqueue(EnqueueOutcome.QUEUED, j.job_id, state)
                    for j, state in zip(jobs, states, strict=True)]  # fmt: skip
        inserted = {r[1]: r for r in rows}
        out = []
        for job in jobs:
            pk, _, state, _ = inserted[job.job_id]
            if job.waiter:
                self._remember_waiter(queue, job.job_id, pk)
            out.append(StoredEnqueue(EnqueueOutcome.QUEUED, job.job_id, JobState(state)))
        return out

    def _insert_rows(
        self, queue: str, jobs: Sequence[NewJob], now: int, *, skip_taken: bool, rows: bool = True
    ) -> list[Any]:
        """Insert ``jobs`` (distinct ids) and their first events in one statement; the rows
        ``(id, job_id, state, lifo)`` inserted. ``skip_taken``: ``ON CONFLICT DO NOTHING`` (a
        taken id is left out of the answer); otherwise a taken id fails the statement with an
        ``IntegrityError``. ``rows`` False: no rows come back (reading 1,000 of them cost more
        than the statement's parse), and the statement itself sends the workers' ``NOTIFY``
        when a job is queued (``_after_insert`` does both otherwise).

        One array per column (``unnest``): the statement and its parse stay the same size
        whatever the chunk's, where a VALUES list of 17 parameters a row took longer to build
        and to plan than to execute. A column whose value is the same for the whole chunk
        (options, content type, handler: the common case) is one parameter instead: psycopg
        packs an array element by element in Python."""
        values = self._chunk_columns(queue, jobs, now)
        picks: list[str] = []  # per column: ``u.<name>`` (an array) or ``%s::<type>`` (one value)
        scalars: list[Any] = []
        arrays: list[tuple[str, list[Any]]] = []
        names: list[str] = []
        for (name, sql_type), column in zip(_CHUNK_COLUMNS, values, strict=True):
            if name != "job_id" and column.count(column[0]) == len(column):
                picks.append(f"%s::{sql_type}")
                scalars.append(column[0])
            else:  # binary: no quoting per element
                picks.append(f"u.{name}")
                arrays.append((f"%b::{sql_type}[]", column))
                names.append(name)
        created = self._param_dt(now)
        conflict = "ON CONFLICT (queue, job_id) DO NOTHING " if skip_taken else ""
        return self._pg_sql(
            f"WITH ins AS (INSERT INTO {self._table} (queue, created_at, attempts, stalls, "
            "worker, token, dedup_key, order_key, has_successor, "
            f"{', '.join(name for name, _ in _CHUNK_COLUMNS)}) "
            f"SELECT %s, %s, 0, 0, '', 0, '', 0, false, {', '.join(picks)} "
            f"FROM unnest({', '.join(a for a, _ in arrays)}) WITH ORDINALITY "
            f"AS u ({', '.join(names)}, ord) ORDER BY u.ord "
            f"{conflict}RETURNING id, job_id, state, lifo), "
            f"logged AS (INSERT INTO {self._event_table} (job_id, queue, kind, at, worker, "
            "stream_id) SELECT id, %s, state, %s, '', '' FROM ins) "
            + (
                "SELECT id, job_id, state, lifo FROM ins"
                if rows
                else "SELECT CASE WHEN bool_or(state = 'queued') THEN pg_notify(%s, %s) END "
                "FROM ins"
            ),
            [
                queue,
                created,
                *scalars,
                *(column for _, column in arrays),
                queue,
                created,
                *(() if rows else (CHANNEL, f"w {queue}")),
            ],  # fmt: skip
        )

    def _after_insert(self, queue: str, rows: list[Any]) -> None:
        """In the chunk's transaction, after ``_insert_rows``: the claim order of its LIFO
        jobs, and the workers' wake-up when a job is queued."""
        lifo = [r[0] for r in rows if r[3]]
        if lifo:  # newest LIFO job first: its key is below every earlier one's
            self._sql(
                f"UPDATE {self._table} SET order_key = -id WHERE id = ANY(%s)", [lifo], fetch=False
            )
        if any(r[2] == JobState.QUEUED for r in rows):
            self._signal(f"w {queue}")

    def _chunk_columns(self, queue: str, jobs: Sequence[NewJob], now: int) -> list[list[Any]]:
        """The values of ``_CHUNK_COLUMNS`` for ``jobs``, one list per column (built column
        by column: a loop per job appending to 15 lists cost more than the insert's parse)."""
        dues = [self._due(job, now) for job in jobs]
        opts = [job.options for job in jobs]
        handler = self.handler_names(queue)  # ``_handler_column``, its lookup once per chunk
        return [
            [job.job_id for job in jobs],
            ["scheduled" if due > now else "queued" for due in dues],
            [job.payload for job in jobs],
            [job.content_type for job in jobs],
            [o.max_attempts for o in opts],
            [o.max_stalls for o in opts],
            [o.priority for o in opts],
            [o.min_backoff for o in opts],
            [o.max_backoff for o in opts],
            [o.result_ttl for o in opts],
            [self._param_dt(due) if due > now else None for due in dues],
            [1 if job.waiter else 0 for job in jobs],
            [job.lifo for job in jobs],
            [job.group or "" for job in jobs],
            [task_name(job.content_type, job.payload) or handler for job in jobs],
        ]

    @staticmethod
    def _due(job: NewJob, now: int) -> int:
        due = max(job.run_at or 0, now + job.delay)
        if job.dedup is not None and job.dedup.mode is DedupMode.DEBOUNCE:
            due = max(due, now + (job.dedup.ttl or 0))
        return due
