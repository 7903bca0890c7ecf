"""Database backend: the Django models are the state, changed in short transactions.

Why it exists: an enqueue inside the caller's ``transaction.atomic()`` commits or rolls back
with the caller's own writes (the transactional-outbox guarantee Redis cannot give), and it needs
no server beyond the project's database: on SQLite it is the embedded default.

Concurrency rules:
- PostgreSQL: claims lock candidate rows with ``FOR UPDATE SKIP LOCKED``, so workers never wait
  on each other; wake-ups travel by ``LISTEN/NOTIFY``, sent inside the transaction so a worker is
  woken only once the job is committed.
- SQLite: one writer at a time. A transaction that reads and then writes fails at once with
  "database is locked" if another connection committed in between (WAL snapshot), so every write
  transaction here *starts* with a write (``_write_lock``), which waits on the busy timeout
  instead. SQLite has no cross-process signal; a watcher thread reads ``PRAGMA data_version``
  (which changes when any other connection commits, and costs no disk read) every
  ``poll_interval`` and wakes this process's waiters, so an idle worker neither runs claim
  queries in a loop nor sleeps through a new job.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Count, F

from ..job import (
    AckOutcome,
    CancelOutcome,
    ClaimedJob,
    EnqueueOutcome,
    Event,
    FinalOutcome,
    JobRecord,
    NewJob,
    StoredEnqueue,
)
from ..registry import handler_name
from ..states import TERMINAL_STATES, WAITING_STATES, JobState
from .base import Ack, ClaimBatch, Clock, ReapReport, Storage, WorkerRecord

logger = logging.getLogger("django_jobq.storage")
CHANNEL = "django_jobq"
BULK_CHUNK = 500  # jobs per enqueue_many transaction
RECHECK = 2.0  # seconds: longest wait without re-reading the database (see _wait)
STALLED_ERROR = {"type": "Stalled", "message": "lease expired more than max_stalls times"}
SCHEDULED_STATES = (JobState.SCHEDULED, JobState.RETRYING)


def _dt(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _ms(value: dt.datetime) -> int:
    return int(value.timestamp() * 1000)


def _ms_or_none(value: dt.datetime | None) -> int | None:
    return None if value is None else _ms(value)


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _json_bytes(value: Any) -> bytes | None:
    return None if value is None else json.dumps(value).encode()


class DatabaseStorage(Storage):
    supports_transactional_enqueue = True

    def __init__(
        self, using: str = "default", *, clock: Clock | None = None, poll_interval: float = 0.01
    ) -> None:
        from ..models import Job, JobEvent, QueueConfig, WorkerInfo

        self.using = using
        self.clock = clock
        self.poll_interval = poll_interval
        self.Job, self.JobEvent, self.QueueConfig, self.WorkerInfo = (
            Job, JobEvent, QueueConfig, WorkerInfo,
        )  # fmt: skip
        # Wake-ups: every signal bumps a generation number. A waiter compares it with the value
        # it saw *before* reading the database, so a signal that lands between its read and its
        # wait is never lost (the classic missed wake-up of condition variables).
        self._cond = threading.Condition()
        self._generation = 0
        self._claim_seen: dict[str, int] = {}
        self._interrupted: set[str] = set()
        self._listener: _PgListener | _SqliteWatcher | None = None
        self._wal_checked = False

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
                cursor.execute(f"DELETE FROM {self.Job._meta.db_table} WHERE id = -1")  # noqa: S608

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
        for start in range(0, len(rows), 500):
            chunk = rows[start : start + 500]
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
    @property
    def _table(self) -> str:
        return connections[self.using].ops.quote_name(self.Job._meta.db_table)

    @property
    def _event_table(self) -> str:
        return connections[self.using].ops.quote_name(self.JobEvent._meta.db_table)

    @property
    def _skip_locked(self) -> str:
        return " FOR UPDATE SKIP LOCKED" if self.vendor == "postgresql" else ""

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

    # -- producer ---------------------------------------------------------------------------

    def enqueue(self, queue: str, job: NewJob) -> StoredEnqueue:
        with self._atomic():
            self._write_lock()
            now = self._now()  # after the lock: no earlier than the commit we waited for
            # The common case first: a new id is one INSERT … ON CONFLICT DO NOTHING (the
            # unique (queue, job_id) index decides races, also between processes).
            created = self._insert(queue, job, now)
            if created is not None:
                return created
            existing = self._existing(queue, job.job_id, now)
            if existing is None:  # it had expired: _existing removed it, the id is free
                created = self._insert(queue, job, now)
                if created is not None:
                    return created
                existing = self._existing(queue, job.job_id, now)
            return self._duplicate(existing, job)

    def enqueue_many(self, queue: str, jobs: Sequence[NewJob]) -> list[StoredEnqueue]:
        """All of ``jobs`` in one transaction per chunk: one commit instead of one per job."""
        out: list[StoredEnqueue] = []
        for start in range(0, len(jobs), BULK_CHUNK):
            out += self._enqueue_chunk(queue, jobs[start : start + BULK_CHUNK])
        return out

    def _enqueue_chunk(self, queue: str, jobs: Sequence[NewJob]) -> list[StoredEnqueue]:
        with self._atomic():
            self._write_lock()
            now = self._now()  # after the lock: no earlier than the commit we waited for
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
                return [self.enqueue(queue, job) for job in jobs]
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
                    out.append(
                        StoredEnqueue(EnqueueOutcome.QUEUED, job.job_id, JobState(row.state))
                    )
                    continue
                prior = existing.get(job.job_id)
                if prior is None:  # a repeat, within this batch, of an id created above
                    prior = next(r for r in rows if r.job_id == job.job_id)
                out.append(self._duplicate(prior, job))
            return out

    def _new_row(self, queue: str, job: NewJob, now: int) -> Any:
        o = job.options
        due = max(job.run_at or 0, now + job.delay)
        state = JobState.SCHEDULED if due > now else JobState.QUEUED
        return self.Job(
            queue=queue, job_id=job.job_id, handler=handler_name(queue), state=state,
            payload=job.payload, content_type=job.content_type, max_attempts=o.max_attempts,
            max_stalls=o.max_stalls, priority=o.priority, min_backoff=o.min_backoff,
            max_backoff=o.max_backoff, result_ttl=o.result_ttl,
            run_at=_dt(due) if state is JobState.SCHEDULED else None,
            created_at=_dt(now), waiters=1 if job.waiter else 0,
        )  # fmt: skip

    def _existing(self, queue: str, job_id: str, now: int) -> Any:
        qs = self._jobs().filter(queue=queue, job_id=job_id)
        if self.vendor == "postgresql":
            qs = qs.select_for_update()
        row = qs.first()
        if row is not None and row.expires_at is not None and _ms(row.expires_at) <= now:
            row.delete()  # its TTL passed: the id is free again
            return None
        return row

    def _insert(self, queue: str, job: NewJob, now: int) -> StoredEnqueue | None:
        """Insert the job unless its id exists; None when it does. Raw SQL: enqueue is a hot
        path and this is one statement where the ORM needed a read and a savepoint."""
        o = job.options
        due = max(job.run_at or 0, now + job.delay)
        state = JobState.SCHEDULED if due > now else JobState.QUEUED
        rows = self._sql(
            f"INSERT INTO {self._table} (queue, job_id, handler, state, payload, content_type, "
            "attempts, max_attempts, stalls, max_stalls, priority, min_backoff, max_backoff, "
            "result_ttl, run_at, created_at, worker, token, waiters) VALUES (%s, %s, %s, %s, %s, "
            "%s, 0, %s, 0, %s, %s, %s, %s, %s, %s, %s, '', 0, %s) "
            "ON CONFLICT (queue, job_id) DO NOTHING RETURNING id",
            [
                queue, job.job_id, handler_name(queue), state.value, job.payload,
                job.content_type, o.max_attempts,
                o.max_stalls, o.priority, o.min_backoff, o.max_backoff, o.result_ttl,
                self._param_dt(due) if state is JobState.SCHEDULED else None,
                self._param_dt(now), 1 if job.waiter else 0,
            ],
        )  # fmt: skip
        if not rows:
            return None
        self._events([(rows[0][0], queue, job.job_id)], state.value, now)
        if state is JobState.QUEUED:
            self._signal(f"w {queue}")
        return StoredEnqueue(EnqueueOutcome.QUEUED, job.job_id, state)

    def _duplicate(self, row: Any, job: NewJob) -> StoredEnqueue:
        state = JobState(row.state)
        if job.waiter and state not in TERMINAL_STATES:
            self._jobs().filter(pk=row.pk).update(waiters=F("waiters") + 1)
        done = state is JobState.COMPLETED
        outcome = EnqueueOutcome.COMPLETED if done else EnqueueOutcome.DUPLICATE
        return StoredEnqueue(outcome, job.job_id, state, _bytes(row.result), _json_bytes(row.error))

    # -- worker -----------------------------------------------------------------------------

    def claim(self, queue: str, worker_id: str, count: int, lease_ms: int) -> ClaimBatch:
        # The first claim since the worker's last wait fixes the generation that wait compares
        # with: a job committed after this point wakes it even if this claim missed the job.
        since = self._snapshot()
        with self._cond:
            self._claim_seen.setdefault(worker_id, since)
        batch = ClaimBatch()
        if not self._claimable(queue, self._now()):
            # Nothing to take: answer from a read, without queueing for SQLite's single write
            # lock (idle workers on several queues would otherwise serialise every writer).
            batch.next_due_in = self._next_due_in(queue, self._now())
            return batch
        with self._atomic():
            self._write_lock()
            now = self._now()  # after the lock: no earlier than the commit we waited for
            self._promote_due(queue, now, 1000)
            # One UPDATE … RETURNING moves the best queued jobs to active (SQLite ≥ 3.35 and
            # PostgreSQL). Raw SQL: this is the worker's hot path, and the ORM version needed a
            # select, an update and a re-select.
            rows = self._sql(
                f"UPDATE {self._table} SET state = 'active', worker = %s, token = token + 1, "
                "attempts = attempts + 1, started_at = %s, lease_deadline = %s "
                f"WHERE id IN (SELECT id FROM {self._table} WHERE queue = %s AND state = 'queued' "
                f"ORDER BY priority, id LIMIT %s{self._skip_locked}) "
                "RETURNING id, job_id, payload, token, attempts, max_attempts, min_backoff, "
                "max_backoff, content_type, priority",
                [worker_id, self._param_dt(now), self._param_dt(now + lease_ms), queue, count],
            )
            rows.sort(key=lambda r: (r[9], r[0]))  # RETURNING has no order: priority, FIFO
            if rows:
                self._events([(r[0], queue, r[1]) for r in rows], "active", now, worker_id)
                batch.jobs = [
                    ClaimedJob(queue, r[1], bytes(r[2]), r[3], r[4], r[5], r[6], r[7], r[8])
                    for r in rows
                ]
            batch.next_due_in = self._next_due_in(queue, now)
            return batch

    def _claimable(self, queue: str, now: int) -> bool:
        return bool(
            self._sql(
                f"SELECT 1 FROM {self._table} WHERE queue = %s AND (state = 'queued' OR "
                "(state IN ('scheduled', 'retrying') AND run_at <= %s)) LIMIT 1",
                [queue, self._param_dt(now)],
            )
        )

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
        """The guarded write that checks the lease and locks the row; None when lost."""
        owned = self._jobs().filter(queue=queue, job_id=job_id, state=JobState.ACTIVE, token=token)
        if owned.update(lease_deadline=None, **fields) == 0:
            return None
        return (
            self._jobs().filter(queue=queue, job_id=job_id)
            .values("id", "attempts", "max_attempts", "result_ttl", "waiters", "worker").get()
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
        self._events([(row["id"], queue, job_id)], kind, now, row.get("worker", ""))
        if row["waiters"]:
            self._signal(f"d {queue} {job_id}")

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
        now = self._now()
        with self._atomic():
            row = self._take_lease(queue, job_id, token, error=json.loads(error))
            if row is None:
                return AckOutcome.LEASE_LOST
            if permanent or row["attempts"] >= row["max_attempts"]:
                fields = self._finish_fields(row, JobState.FAILED, now)
                self._jobs().filter(pk=row["id"]).update(**fields)
                self._finished(row, queue, job_id, "failed", now)
                return AckOutcome.FAILED
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
                                              "waiters", "worker")}  # fmt: skip
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
            table = connections[self.using].ops.quote_name(self.Job._meta.db_table)
            with connections[self.using].cursor() as cursor:
                cursor.executemany(
                    f"UPDATE {table} SET result = %s WHERE id = %s",  # noqa: S608 - table name
                    [(row.result, row.pk) for row in changed],
                )
            by_worker: dict[str, list[tuple[int, str, str]]] = {}
            for row in changed:
                by_worker.setdefault(row.worker, []).append((row.pk, queue, row.job_id))
            for worker, items in by_worker.items():
                self._events(items, "completed", now, worker)
            for job_id in waited:
                self._signal(f"d {queue} {job_id}")
        return out

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

    # -- management -------------------------------------------------------------------------

    def cancel(self, queue: str, job_id: str) -> CancelOutcome:
        with self._atomic():
            self._write_lock()
            now = self._now()  # after the lock: no earlier than the commit we waited for
            existing = self._existing(queue, job_id, now)
            if existing is None:
                return CancelOutcome.NOT_FOUND
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

    def get_record(self, queue: str, job_id: str) -> JobRecord | None:
        row = self._jobs().filter(queue=queue, job_id=job_id).first()
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
        )

    def wait_for_outcome(self, queue: str, job_id: str, timeout: float) -> FinalOutcome | None:
        deadline = time.monotonic() + timeout
        while True:
            since = self._snapshot()
            record = self.get_record(queue, job_id)
            if record is not None and record.state in TERMINAL_STATES:
                return FinalOutcome(record.state, record.result, record.error)
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
                                 "waiters")[:limit]:  # fmt: skip
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
            if report.requeued:
                self._signal(f"w {queue}")
            report.promoted = self._promote_due(queue, now, limit)
        return report

    def counts(self, queue: str) -> dict[JobState, int]:
        out = dict.fromkeys(
            (JobState.SCHEDULED, JobState.QUEUED, JobState.ACTIVE, JobState.RETRYING,
             JobState.COMPLETED, JobState.FAILED), 0
        )  # fmt: skip
        for row in self._jobs().filter(queue=queue).values("state").annotate(n=Count("id")):
            state = JobState(row["state"])
            if state in out:
                out[state] = row["n"]
        return out

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
                    Event(str(r["id"]), queue, r["job__job_id"], r["kind"], _ms(r["at"]),
                          r["worker"] or None)
                    for r in rows
                ]  # fmt: skip
            self._wait(deadline - time.monotonic(), since)

    def register_queue(self, queue: str) -> None:
        qs = self.QueueConfig.objects.using(self.using)
        if qs.filter(name=queue).exists():  # the common case: no write, no write lock
            return
        with self._atomic():
            self._write_lock()
            qs.get_or_create(name=queue)

    def list_queues(self) -> list[str]:
        names = self.QueueConfig.objects.using(self.using).values_list("name", flat=True)
        return sorted(names)

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
