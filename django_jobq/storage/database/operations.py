"""Operator actions: cancel, change, retry, inspection (records, counts, dead letters), queue
control (pause, limits, drain, clean, obliterate) and the worker registry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction
from django.db.models import Sum

from ...errors import QueueBusy
from ...job import (
    PARKED_FLOOR,
    CancelOutcome,
    ChangeOutcome,
    DedupMode,
    JobRecord,
    QueueLimits,
    RetryOutcome,
)
from ...states import TERMINAL_STATES, WAITING_STATES, JobState
from ..base import WorkerRecord
from .claim import ClaimAck
from .core import (
    MARK,
    SCHEDULED_STATES,
    SUCCESSOR,
    UPDATABLE_STATES,
    _bytes,
    _chunks,
    _dt,
    _json_bytes,
    _ms,
    _ms_or_none,
)


def state_counts(using: str, queues: Sequence[str]) -> dict[str, dict[JobState, int]]:
    """Rows per state of each queue named (states with none left out), in one read of the
    triggers' counts: the storage's ``counts`` and the admin's overview alike."""
    from ...models import StateCount

    rows = (
        StateCount.objects.using(using).filter(queue__in=list(queues))
        .values_list("queue", "state").annotate(total=Sum("n")).order_by()
    )  # fmt: skip
    out: dict[str, dict[JobState, int]] = {}
    for queue, state, total in rows:
        if total and state in JobState.values:
            out.setdefault(queue, {})[JobState(state)] = int(total)
    return out


def recount(using: str) -> None:
    """Count every (queue, state) of the job rows again into ``StateCount`` (SQLite: its one
    writer at a time makes the count and the replacement one consistent step). Nothing when
    the tables are not there (migrated back, or not yet)."""
    from ...models import Job, StateCount

    connection = connections[using]
    if StateCount._meta.db_table not in connection.introspection.table_names():
        return
    with transaction.atomic(using=using), connection.cursor() as cursor:
        counts, jobs = (connection.ops.quote_name(m._meta.db_table) for m in (StateCount, Job))
        cursor.execute(f"DELETE FROM {counts}")  # noqa: S608 - the models' own tables
        cursor.execute(
            f"INSERT INTO {counts} (queue, state, slot, n) "  # noqa: S608
            f"SELECT queue, state, 0, COUNT(*) FROM {jobs} GROUP BY queue, state"
        )


class Operations(ClaimAck):
    """What operators (admin, API, management commands) do to jobs and queues."""

    def request_cancel(self, queue: str, job_id: str, *, force: bool = False) -> CancelOutcome:
        with self._atomic():
            self._write_lock()
            row = self._existing(queue, job_id, self._now())
            if row is None or row.state != JobState.ACTIVE or row.has_successor:
                return self.cancel(queue, job_id)  # in this transaction: no job slips between
            self._jobs().filter(pk=row.pk).update(cancel_requested="force" if force else "stop")
            return CancelOutcome.REQUESTED

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
            # Every failed row has a finish time; saying so lets the partial (queue, state,
            # finished_at) index give the order.
            self._dead(queue, now)
            .filter(finished_at__isnull=False)
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

    def counts(self, queue: str) -> dict[JobState, int]:
        """The triggers' counts (``StateCount``): a few rows read, however many jobs."""
        out = dict.fromkeys(
            (JobState.SCHEDULED, JobState.QUEUED, JobState.ACTIVE, JobState.RETRYING,
             JobState.BLOCKED, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED), 0
        )  # fmt: skip
        for state, n in state_counts(self.using, [queue]).get(queue, {}).items():
            if state in out:
                out[state] = n
        return out

    def fold_counts(self, queue: str) -> None:
        """PostgreSQL: move the counts of backends that are gone into slot 0 (their slots would
        pile up, one set per connection ever made). A row still locked by a writer is left for
        the next pass (``SKIP LOCKED``), so folding never waits on a transition; a backend
        that took a folded slot's process id anew adds to a fresh row."""
        if self.vendor != "postgresql":
            return
        table = self._quoted(self.StateCount)
        self._sql(
            f"WITH gone AS (DELETE FROM {table} WHERE id IN ("  # noqa: S608 - the model's table
            f"SELECT id FROM {table} WHERE queue = %s AND slot <> 0 "
            "AND slot / 16 NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL) "
            "FOR UPDATE SKIP LOCKED) RETURNING state, n) "
            f"INSERT INTO {table} AS c (queue, state, slot, n) "
            "SELECT %s, state, 0, SUM(n) FROM gone GROUP BY state ORDER BY state "
            "ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + EXCLUDED.n",
            [queue, queue],
            fetch=False,
        )

    def oldest_queued(self, queue: str) -> int | None:
        """The oldest queued row by creation (index ``jobq_job_q_state_created``)."""
        row = (
            self._jobs().filter(queue=queue, state=JobState.QUEUED).order_by("created_at")
            .values_list("created_at", "run_at").first()
        )  # fmt: skip
        if row is None:
            return None
        return max(_ms(row[0]), _ms_or_none(row[1]) or 0)

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

    def obliterate(self, queue: str, *, force: bool = False) -> int:
        with self._atomic():
            self._write_lock()
            if self.vendor == "postgresql":  # no claim may start while the queue goes
                self._configs().select_for_update().filter(name=queue).first()
            if not force and self._jobs().filter(queue=queue, state=JobState.ACTIVE).exists():
                raise QueueBusy(queue)
            for model in (self.DedupKey, self.ClaimLog, self.FailureCallRow):
                self._sql(
                    f"DELETE FROM {self._quoted(model)} WHERE queue = %s", [queue], fetch=False
                )
            removed = self._records(self._jobs().filter(queue=queue), self._now()).count()
            self._sql(f"DELETE FROM {self._table} WHERE queue = %s", [queue], fetch=False)
            # The events of the rows gone, after them (see ``_delete_rows``); a job enqueued
            # meanwhile keeps its row and its event.
            self._forget_events(
                f"queue = %s AND NOT EXISTS "
                f"(SELECT 1 FROM {self._table} j WHERE j.id = {self._event_table}.job_id)",
                [queue],
            )
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

    def send_worker_command(self, worker_id: str, command: dict) -> None:
        with self._atomic():
            self._write_lock()
            self.WorkerInfo.objects.using(self.using).filter(worker_id=worker_id).update(
                command=command
            )

    def take_worker_command(self, worker_id: str) -> dict | None:
        """A read first, then a write only when there is something to take: every heartbeat
        asks, and on SQLite a write would take the database's lock each time."""
        rows = self.WorkerInfo.objects.using(self.using).filter(worker_id=worker_id)
        if not rows.filter(command__isnull=False).exists():
            return None
        with self._atomic():
            self._write_lock()
            row = rows.select_for_update().values_list("command", flat=True).first()
            rows.update(command=None)
        return row if isinstance(row, dict) else None

    def broadcasts(self) -> Any:
        from .broadcast import DatabaseBroadcasts  # its models load with the app

        if getattr(self, "_broadcasts", None) is None:
            self._broadcasts = DatabaseBroadcasts(self.using, clock=self.clock)
        return self._broadcasts
