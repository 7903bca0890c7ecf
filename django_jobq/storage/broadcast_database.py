"""Broadcasts on the database backend: a message table, a cursor row per group, a row per
delivery in flight (``broadcast_models.py``).

Each call is one transaction. Claims of one group serialise on its row (``SELECT ... FOR
UPDATE``) because they move its cursor; deliveries are taken with ``SKIP LOCKED`` on
PostgreSQL, so a claim never waits for a worker settling another message. SQLite serialises
writers anyway: every transaction takes the write lock before its first read (as in
``database.py``), so two claims cannot both read the cursor and then both fail to upgrade.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, transaction
from django.db.models import Count

from ..job import AckOutcome
from .broadcast_base import (
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
)

STALLED = b'{"type":"Stalled","message":"lease lapsed too often"}'
POLL = 0.05  # s between looks for new messages (no wake-up signal on this backend yet)
_OUTCOMES = {
    SettleKind.COMPLETE: AckOutcome.COMPLETED,
    SettleKind.RETRY: AckOutcome.RETRYING,
    SettleKind.DEAD: AckOutcome.FAILED,
    SettleKind.RELEASE: AckOutcome.RELEASED,
}


class DatabaseBroadcasts(BroadcastStore):
    def __init__(self, using: str = "default", *, clock: Callable[[], int] | None = None) -> None:
        from .. import broadcast_models as m

        self.using = using
        self.clock = clock
        self._wal_checked = False
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
            raise LookupError(f"broadcast {name!r} has no group {group!r}")
        return row

    # -- producer ---------------------------------------------------------------------------

    def publish(
        self, name: str, messages: Sequence[NewMessage], retention: Retention
    ) -> list[Published]:
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
        return out

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
                        self._bury(d, now, STALLED)
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
            for d in taken:
                d.state, d.token, d.lease_until = "active", d.token + 1, now + lease_ms
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
                rows = rows.filter(seq__in=[int(p) for p in positions])
            alive = self._rows(self.Message).filter(broadcast=name).values("seq")
            return rows.filter(seq__in=alive).update(
                state="retrying", due=self._now(), failures=0, stalls=0, payload=None
            )

    def purge_dead(self, name: str, group: str) -> int:
        with self._atomic():
            self._write_lock()
            deleted, _ = self._deliveries(name, group).filter(state="dead").delete()
            return deleted

    def wait(self, name: str, timeout: float) -> None:
        time.sleep(min(timeout, POLL))
