"""Handlers, one per queue, registered with ``@handler("queue")`` in an app's ``jobs.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError
from .job import FailedJob, Job
from .validation import is_seconds, validate_queue_name

Handler = Callable[[Job], Any]
#: Called once per permanent failure with (payload, job, error); see ``on_failure``.
FailureHandler = Callable[[Any, FailedJob, dict[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class HandlerOptions:
    """How the worker runs a queue's handler (seconds; None: no limit).

    ``timeout`` is soft: past it the job's ``is_cancelled()`` turns True and a cooperative
    handler stops. ``hard_timeout`` is enforced: the process pool kills the child running it
    (and starts a new one), the async pool cancels the task; the attempt fails with
    ``HardTimeout`` and retries as the policy says. The thread pool cannot stop a thread, so
    a worker refuses to serve a handler with a hard timeout there."""

    timeout: float | None = None
    hard_timeout: float | None = None
    # The handler takes a list of up to ``batch`` jobs (bulk inserts, batched API calls) and
    # returns one result per job, in order; an exception instance in that list fails just
    # that job. Timeouts then apply to the whole batch.
    batch: int | None = None


def _seconds(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if not is_seconds(value) or value <= 0:
        raise ConfigurationError(
            f"{name} must be a positive, finite number of seconds, got {value!r}"
        )
    return float(value)


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._options: dict[str, HandlerOptions] = {}
        self._failure_handlers: dict[str, FailureHandler] = {}

    def register(
        self,
        queue: str,
        func: Handler,
        *,
        timeout: float | None = None,
        hard_timeout: float | None = None,
        batch: int | None = None,
        on_failure: FailureHandler | None = None,
    ) -> Handler:
        validate_queue_name(queue)
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int)
                                  or not 1 <= batch <= 1000):  # fmt: skip
            raise ConfigurationError(f"batch must be an integer from 1 to 1000, got {batch!r}")
        options = HandlerOptions(
            _seconds("timeout", timeout), _seconds("hard_timeout", hard_timeout), batch
        )
        existing = self._handlers.get(queue)
        if existing is not None and _qualname(existing) != _qualname(func):
            # Two handlers for one queue would make which one runs an accident of import order.
            raise ConfigurationError(
                f"queue {queue!r} already has handler {_qualname(existing)};"
                f" cannot also register {_qualname(func)}"
            )
        if on_failure is not None:
            self.register_failure_handler(queue, on_failure)
        self._handlers[queue] = func
        self._options[queue] = options
        return func

    def register_failure_handler(self, queue: str, func: FailureHandler) -> FailureHandler:
        validate_queue_name(queue)
        if not callable(func):
            raise ConfigurationError(f"the failure handler of {queue!r} must be callable")
        existing = self._failure_handlers.get(queue)
        if existing is not None and _qualname(existing) != _qualname(func):
            raise ConfigurationError(
                f"queue {queue!r} already has failure handler {_qualname(existing)};"
                f" cannot also register {_qualname(func)}"
            )
        self._failure_handlers[queue] = func
        return func

    def failure_handler(self, queue: str) -> FailureHandler | None:
        return self._failure_handlers.get(queue)

    def unregister(self, queue: str) -> None:
        self._handlers.pop(queue, None)
        self._options.pop(queue, None)
        self._failure_handlers.pop(queue, None)

    def options(self, queue: str) -> HandlerOptions:
        return self._options.get(queue) or HandlerOptions()

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


def handler(
    queue: str,
    *,
    timeout: float | None = None,
    hard_timeout: float | None = None,
    batch: int | None = None,
    on_failure: FailureHandler | None = None,
) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of ``queue``.

    The function receives a ``Job`` (id, payload, attempt, cancellation flag) and returns the
    job's result (JSON-serialisable by default); it may be ``async def``. ``timeout``,
    ``hard_timeout`` (seconds) and ``batch``: see ``HandlerOptions``. ``on_failure``: the
    queue's failure handler (see ``on_failure``).
    """

    def decorator(func: Handler) -> Handler:
        return registry.register(
            queue, func, timeout=timeout, hard_timeout=hard_timeout, batch=batch,
            on_failure=on_failure,
        )  # fmt: skip

    return decorator


def on_failure(queue: str) -> Callable[[FailureHandler], FailureHandler]:
    """Register the decorated function as the failure handler of ``queue``.

    It is called as ``func(payload, job, error)`` once per job that fails for good (attempts
    used up, ``PermanentError``, stalled past ``max_stalls``; not for a cancelled job):
    ``payload`` decoded as the handler got it (its raw bytes if it does not decode), ``job``
    a ``FailedJob`` (id, queue, attempts, failed_at, tries), ``error`` the failure's
    ``{"type", "message", "traceback"}``. Until it returns without raising it is called again
    with a long backoff (``JOBQ["WORKER"]["failure_backoff"]``), so it runs at least once per
    failure: make it idempotent (a worker killed while it runs repeats the call).
    """

    def decorator(func: FailureHandler) -> FailureHandler:
        return registry.register_failure_handler(queue, func)

    return decorator
