"""Celery interoperability over kombu: run Celery task messages as django_jobq jobs (the
bridge), send jobs to Celery workers (``publish``), and store results where Celery's
``AsyncResult`` finds them. See docs/migrating-from-celery.md.

    # jobs.py of an app: the Celery task's code, now run by ``manage.py runworker``
    from django_jobq.celery_compat import celery_task

    @celery_task("proj.tasks.add")
    def add(x, y):
        return x + y

    # manage.py runworker --from-kombu amqp://guest:guest@127.0.0.1:5672// --celery-queue celery

Settings (all optional), in ``JOBQ["CELERY"]``: ``BROKER_URL`` (publish, and the bridge when
``CONSUME_QUEUES`` is set), ``CONSUME_QUEUES`` (Celery queues ``runworker`` bridges without
``--from-kombu``), ``ROUTES`` (``{"task.name": "jobq-queue"}`` for tasks handled by a plain
``@handler``), ``RESULT_BACKEND`` (a ``redis://`` URL: Celery's result backend, written for
Celery-started jobs), ``RESULT_EXPIRES`` (seconds, Celery's ``result_expires``),
``UNROUTABLE_QUEUE`` (where messages that cannot run are kept) and ``PREFETCH``.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any

from ...conf import jobq_settings, queue_defaults
from ...errors import (
    ConfigurationError,
    InvalidOption,
    InvalidQueueName,
    PermanentError,
    ValidationError,
)
from ...job import Job
from ...tasks.registry import registry
from ...validation import is_seconds, validate_queue_name
from .protocol import CeleryTask, MalformedMessage, build, job_id_for, parse
from .results import CeleryResultWriter

__all__ = [
    "CeleryTask",
    "MalformedMessage",
    "celery_settings",
    "celery_task",
    "job_id_for",
    "parse",
    "publish",
    "result_writer",
    "route_for",
]

logger = logging.getLogger("django_jobq.celery")

# Celery task name -> (jobq queue, max_retries), filled by @celery_task.
_tasks: dict[str, tuple[str, int]] = {}


def celery_settings() -> dict[str, Any]:
    return jobq_settings()["CELERY"]


def result_writer() -> CeleryResultWriter | None:
    conf = celery_settings()
    url = conf["RESULT_BACKEND"]
    return CeleryResultWriter(url, expires=conf["RESULT_EXPIRES"]) if url else None


def route_for(task_name: str) -> tuple[str, int | None] | None:
    """(jobq queue, max_retries or None for the queue's own max_attempts) that runs
    ``task_name``, or None when nothing here runs it."""
    routed = celery_settings()["ROUTES"].get(task_name)
    if routed:
        return routed, None
    return _tasks.get(task_name)


def max_attempts_for(queue: str, max_retries: int | None, retries: int) -> int:
    """A message that Celery already retried ``retries`` times gets the attempts it has left
    (at least one): Celery's ``max_retries`` counts retries, our ``max_attempts`` runs."""
    total = queue_defaults(queue).max_attempts if max_retries is None else max_retries + 1
    return max(1, total - retries)


def celery_task(
    name: str, *, queue: str | None = None, max_retries: int = 3, bind: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function as the code of Celery task ``name``.

    The function keeps Celery's calling convention, ``func(*args, **kwargs)`` (with
    ``bind=True``, ``func(job, *args, **kwargs)``: our ``Job`` stands where Celery's bound task
    would). It runs on the jobq queue ``queue`` (default: the task name itself). Raise
    ``PermanentError`` to fail without retries, ``Retry(retry_in=…)`` to choose the delay.
    """
    target = queue or name
    try:
        validate_queue_name(target)
    except InvalidQueueName as exc:
        raise ConfigurationError(f"{exc}: pass queue='…' to @celery_task({name!r})") from exc

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def run(job: Job) -> Any:
            payload = job.payload if isinstance(job.payload, dict) else {}
            args, kwargs = payload.get("args", []), payload.get("kwargs", {})
            request = payload.get("celery") or {"id": job.id, "task": name}
            writer = result_writer()
            try:
                expires = request.get("expires")
                if expires and dt.datetime.fromisoformat(expires) < dt.datetime.now(dt.UTC):
                    raise PermanentError(f"task {request['id']} expired at {expires}")
                result = func(job, *args, **kwargs) if bind else func(*args, **kwargs)
            except BaseException as exc:
                final = isinstance(exc, PermanentError) or job.is_last_attempt
                if final and writer is not None:
                    _write(writer.failure, request, exc)
                raise
            if writer is not None:
                _write(writer.success, request, result)
            return result

        registry.register(target, run)
        _tasks[name] = (target, max_retries)
        return run

    return decorator


def _write(method: Callable[[dict, Any], None], request: dict, value: Any) -> None:
    """The job's own outcome is the record; a result backend that is down must not make a
    finished task run again, so a failed write is logged, not raised."""
    try:
        method(request, value)
    except Exception:
        logger.exception("[%s] could not write the Celery result of task", request.get("id"))


def publish(
    task_name: str,
    args: list[Any] | tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    task_id: str | None = None,
    queue: str = "celery",
    exchange: str | None = None,
    routing_key: str | None = None,
    countdown: float | None = None,
    eta: dt.datetime | None = None,
    expires: dt.datetime | float | None = None,
    priority: int | None = None,
    broker_url: str | None = None,
    max_payload_bytes: int | None = None,
) -> str:
    """Send a Celery protocol 2 message (JSON) that a Celery worker consuming ``queue`` runs as
    ``task_name``; returns the task id (``AsyncResult(task_id)`` on the Celery side).

    The exchange and routing key default to Celery's defaults for a queue (a direct exchange
    named like the queue); the queue is declared the way Celery declares it, so a message sent
    before any worker started is kept.
    """
    from kombu import Connection, Exchange
    from kombu import Queue as KombuQueue
    from kombu.pools import producers

    url = broker_url or celery_settings()["BROKER_URL"]
    if not url:
        raise ConfigurationError("no broker: pass broker_url or set JOBQ['CELERY']['BROKER_URL']")
    task_id = task_id or str(uuid.uuid4())
    for name, value in (("countdown", countdown), ("expires", expires)):
        if value is not None and not isinstance(value, dt.datetime) and not is_seconds(value):
            raise InvalidOption(f"{name} must be a finite number of seconds, got {value!r}")
    if eta is None and countdown is not None:
        eta = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=countdown)
    if isinstance(expires, int | float):
        expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=expires)
    body, headers, properties = build(
        task_name, args, kwargs or {}, task_id=task_id, eta=eta, expires=expires
    )
    limit = max_payload_bytes or jobq_settings()["MAX_PAYLOAD_BYTES"]
    if len(body.encode()) > limit:
        raise ValidationError(f"message body is {len(body.encode())} bytes, over {limit}")
    kq = KombuQueue(queue, Exchange(exchange or queue, type="direct"), routing_key or queue)
    with producers[Connection(url)].acquire(block=True, timeout=10) as producer:
        producer.publish(
            body,
            exchange=kq.exchange,
            routing_key=kq.routing_key,
            declare=[kq],
            headers=headers,
            content_type="application/json",
            content_encoding="utf-8",
            priority=priority,
            retry=True,
            retry_policy={"max_retries": 3, "interval_start": 0.1, "interval_step": 0.5},
            **properties,
        )
    return task_id
