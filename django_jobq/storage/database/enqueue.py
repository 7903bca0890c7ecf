"""Enqueue and scheduling: inserting jobs (one by one and in bulk), the rules for an id that
exists (duplicate, update, singleton successor), deduplication keys, moving a job's due time,
promoting due jobs to queued, and handing an id to its singleton successor."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F

from ...errors import StorageError
from ...job import DedupMode, EnqueueOutcome, FinalOutcome, NewJob, RunAtUpdate, StoredEnqueue
from ...serde import task_name
from ...states import TERMINAL_STATES, JobState
from .bulk import BulkInsert
from .core import (
    BULK_CHUNK,
    MARK,
    PG_BULK_CHUNK,
    SCHEDULED_STATES,
    SUCCESSOR,
    UPDATABLE_STATES,
    _bytes,
    _chunks,
    _dt,
    _json_bytes,
    _moves,
    _ms,
    _ms_or_none,
    _public_id,
)
from .wakeups import CHANNEL


class Enqueue(BulkInsert):
    """Producer transitions and the scheduling rules they share with the worker."""

    def enqueue(self, queue: str, job: NewJob) -> StoredEnqueue:
        if self.vendor == "postgresql" and job.dedup is None and not job.lifo:
            # The common case: a new id is one statement (row, event and wake-up), atomic on
            # its own outside a transaction and part of the caller's inside one. An id that
            # exists takes the transactional path below, which applies the rules for it.
            created = self._create(queue, job, self._now())
            if created is not None:
                return created
        with self._atomic():
            self._write_lock()
            now = self._now()  # after the lock: no earlier than the commit we waited for
            return self._enqueue_one(queue, job, now)

    def enqueue_and_wait(
        self, queue: str, job: NewJob, timeout: float
    ) -> tuple[StoredEnqueue, FinalOutcome | None]:
        """The enqueue, then a wait that needs no first read of the row: the waiter's mark is
        taken before the enqueue (see ``_outcome_until``), so on PostgreSQL the caller's next
        database work is the one read after its job's ``NOTIFY``, and none at all when that
        ``NOTIFY`` carried the result (a completion; see ``_carried_outcome``)."""
        deadline = time.monotonic() + timeout
        with self._watch((queue, job.job_id)):  # from before the enqueue: nothing missed
            since = self._outcome_mark((queue, job.job_id))
            stored = self.enqueue(queue, job)
            if stored.state in TERMINAL_STATES:
                return stored, None
            if stored.job_id != job.job_id:  # answered by a dedup key's holder: read, wait
                return stored, self._outcome_until(queue, job.job_id, deadline)
            return stored, self._outcome_until(queue, job.job_id, deadline, since)

    def enqueue_many(self, queue: str, jobs: Sequence[NewJob]) -> list[StoredEnqueue]:
        """All of ``jobs`` in one transaction per chunk: one commit instead of one per job."""
        out: list[StoredEnqueue] = []
        size = PG_BULK_CHUNK if self.vendor == "postgresql" else BULK_CHUNK
        for chunk in _chunks(jobs, size):
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
        # Rules that depend on what each earlier job of the chunk did: one by one.
        one_by_one = any(
            job.dedup is not None or job.singleton or (job.update is not None and job.update.any)
            for job in jobs
        )
        if self.vendor == "postgresql" and not one_by_one:
            if len({job.job_id for job in jobs}) == len(jobs):  # else: repeats, the rules
                stored = self._insert_new_chunk(queue, jobs)
                if stored is not None:
                    return stored
        with self._atomic():
            self._write_lock()
            now = self._now()  # after the lock: no earlier than the commit we waited for
            if one_by_one:
                return [self._enqueue_one(queue, job, now) for job in jobs]
            if self.vendor == "postgresql":
                return self._insert_chunk(queue, jobs, now)
            return self._bulk_create_chunk(queue, jobs, now)

    def _bulk_create_chunk(
        self, queue: str, jobs: Sequence[NewJob], now: int
    ) -> list[StoredEnqueue]:
        """SQLite, inside the chunk's transaction: the ids that exist are read first, the new
        ones stored with one ``bulk_create``."""
        ids = list(dict.fromkeys(job.job_id for job in jobs))
        qs = self._jobs().filter(queue=queue, job_id__in=ids)
        existing = {row.job_id: row for row in qs}
        expired = [r.pk for r in existing.values() if r.expires_at and _ms(r.expires_at) <= now]
        if expired:  # their TTL passed: the ids are free again
            self._delete_rows(expired)
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
                out.append(StoredEnqueue(EnqueueOutcome.QUEUED, job.job_id, JobState(row.state)))
                continue
            prior = existing.get(job.job_id)
            if prior is None:  # a repeat, within this batch, of an id created above
                prior = next(r for r in rows if r.job_id == job.job_id)
            out.append(self._duplicate(queue, prior, job))
        return out

    def _insert_chunk(self, queue: str, jobs: Sequence[NewJob], now: int) -> list[StoredEnqueue]:
        """PostgreSQL, inside the chunk's transaction, when the fast path (``bulk.py``) could
        not take the chunk: every new id of ``jobs`` in one ``INSERT … SELECT … FROM unnest(…)
        ON CONFLICT DO NOTHING``, their events in the same statement.
        An id that exists (or repeats within the chunk) then goes through ``_enqueue_one``,
        which applies the rules for it (an expired row is replaced, a live one answers
        DUPLICATE or COMPLETED and gains the waiter)."""
        fresh: dict[str, NewJob] = {}
        for job in jobs:
            fresh.setdefault(job.job_id, job)
        expired = self._pg_sql(  # their TTL passed: the ids are free, and take their place
            f"SELECT id FROM {self._table} WHERE queue = %s AND job_id = ANY(%b::text[]) "
            "AND expires_at <= %s FOR UPDATE",
            [queue, list(fresh), self._param_dt(now)],
        )
        if expired:
            self._delete_rows([r[0] for r in expired])
        rows = self._insert_rows(queue, list(fresh.values()), now, skip_taken=True)
        if len(rows) == len(fresh) and not expired:
            self._bulk_careful.discard(queue)  # no id was taken: the fast path again
        else:
            self._bulk_careful.add(queue)
        inserted = {r[1]: (r[0], JobState(r[2])) for r in rows}
        self._after_insert(queue, rows)
        out = []
        for job in jobs:
            new = inserted.pop(job.job_id, None)
            if new is None:  # the id existed, or repeats an id of this chunk
                out.append(self._enqueue_one(queue, job, now))
                continue
            if job.waiter:
                self._remember_waiter(queue, job.job_id, new[0])
            out.append(StoredEnqueue(EnqueueOutcome.QUEUED, job.job_id, new[1]))
        return out

    def _handler_column(self, queue: str, job: NewJob) -> str:
        """What the ``Job.handler`` column shows for one job: its task's name for a task
        function's job (the admin, the API and the Spark analytics group and filter by job
        type), else the queue's handler (``handler_names``)."""
        return task_name(job.content_type, job.payload) or self.handler_names(queue)

    def _new_row(self, queue: str, job: NewJob, now: int) -> Any:
        o = job.options
        due = self._due(job, now)
        state = JobState.SCHEDULED if due > now else JobState.QUEUED
        return self.Job(
            queue=queue, job_id=job.job_id, state=state,
            handler=self._handler_column(queue, job),
            payload=job.payload, content_type=job.content_type, max_attempts=o.max_attempts,
            max_stalls=o.max_stalls, priority=o.priority, min_backoff=o.min_backoff,
            max_backoff=o.max_backoff, result_ttl=o.result_ttl,
            run_at=_dt(due) if state is JobState.SCHEDULED else None,
            created_at=_dt(now), waiters=1 if job.waiter else 0, lifo=job.lifo,
            group=job.group or "", dedup_key="", order_key=0,
        )  # fmt: skip

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
        pg = self.vendor == "postgresql"
        insert = (
            f"INSERT INTO {self._table} (queue, job_id, handler, state, payload, content_type, "
            "attempts, max_attempts, stalls, max_stalls, priority, min_backoff, max_backoff, "
            "result_ttl, run_at, created_at, worker, token, waiters, lifo, job_group, dedup_key, "
            "order_key, has_successor) VALUES (%s, %s, %s, %s, %s, %s, 0, %s, 0, %s, %s, %s, %s, "
            "%s, %s, %s, '', 0, %s, %s, %s, %s, 0, %s) "
            "ON CONFLICT (queue, job_id) DO NOTHING RETURNING id"
        )
        params = [
            queue, job.job_id + SUCCESSOR if successor else job.job_id,
            self._handler_column(queue, job),
            state.value, job.payload, job.content_type, o.max_attempts,
            o.max_stalls, o.priority, o.min_backoff, o.max_backoff, o.result_ttl,
            None if run_at is None else self._param_dt(run_at),
            self._param_dt(now), 1 if job.waiter and not successor else 0, job.lifo,
            job.group or "", job.dedup.key if job.dedup and not successor else "", False,
        ]  # fmt: skip
        if pg:
            # PostgreSQL: the row, its event and the workers' wake-up (sent at commit) in one
            # statement, so that outside a transaction it is atomic on its own.
            wake = state is JobState.QUEUED
            rows = self._pg_sql(
                f"WITH ins AS ({insert}), logged AS (INSERT INTO {self._event_table} (job_id, "
                "queue, kind, at, worker, stream_id) SELECT id, %s, %s, %s, '', '' FROM ins) "
                "SELECT id, CASE WHEN %s THEN pg_notify(%s, %s) END FROM ins",
                [*params, queue, state.value, params[13], wake, CHANNEL, f"w {queue}"],
            )
        else:
            rows = self._sql(insert, params)
        if not rows:
            return None
        pk = rows[0][0]
        if job.lifo:  # newest LIFO job first: its key is below every earlier one's
            self._sql(f"UPDATE {self._table} SET order_key = -id WHERE id = %s", [pk], fetch=False)
        if pg:
            if state is JobState.QUEUED:  # this process's waiters (others got the NOTIFY)
                transaction.on_commit(lambda: self._wake_local(f"w {queue}"), using=self.using)
        else:
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

    def _next_due_in(self, queue: str, now: int) -> int | None:
        due = (  # run_at not null: the partial due index holds only such rows
            self._jobs().filter(queue=queue, state__in=SCHEDULED_STATES, run_at__isnull=False)
            .order_by("run_at").values_list("run_at", flat=True).first()
        )  # fmt: skip
        return None if due is None else max(_ms(due) - now, 0)

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
