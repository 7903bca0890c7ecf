"""The broadcast storage contract: one published message, delivered once to every group.

A *broadcast* is an append-only log of messages; a *group* is a named reader of that log with
its own cursor. Workers of one group share its messages (each message goes to one of them at a
time, with a lease); every group sees every message. Each method below is one atomic step, as
in ``storage/base.py``; ``tests/contract/test_broadcast_contract.py`` holds the suite that
every backend passes.

Positions order messages within one broadcast (a counter on the memory and database backends,
the stream entry id on Redis); they are opaque strings to callers. Times are epoch ms from the
injected clock when there is one, else from the backend.

Delivery of one message to one group, like a job::

    unread --claim--> active --complete--> (done)
                        |  --fail, attempts left--> retrying --due--> active
                        |  --fail for good / stalled past max_stalls--> dead --retry--> retrying
                        '--lease lapsed (claim takes it over, stalls+1)--> active

Every claim of a message by a group gets a new *token*; only the holder of the newest token
may settle it (fencing). Retention (``Retention``) drops the oldest messages at publish; a
message dropped before a group read it, or while its delivery was active or retrying, counts
in that group's ``missed`` and is not delivered (dead letters keep a copy and survive).
"""

from __future__ import annotations

import abc
import enum
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from ..job import AckOutcome


class PublishOutcome(enum.StrEnum):
    PUBLISHED = "published"
    DUPLICATE = "duplicate"  # the id is held by a retained message: nothing written


class SettleKind(enum.StrEnum):
    COMPLETE = "complete"  # handled: the group is done with the message
    RETRY = "retry"  # failed, runs again after ``retry_in`` ms (one attempt used)
    DEAD = "dead"  # failed for good: kept as a dead letter of the group
    RELEASE = "release"  # not started (worker shutting down): back at once, no attempt used


@dataclass(frozen=True, slots=True)
class NewMessage:
    message_id: str
    payload: bytes
    content_type: str


@dataclass(frozen=True, slots=True)
class Retention:
    """Bounds applied at each publish: keep at most ``maxlen`` messages, none older than
    ``max_age`` ms (None: no bound of that kind)."""

    maxlen: int | None = None
    max_age: int | None = None


@dataclass(frozen=True, slots=True)
class Published:
    message_id: str
    outcome: PublishOutcome
    position: str  # of the new message, or of the retained one that holds the id


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message leased to one worker of one group."""

    broadcast: str
    group: str
    position: str
    token: int
    attempt: int  # 1 for the first run; +1 after each failed attempt (not after a stall)
    message_id: str
    payload: bytes
    content_type: str
    published_at: int


@dataclass(frozen=True, slots=True)
class Settle:
    """A worker's verdict on one delivery."""

    kind: SettleKind
    position: str
    token: int
    retry_in: int = 0  # RETRY: ms from now until it is due again
    error: bytes = b""  # RETRY / DEAD: the JSON error record


@dataclass(frozen=True, slots=True)
class GroupStatus:
    group: str
    lag: int  # retained messages the group has not read yet
    active: int  # leased to a worker now
    retrying: int  # failed, waiting for their next attempt
    dead: int  # failed for good (dead letters)
    missed: int  # dropped by retention before the group handled them (since it subscribed)
    position: str  # of the last message the group read ("" before the first)

    @property
    def pending(self) -> int:
        """Read but not yet handled: active plus retrying."""
        return self.active + self.retrying


@dataclass(frozen=True, slots=True)
class DeadMessage:
    position: str
    message_id: str
    payload: bytes
    content_type: str
    published_at: int
    failed_at: int
    attempts: int
    error: bytes  # JSON error record of the last attempt


@dataclass(frozen=True, slots=True)
class DeliveryState:
    """Where one message stands for one group (``delivery``)."""

    state: str  # "unread" | "active" | "retrying" | "dead" | "done" | "missed" | "unknown"
    attempts: int = 0
    progress: bytes | None = None
    error: bytes | None = None


class BroadcastStore(abc.ABC):
    """Storage of broadcasts for one backend; obtained with ``Storage.broadcasts()``."""

    @abc.abstractmethod
    def publish(
        self, name: str, messages: Sequence[NewMessage], retention: Retention
    ) -> list[Published]:
        """Append each message whose id no retained message holds (in order), then apply
        ``retention``, in one atomic step. A duplicate id within the batch is a duplicate."""

    @abc.abstractmethod
    def subscribe(self, name: str, group: str, start: str | int = "now") -> bool:
        """Create ``group`` unless it exists (True when created). ``start``: ``"now"`` (only
        messages published from now on), ``"earliest"`` (every retained message) or an epoch
        ms (messages published at or after it). An existing group keeps its position."""

    @abc.abstractmethod
    def unsubscribe(self, name: str, group: str) -> bool:
        """Forget ``group``: its position, deliveries and dead letters (True when it existed)."""

    @abc.abstractmethod
    def claim(
        self, name: str, group: str, consumer: str, count: int, lease_ms: int, max_stalls: int
    ) -> list[Delivery]:
        """Lease up to ``count`` messages to ``consumer``, in one atomic step, in this order:
        due retries; deliveries whose lease lapsed, in publish order and no more than the
        claim has room for (stalls+1; past ``max_stalls`` they become dead instead, using that
        room too); then unread messages in publish order, moving the group's position. Each
        delivery gets token max(previous + 1, ``token_base()``), so a group subscribed again
        never hands out an old group's token; raises ``LookupError`` for an unknown group."""

    @abc.abstractmethod
    def settle(self, name: str, group: str, verdicts: Sequence[Settle]) -> list[AckOutcome]:
        """Apply each verdict if its token is the delivery's newest (else ``LEASE_LOST``,
        nothing written): COMPLETE -> COMPLETED, RETRY -> RETRYING, DEAD -> FAILED,
        RELEASE -> RELEASED."""

    @abc.abstractmethod
    def heartbeat(
        self, name: str, group: str, leases: Sequence[tuple[str, int]], lease_ms: int
    ) -> list[str]:
        """Extend the given (position, token) leases; returns the positions no longer held."""

    @abc.abstractmethod
    def report(self, name: str, group: str, position: str, token: int, progress: bytes) -> bool:
        """Store a delivery's progress (JSON); False when the token is not the newest."""

    @abc.abstractmethod
    def delivery(self, name: str, group: str, message_id: str) -> DeliveryState:
        """Where the message with ``message_id`` stands for ``group``."""

    @abc.abstractmethod
    def status(self, name: str) -> list[GroupStatus]:
        """Every group of the broadcast, by name."""

    @abc.abstractmethod
    def length(self, name: str) -> int:
        """Messages retained."""

    @abc.abstractmethod
    def names(self) -> list[str]:
        """Broadcasts that have a message or a group, sorted."""

    @abc.abstractmethod
    def dead_letters(self, name: str, group: str, limit: int = 100) -> list[DeadMessage]:
        """The group's dead letters, oldest failure first."""

    @abc.abstractmethod
    def retry_dead(self, name: str, group: str, positions: Sequence[str] | None = None) -> int:
        """Move dead letters (all when None) back to retrying, due now, attempts reset; a
        dead letter whose message retention dropped stays dead. Returns how many moved."""

    @abc.abstractmethod
    def purge_dead(self, name: str, group: str) -> int:
        """Delete the group's dead letters; returns how many."""

    def waiter(self, names: Sequence[str]) -> Waiter:
        """A ``Waiter`` for an idle subscriber worker serving ``names``."""
        return Waiter()


class Waiter:
    """Blocks an idle subscriber worker until a message may be claimable, by an event rather
    than a timer wherever the backend has one (a publish, a dead letter sent back).

    The fetcher calls ``arm()``, then claims once more, then ``wait()``: a publish after
    ``arm()`` ends the wait, and one before it was seen by that claim, so no wake-up is lost
    between an empty claim and the wait. ``interrupt()`` (another thread: shutdown) ends a
    wait at once. This default, for a backend without a signal, is a bounded poll."""

    poll = 0.05  # s: longest sleep of the polling default

    def __init__(self) -> None:
        self._interrupted = threading.Event()

    def arm(self) -> None:  # noqa: B027 - nothing to record for a poll
        """Record the point after which a publish ends ``wait``."""

    def wait(self, timeout: float) -> None:
        """Return after a publish since ``arm()``, an ``interrupt()``, or ``timeout`` s."""
        self._interrupted.wait(min(timeout, self.poll))
        self._interrupted.clear()

    def interrupt(self) -> None:
        self._interrupted.set()

    def close(self) -> None:  # noqa: B027 - nothing held by the default
        """Free what the waiter holds (a connection)."""
