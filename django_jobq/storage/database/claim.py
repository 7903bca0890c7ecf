"""Claim and acknowledgement: the worker's hot path (claim, heartbeat, complete, fail, release,
postpone, progress reports), flow control (pause, postpone, concurrency and rate limits) as a
claim applies it, and the reaper that hands back jobs whose lease expired."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.db.models import F, OuterRef, Q, Subquery

from ...job import EVENT_DATA_MAX, LOG_LINES, AckOutcome, ClaimedJob
from ...states import GROUP_SCAN, PROMOTE_LIMIT, STALLED_ERROR, JobState
from ..base import Ack, ClaimBatch, ReapReport, token_base
from .core import (
    CONFIG_COLUMNS,
    ORDER,
    RETURNING,
    _chunks,
    _dt,
    _raw_ms,
    _storable_json,
    not_before,
)
from .enqueue import Enqueue
from .wakeups import CHANNEL

ACK_CHUNK = 1000  # completions per statement
_STALLED = json.loads(STALLED_ERROR)  # a JSON column holds the record
# Results up to this many bytes ride in their completion's NOTIFY (base64: ~5.5 kB, with the
# names well under the 8,000-byte payload limit); larger ones are read by their waiters.
CARRIED_RESULT = 4096
# ``RETURNING``'s columns qualified by the claim's alias ``j`` (built once, not per claim).
_J_RETURNING = ", ".join(f"j.{c.strip()}" for c in RETURNING[len("RETURNING ") :].split(","))


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


class ClaimAck(Enqueue):
    """The worker's transitions, each guarded by the job's lease token."""

    def wait_and_claim(
        self, queue: str, worker_id: str, count: int, lease_ms: int, timeout: float
    ) -> ClaimBatch | None:
        """The wait, then the claim from the same thread as soon as it ends: the worker's
        loop needs no claim of its own after a wake-up, nor an empty one after each job it
        took (its next wait ends at once when this claim may have left jobs behind: a full
        batch, or a commit since the claim began)."""
        deadline = time.monotonic() + timeout
        while True:
            if self._wait_for_work(deadline - time.monotonic(), worker_id):
                return ClaimBatch()  # stopping: claim nothing
            batch = self.claim(queue, worker_id, count, lease_ms)
            left = deadline - time.monotonic()
            # A wait capped short of ``timeout`` (RECHECK, an unwatched SQLite's polling)
            # that found nothing goes on waiting, unless a due time comes before the end.
            due = batch.next_due_in is not None and batch.next_due_in / 1000 < left
            if batch.jobs or due or left <= 0:
                break
        if len(batch.jobs) >= count:
            with self._cond:
                self._claim_seen[worker_id] = -1  # no count matches: the next wait claims
        return batch

    def claim(self, queue: str, worker_id: str, count: int, lease_ms: int) -> ClaimBatch:
        # The first claim since the worker's last wait fixes the generation that wait compares
        # with: a job committed after this point wakes it even if this claim missed the job.
        since = self._snapshot(work=True)
        with self._cond:
            self._claim_seen.setdefault(worker_id, since)
        now = self._now()
        if self.vendor == "postgresql":
            # The gate and the claim in one statement: a worker woken by an enqueue's NOTIFY
            # claims in one round trip (the request/response path). It claims only when the
            # gate, in the same snapshot, finds no flow control and nothing due to promote;
            # otherwise its gate answers and the paths below take over.
            flow, due, next_run, rows = self._gated_claim(queue, worker_id, count, lease_ms, now)
            next_due_in = None if next_run is None else max(next_run - now, 0)
            if rows or (not due and not flow.limited and flow.held(now) is None):
                # (nothing claimed: nothing queued, or other claimers hold it, SKIP LOCKED)
                jobs = self._claimed(queue, rows, worker_id, now, logged=True)
                return ClaimBatch(jobs, next_due_in)
            # Held, limited or due: whether a job is queued only matters from here on.
            queued = flow.held(now) is None and not due and self._queued(queue)
        else:
            flow, queued, due, next_run = self._gate(queue, now)
        held = flow.held(now)
        if held is not None:
            return held
        next_due_in = None if next_run is None else max(next_run - now, 0)
        if not queued and not due:
            # Nothing to take: answer from a read, without queueing for SQLite's single write
            # lock (idle workers on several queues would otherwise serialise every writer).
            return ClaimBatch(next_due_in=next_due_in)
        if self.vendor == "postgresql" and not flow.limited and not due:
            # The drain's case: one statement picks, activates and logs the batch, atomic on
            # its own (no BEGIN/COMMIT round trips); nothing was promoted, so the gate's next
            # due time still holds.
            rows = self._claim_statement(queue, worker_id, count, lease_ms, now)
            return ClaimBatch(self._claimed(queue, rows, worker_id, now, logged=True), next_due_in)
        with self._lazy_sync(), self._atomic():
            self._write_lock()
            now = self._now()  # after the lock: no earlier than the commit we waited for
            if flow.limited:
                # Re-read under the row lock: limits are counted by one claimer at a time.
                flow = self._flow(queue, lock=True)
                held = flow.held(now)
                if held is not None:
                    return held
                return self._claim_limited(queue, worker_id, count, lease_ms, flow, now)
            if due:  # the gate saw due jobs: promote them, then the next due time moved
                self._promote_due(queue, now, PROMOTE_LIMIT)
                next_due_in = self._next_due_in(queue, now)
            rows = self._activate(queue, worker_id, now, lease_ms, limit=count)
            jobs = self._claimed(queue, rows, worker_id, now)
            return ClaimBatch(jobs, next_due_in)

    @contextmanager
    def _lazy_sync(self) -> Iterator[None]:
        """SQLite: the claim's commit without its own fsync (``synchronous=NORMAL`` in WAL mode
        for this one transaction), for the reason ``_claim_statement`` gives for PostgreSQL:
        the WAL is appended in order, so the next fully synced commit (a verdict, an enqueue)
        makes the claim durable too, and a claim lost to a power cut is a claim that did not
        happen. Only outside a caller's transaction, and only in WAL mode."""
        conn = connections[self.using]
        if self.vendor != "sqlite" or conn.in_atomic_block or not self._wal_checked:
            yield
            return
        with conn.cursor() as cursor:
            cursor.execute("PRAGMA synchronous")
            before = cursor.fetchone()[0]
            cursor.execute("PRAGMA synchronous = NORMAL")
        try:
            yield
        finally:
            with conn.cursor() as cursor:
                cursor.execute(f"PRAGMA synchronous = {int(before)}")

    def _gate(self, queue: str, now: int) -> tuple[_Flow, bool, bool, int | None]:
        """In one read: the queue's flow control, whether a job is queued, whether a scheduled
        one is due (a claim must promote it first), and the earliest due time (epoch ms)."""
        t = self._table
        waiting = "j.queue = %s AND j.state IN ('scheduled', 'retrying')"
        row = self._sql(
            f"SELECT c.paused, c.postponed_until, c.concurrency, c.rate_max, c.rate_window, "
            f"c.group_rate_max, c.group_rate_window, "
            f"EXISTS (SELECT 1 FROM {t} j WHERE j.queue = %s AND j.state = 'queued'), "
            f"EXISTS (SELECT 1 FROM {t} j WHERE {waiting} AND j.run_at <= %s), "
            f"(SELECT MIN(j.run_at) FROM {t} j WHERE {waiting} AND j.run_at IS NOT NULL) "
            "FROM (SELECT 1 AS one) d "
            f"LEFT JOIN {self._quoted(self.QueueConfig)} c ON c.name = %s",
            [queue, queue, self._param_dt(now), queue, queue],
        )[0]
        return _Flow.from_row(row), bool(row[7]), bool(row[8]), _raw_ms(row[9])

    def _activate_ctes(self) -> str:
        """The ``claimed`` and ``logged`` CTEs both PostgreSQL claims end with (rows of a
        ``picked`` CTE to active, with their ``active`` events). Their parameters, in order:
        worker, token base twice, started at, lease deadline, queue, at, worker."""
        return (
            f"claimed AS (UPDATE {self._table} j SET state = 'active', worker = %s, "
            "token = CASE WHEN j.token >= %s THEN j.token + 1 ELSE %s END, "
            "attempts = j.attempts + 1, started_at = GREATEST(%s, j.created_at), "
            "lease_deadline = %s "
            f"FROM picked WHERE j.id = picked.id AND j.state = 'queued' RETURNING {_J_RETURNING}), "
            f"logged AS (INSERT INTO {self._event_table} (job_id, queue, kind, at, worker, "
            "stream_id) SELECT id, %s, 'active', GREATEST(%s, created_at), %s, '' FROM claimed), "
        )

    def _quick_cte(self) -> str:
        """The ``quick`` CTE both PostgreSQL claims end with: their transaction's commit does
        not wait for the WAL flush (``synchronous_commit`` off until it ends; the reason is
        in ``_claim_statement``'s docstring). Only when the claim is its own transaction: in
        a caller's, the setting would also relax the caller's other writes (a verdict, an
        enqueue, its own rows), so there the claim commits as durably as they do."""
        if connections[self.using].in_atomic_block:
            return "quick AS (SELECT 'on' AS off) "
        return "quick AS (SELECT set_config('synchronous_commit', 'off', true) AS off) "

    def _gated_claim(
        self, queue: str, worker_id: str, count: int, lease_ms: int, now: int
    ) -> tuple[_Flow, bool, int | None, list[Any]]:
        """PostgreSQL: ``_gate`` and ``_claim_statement`` as one statement. The claim's
        ``picked`` takes rows only when the gate row (same snapshot) shows no config that
        holds or limits the queue and no scheduled job due (those need the transactional
        path: limits counted under the config row lock, due jobs promoted first, so a due
        job of a better priority is not passed over). Returns the gate's answers (flow, a
        job due, the earliest due time) and the claimed rows (``RETURNING``'s columns).

        Leaner than ``_gate`` because it runs at every wake-up of a request/response: the
        due flag is the earliest due time compared with now (one index probe, not two),
        and it has no "anything queued" probe (an empty ``picked`` says so when the gate
        lets it run; the rare held or limited answer asks ``_queued`` afterwards). Each
        probe of the jobs table costs planning time on every call, more than its run; so
        does each mention of a probe's column in the gate itself (the planner copies the
        probe into each), hence "due" is worked out twice from ``next_run``: in ``picked``,
        which reads the gate's row, and here."""
        t, base, at = self._table, token_base(), self._param_dt(now)
        rows = self._pg_sql(
            "WITH gate AS (SELECT c.paused, c.postponed_until, c.concurrency, c.rate_max, "
            "c.rate_window, c.group_rate_max, c.group_rate_window, "
            f"(SELECT j.run_at FROM {t} j WHERE j.queue = %s "
            "AND j.state IN ('scheduled', 'retrying') AND j.run_at IS NOT NULL "
            "ORDER BY j.run_at LIMIT 1) AS next_run FROM (SELECT 1 AS one) d "
            f"LEFT JOIN {self._quoted(self.QueueConfig)} c ON c.name = %s), "
            f"picked AS (SELECT id FROM {t} WHERE queue = %s AND state = 'queued' AND "
            "(SELECT NOT COALESCE(g.next_run <= %s, false) AND NOT COALESCE(g.paused, false) AND "
            "(g.postponed_until IS NULL OR g.postponed_until <= %s) AND g.concurrency IS NULL "
            "AND g.rate_max IS NULL AND g.group_rate_max IS NULL FROM gate g) "
            f"{ORDER} LIMIT %s FOR UPDATE SKIP LOCKED), "
            + self._activate_ctes()
            + self._quick_cte()
            + "SELECT gate.*, claimed.* FROM gate CROSS JOIN quick LEFT JOIN claimed ON true",
            [queue, queue, queue, at, at, count, worker_id, base, base, at,
             self._param_dt(now + lease_ms), queue, at, worker_id],
        )  # fmt: skip
        gate = rows[0]
        claimed = [r[8:] for r in rows if r[8] is not None]
        next_run = _raw_ms(gate[7])
        return _Flow.from_row(gate), next_run is not None and next_run <= now, next_run, claimed

    def _queued(self, queue: str) -> bool:
        """Whether ``queue`` has a queued job (locked ones too)."""
        return bool(
            self._sql(
                f"SELECT 1 FROM {self._table} WHERE queue = %s AND state = 'queued' LIMIT 1",
                [queue],
            )
        )

    def _claim_statement(
        self, queue: str, worker_id: str, count: int, lease_ms: int, now: int
    ) -> list[Any]:
        """PostgreSQL: the best ``count`` queued jobs to active and their ``active`` events, in
        one statement. ``SKIP LOCKED``: concurrent claimers take disjoint rows and never wait;
        a row another claimer activated meanwhile fails the re-checked ``state = 'queued'``.
        The token rule is ``_activate``'s.

        Its commit does not wait for the WAL flush (``synchronous_commit`` off for this
        statement's transaction only), which saves a disk flush per batch: WAL is written in
        order, so the flush of any later commit (the verdict, an enqueue) makes the claim
        durable too, and a claim lost to a server crash before that is only a claim that did
        not happen: the job is queued again, and the lost run's verdict fails its lease check
        because the next claim's token is drawn from the clock (``token_base``)."""
        t, base, at = self._table, token_base(), self._param_dt(now)
        return self._pg_sql(
            f"WITH picked AS (SELECT id FROM {t} WHERE queue = %s AND state = 'queued' {ORDER} "
            "LIMIT %s FOR UPDATE SKIP LOCKED), "
            + self._activate_ctes()
            + self._quick_cte()
            + "SELECT claimed.* FROM claimed, quick",
            [queue, count, worker_id, base, base, at, self._param_dt(now + lease_ms),
             queue, at, worker_id],
        )  # fmt: skip

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
            f"attempts = attempts + 1, started_at = {self._greatest}(%s, created_at), "
            f"lease_deadline = %s WHERE {where} " + RETURNING,
            [worker_id, base, base, self._param_dt(now), self._param_dt(now + lease_ms), *params],
        )

    def _claimed(
        self, queue: str, rows: list[Any], worker_id: str, now: int, *, logged: bool = False
    ) -> list[ClaimedJob]:
        """The claimed rows as jobs, in claim order; their events too unless ``logged``."""
        rows.sort(key=lambda r: (r[9], r[10], r[0]))  # RETURNING has no order: claim order
        if not logged:  # each at its row's start: now, or a later creation (``_greatest``)
            starts: dict[int, list[tuple[int, str, str]]] = {}
            for r in rows:
                at = not_before(now, r[12])
                starts.setdefault(at, []).append((r[0], queue, r[1]))
            for at, items in starts.items():
                self._events(items, "active", at, worker_id)
        # The wait (metrics: jobq_job_wait_seconds) runs from enqueue, or from the due time
        # when that is later (a delayed job, a retry), to this claim, by the storage's clock.
        return [
            ClaimedJob(queue, r[1], bytes(r[2]), r[3], r[4], r[5], r[6], r[7], r[8],
                       waited_ms=max(now - max(_raw_ms(r[12]) or now, _raw_ms(r[13]) or 0), 0))
            for r in rows
        ]  # fmt: skip

    def _claim_limited(
        self, queue: str, worker_id: str, count: int, lease_ms: int, flow: _Flow, now: int
    ) -> ClaimBatch:
        """A claim under ``QueueLimits`` (the caller holds the queue's config row lock)."""
        self._promote_due(queue, now, PROMOTE_LIMIT)
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
        scheduled, due when their group's oldest claim in the window leaves it (as on memory
        and Redis; with a lowered ``group_rate_max`` the window may hold more claims than the
        budget, and the group may still be over it then: the next claim defers again), and
        keep their order key."""
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
                    due = window[0] + flow.group_rate_window
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
                    "has_successor", "started_at", "cap", "content_type").get()
        )  # fmt: skip

    def complete(self, queue: str, job_id: str, token: int, result: bytes) -> AckOutcome:
        now = self._now()
        with self._atomic():
            row = self._take_lease(queue, job_id, token, result=result)
            if row is None:
                return AckOutcome.LEASE_LOST
            now = not_before(now, row.get("started_at"))  # one stamp for the row and its event
            self._jobs().filter(pk=row["id"]).update(
                **self._finish_fields(row, JobState.COMPLETED, now)
            )
            self._finished(row, queue, job_id, "completed", now, result)
            return AckOutcome.COMPLETED

    def _finished(
        self, row: Any, queue: str, job_id: str, kind: str, now: int, data: bytes | None = None
    ) -> None:
        """After a row reached a final state: its event (carrying ``data``, the result or
        error), its waiters, a freed slot, and its successor's release (in this same
        transaction)."""
        if kind == "failed":  # before a successor renames the row
            self._record_failure_call(queue, job_id, row["id"], now)
        carried = [(data, row.get("content_type") or "json")] if data is not None else None
        self._events([(row["id"], queue, job_id)], kind, now, row.get("worker", ""), carried)
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
            now = not_before(now, row.get("started_at"))  # one stamp for the row and its event
            if permanent or row["attempts"] >= row["max_attempts"]:
                fields = self._finish_fields(row, final, now)
                self._jobs().filter(pk=row["id"]).update(**fields)
                self._finished(row, queue, job_id, final.value, now, error)
                return AckOutcome(final.value)
            due = now + max(retry_in or 0, 0)
            self._jobs().filter(pk=row["id"]).update(state=JobState.RETRYING, run_at=_dt(due))
            self._events([(row["id"], queue, job_id)], "retrying", now, row["worker"],
                         [(error, "json")])  # fmt: skip
            self._signal(f"w {queue}")
            return AckOutcome.RETRYING

    def ack_many(self, queue: str, acks: Sequence[Ack]) -> list[AckOutcome]:
        """One transaction for the batch (each verdict is still lease-checked on its own): a
        worker's completions cost one commit per batch, not one per job."""
        completes = [a for a in acks if a.kind == "complete"]
        done: dict[tuple[str, int], AckOutcome] = {}
        if completes and self.vendor == "postgresql":
            # One statement per chunk, atomic on its own: no BEGIN/COMMIT round trips, and a
            # completion never waits for the other verdicts of the batch. What it leaves
            # (lost leases, runs with a successor to release) goes the transactional way.
            for chunk in _chunks(completes, ACK_CHUNK):
                done.update(self._complete_statement(queue, chunk))
            completes = [a for a in completes if (a.job_id, a.token) not in done]
            completes = list({(a.job_id, a.token): a for a in completes}.values())
            if not completes and all(a.kind == "complete" for a in acks):
                return self._answers(queue, acks, done)
        with self._atomic():
            self._write_lock()
            if completes:
                done.update(self._complete_many(queue, completes))
            return self._answers(queue, acks, done)

    def _answers(
        self, queue: str, acks: Sequence[Ack], done: dict[tuple[str, int], AckOutcome]
    ) -> list[AckOutcome]:
        """The outcome of each ack in order: completions from ``done`` (a repeat within the
        batch finds its job settled), the other verdicts applied one by one here."""
        out = []
        settled: set[tuple[str, int]] = set()
        for ack in acks:
            if ack.kind == "complete":
                key = (ack.job_id, ack.token)
                out.append(AckOutcome.LEASE_LOST if key in settled else done[key])
                settled.add(key)
            else:
                out.extend(super().ack_many(queue, [ack]))
        return out

    def _complete_statement(
        self, queue: str, acks: Sequence[Ack]
    ) -> dict[tuple[str, int], AckOutcome]:
        """PostgreSQL: complete every ack whose lease holds, in one statement: lock and check
        the rows against their tokens, write state, result and expiry, append the events, and
        notify each job's waiters (``pg_notify`` is sent at commit) with the outcome itself
        when it is small (``_carried_outcome``: a request/response reads no row). Runs with
        a blocked successor are left out (``_complete_many`` releases the successor in the
        same transaction); so is a repeat of an ack within the batch. Returns the completed
        ones."""
        now = self._now()
        seen: set[tuple[str, int]] = set()
        ids: list[str] = []
        tokens: list[int] = []
        bodies: list[bytes] = []
        for ack in acks:
            if (ack.job_id, ack.token) not in seen:
                seen.add((ack.job_id, ack.token))
                ids.append(ack.job_id)
                tokens.append(ack.token)
                bodies.append(ack.body)
        t, at = self._table, self._param_dt(now)
        if len(ids) == 1:
            # A lone completion (every request/response): plain equalities, which the
            # planner matches to an index on (queue, job_id) or (queue, state) even with no
            # statistics (a new table, autovacuum off), where the join with ``unnest`` had
            # it read every row of the queue, finished ones included, to find one.
            head = (
                "WITH old AS (SELECT j.id, j.waiters, %s::bytea AS result FROM "
                f"{t} j WHERE j.queue = %s AND j.job_id = %s AND j.token = %s "
            )
            head_params: list[Any] = [bodies[0], queue, ids[0], tokens[0]]
        else:
            head = (
                "WITH v (job_id, token, result) AS "
                "(SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bytea[])), "
                f"old AS (SELECT j.id, j.waiters, v.result FROM {t} j JOIN v "
                "ON j.job_id = v.job_id AND j.token = v.token WHERE j.queue = %s "
                "AND j.job_id = ANY(%s::text[]) "
            )
            head_params = [ids, tokens, bodies, queue, ids]
        rows = self._pg_sql(
            head + "AND j.state = 'active' AND NOT j.has_successor FOR UPDATE OF j), "
            f"done AS (UPDATE {t} j SET state = 'completed', result = old.result, "
            "finished_at = GREATEST(%s, j.started_at), "
            "expires_at = %s + j.result_ttl * interval '1 millisecond', "
            "lease_deadline = NULL, waiters = 0 FROM old WHERE j.id = old.id "
            "RETURNING j.id, j.job_id, j.token, j.worker, old.waiters, old.result, j.result_ttl, "
            "j.finished_at, j.content_type), "
            # The result the event carries (Event.data), as events.event_detail writes it.
            f"logged AS (INSERT INTO {self._event_table} (job_id, queue, kind, at, worker, "
            "stream_id, detail) SELECT id, %s, 'completed', finished_at, worker, '', "
            "CASE WHEN octet_length(result) > %s THEN '{\"omitted\": true}'::jsonb ELSE "
            "jsonb_build_object('raw', encode(result, 'base64'), 'ct', content_type) END "
            "FROM done), "
            # The waiters' signal: the row, its expiry and its result ride along when they
            # fit well inside NOTIFY's 8,000-byte payload (the waiter then needs no read).
            # MATERIALIZED: built once per row; inlined, each of the two mentions of ``msg``
            # below was a copy of it to plan and to run (the base64 of the result twice).
            "said AS MATERIALIZED (SELECT d.job_id, d.token, d.waiters, "
            "'d ' || %s || ' ' || d.job_id || CASE WHEN octet_length(d.result) <= %s "
            "THEN ' ' || d.id || ' ' || (%s + d.result_ttl) || ' ' || "
            "encode(d.result, 'base64') ELSE '' END AS msg "
            "FROM done d) "
            "SELECT s.job_id, s.token, CASE WHEN s.waiters > 0 THEN s.msg END, "
            "CASE WHEN s.waiters > 0 THEN pg_notify(%s, s.msg) END, "
            f"(SELECT c.concurrency FROM {self._quoted(self.QueueConfig)} c WHERE c.name = %s) "
            "FROM said s",
            [*head_params, at, at, queue, EVENT_DATA_MAX, queue, CARRIED_RESULT, now, CHANNEL,
             queue],  # fmt: skip
        )  # fmt: skip
        said = [r[2] for r in rows if r[2] is not None]
        if said:  # this process's waiters (others get the NOTIFY)
            transaction.on_commit(lambda: self._wake_done(said), using=self.using)
        if rows and rows[0][4] is not None:
            self._signal(f"w {queue}")  # a capped queue's slots were freed
        return {(r[0], r[1]): AckOutcome.COMPLETED for r in rows}

    def _complete_many(self, queue: str, acks: Sequence[Ack]) -> dict[tuple[str, int], AckOutcome]:
        """Set-based ``complete`` for a batch, inside the caller's transaction: one locked read,
        one update statement executed per row (SQLite runs it in C, psycopg pipelines it), one
        insert of events per worker. Each job is still checked against its own lease token.
        Raw SQL: on SQLite this is every completion's path, and model instances cost more than
        the statements."""
        now = self._now()
        ids = list(dict.fromkeys(a.job_id for a in acks))
        rows: dict[str, Sequence[Any]] = {}
        for chunk in _chunks(ids):
            marks = ", ".join(["%s"] * len(chunk))
            for row in self._sql(
                "SELECT id, job_id, state, token, result_ttl, waiters, worker, has_successor, "
                f"started_at, content_type FROM {self._table} WHERE queue = %s AND job_id IN "
                f"({marks})"
                f"{self._for_update}",
                [queue, *chunk],
            ):
                rows[row[1]] = row
        out: dict[tuple[str, int], AckOutcome] = {}
        changed: list[Sequence[Any]] = []
        updates: list[tuple[Any, ...]] = []
        finished = self._param_dt(now)
        by_stamp: dict[tuple[str, int], list[tuple[int, str, str]]] = {}  # (worker, at): events
        carried: dict[tuple[str, int], list[tuple[bytes | None, str]]] = {}  # their results
        for ack in acks:
            if (ack.job_id, ack.token) in out:  # a repeat: ack_many answers it
                continue
            row = rows.get(ack.job_id)
            if row is None or row[2] != JobState.ACTIVE or row[3] != ack.token:
                out[(ack.job_id, ack.token)] = AckOutcome.LEASE_LOST
                continue
            changed.append(row)
            # Started later by this clock (``_greatest``): finished then, not before.
            at = not_before(now, row[8])
            stamp = finished if at == now else self._param_dt(at)
            updates.append((ack.body, stamp, self._param_dt(now + row[4]), row[0]))
            by_stamp.setdefault((row[6], at), []).append((row[0], queue, row[1]))
            carried.setdefault((row[6], at), []).append((ack.body, row[9] or "json"))
            out[(ack.job_id, ack.token)] = AckOutcome.COMPLETED
        if not changed:
            return out
        with connections[self.using].cursor() as cursor:
            cursor.executemany(
                f"UPDATE {self._table} SET state = 'completed', result = %s, finished_at = %s, "
                "expires_at = %s, lease_deadline = NULL, waiters = 0 WHERE id = %s",
                updates,
            )
        for (worker, at), items in by_stamp.items():
            self._events(items, "completed", at, worker, carried[(worker, at)])
        for row in changed:
            if row[5]:
                self._signal(f"d {queue} {row[1]}")
        if self._sql(
            f"SELECT 1 FROM {self._quoted(self.QueueConfig)} WHERE name = %s "
            "AND concurrency IS NOT NULL",
            [queue],
        ):
            self._signal(f"w {queue}")  # slots were freed
        for row in changed:
            if row[7]:
                self._release_successor(queue, row[1], row[0], now)
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
                self._events(target, "progress", now, row["worker"], [(progress, "json")])
            if log is not None:
                self._events(target, "log", now, row["worker"])
            return True

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
                        stalls=F("stalls") + 1, error=_STALLED, **fields
                    )
                    self._finished(row, queue, row["job_id"], "failed", now, STALLED_ERROR)
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
