"""What runs each job: handlers, one per queue, registered with ``@handler("queue")`` in an
app's ``jobs.py``, and task functions by name (``@task``, ``core.py``).

It imports only plumbing and ``policy.py`` (no queue, no storage), so the storage builder
(``backend.py``) can hand the database backend the handler names its rows show, and every
feature above may ask which code runs a queue.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..conf import jobq_settings
from ..errors import ConfigurationError, PermanentError
from ..job import FailedJob, Job
from ..serde import task_name
from ..validation import is_seconds, logical_name, validate_queue_name
from .policy import RetryPolicy, backoff_from, exception_classes

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
    # The handler runs inside ``transaction.atomic()`` on the queue's database, and the job's
    # completion is written in that same transaction (``worker/execution.py``: exactly-once
    # database effects, docs/reliability.md). A database alias instead of True says where the
    # handler writes; ``manage.py check`` refuses one that is not the queue's database.
    atomic: bool | str = False


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
        # Retry policy of each queue's failure handler (``tasks.RetryPolicy``): absent, the
        # worker's exponential ``failure_backoff`` and no exception gives up.
        self._failure_policies: dict[str, Any] = {}
        # Task functions (``tasks/core.py``) by name: several may share a queue.
        self._tasks: dict[str, Any] = {}

    def register(
        self,
        queue: str,
        func: Handler,
        *,
        timeout: float | None = None,
        hard_timeout: float | None = None,
        batch: int | None = None,
        on_failure: FailureHandler | None = None,
        failure_backoff: Any = None,
        failure_retry_on: Any = (),
        failure_dont_retry_on: Any = (),
        atomic: bool | str = False,
    ) -> Handler:
        validate_queue_name(queue)
        check_atomic(f"the handler of {queue!r}", func, atomic, batch)
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int)
                                  or not 1 <= batch <= 1000):  # fmt: skip
            raise ConfigurationError(f"batch must be an integer from 1 to 1000, got {batch!r}")
        options = HandlerOptions(
            _seconds("timeout", timeout), _seconds("hard_timeout", hard_timeout), batch, atomic
        )
        existing = self._handlers.get(queue)
        if existing is not None and _qualname(existing) != _qualname(func):
            # Two handlers for one queue would make which one runs an accident of import order.
            raise ConfigurationError(
                f"queue {queue!r} already has handler {_qualname(existing)};"
                f" cannot also register {_qualname(func)}"
            )
        if on_failure is not None:
            self.register_failure_handler(
                queue, on_failure, backoff=failure_backoff, retry_on=failure_retry_on,
                dont_retry_on=failure_dont_retry_on,
            )  # fmt: skip
        self._handlers[queue] = func
        self._options[queue] = options
        return func

    def register_failure_handler(
        self,
        queue: str,
        func: FailureHandler,
        *,
        backoff: Any = None,
        retry_on: Any = (),
        dont_retry_on: Any = (),
    ) -> FailureHandler:
        """The failure handler of ``queue``, for its jobs whose task has none of its own.

        Its retry policy, when it raises: ``backoff`` (a ``tasks.Backoff`` or seconds; None:
        ``JOBQ["WORKER"]["failure_backoff"]``, doubling); ``retry_on`` / ``dont_retry_on``
        (exception classes) say which errors give up instead of calling it again, as for
        tasks (see ``failure_policy``)."""
        validate_queue_name(queue)
        policy = failure_policy(backoff, retry_on, dont_retry_on)
        if not callable(func):
            raise ConfigurationError(f"the failure handler of {queue!r} must be callable")
        existing = self._failure_handlers.get(queue)
        if existing is not None and _qualname(existing) != _qualname(func):
            raise ConfigurationError(
                f"queue {queue!r} already has failure handler {_qualname(existing)};"
                f" cannot also register {_qualname(func)}"
            )
        self._failure_handlers[queue] = func
        if policy is None:
            self._failure_policies.pop(queue, None)
        else:
            self._failure_policies[queue] = policy
        return func

    def failure_handler(self, queue: str) -> FailureHandler | None:
        """The queue's own failure handler (not its tasks'), or None."""
        return self._failure_handlers.get(logical_name(queue))

    def failure_backoff(self, queue: str) -> Any:
        """The ``Backoff`` of the queue's failure handler, or None (the worker's setting)."""
        policy = self._failure_policies.get(logical_name(queue))
        return None if policy is None else policy.backoff

    def failure_target(self, queue: str, task_name: object) -> tuple[FailureHandler, Any] | None:
        """(function, retry policy or None) that is told about a failed job of ``queue``
        naming task ``task_name`` (None for a plain job): the task's own failure handler when
        it has one, else the queue's; None when neither exists here."""
        queue = logical_name(queue)  # a partition: its logical queue's handler
        found = self._tasks.get(task_name) if isinstance(task_name, str) else None
        if found is not None and found.failure_handler is not None:
            return found.failure_handler, found.failure_policy
        func = self._failure_handlers.get(queue)
        return None if func is None else (func, self._failure_policies.get(queue))

    def has_failure_handler(self, queue: str) -> bool:
        """Whether a failure of ``queue`` may have someone to tell here: the queue has a
        failure handler, or a task routed to it (``JOBQ["ROUTES"]``, else its ``@task``
        queue) has one. A worker turns the queue's failure hook on exactly then."""
        queue = logical_name(queue)
        if queue in self._failure_handlers:
            return True
        if not any(t.failure_handler is not None for t in self._tasks.values()):
            return False
        return any(
            t.failure_handler is not None and route(t.name, t.queue) == queue
            for t in self._tasks.values()
        )

    def unregister(self, queue: str) -> None:
        self._handlers.pop(queue, None)
        self._options.pop(queue, None)
        self._failure_handlers.pop(queue, None)
        self._failure_policies.pop(queue, None)

    def atomic_queues(self, queues: list[str] | None = None) -> list[str]:
        """Those of ``queues`` (every known queue when None) whose handler, or a task routed
        to them, has ``atomic=True``: what ``manage.py check`` and a starting worker look at."""
        found = self.atomic_writers()
        wanted = self.queues() if queues is None else [logical_name(q) for q in queues]
        return sorted(q for q in set(wanted) if q in found)

    def atomic_writers(self) -> dict[str, list[tuple[str, bool | str]]]:
        """Per queue, its atomic handler and tasks: (what, ``atomic`` as declared)."""
        found: dict[str, list[tuple[str, bool | str]]] = {}
        for queue, options in self._options.items():
            if options.atomic:
                found.setdefault(queue, []).append((f"the handler of {queue!r}", options.atomic))
        for t in self._tasks.values():
            if t.atomic:
                found.setdefault(route(t.name, t.queue), []).append((f"task {t.name!r}", t.atomic))
        return found

    def options(self, queue: str) -> HandlerOptions:
        return self._options.get(logical_name(queue)) or HandlerOptions()

    def get(self, queue: str) -> Handler | None:
        """The queue's handler; for a queue only tasks are routed to, ``untagged_job``, which
        fails a job that names no task (the task itself is found by ``task_runner``)."""
        queue = logical_name(queue)  # a partition runs its logical queue's handler
        found = self._handlers.get(queue)
        if found is None and queue in self._task_queues():
            return untagged_job
        return found

    def queues(self) -> list[str]:
        """Every queue a worker started without a queue list serves: handlers' and tasks'
        (after ``JOBQ["ROUTES"]``)."""
        return sorted(set(self._handlers) | self._task_queues())

    # -- task functions ----------------------------------------------------------------------

    def register_task(self, task: Any) -> Any:
        """Register a ``Task`` under its name. A second task of one name is refused (which one
        runs would depend on import order), unless it is the same function imported again."""
        existing = self._tasks.get(task.name)
        if existing is not None and _qualname(existing.func) != _qualname(task.func):
            raise ConfigurationError(
                f"task name {task.name!r} is already taken by {_qualname(existing.func)};"
                f" cannot also register {_qualname(task.func)}"
            )
        self._tasks[task.name] = task
        return task

    def unregister_task(self, name: str) -> None:
        self._tasks.pop(name, None)

    def task(self, name: str) -> Any | None:
        return self._tasks.get(name)

    def tasks(self) -> list[Any]:
        return [self._tasks[name] for name in sorted(self._tasks)]

    def task_runner(self, name: object) -> Handler | None:
        """What the worker calls for a job naming task ``name``; None for an unknown name."""
        found = self._tasks.get(name) if isinstance(name, str) else None
        return None if found is None else found.runner()

    def _task_queues(self) -> set[str]:
        if not self._tasks:
            return set()
        return {route(t.name, t.queue) for t in self._tasks.values()}


def check_atomic(what: str, func: Callable, atomic: object, batch: int | None = None) -> None:
    """``atomic=True`` needs a plain function run on a worker thread: Django's transactions
    belong to a thread and refuse an event loop's, and a batch's jobs would share one
    transaction (not supported yet)."""
    if not isinstance(atomic, bool | str) or atomic == "":
        raise ConfigurationError(
            f"{what}: atomic must be True, False or a database alias, got {atomic!r}"
        )
    if not atomic:
        return
    if inspect.iscoroutinefunction(func):
        raise ConfigurationError(
            f"{what}: atomic=True needs a plain function (Django's transactions are not"
            " available to async code)"
        )
    if batch:
        raise ConfigurationError(f"{what}: atomic=True is not supported for batch handlers")


def untagged_job(job: Job) -> Any:
    """The handler of a queue that only tasks use, called for a job that names no task (a
    plain ``Queue.enqueue`` onto it): no function can take it, so it fails for good."""
    raise PermanentError(
        f"queue {job.queue!r} serves task functions only; this job names no task"
        " (enqueue it through the task: fn.enqueue(...))"
    )


def failure_policy(backoff: Any, retry_on: Any, dont_retry_on: Any) -> Any:
    """The ``tasks.RetryPolicy`` of a failure handler, checked at registration (a bad value
    fails at import); None when every part is the default."""
    policy = RetryPolicy(
        exception_classes("retry_on", retry_on),
        exception_classes("dont_retry_on", dont_retry_on),
        backoff_from(backoff),
    )
    return None if policy.is_default else policy


def handler_name(queue: str) -> str:
    """Dotted path of the handler registered for ``queue`` here ("" when none, or when only
    tasks use it: their jobs show their task's name, ``job_handler_name``)."""
    func = registry._handlers.get(logical_name(queue))
    return _qualname(func) if func is not None else ""


def job_handler_name(queue: str, content_type: str, payload: bytes | None) -> str:
    """What the ``Job.handler`` column shows for one job: its task's name for a task function's
    job (the admin, the API and the Spark analytics then group and filter by job type), else
    the queue's handler."""
    return task_name(content_type, payload) or handler_name(queue)


def route(name: str, default: str) -> str:
    """The queue of task ``name``: ``JOBQ["ROUTES"][name]`` when set, else ``default``."""
    return jobq_settings()["ROUTES"].get(name, default)


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
    atomic: bool | str = False,
) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of ``queue``.

    The function receives a ``Job`` (id, payload, attempt, cancellation flag) and returns the
    job's result (JSON-serialisable by default); it may be ``async def``. ``timeout``,
    ``hard_timeout`` (seconds), ``batch`` and ``atomic``: see ``HandlerOptions``.
    ``on_failure``: the queue's failure handler (see ``on_failure``).
    """

    def decorator(func: Handler) -> Handler:
        return registry.register(
            queue, func, timeout=timeout, hard_timeout=hard_timeout, batch=batch,
            on_failure=on_failure, atomic=atomic,
        )  # fmt: skip

    return decorator


def on_failure(
    queue: str, *, backoff: Any = None, retry_on: Any = (), dont_retry_on: Any = ()
) -> Callable[[FailureHandler], FailureHandler]:
    """Register the decorated function as the failure handler of ``queue``.

    It is called as ``func(payload, job, error)`` once per job that fails for good (attempts
    used up, ``PermanentError``, stalled past ``max_stalls``; not for a cancelled job):
    ``payload`` decoded as the handler got it (its raw bytes if it does not decode), ``job``
    a ``FailedJob`` (id, queue, attempts, failed_at, tries), ``error`` the failure's
    ``{"type", "message", "traceback"}``. Until it returns without raising it is called again
    with a long backoff (``JOBQ["WORKER"]["failure_backoff"]``, or ``backoff``: a
    ``django_jobq.Backoff`` or fixed seconds), so it runs at least once per
    failure: make it idempotent (a worker killed while it runs repeats the call). An
    exception in ``dont_retry_on``, one not in ``retry_on`` when that is given, or a
    ``PermanentError`` gives up on the call instead (logged; the dead letter stays).
    A task's own failure handler (``@task(on_failure=...)``) takes precedence for its jobs.
    """

    def decorator(func: FailureHandler) -> FailureHandler:
        return registry.register_failure_handler(
            queue, func, backoff=backoff, retry_on=retry_on, dont_retry_on=dont_retry_on
        )

    return decorator
