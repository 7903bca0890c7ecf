"""Broadcasts in process memory (tests, single-process embedding); one lock makes each call
atomic, as the contract in ``broadcast_base.py`` asks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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

_OUTCOMES = {
    SettleKind.COMPLETE: AckOutcome.COMPLETED,
    SettleKind.RETRY: AckOutcome.RETRYING,
    SettleKind.DEAD: AckOutcome.FAILED,
    SettleKind.RELEASE: AckOutcome.RELEASED,
}


@dataclass(slots=True)
class _Message:
    seq: int
    message_id: str
    payload: bytes
    content_type: str
    published_at: int


@dataclass(slots=True)
class _Delivery:
    message: _Message
    state: str = "active"  # active | retrying | dead
    token: int = 0
    failures: int = 0
    stalls: int = 0
    lease_until: int = 0
    due: int = 0
    progress: bytes | None = None
    error: bytes = b""
    failed_at: int = 0


@dataclass(slots=True)
class _Group:
    cursor: int
    missed: int = 0
    deliveries: dict[int, _Delivery] = field(default_factory=dict)


@dataclass(slots=True)
class _Log:
    messages: dict[int, _Message] = field(default_factory=dict)  # insertion order = seq order
    ids: dict[str, int] = field(default_factory=dict)
    last_seq: int = 0
    groups: dict[str, _Group] = field(default_factory=dict)
    wakes: int = 0  # publishes and dead letters sent back: what ends a waiter's wait


class MemoryBroadcasts(BroadcastStore):
    def __init__(self, clock: Callable[[], int] | None = None) -> None:
        self.clock = clock
        self._cond = threading.Condition()
        self._logs: dict[str, _Log] = {}

    def _now(self) -> int:
        return self.clock() if self.clock else int(time.time() * 1000)

    def _log(self, name: str) -> _Log:
        log = self._logs.get(name)
        if log is None:
            log = self._logs[name] = _Log()
        return log

    def _group(self, name: str, group: str) -> _Group:
        found = self._log(name).groups.get(group)
        if found is None:
            raise UnknownGroup(name, group)
        return found

    # -- producer ---------------------------------------------------------------------------

    def publish(
        self, name: str, messages: Sequence[NewMessage], retention: Retention
    ) -> list[Published]:
        with self._cond:
            log, now, out = self._log(name), self._now(), []
            for m in messages:
                held = log.ids.get(m.message_id)
                if held is not None:
                    out.append(Published(m.message_id, PublishOutcome.DUPLICATE, str(held)))
                    continue
                log.last_seq += 1
                log.messages[log.last_seq] = _Message(
                    log.last_seq, m.message_id, m.payload, m.content_type, now
                )
                log.ids[m.message_id] = log.last_seq
                out.append(Published(m.message_id, PublishOutcome.PUBLISHED, str(log.last_seq)))
            self._trim(log, retention, now)
            log.wakes += 1
            self._cond.notify_all()
            return out

    def _trim(self, log: _Log, retention: Retention, now: int) -> None:
        while log.messages:
            seq, oldest = next(iter(log.messages.items()))
            too_many = retention.maxlen is not None and len(log.messages) > retention.maxlen
            too_old = (
                retention.max_age is not None and oldest.published_at < now - retention.max_age
            )
            if not (too_many or too_old):
                return
            del log.messages[seq]
            log.ids.pop(oldest.message_id, None)
            for g in log.groups.values():
                d = g.deliveries.get(seq)
                if seq > g.cursor or (d is not None and d.state != "dead"):
                    g.missed += 1
                if seq > g.cursor:
                    g.cursor = seq  # never read: the group moves past it
                if d is not None and d.state != "dead":
                    del g.deliveries[seq]

    # -- groups -----------------------------------------------------------------------------

    def subscribe(self, name: str, group: str, start: str | int = "now") -> bool:
        with self._cond:
            log = self._log(name)
            if group in log.groups:
                return False
            if start == "now":
                cursor = log.last_seq
            elif start == "earliest":
                cursor = 0
            else:
                older = [s for s, m in log.messages.items() if m.published_at < int(start)]
                cursor = max(older, default=next(iter(log.messages), log.last_seq + 1) - 1)
            log.groups[group] = _Group(cursor=cursor)
            return True

    def unsubscribe(self, name: str, group: str) -> bool:
        with self._cond:
            return self._log(name).groups.pop(group, None) is not None

    # -- consumer ---------------------------------------------------------------------------

    def claim(
        self, name: str, group: str, consumer: str, count: int, lease_ms: int, max_stalls: int
    ) -> list[Delivery]:
        with self._cond:
            log, g, now = self._log(name), self._group(name, group), self._now()
            taken: list[_Delivery] = []
            due = sorted(
                (d for d in g.deliveries.values() if d.state == "retrying" and d.due <= now),
                key=lambda d: (d.due, d.message.seq),
            )
            taken += due[:count]
            # Lapsed leases, no more than the room left (one made a dead letter uses it too).
            lapsed = [d for d in sorted(g.deliveries.values(), key=lambda d: d.message.seq)
                      if d.state == "active" and d.lease_until <= now]  # fmt: skip
            for d in lapsed[: count - len(taken)]:
                d.stalls += 1
                if d.stalls > max_stalls:
                    d.state, d.failed_at = "dead", now
                    d.error = DELIVERY_STALLED_ERROR
                else:
                    taken.append(d)
            for seq, message in log.messages.items():
                if len(taken) >= count:
                    break
                if seq > g.cursor:
                    g.cursor = seq
                    d = g.deliveries[seq] = _Delivery(message)
                    taken.append(d)
            out = []
            for d in taken:
                # From the clock (token_base): a group subscribed again fences off old leases.
                d.token = max(d.token + 1, token_base())
                d.state, d.lease_until = "active", now + lease_ms
                m = d.message
                out.append(
                    Delivery(
                        name,
                        group,
                        str(m.seq),
                        d.token,
                        d.failures + 1,
                        m.message_id,
                        m.payload,
                        m.content_type,
                        m.published_at,
                    )
                )
            return out

    def _held(self, g: _Group, position: str, token: int) -> _Delivery | None:
        d = g.deliveries.get(int(position))
        return d if d is not None and d.state == "active" and d.token == token else None

    def settle(self, name: str, group: str, verdicts: Sequence[Settle]) -> list[AckOutcome]:
        with self._cond:
            g, now, out = self._group(name, group), self._now(), []
            for v in verdicts:
                d = self._held(g, v.position, v.token)
                if d is None:
                    out.append(AckOutcome.LEASE_LOST)
                    continue
                if v.kind is SettleKind.COMPLETE:
                    del g.deliveries[d.message.seq]
                elif v.kind is SettleKind.DEAD:
                    d.state, d.failed_at, d.error, d.failures = "dead", now, v.error, d.failures + 1
                else:
                    if v.kind is SettleKind.RETRY:
                        d.failures, d.error = d.failures + 1, v.error
                    d.state, d.due = (
                        "retrying",
                        now + (v.retry_in if v.kind is SettleKind.RETRY else 0),
                    )
                out.append(_OUTCOMES[v.kind])
            return out

    def heartbeat(
        self, name: str, group: str, leases: Sequence[tuple[str, int]], lease_ms: int
    ) -> list[str]:
        with self._cond:
            g, now, lost = self._group(name, group), self._now(), []
            for position, token in leases:
                d = self._held(g, position, token)
                if d is None:
                    lost.append(position)
                else:
                    d.lease_until = now + lease_ms
            return lost

    def report(self, name: str, group: str, position: str, token: int, progress: bytes) -> bool:
        with self._cond:
            d = self._held(self._group(name, group), position, token)
            if d is not None:
                d.progress = progress
            return d is not None

    # -- inspection -------------------------------------------------------------------------

    def delivery(self, name: str, group: str, message_id: str) -> DeliveryState:
        with self._cond:
            log, g = self._log(name), self._group(name, group)
            for d in g.deliveries.values():
                if d.message.message_id == message_id:
                    return DeliveryState(d.state, d.failures, d.progress, d.error or None)
            seq = log.ids.get(message_id)
            if seq is None:
                return DeliveryState("unknown")
            return DeliveryState("done" if seq <= g.cursor else "unread")

    def status(self, name: str) -> list[GroupStatus]:
        with self._cond:
            log, out = self._log(name), []
            for group, g in sorted(log.groups.items()):
                states = [d.state for d in g.deliveries.values()]
                lag = sum(1 for seq in log.messages if seq > g.cursor)
                out.append(
                    GroupStatus(
                        group,
                        lag,
                        states.count("active"),
                        states.count("retrying"),
                        states.count("dead"),
                        g.missed,
                        str(g.cursor) if g.cursor else "",
                    )
                )
            return out

    def length(self, name: str) -> int:
        with self._cond:
            return len(self._log(name).messages)

    def names(self) -> list[str]:
        with self._cond:
            return sorted(n for n, log in self._logs.items() if log.messages or log.groups)

    def dead_letters(self, name: str, group: str, limit: int = 100) -> list[DeadMessage]:
        with self._cond:
            dead = [d for d in self._group(name, group).deliveries.values() if d.state == "dead"]
            dead.sort(key=lambda d: (d.failed_at, d.message.seq))
            return [
                DeadMessage(
                    str(d.message.seq),
                    d.message.message_id,
                    d.message.payload,
                    d.message.content_type,
                    d.message.published_at,
                    d.failed_at,
                    d.failures,
                    d.error,
                )
                for d in dead[:limit]
            ]

    def retry_dead(self, name: str, group: str, positions: Sequence[str] | None = None) -> int:
        with self._cond:
            log, g, now, moved = self._log(name), self._group(name, group), self._now(), 0
            wanted = None if positions is None else {int(p) for p in positions if p.isdigit()}
            for seq, d in g.deliveries.items():
                if d.state != "dead" or (wanted is not None and seq not in wanted):
                    continue
                if seq not in log.messages:
                    continue  # retention dropped the message: the dead letter stays
                d.state, d.due, d.failures, d.stalls = "retrying", now, 0, 0
                moved += 1
            log.wakes += 1
            self._cond.notify_all()
            return moved

    def purge_dead(self, name: str, group: str) -> int:
        with self._cond:
            g = self._group(name, group)
            dead = [seq for seq, d in g.deliveries.items() if d.state == "dead"]
            for seq in dead:
                del g.deliveries[seq]
            return len(dead)

    def waiter(self, names: Sequence[str]) -> Waiter:
        return _MemoryWaiter(self, names)


class _MemoryWaiter(Waiter):
    """Waits on the store's condition for a publish to one of ``names``."""

    def __init__(self, store: MemoryBroadcasts, names: Sequence[str]) -> None:
        super().__init__()
        self.store, self.names = store, list(names)
        self._seen: list[int] = []
        self._stop = False

    def _marks(self) -> list[int]:
        return [self.store._log(n).wakes for n in self.names]

    def arm(self) -> None:
        with self.store._cond:
            self._seen = self._marks()

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.store._cond:
            while not self._stop and self._marks() == self._seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.store._cond.wait(remaining)
            self._stop = False

    def interrupt(self) -> None:
        with self.store._cond:
            self._stop = True
            self.store._cond.notify_all()
