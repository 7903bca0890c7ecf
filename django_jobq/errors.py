"""Exceptions raised by django_jobq, and the ones handlers raise to steer retries."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any


class JobQError(Exception):
    """Base class of every error django_jobq raises."""


class ValidationError(JobQError, ValueError):
    """Bad input refused at the edge: nothing was written to storage."""


class InvalidJobId(ValidationError):
    pass


class InvalidQueueName(ValidationError):
    pass


class InvalidOption(ValidationError):
    pass


class PayloadTooLarge(ValidationError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload is {size} bytes, over the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class SerializationError(ValidationError):
    pass


class InvalidPayload(SerializationError):
    """A value no job can carry: not encodable by the queue's serde, a float that is NaN or
    infinite (JSON has no spelling for them and the databases refuse them), or nested deeper
    than the interpreter can walk. Raised where the value enters (enqueue, progress, a
    handler's result), never later, when a mirror or an API reader would trip over it."""


class ConfigurationError(JobQError):
    pass


class StorageError(JobQError):
    """The storage answered something it should never answer (a bug or a foreign write)."""


class StorageUnavailable(JobQError):
    """The job storage did not answer: Redis down, partitioned, timed out or still loading;
    the database connection lost or locked past its timeout. Raised by every backend, with
    the client's own error as ``__cause__``.

    Whether the operation took effect is unknown when the reply was lost (a timeout), so
    retry with the same job id: ids make a repeated enqueue safe."""


class StorageFull(StorageUnavailable):
    """Redis refused a write at ``maxmemory`` (policy ``noeviction``, the one a queue needs).
    Nothing of the refused operation was written: each script's first write is the one
    refused, so a retry once memory is freed is safe."""


class JobNotFound(JobQError, LookupError):
    pass


class JobFailed(JobQError):
    """`enqueue_and_wait` of a job that failed for good; carries the remote error."""

    def __init__(self, job_id: str, error: dict[str, Any] | None, state: str = "failed") -> None:
        self.job_id = job_id
        self.error = error or {}
        self.state = state
        message = self.error.get("message") or state
        super().__init__(f"job {job_id} {state}: {self.error.get('type', '')}: {message}")


class Timeout(JobQError, TimeoutError):
    """`enqueue_and_wait` gave up waiting; the job itself keeps running."""

    def __init__(self, job_id: str, timeout: float) -> None:
        super().__init__(f"no result for job {job_id} within {timeout}s (the job keeps running)")
        self.job_id = job_id
        self.timeout = timeout


class PermanentError(Exception):
    """Raised by a handler: fail the job now, with no further attempts."""


class Retry(Exception):
    """Raised by a handler to retry at a chosen time instead of the exponential backoff.

    Any exception that carries a ``retry_in`` (seconds) or ``retry_at`` (datetime or epoch
    seconds) attribute is honoured the same way, so libraries' own errors can steer retries.
    """

    def __init__(
        self,
        message: str = "retry requested",
        *,
        retry_in: float | None = None,
        retry_at: dt.datetime | float | None = None,
    ) -> None:
        super().__init__(message)
        self.retry_in = retry_in
        self.retry_at = retry_at


class RetryDecision(Exception):  # noqa: N818 - a verdict, not an error of its own
    """A task's retry policy ruling on the exception it carries (``tasks/policy.py``): fail for
    good (``permanent``) or retry after ``retry_in`` seconds. The worker records the carried
    exception, not this wrapper, so a dead letter shows the task's own error type."""

    def __init__(
        self, error: BaseException, *, permanent: bool = False, retry_in: float | None = None
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.permanent = permanent
        self.retry_in = retry_in


class HardTimeout(Exception):  # noqa: N818 - names what happened to the attempt
    """An attempt ran past its handler's ``hard_timeout`` and was stopped by the worker (the
    process pool kills its child; the async pool cancels the task). The job retries as any
    failure would."""


class JobCancelled(Exception):  # noqa: N818 - names what happened to the attempt
    """An operator cancelled the running attempt (``Queue.cancel`` of an active job): the job
    ends ``cancelled`` whatever its handler did after that."""


class QueueBusy(JobQError):
    """``obliterate`` of a queue that still has active jobs (pass ``force=True`` to go on)."""

    def __init__(self, queue: str) -> None:  # one text, whichever backend refused
        super().__init__(f"queue {queue!r} has active jobs; pass force=True to obliterate it")


class EventsLost(JobQError, LookupError):
    """An event feed's position is gone: events after ``since`` were removed before they were
    read (the stream's ``EVENTS_MAXLEN`` cap, the retention of their jobs, an obliterated
    queue, a storage that lost its data). Raised instead of going on past a silent gap; to go
    on anyway, read again from ``"0"`` (the oldest event kept) and resync what the gap hid."""

    def __init__(self, queue: str, since: str) -> None:
        self.queue, self.since = queue, since
        super().__init__(
            f"events of queue {queue!r} after {since!r} are no longer kept (some were removed "
            "unread); resume from '0', the oldest kept, and resync what they would have told"
        )


class UnknownGroup(JobQError, LookupError):
    """A broadcast asked about a subscriber group it does not have."""

    def __init__(self, broadcast: str, group: str) -> None:
        super().__init__(f"broadcast {broadcast!r} has no group {group!r}")


class RateLimited(Exception):  # noqa: N818 - a signal from a handler, named for what it says
    """Raised by a handler: "the service I call is rate limited, run me again in ``retry_in``
    seconds". The job goes back to scheduled without using an attempt. With ``queue_wide``
    the whole queue stops claiming until then (every job calls the same limited service)."""

    def __init__(
        self, retry_in: float, message: str = "rate limited", *, queue_wide: bool = False
    ) -> None:
        super().__init__(message)
        if (
            isinstance(retry_in, bool)
            or not isinstance(retry_in, int | float)
            or not 0 <= retry_in < math.inf  # NaN fails both comparisons
        ):
            raise ValueError(f"retry_in must be a finite number of seconds >= 0, got {retry_in!r}")
        self.retry_in = retry_in
        self.queue_wide = queue_wide


class FlowError(InvalidOption):
    """A flow that cannot be enqueued (a cycle, one job defined twice differently): refused
    before any of its jobs is stored."""


class ChildFailed(PermanentError):
    """A flow parent whose child failed, was cancelled or vanished, under the default
    ``on_child_failure="fail"``: the parent fails for good without running."""
