"""Handlers, one per queue, registered with ``@handler("queue")`` in an app's ``jobs.py``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import ConfigurationError
from .job import Job
from .validation import validate_queue_name

Handler = Callable[[Job], Any]


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, queue: str, func: Handler) -> Handler:
        validate_queue_name(queue)
        existing = self._handlers.get(queue)
        if existing is not None and _qualname(existing) != _qualname(func):
            # Two handlers for one queue would make which one runs an accident of import order.
            raise ConfigurationError(
                f"queue {queue!r} already has handler {_qualname(existing)};"
                f" cannot also register {_qualname(func)}"
            )
        self._handlers[queue] = func
        return func

    def unregister(self, queue: str) -> None:
        self._handlers.pop(queue, None)

    def get(self, queue: str) -> Handler | None:
        return self._handlers.get(queue)

    def queues(self) -> list[str]:
        return sorted(self._handlers)


def handler_name(queue: str) -> str:
    """Dotted path of the handler registered for ``queue`` here ("" when none): what the
    ``Job.handler`` column shows."""
    func = registry.get(queue)
    return _qualname(func) if func is not None else ""


def _qualname(func: Callable) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


registry = HandlerRegistry()


def handler(queue: str) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of ``queue``.

    The function receives a ``Job`` (id, payload, attempt, cancellation flag) and returns the
    job's result (JSON-serialisable by default).
    """

    def decorator(func: Handler) -> Handler:
        return registry.register(queue, func)

    return decorator
