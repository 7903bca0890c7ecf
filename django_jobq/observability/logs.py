"""Logs: JSON lines with the job they are about, and the management commands' set-up.

JSON log lines carry the job they are about: job id, queue, attempt, worker and trace id.

``JsonFormatter`` turns each record into one JSON object. While a worker runs a job on its
thread pool, the job is known to the thread (a context variable the worker sets around the
handler call), so the handler's own log lines and the worker's lines about that attempt carry
``job_id``, ``queue``, ``attempt`` and ``worker``; with tracing on they also carry the
attempt span's ``trace_id`` and ``span_id``. The worker sets the variable only once a
``JsonFormatter`` exists in the process (``ENABLED``), so projects that log plain text pay
nothing for it.

    LOGGING = {"version": 1,
               "formatters": {"json": {"()": "django_jobq.observability.logs.JsonFormatter"}},
               "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
               "root": {"handlers": ["console"], "level": "INFO"}}

or ``runworker --log-format json`` when the project configures no logging of its own
(``configure``: the commands honour ``--verbosity`` without clobbering a project's own LOGGING).
The old path ``django_jobq.logjson.JsonFormatter`` keeps working.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ENABLED = False  # a JsonFormatter was made in this process: the worker records job context
_job: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "django_jobq_job", default=None
)


@contextmanager
def job_context(queue: str, job_id: str, attempt: int, worker: str) -> Iterator[None]:
    """The job that log lines of this thread (or task) are about, while the block runs."""
    token = _job.set({"job_id": job_id, "queue": queue, "attempt": attempt, "worker": worker})
    try:
        yield
    finally:
        _job.reset(token)


def _trace_ids() -> dict[str, str]:
    from . import tracing

    if not tracing.active():
        return {}
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, process,
    thread, the job fields when the line is about a running job, the trace ids when traced,
    and ``exception`` (the formatted traceback) when there is one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        global ENABLED
        super().__init__(*args, **kwargs)
        ENABLED = True

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        job = _job.get()
        if job is not None:
            line.update(job)
        line.update(_trace_ids())
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


def configure(verbosity: int, fmt: str = "text") -> None:
    """``fmt`` "json": one JSON object per line (``JsonFormatter``), when the project
    configured no handler of its own (its LOGGING decides otherwise)."""
    logger = logging.getLogger("django_jobq")
    logger.setLevel(LEVELS.get(verbosity, logging.DEBUG))
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        if fmt == "json":
            handler.setFormatter(JsonFormatter())
        else:
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s %(process)d %(message)s")
            )
        logger.addHandler(handler)
