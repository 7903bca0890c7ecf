"""Task functions: ``@task`` turns a plain function into a named job type.

Why named job types: ``@handler`` gives a queue exactly one function, so every kind of work
needed a queue of its own. A task is a function with a *name*; several tasks share a queue and
the worker picks the function by the name the job carries.

Where the name travels: in the job envelope's ``meta`` (``envelope.py``), beside a payload
``{"args": [...], "kwargs": {...}}``. That needs no storage column on any backend, keeps the
plain ``Queue.enqueue`` path untouched, and no user payload can pose as a task call (the
envelope is marked by the content type, not by the value). The worker's ``execution.prepare``
sees ``meta["task"]`` and runs the task of that name, whatever the queue's own handler.

Arguments are checked against the function's signature and serialised (the queue's serde,
JSON by default) *before* anything is stored, so a wrong call raises at the caller and writes
nothing. A parameter annotated with a pydantic model (anything with ``model_validate`` and
``model_dump``) is validated at the caller and rebuilt as that model in the worker.
"""

from __future__ import annotations

import copy
import inspect
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigurationError, InvalidOption, InvalidPayload, PermanentError
from ..job import EnqueueResult, Job, JobResult, JobStatus
from ..serde import TASK_META
from ..validation import (
    validate_positive_int,
    validate_positive_ms,
    validate_priority,
    validate_queue_name,
    validate_seconds,
)
from .policy import RetryPolicy, backoff_from, exception_classes
from .registry import HandlerRegistry, check_atomic, registry, route

ARGS, KWARGS = "args", "kwargs"
# Dotted Python names, plus ":" and "-" for names a project picks itself ("emails:welcome").
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:\-]{0,199}$")
# Keyword arguments the enqueue methods take for themselves; a task cannot have parameters
# with these names, or a call could never reach them.
RESERVED = ("job_id", "wait_timeout")
# What ``using()`` accepts besides the job options of ``Queue.enqueue``.
_USING_OWN = ("queue",)


def validate_task_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigurationError(
            f"task name {name!r}: use letters, digits and _ . : - (at most 200 characters, "
            "starting with a letter or _)"
        )
    return name


class Task:
    """A function registered as a named job type (see ``task``).

    Calling the object calls the function here and now (handy in tests and shells); the
    ``enqueue*`` methods put a job on the task's queue instead. ``using(...)`` returns a copy
    with job options (delay, priority, dedup_key, ..., or another ``queue``) bound."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: str,
        queue: str,
        policy: RetryPolicy,
        job_options: dict[str, Any],
        atomic: bool | str = False,
    ) -> None:
        self.func = func
        self.name = validate_task_name(name)
        self.queue = validate_queue_name(queue)
        self.policy = policy
        self.is_async = inspect.iscoroutinefunction(func)
        self.signature = inspect.signature(func)
        clash = [p for p in RESERVED if p in self.signature.parameters]
        if clash:
            raise ConfigurationError(
                f"task {self.name!r}: parameter(s) {clash} are reserved by enqueue(); rename them"
            )
        self._options = job_options
        check_atomic(f"task {self.name!r}", func, atomic)
        self.atomic = atomic  # run in a transaction with its completion (HandlerOptions)
        # Shared by every ``using()`` copy: a failure handler set on any of them is the task's.
        self._failure: dict[str, Any] = {"func": None, "policy": None}
        self._queue_override: Any = None
        self._models: dict[str, Any] | None = None
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __repr__(self) -> str:
        return f"<Task {self.name!r} on queue {self.queue!r}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    # -- producing --------------------------------------------------------------------------

    def using(self, **options: Any) -> Task:
        """A copy of this task with job options bound: any option of ``Queue.enqueue``
        (``delay``, ``run_at``, ``priority``, ``dedup_key``, ``max_attempts``, ...), and
        ``queue``: a queue name or a ``Queue`` object (its storage then) instead of the
        task's routed queue."""
        bound = copy.copy(self)
        options = dict(options)
        runs = {k: options.pop(k) for k in ("timeout", "hard_timeout") if k in options}
        bound._options = {**self._options, **options}
        if runs:  # run timeouts travel in the envelope, as @task's do (see _job_options)
            checked = _job_options(None, None, None, runs.get("timeout"), runs.get("hard_timeout"))
            bound._options["meta"] = {**(self._options.get("meta") or {}), **checked["meta"]}
        if "queue" in options:
            target = bound._options.pop("queue")
            if isinstance(target, str):
                validate_queue_name(target)
            elif not hasattr(target, "enqueue") or not hasattr(target, "name"):
                raise InvalidOption(f"queue must be a queue name or a Queue, got {target!r}")
            bound._queue_override = target
        return bound

    def target_queue(self) -> Any:
        """The Queue jobs of this call go to: ``using(queue=...)``, else ``JOBQ["ROUTES"]``
        for this task's name, else the queue given to ``@task``."""
        from ..queue.core import Queue, get_queue

        target = self._queue_override
        if isinstance(target, Queue):
            return target
        if target is None:
            target = route(self.name, self.queue)
        return get_queue(target)

    def payload(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The job payload of a call, after checking it against the signature.

        Raises ``InvalidPayload`` (nothing stored) when the arguments do not bind or a typed
        parameter's value does not validate."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidPayload(f"task {self.name!r}{self.signature}: {exc}") from None
        models = self._model_params()
        if models:
            for param, model in models.items():
                if param in bound.arguments:
                    bound.arguments[param] = _dump_model(self.name, param, model,
                                                         bound.arguments[param])  # fmt: skip
        return {ARGS: list(bound.args), KWARGS: dict(bound.kwargs)}

    def _call(self, args: tuple, kwargs: dict) -> tuple[dict[str, Any], dict[str, Any]]:
        """(payload, job options) of one call; the options carry the task's name in the
        envelope meta, beside any run timeouts."""
        options = dict(self._options)
        options["meta"] = {**(options.get("meta") or {}), TASK_META: self.name}
        return self.payload(args, kwargs), options

    def enqueue(self, *args: Any, job_id: str | None = None, **kwargs: Any) -> EnqueueResult:
        """Put a call of this task on its queue; ``args``/``kwargs`` are the function's.
        Returns the ``EnqueueResult`` (``job_id``, ``outcome``) as ``Queue.enqueue`` does."""
        payload, options = self._call(args, kwargs)
        return self.target_queue().enqueue(job_id, payload, **options)

    delay = enqueue  # Celery's spelling, for code being migrated

    def enqueue_and_wait(
        self, *args: Any, wait_timeout: float, job_id: str | None = None, **kwargs: Any
    ) -> Any:
        """Enqueue and wait up to ``wait_timeout`` seconds for the function's return value
        (``JobFailed`` if it failed for good, ``Timeout`` if no outcome came in time)."""
        payload, options = self._call(args, kwargs)
        return self.target_queue().enqueue_and_wait(
            job_id, payload, timeout=wait_timeout, **options
        )

    async def aenqueue(self, *args: Any, job_id: str | None = None, **kwargs: Any) -> EnqueueResult:
        """``enqueue`` for async code (``Queue.aenqueue``: native async I/O on Redis)."""
        payload, options = self._call(args, kwargs)
        return await self.target_queue().aenqueue(job_id, payload, **options)

    async def aenqueue_and_wait(
        self, *args: Any, wait_timeout: float, job_id: str | None = None, **kwargs: Any
    ) -> Any:
        """``enqueue_and_wait`` for async code (``Queue.aenqueue_and_wait``)."""
        payload, options = self._call(args, kwargs)
        return await self.target_queue().aenqueue_and_wait(
            job_id, payload, timeout=wait_timeout, **options
        )

    def s(self, *args: Any, **kwargs: Any) -> Any:
        """A signature: this call, not sent yet, for ``chain`` / ``group`` / ``chord``; in a
        chain or chord it receives the result(s) before it as its first argument."""
        from .canvas import Signature

        return Signature(self, args, kwargs, immutable=False)

    def si(self, *args: Any, **kwargs: Any) -> Any:
        """An immutable signature: it takes no result from the calls before it."""
        from .canvas import Signature

        self.payload(args, kwargs)
        return Signature(self, args, kwargs, immutable=True)

    def get_status(self, job_id: str) -> JobStatus | None:
        return self.target_queue().get_status(job_id)

    def get_result(self, job_id: str) -> JobResult | None:
        return self.target_queue().get_result(job_id)

    # -- failing for good ---------------------------------------------------------------------

    @property
    def failure_handler(self) -> Callable[[Any, Any, dict[str, Any]], Any] | None:
        """The function told when a job of this task fails for good (``on_failure``)."""
        return self._failure["func"]

    @property
    def failure_policy(self) -> RetryPolicy | None:
        """The retry policy of the failure handler (None: the worker's ``failure_backoff``)."""
        return self._failure["policy"]

    def on_failure(
        self,
        func: Callable[[Any, Any, dict[str, Any]], Any] | None = None,
        *,
        backoff: Any = None,
        retry_on: Any = (),
        dont_retry_on: Any = (),
    ) -> Any:
        """Set this task's failure handler: ``@my_task.on_failure`` or
        ``@my_task.on_failure(backoff=Backoff.fixed(30), retry_on=(OSError,))``.

        It is called as ``func(payload, job, error)`` (``payload`` the job's
        ``{"args": [...], "kwargs": {...}}``, ``job`` a ``FailedJob`` with ``job.task`` this
        task's name) once per job of this task that fails for good, with the guarantees of a
        queue's failure handler (recorded in the step that fails the job, at least once,
        retried by its own policy), instead of the queue's. Returns ``func``."""
        from .registry import failure_policy

        policy = failure_policy(backoff, retry_on, dont_retry_on)

        def set_handler(fn: Callable[[Any, Any, dict[str, Any]], Any]) -> Any:
            if not callable(fn):
                raise ConfigurationError(f"the failure handler of task {self.name!r} must be "
                                         f"callable, got {fn!r}")  # fmt: skip
            current = self._failure["func"]
            if current is not None and _qualname(current) != _qualname(fn):
                raise ConfigurationError(
                    f"task {self.name!r} already has failure handler {_qualname(current)};"
                    f" cannot also register {_qualname(fn)}"
                )
            self._failure.update(func=fn, policy=policy)
            return fn

        return set_handler if func is None else set_handler(func)

    # -- running (in the worker) ------------------------------------------------------------

    def call_args(self, job: Job) -> tuple[list[Any], dict[str, Any]]:
        """The arguments a job carries, checked again against the signature: the code may have
        changed since the job was enqueued, and a call that cannot bind fails for good (a retry
        would not change the arguments) instead of raising ``TypeError`` inside the task."""
        payload = job.payload
        if (not isinstance(payload, dict) or not isinstance(payload.get(ARGS), list)
                or not isinstance(payload.get(KWARGS), dict)):  # fmt: skip
            raise PermanentError(f"task {self.name!r}: the job's payload is not a task call")
        args, kwargs = payload[ARGS], payload[KWARGS]
        takes = job.meta.get("takes") if job.meta else None
        if takes == "one" and len(job.children) == 1:  # a chain step: the step before's result
            args = [job.children[0].value, *args]
        elif takes == "all":  # a chord callback: every member's result, in the group's order
            args = [[c.value for c in job.children], *args]
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise PermanentError(
                f"task {self.name!r}{self.signature} cannot take this job's arguments: {exc}"
            ) from None
        for param, model in self._model_params().items():
            if param in bound.arguments:
                try:
                    bound.arguments[param] = model.model_validate(bound.arguments[param])
                except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError & co.
                    raise PermanentError(
                        f"task {self.name!r}: argument {param!r} is not a valid "
                        f"{model.__name__}: {exc}"
                    ) from None
        return list(bound.args), dict(bound.kwargs)

    def run_job(self, job: Job) -> Any:
        args, kwargs = self.call_args(job)
        try:
            return self.func(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised, ruled on by the policy
            if self.policy.is_default:
                raise
            raise self.policy.decide(exc, job.attempt) from exc

    async def arun_job(self, job: Job) -> Any:
        args, kwargs = self.call_args(job)
        try:
            return await self.func(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - as in run_job
            if self.policy.is_default:
                raise
            raise self.policy.decide(exc, job.attempt) from exc

    def runner(self) -> Callable[[Job], Any]:
        """What the worker calls with the Job: a coroutine function for an ``async def`` task,
        so the async pool awaits it on its loop instead of sending it to a thread."""
        return self.arun_job if self.is_async else self.run_job

    def _model_params(self) -> dict[str, Any]:
        """Parameters annotated with a pydantic-style model class, resolved once (annotations
        may be strings under ``from __future__ import annotations``)."""
        if self._models is None:
            try:
                hints = typing.get_type_hints(self.func)
            except Exception:  # noqa: BLE001 - unresolvable annotations: no typed payloads
                hints = {}
            self._models = {
                name: hint
                for name, hint in hints.items()
                if name in self.signature.parameters and _is_model(hint)
            }
        return self._models


def _qualname(func: Any) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


def _is_model(hint: Any) -> bool:
    return isinstance(hint, type) and all(
        callable(getattr(hint, attr, None)) for attr in ("model_validate", "model_dump")
    )


def _dump_model(task_name: str, param: str, model: Any, value: Any) -> Any:
    try:
        instance = value if isinstance(value, model) else model.model_validate(value)
        return instance.model_dump(mode="json")
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError & co.
        raise InvalidPayload(
            f"task {task_name!r}: argument {param!r} is not a valid {model.__name__}: {exc}"
        ) from None


def _job_options(
    max_attempts: int | None,
    priority: int | None,
    result_ttl: int | None,
    timeout: float | None,
    hard_timeout: float | None,
) -> dict[str, Any]:
    """The job options of every call, checked at decoration so a bad ``@task`` argument
    fails at import, not at the first enqueue. Run timeouts go into the envelope meta (where
    ``Queue.build`` puts a per-job ``timeout``), which keeps ``enqueue_and_wait``'s own
    ``timeout`` (the wait) free."""
    try:
        options: dict[str, Any] = {}
        if max_attempts is not None:
            options["max_attempts"] = validate_positive_int("max_attempts", max_attempts)
        if priority is not None:
            options["priority"] = validate_priority(priority)
        if result_ttl is not None:
            options["result_ttl"] = validate_positive_ms("result_ttl", result_ttl)
        meta = {name: validate_seconds(name, value, maximum=86400)
                for name, value in (("timeout", timeout), ("hard_timeout", hard_timeout))
                if value is not None}  # fmt: skip
    except InvalidOption as exc:
        raise ConfigurationError(f"@task: {exc}") from None
    if meta:
        options["meta"] = meta
    return options


def task(
    func: Callable[..., Any] | None = None,
    *,
    queue: str = "default",
    name: str | None = None,
    max_attempts: int | None = None,
    retry_on: tuple[type[BaseException], ...] | type[BaseException] = (),
    dont_retry_on: tuple[type[BaseException], ...] | type[BaseException] = (),
    backoff: Any = None,
    timeout: float | None = None,
    hard_timeout: float | None = None,
    priority: int | None = None,
    result_ttl: int | None = None,
    on_failure: Callable[[Any, Any, dict[str, Any]], Any] | None = None,
    atomic: bool | str = False,
    registry: HandlerRegistry = registry,
) -> Any:
    """Register a function as a task: a named job type on ``queue``.

    ``name`` defaults to ``module.qualname`` (what Celery does); jobs carry it and the worker
    runs the task of that name. ``max_attempts``, ``priority``, ``result_ttl`` (ms) are job
    options of every call; ``timeout`` / ``hard_timeout`` (seconds) bound each run;
    ``retry_on`` / ``dont_retry_on`` / ``backoff`` are the retry policy (``RetryPolicy``,
    ``Backoff``). ``on_failure``: called once per job of this task that fails for good
    (see ``Task.on_failure``, which also gives it a retry policy of its own). ``atomic``:
    each run's database writes commit together with its completion, or not at all
    (``HandlerOptions.atomic``; the database backend). Use as
    ``@task`` or ``@task(queue="emails", ...)``.
    """

    def decorate(fn: Callable[..., Any]) -> Task:
        if not callable(fn):
            raise ConfigurationError(f"@task needs a function, got {fn!r}")
        policy = RetryPolicy(
            exception_classes("retry_on", retry_on),
            exception_classes("dont_retry_on", dont_retry_on),
            backoff_from(backoff),
        )
        options = _job_options(max_attempts, priority, result_ttl, timeout, hard_timeout)
        qualname = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
        made = Task(
            fn, name=name or qualname, queue=queue, policy=policy, job_options=options,
            atomic=atomic,
        )  # fmt: skip
        if on_failure is not None:
            made.on_failure(on_failure)
        return registry.register_task(made)

    if func is not None:  # bare @task
        return decorate(func)
    return decorate
