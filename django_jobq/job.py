"""Value objects passed between the Queue API, the worker and the storage backends.

Storage speaks bytes and integer milliseconds (what Lua and SQL can store exactly); the Queue API
turns them into Python values and datetimes for callers.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidOption
from .serde import check_json_value, serde_for, storable_text
from .states import JobState

#: Log lines kept per job (older ones drop off) and the longest line kept (longer are cut).
LOG_LINES = 100
LOG_LINE_MAX = 2000
#: The largest progress value, as JSON: progress is a status line, not a result channel.
PROGRESS_MAX_BYTES = 16 * 1024

#: Due time (epoch ms, 9000-01-01) of a flow parent parked until its children finish: later
#: than any real schedule, yet exact as a double score and inside datetime's range.
PARKED_MS = 221_845_392_000_000
#: Anything due after this counts as parked: a parent parked again by a worker is due at
#: PARKED_MS as that worker's clock reckons, a little off the storage's.
PARKED_FLOOR = PARKED_MS - 365 * 24 * 3600 * 1000

#: Sends (progress JSON or None, log line or None) for the running attempt; False: lease lost.
Reporter = Callable[[bytes | None, str | None], bool]


def ms_to_datetime(ms: int | None) -> dt.datetime | None:
    if not ms:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


class EnqueueOutcome(enum.StrEnum):
    QUEUED = "queued"  # a new job was stored (queued; scheduled when due later; blocked)
    DUPLICATE = "duplicate"  # the id (or dedup key) is taken and has not completed: no write
    COMPLETED = "completed"  # the id exists and completed: its cached result is returned
    UPDATED = "updated"  # a waiting job with this id (or dedup key) was updated in place
    # Journal mode: written to the database journal, not yet sent to Redis (the transaction is
    # still open, or Redis was unreachable); sent on commit or by jobq_reconcile.
    PENDING = "pending"


class CancelOutcome(enum.StrEnum):
    CANCELLED = "cancelled"  # now (or already) cancelled; it will never run
    REQUESTED = "requested"  # running: its worker was asked to stop it (see Queue.cancel)
    NOT_FOUND = "not_found"  # no such job, or its record expired
    ACTIVE = "active"  # running: cannot be cancelled by this call
    COMPLETED = "completed"
    FAILED = "failed"


class ChangeOutcome(enum.StrEnum):
    """What change_run_at / change_priority / promote did."""

    CHANGED = "changed"  # the waiting job now has the new due time / priority
    NOT_FOUND = "not_found"
    ACTIVE = "active"  # running (and no blocked successor): nothing to change
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class RetryOutcome(enum.StrEnum):
    """What ``retry`` did with a job that ended badly."""

    RETRIED = "retried"  # failed or cancelled -> queued again, attempts and stalls reset
    NOT_FOUND = "not_found"  # no such job, or its record expired (or was purged)
    WAITING = "waiting"  # scheduled, queued or retrying: it will run without help
    ACTIVE = "active"  # running now
    COMPLETED = "completed"  # succeeded: nothing to retry


class DedupMode(enum.StrEnum):
    SIMPLE = "simple"  # key held until the holder finishes (or ttl, when given, passes)
    THROTTLE = "throttle"  # key held for ttl whatever the holder does: repeats are dropped
    DEBOUNCE = "debounce"  # the last enqueue within ttl wins: it replaces the waiting holder


class RunAtUpdate(enum.StrEnum):
    NO = "no"
    YES = "yes"
    IF_LATER = "if_later"
    IF_EARLIER = "if_earlier"


class AckOutcome(enum.StrEnum):
    """What a worker's complete / fail / release call did."""

    COMPLETED = "completed"
    FAILED = "failed"
    RETRYING = "retrying"
    RELEASED = "released"
    POSTPONED = "postponed"  # rate limited by the handler: back to scheduled, no attempt used
    LEASE_LOST = "lease_lost"  # the lease was reclaimed (or the job vanished): nothing written
    CANCELLED = "cancelled"  # an operator cancelled the running attempt: it ended cancelled


@dataclass(frozen=True, slots=True)
class JobOptions:
    """Per-job options, fully resolved (queue defaults applied) before they reach storage."""

    max_attempts: int = 3
    result_ttl: int = 24 * 3600 * 1000  # ms a finished job's record (result, error) is kept
    min_backoff: int = 1000  # ms before the second attempt
    max_backoff: int = 3600 * 1000  # ms cap of the exponential backoff
    max_stalls: int = 1  # lease expiries tolerated before the job fails
    priority: int = 0  # lower runs first; FIFO within a priority


@dataclass(frozen=True, slots=True)
class JobUpdate:
    """What an enqueue may change in a *waiting* job that has the same id (or, in debounce
    mode, the same dedup key). An active job is never touched; see ``NewJob.singleton``."""

    data: bool = False  # replace payload and content type
    run_at: RunAtUpdate = RunAtUpdate.NO  # move the due time to this enqueue's due time
    max_attempts: bool = False
    backoff: bool = False  # min_backoff and max_backoff
    reset_counts: bool = False  # attempts and stalls back to 0

    @property
    def any(self) -> bool:
        return bool(
            self.data or self.run_at is not RunAtUpdate.NO or self.max_attempts
            or self.backoff or self.reset_counts
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Dedup:
    """Deduplication by a key other than the id (validated like a job id)."""

    key: str
    mode: DedupMode = DedupMode.SIMPLE
    ttl: int | None = None  # ms; required for throttle and debounce


@dataclass(slots=True)  # not frozen: a frozen init costs ~1 us a job in bulk enqueues
class NewJob:
    """One job as storage receives it: validated, serialised, options resolved."""

    job_id: str
    payload: bytes
    options: JobOptions
    run_at: int | None = None  # epoch ms by the caller's clock; None or <= now: runnable now
    delay: int = 0  # ms from now by the storage's clock (so a producer's clock skew is moot)
    content_type: str = "json"
    waiter: bool = False  # the caller will wait for the outcome (enqueue_and_wait)
    lifo: bool = False  # runs before every FIFO job of its priority (newest LIFO job first)
    group: str | None = None  # rate-limit group (e.g. a customer id), validated like an id
    singleton: bool = False  # id active: store this as its blocked successor (see base.py)
    update: JobUpdate | None = None  # id waiting: what to change in it
    dedup: Dedup | None = None


@dataclass(slots=True)  # internal and hot, like NewJob
class StoredEnqueue:
    outcome: EnqueueOutcome
    job_id: str
    state: JobState
    result: bytes | None = None
    error: bytes | None = None


@dataclass(slots=True)
class ClaimedJob:
    """A job leased to one worker; ``token`` fences every later write of this attempt."""

    queue: str
    job_id: str
    payload: bytes
    token: int
    attempt: int  # 1-based number of this run
    max_attempts: int
    min_backoff: int
    max_backoff: int
    content_type: str = "json"
    # Milliseconds from the job's enqueue (or its due time, when later: a delay, a retry's
    # backoff) to this claim, by the storage's clock; None when the backend does not say.
    # Feeds the wait-time histogram (metrics/tally.py).
    waited_ms: int | None = None


@dataclass(frozen=True, slots=True)
class JobRecord:
    """Everything storage knows of one job (the source of `get_status`)."""

    queue: str
    job_id: str
    state: JobState
    attempts: int  # runs started so far
    max_attempts: int
    stalls: int
    max_stalls: int
    priority: int
    created_at: int
    run_at: int | None
    started_at: int | None
    finished_at: int | None
    worker: str | None
    result_ttl: int
    content_type: str
    payload: bytes | None
    result: bytes | None
    error: bytes | None
    expires_at: int | None = None
    lifo: bool = False
    group: str | None = None
    dedup_key: str | None = None
    min_backoff: int = 0
    max_backoff: int = 0
    has_successor: bool = False  # a blocked singleton successor waits for this job to finish
    progress: bytes | None = None  # JSON of the handler's last set_progress
    logs: tuple[tuple[int, str], ...] = ()  # (epoch ms, message), oldest first, last LOG_LINES


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """Flow control of one queue, shared by every worker (stored in the backend).

    ``rate_max`` jobs may *start* (be claimed) within any sliding window of ``rate_window``
    ms; ``group_rate_max`` per group key within ``group_rate_window`` ms; at most
    ``concurrency`` jobs of the queue are active at once across all workers. None: no limit.
    Jobs over a limit wait (they are never failed and use no attempt)."""

    rate_max: int | None = None
    rate_window: int | None = None
    group_rate_max: int | None = None
    group_rate_window: int | None = None
    concurrency: int | None = None


@dataclass(frozen=True, slots=True)
class Keep:
    """How many finished records of one final state a queue keeps: the newest ``count``
    and/or none finished more than ``age`` ms ago (None: no bound of that kind). Whichever
    bound a record passes first removes it, and so does its own ``result_ttl``."""

    count: int | None = None
    age: int | None = None


@dataclass(frozen=True, slots=True)
class Retention:
    """Per-queue retention of finished jobs (BullMQ's ``removeOnComplete`` /
    ``removeOnFail``), stored in the backend like ``QueueLimits``. A state left None keeps
    its records until their ``result_ttl``. A record removed by retention is gone as if it had
    expired: its result with it, and its id free for a new job (docs/settings.md)."""

    completed: Keep | None = None
    failed: Keep | None = None
    cancelled: Keep | None = None

    def items(self) -> list[tuple[str, Keep | None]]:
        """(state name, policy) for the three final states, in a fixed order."""
        return [("completed", self.completed), ("failed", self.failed),
                ("cancelled", self.cancelled)]  # fmt: skip

    @property
    def empty(self) -> bool:
        return all(keep is None for _, keep in self.items())


@dataclass(frozen=True, slots=True)
class FailureCall:
    """A pending call of a queue's failure handler, recorded in the same atomic step that
    failed the job for good. It carries its own copy of what the handler needs, so the call
    survives the job record's ``result_ttl`` and a successor taking the id over."""

    queue: str
    call_id: str  # the backend's name of this call (unique per permanent failure)
    job_id: str
    payload: bytes
    content_type: str
    error: bytes  # JSON {type, message, traceback} of the failure
    attempts: int  # runs the job used
    failed_at: int  # epoch ms
    due_at: int  # epoch ms: when it is (next) claimable; while leased, the lease's end
    tries: int  # claims so far; also the fence a settle must present
    last_error: bytes | None = None  # JSON of the failure handler's own last error
    worker: str | None = None  # the worker that claimed it last (None: never claimed)


@dataclass(frozen=True, slots=True)
class FinalOutcome:
    """A finished job as told to a waiter: its final state and result or error bytes."""

    state: JobState
    result: bytes | None = None
    error: bytes | None = None


def final_outcome(record: Any) -> FinalOutcome | None:
    """What a record tells a waiter once its job has finished; None while it has not. The one
    reading of "the record has the final word" for the waits whose reply never came (a wait
    that gave up, an expired reply list, a result read before waiting)."""
    from .states import TERMINAL_STATES

    if record is None or record.state not in TERMINAL_STATES:
        return None
    return FinalOutcome(record.state, record.result, record.error)


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of a queue's event stream.

    ``data`` is the value the transition carried, as it was then (a later retry does not
    change it): the result of ``completed``, the error (type, message…) of ``failed``,
    ``retrying`` and a running job's ``cancelled``, the value of ``progress``; None for other
    kinds. A value over ``EVENT_DATA_MAX`` encoded bytes is left out of the event, so a stream
    stays small: then ``data_omitted`` is True and the record (``get_result``) has it."""

    id: str
    queue: str
    job_id: str
    kind: str  # the state entered: queued, scheduled, active, completed, retrying, ...
    at: int  # epoch ms
    worker: str | None = None
    data: Any = None
    data_omitted: bool = False


#: The encoded size up to which an event carries its value (``Event.data``); every backend
#: applies it (Redis: ``EVENT_DATA_MAX`` in includes/common.lua, held equal by a test).
EVENT_DATA_MAX = 1024
#: Kinds whose event carries a value, and how it is stored: the result (in the job's serde),
#: an error record, a progress value (JSON).
DATA_KINDS = {"completed": "result", "failed": "error", "retrying": "error",
              "cancelled": "error", "progress": "progress"}  # fmt: skip


def event_data(kind: str, raw: bytes | None, content_type: str = "json") -> Any:
    """The value an event of ``kind`` carries, decoded from its stored bytes; bytes that do
    not decode come back as text (an event must stay readable whatever was written)."""
    if raw is None:
        return None
    what = DATA_KINDS.get(kind)
    if what == "error":
        return decode_error(raw)
    if what == "result":
        try:
            return serde_for(content_type).loads(raw)
        except Exception:  # any decoder error: the event stays readable
            return bytes(raw).decode("utf-8", "replace")
    return decode_progress(raw)


# --- public, decoded views -------------------------------------------------------------------


def decode_error(raw: bytes | None) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return {"type": "Unknown", "message": raw.decode(errors="replace")}
    return value if isinstance(value, dict) else {"type": "Unknown", "message": str(value)}


def decode_progress(raw: bytes | None) -> Any:
    """A stored progress value; bytes that are not JSON (written into storage by hand) come
    back as text rather than hiding the rest of the job's status."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return bytes(raw).decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    outcome: EnqueueOutcome
    job_id: str
    state: JobState
    result: Any = None
    error: dict[str, Any] | None = None

    @property
    def created(self) -> bool:
        return self.outcome is EnqueueOutcome.QUEUED


@dataclass(frozen=True, slots=True)
class JobStatus:
    queue: str
    job_id: str
    state: JobState
    attempts: int
    max_attempts: int
    stalls: int
    priority: int
    created_at: dt.datetime | None
    run_at: dt.datetime | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    worker: str | None
    error: dict[str, Any] | None
    lifo: bool = False
    group: str | None = None
    dedup_key: str | None = None
    has_successor: bool = False  # a blocked singleton run waits for this one
    progress: Any = None  # the handler's last job.set_progress value
    logs: tuple[tuple[dt.datetime, str], ...] = ()  # the last LOG_LINES job.log lines
    task: str | None = None  # the task function it calls (@task), None for a plain job


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A job that failed for good, as the dead-letter list shows it: enough to decide whether
    to retry it (its status and error) and what it was asked to do (its decoded payload)."""

    status: JobStatus
    payload: Any

    @property
    def job_id(self) -> str:
        return self.status.job_id

    @property
    def error(self) -> dict[str, Any] | None:
        return self.status.error


@dataclass(frozen=True, slots=True)
class FailedJob:
    """The job a failure handler is told about: a copy taken when it failed for good (its
    record may have expired or been replaced by then)."""

    id: str
    queue: str
    attempts: int  # runs it used
    failed_at: dt.datetime
    content_type: str
    raw_payload: bytes  # the payload as enqueued, whether or not it decodes
    tries: int  # this call of the failure handler: 1 the first time, 2 after one failed, ...
    task: str | None = None  # the task function's name (tasks/core.py); None for a plain job


@dataclass(frozen=True, slots=True)
class PendingFailureCall:
    """A failure-handler call that has not succeeded yet (``Queue.failure_calls``)."""

    job_id: str
    payload: Any  # decoded (raw bytes when it does not decode)
    error: dict[str, Any] | None  # the job's failure
    attempts: int
    failed_at: dt.datetime
    due_at: dt.datetime  # next try (while one runs: when its lease ends)
    tries: int  # calls so far
    last_error: dict[str, Any] | None  # the failure handler's own last error
    worker: str | None  # the worker that claimed it last (None: never claimed)


@dataclass(frozen=True, slots=True)
class JobResult:
    state: JobState
    value: Any = None
    error: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.state is JobState.COMPLETED


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """How one child of a flow ended, as its parent's handler receives it."""

    queue: str
    job_id: str
    state: JobState  # completed, failed or cancelled; failed too when its record was gone
    value: Any = None  # the child's result (completed)
    error: dict[str, Any] | None = None  # the child's error (failed, cancelled, lost)

    @property
    def ok(self) -> bool:
        return self.state is JobState.COMPLETED


@dataclass(slots=True)
class Job:
    """What a handler receives: the job's identity, payload and a cooperative cancel flag."""

    id: str
    queue: str
    payload: Any
    attempt: int
    max_attempts: int
    token: int = 0
    cancel_event: threading.Event = field(default_factory=threading.Event)
    # Set by the worker: stores progress and log lines with the job, fenced by this attempt's
    # token. None when a handler is called outside a worker (tests): values stay local.
    reporter: Reporter | None = field(default=None, repr=False)
    progress: Any = None
    logs: list[str] = field(default_factory=list, repr=False)
    # A flow parent's children, in the order the flow named them (see flows.py).
    children: tuple[ChildOutcome, ...] = ()
    # Per-job settings from the job's envelope (timeouts, flow links); {} for a plain job.
    meta: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def child_results(self) -> dict[str, Any]:
        """Results of the children that completed, by child job id."""
        return {c.job_id: c.value for c in self.children if c.ok}

    @property
    def previous_result(self) -> Any:
        """The result of a chain's previous step: the value of this job's only child."""
        if len(self.children) != 1:
            raise ValueError(f"previous_result needs exactly one child, this job has "
                             f"{len(self.children)}")  # fmt: skip
        return self.children[0].value

    def is_cancelled(self) -> bool:
        """True once the worker wants this job to stop: shutdown past grace, or lease lost."""
        return self.cancel_event.is_set()

    def set_progress(self, value: Any) -> bool:
        """Publish how far the job got (a number such as 0-100, or a JSON dict), shown by
        ``get_status``, the admin and the API and emitted as a ``progress`` event. Returns
        False when this attempt no longer owns the job (its lease was lost): stop early."""
        # Refused here, in the handler, rather than later by the database under the mirror
        # or the database backend: NaN/Infinity, NUL characters, nesting too deep.
        body = check_json_value(value, "progress")
        if len(body) > PROGRESS_MAX_BYTES:
            raise InvalidOption(f"progress is {len(body)} bytes of JSON, over {PROGRESS_MAX_BYTES}")
        self.progress = value
        return self._report(body, None)

    def log(self, message: str) -> bool:
        """Keep a line with the job (the last LOG_LINES; longer lines are cut), emitted as a
        ``log`` event. For what an operator looking at this one job should see; use Python
        logging for everything else. Returns False when the lease was lost."""
        line = storable_text(str(message)[:LOG_LINE_MAX])
        self.logs.append(line)
        del self.logs[:-LOG_LINES]
        return self._report(None, line)

    def _report(self, progress: bytes | None, line: str | None) -> bool:
        if self.reporter is None:
            return True
        ok = self.reporter(progress, line)
        if not ok:
            self.cancel_event.set()  # the lease is gone: the same signal as a lost heartbeat
        return ok

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts
