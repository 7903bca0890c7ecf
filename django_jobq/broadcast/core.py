"""Broadcasts: a message published once is handled once by every subscriber group.

``Broadcast("user-events").publish(payload, id=...)`` appends to the broadcast's log;
``@subscriber("user-events", group="billing")`` registers a handler that ``runworker`` runs
(``subscribers.py``). Workers of one group share its messages; each group sees every message,
with the at-least-once, retry, dead-letter and progress rules of jobs. Semantics, retention and
measured rates: ``docs/broadcast.md``. Storage: ``storage/broadcast_base.py``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..backend import get_storage
from ..conf import jobq_settings
from ..errors import ConfigurationError, InvalidOption, PayloadTooLarge
from ..job import Job
from ..serde import get_serde
from ..storage.broadcast_base import (
    BroadcastStore,
    DeadMessage,
    DeliveryState,
    GroupStatus,
    NewMessage,
    Published,
    PublishOutcome,
    Retention,
)
from ..tasks.registry import _qualname
from ..validation import (
    validate_job_id,
    validate_positive_int,
    validate_positive_ms,
    validate_queue_name,
)

__all__ = [
    "Broadcast",
    "DeadMessage",
    "DeliveryState",
    "GroupStatus",
    "Published",
    "PublishOutcome",
    "Subscription",
    "subscriber",
    "subscribers",
]

SubscriberHandler = Callable[[Job], Any]


def _maxlen(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOption(f"maxlen must be an integer >= 1 or None, got {value!r}")
    return value


def _max_age(value: object) -> int | None:
    if isinstance(value, dt.timedelta):
        value = int(value.total_seconds() * 1000)
    return None if value is None else validate_positive_ms("max_age", value)


def _start(start: str | int | dt.datetime) -> str | int:
    """``"now"``, ``"earliest"``, or a moment (aware datetime, or epoch ms) as epoch ms."""
    if start in ("now", "earliest"):
        return start  # type: ignore[return-value]
    if isinstance(start, dt.datetime):
        if start.tzinfo is None:
            raise InvalidOption("start must be a timezone-aware datetime")
        return int(start.timestamp() * 1000)
    if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
        return start
    raise InvalidOption(f"start must be 'now', 'earliest', a datetime or epoch ms, got {start!r}")


class Broadcast:
    """A named broadcast on the configured storage (or ``storage=``)."""

    def __init__(
        self,
        name: str,
        *,
        storage: Any = None,
        serde: str | None = None,
        maxlen: int | None | str = "default",
        max_age: int | dt.timedelta | None | str = "default",
        max_payload_bytes: int | None = None,
    ) -> None:
        conf = jobq_settings()
        self.name = validate_queue_name(name)
        self.storage = storage if storage is not None else get_storage()
        self.serde = get_serde(serde or conf["SERDE"])
        self.max_payload_bytes = max_payload_bytes or conf["MAX_PAYLOAD_BYTES"]
        defaults = conf["BROADCASTS"]
        self.retention = Retention(
            _maxlen(defaults["maxlen"] if maxlen == "default" else maxlen),
            _max_age(defaults["max_age"] if max_age == "default" else max_age),
        )

    def __repr__(self) -> str:
        return f"<Broadcast {self.name!r} on {type(self.storage).__name__}>"

    @property
    def store(self) -> BroadcastStore:
        return self.storage.broadcasts()

    # -- producing --------------------------------------------------------------------------

    def _message(self, message_id: str | None, payload: Any) -> NewMessage:
        message_id = validate_job_id(message_id if message_id is not None else uuid.uuid4().hex)
        body = self.serde.dumps(payload)
        if len(body) > self.max_payload_bytes:
            raise PayloadTooLarge(len(body), self.max_payload_bytes)
        return NewMessage(message_id, body, self.serde.name)

    def publish(self, payload: Any = None, id: str | None = None) -> Published:  # noqa: A002
        """Publish one message to every group, once per ``id`` while a message with that id
        is retained (a repeat returns ``duplicate`` and writes nothing). Without ``id`` a
        random one is used (no deduplication)."""
        return self.store.publish(self.name, [self._message(id, payload)], self.retention)[0]

    def publish_many(self, items: Sequence[tuple[str | None, Any]]) -> list[Published]:
        """Publish (id, payload) pairs in one atomic step; all are checked before any is sent."""
        messages = [self._message(i, p) for i, p in items]
        return self.store.publish(self.name, messages, self.retention) if messages else []

    # -- groups -----------------------------------------------------------------------------

    def subscribe(self, group: str, start: str | int | dt.datetime = "now") -> bool:
        """Create ``group`` unless it exists (True when created). It first sees the messages
        published from ``start`` on: ``"now"``, ``"earliest"`` (every retained message) or a
        moment; an existing group keeps its place."""
        return self.store.subscribe(self.name, validate_queue_name(group), _start(start))

    def unsubscribe(self, group: str) -> bool:
        """Forget ``group``, its pending deliveries and its dead letters."""
        return self.store.unsubscribe(self.name, validate_queue_name(group))

    # -- inspection and operations ----------------------------------------------------------

    def status(self) -> list[GroupStatus]:
        """Per group: lag (unread messages), active, retrying, dead and missed counts."""
        return self.store.status(self.name)

    def length(self) -> int:
        return self.store.length(self.name)

    def delivery(self, group: str, message_id: str) -> DeliveryState:
        return self.store.delivery(
            self.name, validate_queue_name(group), validate_job_id(message_id)
        )

    def dead_letters(self, group: str, limit: int = 100) -> list[DeadMessage]:
        return self.store.dead_letters(self.name, validate_queue_name(group), limit)

    def retry_dead(self, group: str, positions: Sequence[str] | None = None) -> int:
        """Run dead letters again (all, or those at ``positions``); see ``BroadcastStore``."""
        return self.store.retry_dead(self.name, validate_queue_name(group), positions)

    def purge_dead(self, group: str) -> int:
        return self.store.purge_dead(self.name, validate_queue_name(group))

    def decode(self, payload: bytes, content_type: str) -> Any:
        from ..serde import serde_for

        return serde_for(content_type).loads(payload)


def broadcast_names(storage: Any = None) -> list[str]:
    """Every broadcast that has a retained message or a group."""
    return (storage if storage is not None else get_storage()).broadcasts().names()


# -- subscribers ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subscription:
    """One group's handler of one broadcast and how failures are retried (ms)."""

    broadcast: str
    group: str
    func: SubscriberHandler
    start: str | int = "now"
    max_attempts: int = 3
    min_backoff: int = 1000
    max_backoff: int = 3600 * 1000
    max_stalls: int = 1
    timeout: float | None = None  # s: past it the handler is asked to stop (async: cancelled)
    hard_timeout: float | None = None  # s: past it the process pool kills the handler's child

    @property
    def label(self) -> str:
        return f"{self.broadcast}:{self.group}"


class SubscriberRegistry:
    def __init__(self) -> None:
        self._subs: dict[tuple[str, str], Subscription] = {}

    def register(self, sub: Subscription) -> Subscription:
        key = (sub.broadcast, sub.group)
        existing = self._subs.get(key)
        if existing is not None and _qualname(existing.func) != _qualname(sub.func):
            raise ConfigurationError(
                f"group {sub.group!r} of broadcast {sub.broadcast!r} already has handler "
                f"{_qualname(existing.func)}; cannot also register {_qualname(sub.func)}"
            )
        self._subs[key] = sub
        return sub

    def unregister(self, broadcast: str, group: str) -> None:
        self._subs.pop((broadcast, group), None)

    def get(self, broadcast: str, group: str) -> Subscription | None:
        return self._subs.get((broadcast, group))

    def all(self) -> list[Subscription]:
        return [self._subs[k] for k in sorted(self._subs)]

    def select(self, specs: Sequence[str]) -> list[Subscription]:
        """Subscriptions named ``NAME`` (every group of it registered here) or ``NAME:GROUP``."""
        chosen: dict[tuple[str, str], Subscription] = {}
        for spec in specs:
            name, _, group = spec.partition(":")
            found = [s for s in self.all() if s.broadcast == name and group in ("", s.group)]
            if not found:
                known = ", ".join(s.label for s in self.all()) or "none"
                raise ConfigurationError(f"no subscriber registered for {spec!r}; known: {known}")
            chosen.update({(s.broadcast, s.group): s for s in found})
        return [chosen[k] for k in sorted(chosen)]


subscribers = SubscriberRegistry()


def subscriber(
    broadcast: str,
    *,
    group: str,
    start: str | int | dt.datetime = "now",
    max_attempts: int | None = None,
    min_backoff: int | None = None,
    max_backoff: int | None = None,
    max_stalls: int | None = None,
    timeout: float | None = None,
    hard_timeout: float | None = None,
) -> Callable[[SubscriberHandler], SubscriberHandler]:
    """Register the decorated function as ``group``'s handler of ``broadcast``.

    It receives a ``Job`` (``id`` is the message id, ``payload``, ``attempt``,
    ``is_cancelled()``, ``set_progress``) and runs in ``runworker``. A group is created by the
    first worker that serves it, starting at ``start`` (see ``Broadcast.subscribe``; create it
    ahead of the deploy to get messages published before any worker ran). Failures retry with
    backoff up to ``max_attempts`` (``PermanentError``: at once to the dead letters); the
    defaults are ``JOBQ["JOB_DEFAULTS"]``'s. ``timeout`` (seconds), as a job handler's: past
    it a handler is asked to stop (``job.is_cancelled()``), an ``async def`` one is cancelled,
    and the attempt fails (``TimeoutError`` when cancelled) and retries as above.
    ``hard_timeout`` (seconds), as a job handler's: enforced by ``runworker --pool process``
    (the child running the handler is killed) and ``--pool async`` (the task is cancelled);
    the attempt fails with ``HardTimeout``. The thread pool refuses such a subscriber.
    """
    for label, value in (("timeout", timeout), ("hard_timeout", hard_timeout)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
        ):
            raise InvalidOption(f"{label} must be a number of seconds > 0, got {value!r}")
    defaults = jobq_settings()["JOB_DEFAULTS"]

    def pick(value: int | None, key: str, minimum: int) -> int:
        chosen = defaults[key] if value is None else value
        if key.endswith("backoff"):
            return validate_positive_ms(key, chosen, allow_zero=True)
        return validate_positive_int(key, chosen, minimum=minimum)

    def decorator(func: SubscriberHandler) -> SubscriberHandler:
        if not callable(func):
            raise ConfigurationError("a subscriber must be callable")
        subscribers.register(
            Subscription(
                validate_queue_name(broadcast),
                validate_queue_name(group),
                func,
                _start(start),
                pick(max_attempts, "max_attempts", 1),
                pick(min_backoff, "min_backoff", 0),
                pick(max_backoff, "max_backoff", 0),
                pick(max_stalls, "max_stalls", 0),
                None if timeout is None else float(timeout),
                None if hard_timeout is None else float(hard_timeout),
            )
        )
        return func

    return decorator
