"""django_jobq: a reliable job queue for Django."""

from .errors import (
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


def __getattr__(name: str):
    # Queue and friends import Django settings machinery; load them lazily so that
    # `import django_jobq` works before settings are configured (e.g. in INSTALLED_APPS).
    if name in ("Queue", "get_queue"):
        from . import queue

        return getattr(queue, name)
    if name in ("handler", "on_failure"):
        from . import registry

        return getattr(registry, name)
    if name in ("task", "Task", "Backoff"):
        from . import tasks

        return getattr(tasks, name)
    raise AttributeError(name)
