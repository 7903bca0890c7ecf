"""Broadcasts on the database backend: a message table, a cursor row per group, a row per
delivery in flight (``broadcast_models.py``).

Each call is one transaction. Claims of one group serialise on its row (``SELECT ... FOR
UPDATE``) because they move its cursor; deliveries are taken with ``SKIP LOCKED`` on
PostgreSQL, so a claim never waits for a worker settling another message. SQLite serialises
writers anyway: every transaction takes the write lock before its first read (as in
``database.py``), so two claims cannot both read the cursor and then both fail to upgrade.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Count

from ...errors import UnknownGroup
from ...job import AckOutcome
from ...states import DELIVERY_STALLED_ERROR
from ..base import token_base
from ..broadcast_base import (
    BroadcastStore,
    DeadMessage,
    Delivery,
    DeliveryState,
    GroupStatus,
    NewMessage,
    Published,
    PublishOutcome,
    Retention,
    Settle,
    SettleKind,
    Waiter,
)

logger = logging.getLogger("django_jobq.broadcast")
# Idle subscribers wake on a publish: PostgreSQL by LISTEN/NOTIFY on this channel (sent inside
# the publish transaction, so delivered at commit); SQLite has no such signal between processes,
# so a waiter there re-reads the broadcasts' counters every POLL seconds (a publish in the same
# process wakes it at once).
CHANNEL = "django_jobq_bc"
POLL = 0.05
PG_SLICE = 0.5  # s: longest LISTEN wait between looks for an interrupt (shutdown)
_OUTCOMES = {
    SettleKind.COMPLETE: AckOutcome.COMPLETED,
    SettleKind.RETRY: AckOutcome.RETRYING,
    SettleKind.DEAD: AckOutcome.FAILED,
    SettleKind.RELEASE: AckOutcome.RELEASED,
}


class DatabaseBroadcasts(BroadcastStore):
    def __init__(self, using: str = "default", *, clock: Callable[[], int] | None = None) -> None:
        from ...models import broadcasts as m

        self.using = using
        self.clock = clock
        self._wal_checked = False
        self._local = threading.Condition()  # publishes of this process, for SQLite waiters
        self._local_wakes = 0
        self.Log, self.Message, self.Group, self.Delivery = (
            m.BroadcastLog,
            m.BroadcastMessage,
            m.BroadcastGroup,
            m.BroadcastDelivery,
        )

    # -- helpers ----------------------------------------------------------------------------

    def _now(self) -> int:
        return self.clock() if self.clock else int(time.time() * 1000)

    @property
    def _postgres(self) -> bool:
        return connections[self.using].vendor == "postgresql"

    def _atomic(self) -> Any:
        return transaction.atomic(using=self.using)

    def _write_lock(self) -> None:
        """SQLite: take the write lock before the first read of the transaction (and use WAL,
        so readers never wait for the writer; it persists in the file, as in ``database.py``)."""
        if not self._postgres:
            if not self._wal_checked:
                self._use_wal()
            with connections[self.using].cursor() as cursor:
                table = connections[self.using].ops.quote_name(self.Log._meta.db_table)
                cursor.execute(f"DELETE FROM {table} WHERE id = -1")  # noqa: S608 - no input

    def _use_wal(self) -> None:
        conn = connections[self.using]
        if conn.settings_dict["NAME"] in ("", ":memory:"):
            self._wal_checked = True
            return
        if conn.in_atomic_block:  # always, from _write_lock
            # The pragma cannot change the journal mode inside a transaction: a short
            # connection of its own does it for the file.
            import sqlite3
            from contextlib import closing

            with closing(sqlite3.connect(conn.settings_dict["NAME"], timeout=20)) as own:
                own.execute("PRAGMA journal_mode=WAL")
        self._wal_checked = True

    def _rows(self, model: Any) -> Any:
        return model.objects.using(self.using)

    def _deliveries(self, name: str, group: str, *, lock: bool = False) -> Any:
        rows = self._rows(self.Delivery).filter(broadcast=name, group=group)
        return rows.select_for_update(skip_locked=True) if lock and self._postgres else rows

    def _group(self, name: str, group: str, *, lock: bool = False) -> Any:
        rows = self._rows(self.Group)
        row = (
            (rows.select_for_update() if lock else rows).filter(broadcast=name, group=group).first()
        )
        if row is None:
            raise UnknownGroup(name, group)
        return row

    # -- producer ---------------------------------------------------------------------------

    def publish(
        self, name: str, messages: Sequence[NewMessage], retention: Retention
    ) -> list[Published]:
        if len(messages) == 1:
            try:
                one = self._publish_one(name, messages[0], retention)
            except IntegrityError:  # a concurrent publish of the same id won: decide below
                one = None
            if one is not None:
                return [one]
        with self._atomic():
            self._write_lock()
            now, out, new = self._now(), [], []
            self._rows(self.Log).get_or_create(name=name)
            log = self._rows(self.Log).select_for_update().get(name=name)
            held = dict(
                self._rows(self.Message)
                .filter(broadcast=name, message_id__in=[m.message_id for m in messages])
                .values_list("message_id", "seq")
            )
            for m in messages:
                if m.message_id in held:
                    out.append(
                        Published(m.message_id, PublishOutcome.DUPLICATE, str(held[m.message_id]))
                    )
                    continue
                log.last_seq += 1
                held[m.message_id] = log.last_seq
                new.append(
                    self.Message(
                        broadcast=name,
                        seq=log.last_seq,
                        message_id=m.message_id,
                        payload=m.payload,
                        content_type=m.content_type,
                        published_at=now,
                    )
                )
                out.append(Published(m.message_id, PublishOutcome.PUBLISHED, str(log.last_seq)))
            self._rows(self.Message).bulk_create(new)
            log.save(update_fields=["last_seq"])
            self._trim(name, retention, now)
            if new:
                self._signal(name)
        return out

    def _publish_one(self, name: str, m: NewMessage, retention: Retention) -> Published | None:
        """A single publish in hand-written SQL: what the ORM path does in eight statements
        takes one on PostgreSQL (duplicate check, counter, insert, the retention figures and
        the NOTIFY in one CTE) and four cheap ones on SQLite (no DML in CTEs there, but no
        round trips either), so a single publish costs about what a single enqueue does.
        The ORM path (``publish``'s body) still decides the rare cases: None here when the
        broadcast has no counter row yet (its first publish), and the caller retries there on
        an ``IntegrityError`` (a concurrent publish of the same id inserted it after this
        statement's snapshot). Retention is checked from the oldest retained message: if
        it might pass a bound, ``_trim`` runs in the same transaction, exactly as before. A
        duplicate appends nothing and has no figures to check from, so with any bound set
        ``_trim`` runs for it (exact, and a duplicate publish is rare)."""
        conn = connections[self.using]
        q = conn.ops.quote_name
        log, msg = q(self.Log._meta.db_table), q(self.Message._meta.db_table)
        with self._atomic(), conn.cursor() as cursor:
            self._write_lock()
            now = self._now()  # after the lock: no earlier than the commit we waited for
            row = (
                self._publish_pg(cursor, log, msg, name, m, now)
                if self._postgres
                else self._publish_sqlite(cursor, log, msg, name, m, now)
            )
            if row is None:
                return None
            seq, duplicate, oldest_seq, oldest_at = row
            if duplicate is not None:
                # Nothing appended, but the retention still applies in this step (as on the
                # several-message path): the bounds may be new, or the messages older now.
                if retention.maxlen is not None or retention.max_age is not None:
                    self._trim(name, retention, now)
                return Published(m.message_id, PublishOutcome.DUPLICATE, str(duplicate))
            # seq - oldest + 1 counts the retained messages, or more when some seq is missing:
            # an overestimate only runs _trim, which counts exactly.
            over = (
                retention.maxlen is not None
                and oldest_seq is not None
                and (seq - oldest_seq + 1 > retention.maxlen)
            )
            old = (
                retention.max_age is not None
                and oldest_at is not None
                and (oldest_at < now - retention.max_age)
            )
            if over or old:
                self._trim(name, retention, now)
            transaction.on_commit(self._wake_local, using=self.using)
        return Published(m.message_id, PublishOutcome.PUBLISHED, str(seq))

    @staticmethod
    def _publish_pg(
        cursor: Any, log: str, msg: str, name: str, m: NewMessage, now: int
    ) -> tuple[int, int | None, int | None, int | None] | None:
        """One statement: the counter moves and the row is inserted only when no retained
        message has the id; the oldest message's seq and time come from the snapshot before
        it; ``pg_notify`` runs only when a row was inserted (delivered at commit)."""
        cursor.execute(
            f"""
            WITH dup AS (SELECT seq FROM {msg} WHERE broadcast = %s AND message_id = %s),
            bump AS (
                UPDATE {log} SET last_seq = last_seq + 1
                WHERE name = %s AND NOT EXISTS (SELECT 1 FROM dup) RETURNING last_seq
            ),
            ins AS (
                INSERT INTO {msg} (broadcast, seq, message_id, payload, content_type,
                                   published_at)
                SELECT %s, last_seq, %s, %s, %s, %s FROM bump RETURNING seq
            )
            SELECT (SELECT seq FROM ins), (SELECT seq FROM dup),
                   (SELECT min(seq) FROM {msg} WHERE broadcast = %s),
                   (SELECT min(published_at) FROM {msg} WHERE broadcast = %s),
                   (SELECT count(*) FROM ins CROSS JOIN LATERAL (SELECT pg_notify(%s, %s)) n)
            """,  # noqa: S608 - table names are ours; every value is a parameter
            [name, m.message_id, name, name, m.message_id, m.payload, m.content_type, now,
             name, name, CHANNEL, name],
        )  # fmt: skip
        seq, duplicate, oldest_seq, oldest_at, _ = cursor.fetchone()
        if seq is None and duplicate is None:
            return None  # no counter row yet
        return seq, duplicate, oldest_seq, oldest_at

    @staticmethod
    def _publish_sqlite(
        cursor: Any, log: str, msg: str, name: str, m: NewMessage, now: int
    ) -> tuple[int, int | None, int | None, int | None] | None:
        """The same steps as separate statements, inside the caller's write-locked
        transaction (no other writer can come between them)."""
        cursor.execute(
            f"SELECT seq FROM {msg} WHERE broadcast = %s AND message_id = %s",  # noqa: S608
            [name, m.message_id],
        )
        found = cursor.fetchone()
        if found is not None:
            return 0, found[0], None, None
        cursor.execute(
            f"UPDATE {log} SET last_seq = last_seq + 1 WHERE name = %s RETURNING last_seq",  # noqa: S608
            [name],
        )
        bumped = cursor.fetchone()
        if bumped is None:
            return None  # no counter row yet
        # Each min() alone, so that SQLite answers it from an index instead of a scan.
        cursor.execute(
            f"SELECT (SELECT min(seq) FROM {msg} WHERE broadcast = %s),"  # noqa: S608
            f" (SELECT min(published_at) FROM {msg} WHERE broadcast = %s)",
            [name, name],
        )
        oldest_seq, oldest_at = cursor.fetchone()
        cursor.execute(
            f"INSERT INTO {msg} (broadcast, seq, message_id, payload, content_type,"  # noqa: S608
            " published_at) VALUES (%s, %s, %s, %s, %s, %s)",
            [name, bumped[0], m.message_id, m.payload, m.content_type, now],
        )
        return bumped[0], None, oldest_seq, oldest_at

    def _signal(self, name: str) -> None:
        """Wake idle subscribers of ``name`` when this transaction commits."""
        if self._postgres:
            with connections[self.using].cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, name])
        transaction.on_commit(self._wake_local, using=self.using)

    def _wake_local(self) -> None:
        with self._local:
            self._local_wakes += 1
            self._local.notify_all()

    def _trim(self, name: str, retention: Retention, now: int) -> None:
        rows = self._rows(self.Message).filter(broadcast=name)
        through = 0  # every message with seq <= through goes
        if retention.maxlen is not None:
            cut = rows.order_by("-seq").values_list("seq", flat=True)[
                retention.maxlen : retention.maxlen + 1
            ]
            through = max(through, next(iter(cut), 0))
        if retention.max_age is not None:
            old = rows.filter(published_at__lt=now - retention.max_age).order_by("-seq")
            through = max(through, next(iter(old.values_list("seq", flat=True)[:1]), 0))
        if not through:
            return
        doomed = rows.filter(seq__lte=through)
        for g in self._rows(self.Group).select_for_update().filter(broadcast=name):
            unread = doomed.filter(seq__gt=g.cursor).count()
            live = self._deliveries(name, g.group).filter(seq__lte=through).exclude(state="dead")
            held = live.count()
            live.delete()
            if unread or held:
                g.missed += unread + held
                g.cursor = max(g.cursor, through)
                g.save(update_fields=["missed", "cursor"])
        doomed.delete()

    # -- groups -----------------------------------------------------------------------------

    def subscribe(self, name: str, group: str, start: str | int = "now") -> bool:
        with self._atomic():
            self._write_lock()
            if self._rows(self.Group).filter(broadcast=name, group=group).exists():
                return False
            self._rows(self.Log).get_or_create(name=name)
            log = self._rows(self.Log).select_for_update().get(name=name)
            messages = self._rows(self.Message).filter(broadcast=name)
            if start == "now":
                cursor = log.last_seq
            elif start == "earliest":
                cursor = 0
            else:
                older = messages.filter(published_at__lt=int(start)).order_by("-seq")
                first = messages.order_by("seq").values_list("seq", flat=True).first()
                cursor = older.values_list("seq", flat=True).first() or (
                    first - 1 if first is not None else log.last_seq
                )
            self._rows(self.Group).create(broadcast=name, group=group, cursor=cursor)
            return True

    def unsubscribe(self, name: str, group: str) -> bool:
        with self._atomic():
            self._write_lock()
            self._deliveries(name, group).delete()
            deleted, _ = self._rows(self.Group).filter(broadcast=name, group=group).delete()
            return deleted > 0

    # -- consumer ---------------------------------------------------------------------------

    def claim(
        self, name: str, group: str, consumer: str, count: int, lease_ms: int, max_stalls: int
    ) -> list[Delivery]:
        with self._atomic():
            self._write_lock()
            g, now = self._group(name, group, lock=True), self._now()
            rows = self._deliveries(name, group, lock=True)
            taken = list(rows.filter(state="retrying", due__lte=now).order_by("due", "seq")[:count])
            if len(taken) < count:
                lapsed = rows.filter(state="active", lease_until__lte=now).order_by("seq")
                for d in lapsed[: count - len(taken)]:
                    d.stalls += 1
                    if d.stalls > max_stalls:
                        self._bury(d, now, DELIVERY_STALLED_ERROR)
                    else:
                        taken.append(d)
            if len(taken) < count:
                fresh = list(
                    self._rows(self.Message)
                    .filter(broadcast=name, seq__gt=g.cursor)
                    .order_by("seq")[: count - len(taken)]
                )
                if fresh:
                    created = [
                        self.Delivery(
                            broadcast=name, group=group, seq=m.seq, message_id=m.message_id
                        )
                        for m in fresh
                    ]
                    taken += self._rows(self.Delivery).bulk_create(created)
                    g.cursor = fresh[-1].seq
                    g.save(update_fields=["cursor"])
            if not taken:
                return []
            messages = {
                m.seq: m
                for m in self._rows(self.Message).filter(
                    broadcast=name, seq__in=[d.seq for d in taken]
                )
            }
            out = []
            # max(token + 1, token_base()): a delivery row goes with its group (unsubscribe)
            # and a group subscribed again starts new rows at 0, so its counter alone would
            # hand a worker of the old group the new group's token (see ``token_base``).
            base = token_base()
            for d in taken:
                d.state, d.lease_until = "active", now + lease_ms
                d.token = max(d.token + 1, base)
                m = messages[d.seq]
                out.append(
                    Delivery(
                        name,
                        group,
                        str(d.seq),
                        d.token,
                        d.failures + 1,
                        d.message_id,
                        bytes(m.payload),
                        m.content_type,
                        m.published_at,
                    )
                )
            self._save_many(taken, ["state", "token", "lease_until", "stalls"])
            return out

    def _save_many(self, rows: list[Any], fields: list[str]) -> None:
        existing = [d for d in rows if d.pk is not None]
        if existing:
            self._rows(self.Delivery).bulk_update(existing, fields)

    def _bury(self, d: Any, now: int, error: bytes) -> None:
        m = self._rows(self.Message).filter(broadcast=d.broadcast, seq=d.seq).first()
        d.state, d.failed_at, d.error = "dead", now, error
        if m is not None:
            d.payload, d.content_type, d.published_at = m.payload, m.content_type, m.published_at
        d.save()

    def settle(self, name: str, group: str, verdicts: Sequence[Settle]) -> list[AckOutcome]:
        with self._atomic():
            self._write_lock()
            now, out, done = self._now(), [], []
            # One read for the batch; it waits for rows another transaction holds (no SKIP
            # LOCKED): a heartbeat holding one for a moment must not make a lost lease.
            rows = self._deliveries(name, group).select_for_update()
            held = {(d.seq, d.token): d for d in rows.filter(
                seq__in={int(v.position) for v in verdicts}, state="active")}  # fmt: skip
            for v in verdicts:
                d = held.pop((int(v.position), v.token), None)
                if d is None:
                    out.append(AckOutcome.LEASE_LOST)
                    continue
                if v.kind is SettleKind.COMPLETE:
                    done.append(d.pk)
                elif v.kind is SettleKind.DEAD:
                    d.failures += 1
                    self._bury(d, now, v.error)
                else:
                    if v.kind is SettleKind.RETRY:
                        d.failures, d.error = d.failures + 1, v.error
                    d.state = "retrying"
                    d.due = now + (v.retry_in if v.kind is SettleKind.RETRY else 0)
                    d.save(update_fields=["state", "due", "failures", "error"])
                out.append(_OUTCOMES[v.kind])
            if done:
                self._rows(self.Delivery).filter(pk__in=done).delete()
            return out

    def heartbeat(
        self, name: str, group: str, leases: Sequence[tuple[str, int]], lease_ms: int
    ) -> list[str]:
        lost = []
        with self._atomic():
            self._write_lock()
            until = self._now() + lease_ms
            for position, token in leases:
                rows = self._rows(self.Delivery).filter(
                    broadcast=name, group=group, seq=int(position), token=token, state="active"
                )
                if not rows.update(lease_until=until):
                    lost.append(position)
        return lost

    def report(self, name: str, group: str, position: str, token: int, progress: bytes) -> bool:
        with self._atomic():
            self._write_lock()
            rows = self._rows(self.Delivery).filter(
                broadcast=name, group=group, seq=int(position), token=token, state="active"
            )
            return rows.update(progress=progress) > 0

    # -- inspection -------------------------------------------------------------------------

    def delivery(self, name: str, group: str, message_id: str) -> DeliveryState:
        g = self._group(name, group)
        d = self._deliveries(name, group).filter(message_id=message_id).first()
        if d is not None:
            return DeliveryState(
                d.state,
                d.failures,
                bytes(d.progress) if d.progress is not None else None,
                bytes(d.error) or None,
            )
        m = self._rows(self.Message).filter(broadcast=name, message_id=message_id).first()
        if m is None:
            return DeliveryState("unknown")
        return DeliveryState("done" if m.seq <= g.cursor else "unread")

    def status(self, name: str) -> list[GroupStatus]:
        groups = list(self._rows(self.Group).filter(broadcast=name).order_by("group"))
        if not groups:
            return []
        counts = {
            (r["group"], r["state"]): r["n"]
            for r in self._rows(self.Delivery)
            .filter(broadcast=name)
            .values("group", "state")
            .annotate(n=Count("id"))
        }
        messages = self._rows(self.Message).filter(broadcast=name)
        out = []
        for g in groups:
            lag = messages.filter(seq__gt=g.cursor).count()
            out.append(
                GroupStatus(
                    g.group,
                    lag,
                    counts.get((g.group, "active"), 0),
                    counts.get((g.group, "retrying"), 0),
                    counts.get((g.group, "dead"), 0),
                    g.missed,
                    str(g.cursor) if g.cursor else "",
                )
            )
        return out

    def length(self, name: str) -> int:
        return self._rows(self.Message).filter(broadcast=name).count()

    def names(self) -> list[str]:
        with_groups = set(self._rows(self.Group).values_list("broadcast", flat=True))
        with_messages = set(
            self._rows(self.Log).filter(last_seq__gt=0).values_list("name", flat=True)
        )
        live = {n for n in with_messages if self._rows(self.Message).filter(broadcast=n).exists()}
        return sorted(with_groups | live)

    def dead_letters(self, name: str, group: str, limit: int = 100) -> list[DeadMessage]:
        rows = self._deliveries(name, group).filter(state="dead").order_by("failed_at", "seq")
        return [
            DeadMessage(
                str(d.seq),
                d.message_id,
                bytes(d.payload or b""),
                d.content_type,
                d.published_at,
                d.failed_at,
                d.failures,
                bytes(d.error),
            )
            for d in rows[:limit]
        ]

    def retry_dead(self, name: str, group: str, positions: Sequence[str] | None = None) -> int:
        with self._atomic():
            self._write_lock()
            rows = self._deliveries(name, group).filter(state="dead")
            if positions is not None:
                rows = rows.filter(seq__in=[int(p) for p in positions if p.isdigit()])
            alive = self._rows(self.Message).filter(broadcast=name).values("seq")
            moved = rows.filter(seq__in=alive).update(
                state="retrying", due=self._now(), failures=0, stalls=0, payload=None
            )
            if moved:
                self._signal(name)
            return moved

    def purge_dead(self, name: str, group: str) -> int:
        with self._atomic():
            self._write_lock()
            deleted, _ = self._deliveries(name, group).filter(state="dead").delete()
            return deleted

    def waiter(self, names: Sequence[str]) -> Waiter:
        if self._postgres:
            return _ListenWaiter(self, names)
        return _PollWaiter(self, names)


class _ListenWaiter(Waiter):
    """PostgreSQL: a connection of its own (outside Django's, autocommit) that LISTENs from
    ``arm()`` on, so a NOTIFY sent between the claim and ``wait()`` waits in its buffer."""

    def __init__(self, store: DatabaseBroadcasts, names: Sequence[str]) -> None:
        super().__init__()
        self.store, self.names = store, set(names)
        self._conn: Any = None

    def _listening(self) -> bool:
        """Connect and LISTEN when not yet; False when it had to (nothing buffered yet)."""
        if self._conn is not None and not self._conn.closed:
            return True
        import psycopg

        params = connections[self.store.using].get_connection_params()
        for option in ("cursor_factory", "context"):
            params.pop(option, None)
        self._conn = psycopg.connect(**params, autocommit=True)
        self._conn.execute(f"LISTEN {CHANNEL}")
        return False

    def arm(self) -> None:
        if self._listening():
            for _ in self._conn.notifies(timeout=0):  # older ones: the next claim sees them
                pass

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        try:
            if not self._listening():
                return  # (re)connected: what came before is unknown, so claim again
            while not self._interrupted.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                for note in self._conn.notifies(timeout=min(remaining, PG_SLICE), stop_after=8):
                    if note.payload in self.names:
                        return
        except Exception:
            self.close()  # a lost connection: the next wait reconnects
            raise
        finally:
            self._interrupted.clear()

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                conn.close()
            except Exception as exc:  # noqa: BLE001 - closing a broken connection
                logger.debug("LISTEN connection not closed cleanly: %s", exc)


class _PollWaiter(Waiter):
    """SQLite: no signal crosses processes, so a bounded poll of the broadcasts' counters
    (every ``POLL`` s; a publish of this process wakes it at once)."""

    def __init__(self, store: DatabaseBroadcasts, names: Sequence[str]) -> None:
        super().__init__()
        self.store, self.names = store, list(names)
        self._seen: tuple[Any, ...] = ()

    def _marks(self) -> tuple[Any, ...]:
        rows = self.store._rows(self.store.Log).filter(name__in=self.names)
        return (self.store._local_wakes, sorted(rows.values_list("name", "last_seq")))

    def arm(self) -> None:
        self._seen = self._marks()

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        local = self.store._local
        while not self._interrupted.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            with local:
                if not self._seen or self.store._local_wakes == self._seen[0]:
                    local.wait(min(remaining, POLL))
            if self._marks() != self._seen:
                break
        self._interrupted.clear()

    def interrupt(self) -> None:
        super().interrupt()
        with self.store._local:
            self.store._local.notify_all()
