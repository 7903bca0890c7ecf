"""django_jobq: a reliable job queue for Django."""

import importlib.abc
import importlib.util
import sys
from typing import Any

from .errors import (
    EventsLost,
    InvalidJobId,
    InvalidOption,
    InvalidPayload,
    InvalidQueueName,
    JobFailed,
    JobQError,
    PayloadTooLarge,
    PermanentError,
    QueueBusy,
    RateLimited,
    Retry,
    StorageFull,
    StorageUnavailable,
    Timeout,
    ValidationError,
)
from .job import (
    CancelOutcome,
    ChangeOutcome,
    DeadLetter,
    EnqueueOutcome,
    EnqueueResult,
    FailedJob,
    Job,
    JobResult,
    JobStatus,
    Keep,
    PendingFailureCall,
    QueueLimits,
    Retention,
    RetryOutcome,
)
from .states import JobState

__version__ = "0.1.0"

__all__ = [
    "CancelOutcome",
    "ChangeOutcome",
    "DeadLetter",
    "EnqueueOutcome",
    "EnqueueResult",
    "FailedJob",
    "InvalidJobId",
    "InvalidOption",
    "InvalidPayload",
    "InvalidQueueName",
    "Job",
    "JobFailed",
    "JobQError",
    "JobResult",
    "JobState",
    "JobStatus",
    "PayloadTooLarge",
    "PendingFailureCall",
    "PermanentError",
    "Queue",
    "EventsLost",
    "QueueBusy",
    "Keep",
    "QueueLimits",
    "Retention",
    "RateLimited",
    "Retry",
    "RetryOutcome",
    "StorageFull",
    "StorageUnavailable",
    "Timeout",
    "ValidationError",
    "Backoff",
    "Task",
    "get_queue",
    "handler",
    "on_failure",
    "task",
]


def __getattr__(name: str) -> Any:
    # Queue and friends import Django settings machinery; load them lazily so that
    # `import django_jobq` works before settings are configured (e.g. in INSTALLED_APPS).
    if name in ("Queue", "get_queue"):
        from .queue import core as queue

        return getattr(queue, name)
    if name in ("handler", "on_failure"):
        from .tasks import registry

        return getattr(registry, name)
    if name in ("task", "Task", "Backoff"):
        from . import tasks

        return getattr(tasks, name)
    raise AttributeError(name)


# Module paths the docs gave before the package was restructured, which users write
# (``TASKS``'s ``BACKEND``, ``LOGGING``'s formatter, ``include()`` of the metrics URLs, imports
# shown in the docs), and where they live now. An old path (or a module under it) is the new
# module itself, not a copy: one module object under two names, so state and ``isinstance``
# agree whichever name imported it.
MOVED = {
    "django_jobq.celery_compat": "django_jobq.contrib.celery",
    "django_jobq.flows": "django_jobq.queue.flows",
    "django_jobq.logjson": "django_jobq.observability.logs",
    "django_jobq.metrics": "django_jobq.observability.metrics",
    "django_jobq.spark": "django_jobq.contrib.spark",
    "django_jobq.tasks_backend": "django_jobq.contrib.tasks_backend",
    "django_jobq.tracing": "django_jobq.observability.tracing",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        old = next((o for o in MOVED if fullname == o or fullname.startswith(o + ".")), None)
        if old is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=MOVED[old])

    def create_module(self, spec: Any) -> Any:
        old = next(o for o in MOVED if spec.name == o or spec.name.startswith(o + "."))
        module = importlib.import_module(MOVED[old] + spec.name[len(old) :])
        spec.loader_state = module.__spec__  # importlib puts the old name's spec on it
        return module

    def exec_module(self, module: Any) -> None:
        """Nothing to run (the module was imported under its own name); its own spec goes
        back, which its relative imports, ``reload`` and pickling read."""
        module.__spec__ = module.__spec__.loader_state


sys.meta_path.insert(0, _MovedModules())
