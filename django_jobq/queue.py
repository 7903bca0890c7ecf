"""The Queue API: what producers and operators call. It validates at the edge, serialises, and
hands storage one atomic operation per call."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from django.db import transaction

from .conf import OPTION_NAMES, get_storage, jobq_settings, queue_defaults
from .errors import InvalidOption, JobFailed, PayloadTooLarge, Timeout
from .job import (
    CancelOutcome,
    EnqueueOutcome,
    EnqueueResult,
    JobOptions,
    JobResult,
    JobStatus,
    NewJob,
    StoredEnqueue,
    decode_error,
    ms_to_datetime,
)
from .serde import Serde, get_serde
from .states import JobState
from .storage.base import Storage
from .validation import (
    validate_job_id,
    validate_positive_int,
    validate_positive_ms,
    validate_priority,
    validate_queue_name,
)

_SERDE_CACHE: dict[str, Serde] = {}


def serde_for(content_type: str) -> Serde:
    """Decode by the content type stored with each job, so a change of SERDE setting never
    makes older jobs unreadable."""
    serde = _SERDE_CACHE.get(content_type)
    if serde is None:
        serde = _SERDE_CACHE[content_type] = get_serde(content_type)
    return serde


def _duration_ms(name: str, value: int | dt.timedelta) -> int:
    if isinstance(value, dt.timedelta):
        value = int(value.total_seconds() * 1000)
    return validate_positive_ms(name, value, allow_zero=True)


class Queue:
    """A named queue on a storage backend.

    Args:
        name: queue name (``A-Z a-z 0-9 _ . -``, at most 64 characters).
        storage: a Storage; defaults to the one the ``JOBQ`` setting selects.
        serde: "json" (default), "msgpack", or an object with dumps/loads.
        max_payload_bytes: refuse serialised payloads above this size.
    """

    def __init__(
        self,
        name: str = "default",
        *,
        storage: Storage | None = None,
        serde: str | Serde | None = None,
        max_payload_bytes: int | None = None,
        defaults: JobOptions | None = None,
    ) -> None:
        conf = jobq_settings()
        self.name = validate_queue_name(name)
        self.storage = storage if storage is not None else get_storage()
        self.serde = get_serde(serde or conf["SERDE"])
        self.max_payload_bytes = max_payload_bytes or conf["MAX_PAYLOAD_BYTES"]
        self.defaults = defaults or queue_defaults(name)
        self._registered = False

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} on {type(self.storage).__name__}>"

    # -- producing --------------------------------------------------------------------------

    def build(
        self,
        job_id: str | None = None,
        payload: Any = None,
        *,
        delay: int | dt.timedelta | None = None,
        run_at: dt.datetime | None = None,
        waiter: bool = False,
        **options: Any,
    ) -> NewJob:
        """Validate and serialise one job without storing it (what every enqueue path uses)."""
        # 128 random bits as 32 hex characters (uuid4's length, a fifth of its cost).
        job_id = os.urandom(16).hex() if job_id is None else validate_job_id(job_id)
        if options:
            unknown = set(options) - set(OPTION_NAMES)
            if unknown:
                raise InvalidOption(f"unknown job option(s) {sorted(unknown)}")
        resolved = self._resolve_options(options)
        body = self.serde.dumps(payload)
        if len(body) > self.max_payload_bytes:
            raise PayloadTooLarge(len(body), self.max_payload_bytes)
        run_at_ms = None
        if run_at is not None:
            if not isinstance(run_at, dt.datetime) or run_at.tzinfo is None:
                raise InvalidOption("run_at must be a timezone-aware datetime")
            run_at_ms = int(run_at.timestamp() * 1000)
        delay_ms = 0 if delay is None else _duration_ms("delay", delay)
        return NewJob(job_id, body, resolved, run_at_ms, delay_ms, self.serde.name, waiter)

    def _resolve_options(self, options: dict[str, Any]) -> JobOptions:
        if not options:
            return self.defaults
        checks = {
            "max_attempts": lambda v: validate_positive_int("max_attempts", v),
            "result_ttl": lambda v: validate_positive_ms("result_ttl", v),
            "min_backoff": lambda v: validate_positive_ms("min_backoff", v, allow_zero=True),
            "max_backoff": lambda v: validate_positive_ms("max_backoff", v, allow_zero=True),
            "max_stalls": lambda v: validate_positive_int("max_stalls", v, minimum=0),
            "priority": validate_priority,
        }
        clean = {k: checks[k](v) for k, v in options.items() if v is not None}
        return replace(self.defaults, **clean)

    def _register(self) -> None:
        if not self._registered:
            self.storage.register_queue(self.name)
            self._registered = True

    def enqueue(
        self, job_id: str | None = None, payload: Any = None, **options: Any
    ) -> EnqueueResult:
        """Put a job on the queue unless its id is already known.

        Returns the outcome: ``queued`` (stored now), ``duplicate`` (the id exists: its state is
        returned and nothing is written) or ``completed`` (the id completed: its cached result
        is returned). Options: max_attempts, result_ttl (ms), min_backoff / max_backoff (ms),
        max_stalls, priority, delay (ms or timedelta), run_at (aware datetime).
        """
        job = self.build(job_id, payload, **options)
        self._register()
        return self._public(self.storage.enqueue(self.name, job))

    def enqueue_on_commit(
        self,
        job_id: str | None = None,
        payload: Any = None,
        *,
        using: str | None = None,
        **options: Any,
    ) -> str:
        """Enqueue once the current database transaction on ``using`` commits; drop the job if
        it rolls back. Returns the job id (generated now when not given).

        For the Redis backend this is the way to tie a job to a database change: a worker can
        no longer pick up a job for a row that is not committed yet, or never will be. The
        job is validated now, so bad input fails inside the transaction. What this cannot
        give is atomicity: if Redis is unreachable at commit time the rows stay committed and
        the enqueue raises. Only the database backend enqueues *inside* the transaction.
        """
        job = self.build(job_id, payload, **options)

        def send() -> None:
            self._register()
            self.storage.enqueue(self.name, job)

        transaction.on_commit(send, using=using)
        return job.job_id

    def enqueue_many(
        self, jobs: Iterable[Mapping[str, Any] | tuple[str | None, Any]]
    ) -> list[EnqueueResult]:
        """Enqueue many jobs in pipelined batches; each item is ``(job_id, payload)`` or a dict
        with ``id``, ``payload`` and options. Every item is validated before anything is sent,
        so one bad item refuses the whole call and writes nothing."""
        built = []
        for item in jobs:
            if isinstance(item, Mapping):
                spec = dict(item)
                built.append(self.build(spec.pop("id", None), spec.pop("payload", None), **spec))
            else:
                job_id, payload = item
                built.append(self.build(job_id, payload))
        if not built:
            return []
        self._register()
        return [self._public(s) for s in self.storage.enqueue_many(self.name, built)]

    def enqueue_and_wait(
        self, job_id: str | None = None, payload: Any = None, *, timeout: float, **options: Any
    ) -> Any:
        """Enqueue (or join an existing job with that id) and wait for its result.

        The wait is registered inside the same atomic step as the enqueue, so a completion can
        never slip between the two. A completed duplicate returns its cached result at once.

        Raises:
            JobFailed: the job failed for good or was cancelled; ``.error`` has the remote error.
            Timeout: no outcome within ``timeout`` seconds (the job itself keeps running).
        """
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            raise InvalidOption(f"timeout must be a positive number of seconds, got {timeout!r}")
        job = self.build(job_id, payload, waiter=True, **options)
        self._register()
        stored = self.storage.enqueue(self.name, job)
        if stored.state is JobState.COMPLETED:
            return self.serde_loads(stored.result)
        if stored.state in (JobState.FAILED, JobState.CANCELLED):
            raise JobFailed(job.job_id, decode_error(stored.error), stored.state.value)
        outcome = self.storage.wait_for_outcome(self.name, job.job_id, timeout)
        if outcome is None:
            raise Timeout(job.job_id, timeout)
        if outcome.state is JobState.COMPLETED:
            return self.serde_loads(outcome.result)
        raise JobFailed(job.job_id, decode_error(outcome.error), outcome.state.value)

    # -- managing ---------------------------------------------------------------------------

    def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a waiting job: ``cancelled``, or why not (``not_found``, ``active``,
        ``completed``, ``failed``). A cancelled job never runs."""
        return self.storage.cancel(self.name, validate_job_id(job_id))

    def get_status(self, job_id: str) -> JobStatus | None:
        record = self.storage.get_record(self.name, validate_job_id(job_id))
        if record is None:
            return None
        return JobStatus(
            queue=self.name,
            job_id=record.job_id,
            state=record.state,
            attempts=record.attempts,
            max_attempts=record.max_attempts,
            stalls=record.stalls,
            priority=record.priority,
            created_at=ms_to_datetime(record.created_at),
            run_at=ms_to_datetime(record.run_at),
            started_at=ms_to_datetime(record.started_at),
            finished_at=ms_to_datetime(record.finished_at),
            worker=record.worker,
            error=decode_error(record.error),
        )

    def get_result(self, job_id: str) -> JobResult | None:
        """The result (completed) or error (failed) while the record lives; ``None`` when the
        job is unknown or expired. For a job still running, the state with no value."""
        record = self.storage.get_record(self.name, validate_job_id(job_id))
        if record is None:
            return None
        value = None
        if record.state is JobState.COMPLETED and record.result is not None:
            value = serde_for(record.content_type).loads(record.result)
        return JobResult(record.state, value, decode_error(record.error))

    def counts(self) -> dict[JobState, int]:
        return self.storage.counts(self.name)

    def publish_celery(
        self,
        task_name: str,
        args: list[Any] | tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> str:
        """Send this work to a Celery worker instead of running it here: a Celery protocol 2
        message (JSON) for ``task_name`` on the Celery queue ``options["queue"]`` (default
        "celery"); returns the task id. The way to move a queue back, or to hand work to
        Celery-only code during a migration. Options: see ``celery_compat.publish``; this
        queue's payload size limit applies."""
        from .celery_compat import publish

        options.setdefault("max_payload_bytes", self.max_payload_bytes)
        return publish(task_name, args, kwargs, **options)

    # -- helpers ----------------------------------------------------------------------------

    def serde_loads(self, data: bytes | None) -> Any:
        return None if data is None else self.serde.loads(data)

    def _public(self, stored: StoredEnqueue) -> EnqueueResult:
        result = None
        if stored.outcome is EnqueueOutcome.COMPLETED and stored.result is not None:
            result = self.serde.loads(stored.result)
        return EnqueueResult(
            stored.outcome, stored.job_id, stored.state, result, decode_error(stored.error)
        )


def now_ms() -> int:
    return int(time.time() * 1000)


_queues: dict[str, Queue] = {}


def get_queue(name: str = "default") -> Queue:
    """A cached Queue on the configured storage (rebuilt when the storage changes)."""
    queue = _queues.get(name)
    if queue is None or queue.storage is not get_storage():
        queue = _queues[name] = Queue(name)
    return queue
