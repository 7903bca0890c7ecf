"""The Queue API: what producers and operators call. It validates at the edge, serialises, and
hands storage one atomic operation per call."""

from __future__ import annotations

import contextvars
import datetime as dt
import logging
import os
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, transaction

from .. import signals
from ..backend import get_storage, in_test_mode
from ..conf import (
    OPTION_NAMES,
    configured_shards,
    jobq_settings,
    journal_in_settings,
    queue_defaults,
    queue_durability,
    validate_durability,
)
from ..errors import (
    ConfigurationError,
    InvalidJobId,
    InvalidOption,
    JobFailed,
    PayloadTooLarge,
    Timeout,
)
from ..job import (
    CancelOutcome,
    ChangeOutcome,
    DeadLetter,
    Dedup,
    DedupMode,
    EnqueueOutcome,
    EnqueueResult,
    Event,
    JobOptions,
    JobRecord,
    JobResult,
    JobStatus,
    JobUpdate,
    Keep,
    NewJob,
    PendingFailureCall,
    QueueLimits,
    Retention,
    RetryOutcome,
    RunAtUpdate,
    StoredEnqueue,
    decode_error,
    decode_progress,
    ms_to_datetime,
)
from ..observability import tracing
from ..serde import JSONSerde, Serde, get_serde, serde_for, task_name, unwrap, wrap
from ..states import TERMINAL_STATES, JobState
from ..storage.base import Storage, in_thread
from ..validation import (
    logical_name,
    parse_retention,
    validate_job_id,
    validate_physical_queue_name,
    validate_positive_int,
    validate_positive_ms,
    validate_priority,
    validate_seconds,
    validate_sharded_name,
    validate_shards,
)
from .events import PageReader, aiterate_pages, iterate_pages, validate_kinds, validate_since

if TYPE_CHECKING:
    from ..storage.redis.storage import RedisStorage

logger = logging.getLogger("django_jobq.queue")


def _duration_ms(name: str, value: int | dt.timedelta, *, allow_zero: bool = True) -> int:
    if isinstance(value, dt.timedelta):
        value = int(value.total_seconds() * 1000)
    return validate_positive_ms(name, value, allow_zero=allow_zero)


def _epoch_ms(name: str, value: dt.datetime) -> int:
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise InvalidOption(f"{name} must be a timezone-aware datetime")
    return int(value.timestamp() * 1000)


def _seconds(name: str, value: object) -> float:
    return validate_seconds(name, value, maximum=86400)


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidOption(f"{name} must be True or False, got {value!r}")
    return value


_RUN_AT_MODES = {False: RunAtUpdate.NO, True: RunAtUpdate.YES, "if_later": RunAtUpdate.IF_LATER,
                 "if_earlier": RunAtUpdate.IF_EARLIER}  # fmt: skip


def _job_update(
    update_data: bool = False,
    update_run_at: bool | str = False,
    update_max_attempts: bool = False,
    update_backoff: bool = False,
    reset_counts: bool = False,
) -> JobUpdate | None:
    mode = _RUN_AT_MODES.get(update_run_at) if isinstance(update_run_at, bool | str) else None
    if mode is None:
        raise InvalidOption(
            f"update_run_at must be True, False, 'if_later' or 'if_earlier', got {update_run_at!r}"
        )
    update = JobUpdate(
        data=_flag("update_data", update_data),
        run_at=mode,
        max_attempts=_flag("update_max_attempts", update_max_attempts),
        backoff=_flag("update_backoff", update_backoff),
        reset_counts=_flag("reset_counts", reset_counts),
    )
    return update if update.any else None


def _dedup(key: str | None, mode: str | None, ttl: int | dt.timedelta | None) -> Dedup | None:
    if key is None:
        if mode is not None or ttl is not None:
            raise InvalidOption("dedup_mode and dedup_ttl need a dedup_key")
        return None
    _key_like_id("dedup_key", key)
    try:
        dedup_mode = DedupMode(mode or "simple")
    except ValueError:
        raise InvalidOption(
            f"dedup_mode must be 'simple', 'throttle' or 'debounce', got {mode!r}"
        ) from None
    ttl_ms = None if ttl is None else _duration_ms("dedup_ttl", ttl, allow_zero=False)
    if ttl_ms is None and dedup_mode is not DedupMode.SIMPLE:
        raise InvalidOption(f"dedup_mode {dedup_mode.value!r} needs a dedup_ttl")
    return Dedup(key, dedup_mode, ttl_ms)


def _key_like_id(name: str, value: object) -> None:
    """Group and dedup keys become parts of Redis keys: the job-id charset keeps them inside
    the queue's hash tag."""
    try:
        validate_job_id(value)
    except InvalidJobId as exc:
        raise InvalidOption(f"{name}: {exc}".replace("job id", "key")) from None


def _limit(name: str, value: object, *, ms: bool = False) -> int | None:
    if value is None:
        return None
    if ms:
        return validate_positive_ms(name, value)
    return validate_positive_int(name, value)


#: The jobs ``enqueue_on_commit`` was asked for inside an ``atomic=True`` run on Redis
#: (``worker/execution.py``), with the storage that run's completion goes to: they are
#: recorded with the run's outcome instead of being sent after a commit a crash could
#: separate them from.
_FOLLOW_UPS: contextvars.ContextVar[tuple[Storage, list[tuple[str, NewJob]]] | None] = (
    contextvars.ContextVar("jobq_follow_ups", default=None)
)


@contextmanager
def collecting_follow_ups(storage: Storage) -> Iterator[list[tuple[str, NewJob]]]:
    """Within: ``enqueue_on_commit`` onto ``storage`` appends (queue, job) to the list."""
    collected: list[tuple[str, NewJob]] = []
    token = _FOLLOW_UPS.set((storage, collected))
    try:
        yield collected
    finally:
        _FOLLOW_UPS.reset(token)


def follow_up_outbox(storage: Storage) -> list[tuple[str, NewJob]] | None:
    active = _FOLLOW_UPS.get()
    return active[1] if active is not None and active[0] is storage else None


class Queue:
    """A named queue on a storage backend.

    Args:
        name: queue name (``A-Z a-z 0-9 _ . -``, at most 64 characters).
        storage: a Storage; defaults to the one the ``JOBQ`` setting selects.
        serde: "json" (default), "msgpack", or an object with dumps/loads.
        max_payload_bytes: refuse serialised payloads above this size.
        durability: "redis" or "journal" (see docs/durability.md); default from the
            ``JOBQ`` setting (``QUEUES[name]["durability"]``, else ``DURABILITY``).
        shards: partitions of this one logical queue (1-64; default
            ``QUEUES[name]["shards"]``, else 1). Above 1 the object is a ``ShardedQueue``
            (``sharded.py``, docs/scaling.md): same API, jobs routed by a stable hash.

    Every method that reaches the storage raises ``StorageUnavailable`` when it does not
    answer (``StorageFull``: Redis at ``maxmemory``), whatever the backend; the storage
    layer translates its client's errors, so nothing here catches redis-py's.
    """

    # The class of a queue with more than one shard (``sharded.py`` registers itself with
    # ``sharded=True``; the package imports it), so this module needs no import of it.
    _sharded_class: type[Queue] | None = None

    def __init_subclass__(cls, *, sharded: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if sharded:
            Queue._sharded_class = cls

    def __new__(cls, name: str = "default", *args: Any, shards: int | None = None,
                **kwargs: Any) -> Queue:  # fmt: skip
        """``Queue(name)`` of a queue with more than one shard is a ``ShardedQueue``, so
        ``get_queue``, the admin, the API and every producer route without being told."""
        if cls is Queue and _shard_count(name, shards) > 1:
            assert Queue._sharded_class is not None  # imported by the package
            cls = Queue._sharded_class
        return super().__new__(cls)

    def __init__(
        self,
        name: str = "default",
        *,
        storage: Storage | None = None,
        serde: str | Serde | None = None,
        max_payload_bytes: int | None = None,
        defaults: JobOptions | None = None,
        durability: str | None = None,
        shards: int | None = None,
    ) -> None:
        conf = jobq_settings()
        # A partition's name is accepted too (an operator asking for one partition, the
        # admin acting on a row): it is a queue of its own with its logical queue's settings.
        self.name = validate_physical_queue_name(name)
        logical = logical_name(self.name)
        self.storage = storage if storage is not None else get_storage()
        if durability is not None:
            self.durability = validate_durability(durability, "durability")
        else:  # the test mode's storage keeps no journal: a journal queue is a plain one there
            self.durability = "redis" if in_test_mode() else queue_durability(logical)
        if self.durability == "journal" and not self.storage.supports_journal:
            raise ConfigurationError(
                f"queue {self.name!r}: durability 'journal' needs the Redis backend, not "
                f"{type(self.storage).__name__} (the database backend already commits every "
                "job in the database)"
            )
        self.serde = get_serde(serde or conf["SERDE"])
        self.max_payload_bytes = max_payload_bytes or conf["MAX_PAYLOAD_BYTES"]
        self.defaults = defaults or queue_defaults(logical)
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
        lifo: bool = False,
        group: str | None = None,
        singleton: bool = False,
        update_data: bool = False,
        update_run_at: bool | str = False,
        update_max_attempts: bool = False,
        update_backoff: bool = False,
        reset_counts: bool = False,
        dedup_key: str | None = None,
        dedup_mode: str | None = None,
        dedup_ttl: int | dt.timedelta | None = None,
        timeout: float | None = None,
        hard_timeout: float | None = None,
        meta: dict[str, Any] | None = None,
        **options: Any,
    ) -> NewJob:
        """Validate and serialise one job without storing it (what every enqueue path uses).

        ``timeout`` / ``hard_timeout`` (seconds) override the handler's for this job; they and
        ``meta`` (flows) travel in the job envelope (``serde.py``)."""
        # 128 random bits as 32 hex characters (uuid4's length, a fifth of its cost).
        job_id = os.urandom(16).hex() if job_id is None else validate_job_id(job_id)
        if options:
            unknown = set(options) - set(OPTION_NAMES)
            if unknown:
                raise InvalidOption(f"unknown job option(s) {sorted(unknown)}")
        resolved = self._resolve_options(options)
        if meta is None and timeout is None and hard_timeout is None:  # the common case
            body, content_type = self.serde.dumps(payload), self.serde.name
        else:
            meta = dict(meta or {})
            for name, value in (("timeout", timeout), ("hard_timeout", hard_timeout)):
                if value is not None:
                    meta[name] = _seconds(name, value)
            if meta:
                body, content_type = wrap(self.serde, payload, meta)
            else:
                body, content_type = self.serde.dumps(payload), self.serde.name
        if len(body) > self.max_payload_bytes:
            raise PayloadTooLarge(len(body), self.max_payload_bytes)
        run_at_ms = None if run_at is None else _epoch_ms("run_at", run_at)
        delay_ms = 0 if delay is None else _duration_ms("delay", delay)
        if group is not None:
            _key_like_id("group", group)
        # The defaults (False, None: identity, so a 0 or "" still meets the checks) need no
        # checking: most jobs use them, and this runs once per job.
        if (
            update_data is False and update_run_at is False and update_max_attempts is False
            and update_backoff is False and reset_counts is False
        ):  # fmt: skip
            update = None
        else:
            update = _job_update(
                update_data, update_run_at, update_max_attempts, update_backoff, reset_counts
            )
        return NewJob(
            job_id, body, resolved, run_at_ms, delay_ms, content_type, waiter,
            lifo=lifo if lifo is False else _flag("lifo", lifo),
            group=group,
            singleton=singleton if singleton is False else _flag("singleton", singleton),
            update=update,
            dedup=None if dedup_key is None and dedup_mode is None and dedup_ttl is None
            else _dedup(dedup_key, dedup_mode, dedup_ttl),
        )  # fmt: skip

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
        returned and nothing is written), ``completed`` (the id completed: its cached result
        is returned) or ``updated`` (a waiting job with this id, or this dedup key, was
        changed as asked). Options:

        - per job: max_attempts, result_ttl (ms), min_backoff / max_backoff (ms), max_stalls,
          priority (lower first), delay (ms or timedelta), run_at (aware datetime), lifo.
        - group: rate-limit group key (see ``set_limits``).
        - a waiting job with the same id: update_data, update_run_at (True, False,
          "if_later", "if_earlier"), update_max_attempts, update_backoff, reset_counts.
        - singleton: if the id is *running*, store this one as blocked; it runs when the
          running one finishes (never two at once).
        - dedup_key / dedup_mode ("simple", "throttle", "debounce") / dedup_ttl (ms).

        See docs/scheduling.md for the exact rules.
        """
        if tracing.active():
            with tracing.producer_span(self.name) as (span, carrier):
                job = self._build_traced(job_id, payload, options, carrier)
                span.set_attribute("messaging.message.id", job.job_id)
                return self.submit(job)
        return self.submit(self.build(job_id, payload, **options))

    def _build_traced(self, job_id: str | None, payload: Any, options: dict[str, Any],
                      carrier: Mapping[str, str]) -> NewJob:  # fmt: skip
        """``build`` for a traced enqueue: a sampled send's context goes in the envelope; an
        unsampled send (``tracing.UNSAMPLED``) marks its job, so that a worker under a
        parent-based sampler drops the attempt instead of sampling it again as a root. The
        mark costs no envelope: a job that has one anyway says it in its meta, a plain JSON
        job with one trailing space (``tracing.mark``). A plain job of another serde (a
        trailing byte would not decode) is left unmarked: its attempt is a root, as before."""
        if carrier is not tracing.UNSAMPLED:
            return self.build(job_id, payload, **_with_trace(options, carrier))
        timeouts = (options.get("timeout"), options.get("hard_timeout"))
        if options.get("meta") or timeouts != (None, None):  # enveloped anyway (see build)
            meta = {**(options.get("meta") or {}), tracing.UNSAMPLED_META: True}
            return self.build(job_id, payload, **{**options, "meta": meta})
        job = self.build(job_id, payload, **options)
        if (job.content_type == "json" and type(self.serde) is JSONSerde
                and len(job.payload) < self.max_payload_bytes):  # fmt: skip
            job.payload = tracing.mark(job.payload)
        return job

    def submit(self, job: NewJob) -> EnqueueResult:
        """Store a job made by ``build`` the way ``enqueue`` does (journal mode included)."""
        home = self._home(job)
        if home.journaled:
            stored = home._journal([job])[0]
        else:
            home._register()
            stored = home.storage.enqueue(home.name, job)
        if signals.job_enqueued.receivers:
            signals.enqueued(Queue, self.name, [stored])
        return self._public(stored)

    def _home(self, job: NewJob) -> Queue:
        """The physical queue that stores ``job``: this one (``ShardedQueue``: a partition)."""
        return self

    def partition_for(self, key: str) -> str:
        """The physical queue a job of routing ``key`` goes to (this queue's own name)."""
        return self.name

    def locate(self, job_id: str) -> Queue:
        """The physical queue that holds ``job_id``: this one (``ShardedQueue``: the partition
        that knows the id, else the one it routes to). For steps that follow one queue's
        storage, such as an event-stream wait."""
        return self

    @property
    def journaled(self) -> bool:
        return self.durability == "journal"

    def _journal(self, jobs: list[NewJob]) -> list[StoredEnqueue]:
        from .journal import submit

        return submit(self.name, jobs, self._send)

    def _send(self, jobs: Sequence[NewJob]) -> list[StoredEnqueue]:
        self._register()
        if len(jobs) == 1:
            return [self.storage.enqueue(self.name, jobs[0])]
        return self.storage.enqueue_many(self.name, jobs)

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
        the enqueue raises. The database backend enqueues *inside* the transaction when it
        is one on its own database (then this is ``enqueue``: the job is rolled back with it,
        and an ``atomic=True`` handler's follow-up jobs exist exactly when it completed), and
        a queue in journal mode journals inside it.
        """
        if tracing.active():
            # The send span is made now, inside the caller's span (a request's), and ends at
            # once: the commit runs its callbacks after the caller left that span, so a span
            # made then would start a trace of its own. The payload is encoded now, as always.
            with tracing.producer_span(self.name) as (span, carrier):
                job = self._build_traced(job_id, payload, options, carrier)
                span.set_attributes({"messaging.message.id": job.job_id, "jobq.on_commit": True})
        else:
            job = self.build(job_id, payload, **options)
        return self._home(job)._on_commit(job, using)

    def _on_commit(self, job: NewJob, using: str | None) -> str:
        if self.journaled:
            if using is not None and using != jobq_settings()["JOURNAL"]["DATABASE_ALIAS"]:
                raise InvalidOption(
                    f"journal mode writes on JOBQ['JOURNAL']['DATABASE_ALIAS'], not {using!r}"
                )
            self._journal([job])
            return job.job_id
        if (outbox := follow_up_outbox(self.storage)) is not None:  # an atomic run on Redis
            outbox.append((self.name, job))
            return job.job_id
        if self.storage.supports_transactional_enqueue and (using or DEFAULT_DB_ALIAS) == getattr(
            self.storage, "using", None
        ):
            self._register()
            stored = self.storage.enqueue(self.name, job)
            if signals.job_enqueued.receivers:
                signals.enqueued(Queue, self.name, [stored])
            return job.job_id

        def send() -> None:
            self._register()
            stored = self.storage.enqueue(self.name, job)
            if signals.job_enqueued.receivers:
                signals.enqueued(Queue, self.name, [stored])

        transaction.on_commit(send, using=using)
        return job.job_id

    def enqueue_many(
        self, jobs: Iterable[Mapping[str, Any] | tuple[str | None, Any]]
    ) -> list[EnqueueResult]:
        """Enqueue many jobs in pipelined batches; each item is ``(job_id, payload)`` or a dict
        with ``id``, ``payload`` and options. Every item is validated before anything is sent,
        so one bad item refuses the whole call and writes nothing."""
        if tracing.active():
            items = list(jobs)
            with tracing.producer_span(self.name, len(items)) as (_, carrier):
                return self._enqueue_many(items, carrier)
        return self._enqueue_many(jobs, {})

    def _enqueue_many(
        self,
        jobs: Iterable[Mapping[str, Any] | tuple[str | None, Any]],
        trace: Mapping[str, str],
    ) -> list[EnqueueResult]:
        built = []
        for item in jobs:
            if isinstance(item, Mapping):
                spec = dict(item)
                job_id, payload = spec.pop("id", None), spec.pop("payload", None)
                built.append(self._build_traced(job_id, payload, spec, trace))
            else:
                job_id, payload = item
                built.append(self._build_traced(job_id, payload, {}, trace))
        if not built:
            return []
        stored = self._store_many(built)
        if signals.job_enqueued.receivers:
            signals.enqueued(Queue, self.name, stored)
        return [self._public(s) for s in stored]

    def _store_many(self, built: list[NewJob]) -> list[StoredEnqueue]:
        """Store validated jobs, answers in their order (``ShardedQueue``: per partition)."""
        if self.journaled:
            return self._journal(built)
        self._register()
        return self.storage.enqueue_many(self.name, built)

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
        validate_seconds("timeout", timeout)
        if options.get("singleton"):
            # A blocked successor has no outcome until an unrelated run finishes; a caller
            # who waits wants the running job's result, which a plain enqueue_and_wait gives.
            raise InvalidOption("enqueue_and_wait cannot be combined with singleton=True")
        waited, outcome = False, None
        if tracing.active():
            with tracing.producer_span(self.name) as (span, carrier):
                job = self._build_traced(job_id, payload, {**options, "waiter": True}, carrier)
                span.set_attribute("messaging.message.id", job.job_id)
                stored = self._home(job)._store_waited(job)
        elif self.journaled or signals.job_enqueued.receivers:
            # (a receiver of job_enqueued hears of the job before it is waited on, as before)
            job = self.build(job_id, payload, waiter=True, **options)
            stored = self._home(job)._store_waited(job)
        else:
            # The hot path: one storage call that enqueues and waits (on Redis one write for
            # both, see Storage.enqueue_and_wait), on the queue that stores the job.
            job = self.build(job_id, payload, waiter=True, **options)
            home = self._home(job)
            home._register()
            stored, outcome = home.storage.enqueue_and_wait(home.name, job, timeout)
            waited = True
        if signals.job_enqueued.receivers:
            signals.enqueued(Queue, self.name, [stored])
        if stored.state is JobState.COMPLETED:
            return self.serde_loads(stored.result)
        if stored.state in (JobState.FAILED, JobState.CANCELLED):
            raise JobFailed(job.job_id, decode_error(stored.error), stored.state.value)
        if not waited:
            home = self._home(job)  # the waiter is registered where the job is
            outcome = home.storage.wait_for_outcome(home.name, job.job_id, timeout)
        if outcome is None:
            raise Timeout(job.job_id, timeout)
        if outcome.state is JobState.COMPLETED:
            return self.serde_loads(outcome.result)
        raise JobFailed(job.job_id, decode_error(outcome.error), outcome.state.value)

    # -- async producing (the storage's async twins: native on Redis, thread hops else) ---

    async def aenqueue(
        self, job_id: str | None = None, payload: Any = None, **options: Any
    ) -> EnqueueResult:
        """``enqueue`` for async code (ASGI views): same arguments, same outcome. On Redis the
        storage call is native async I/O; see ``Storage.aenqueue`` for the other backends."""
        if self.journaled or tracing.active():  # a DB transaction / a thread-bound span stack
            return await sync_to_async(self.enqueue)(job_id, payload, **options)
        job = self.build(job_id, payload, **options)
        home = self._home(job)
        await home._aregister()
        stored = await home.storage.aenqueue(home.name, job)
        if signals.job_enqueued.receivers:
            await sync_to_async(signals.enqueued)(Queue, self.name, [stored])
        return self._public(stored)

    async def aenqueue_and_wait(
        self, job_id: str | None = None, payload: Any = None, *, timeout: float, **options: Any
    ) -> Any:
        """``enqueue_and_wait`` for async code: the wait blocks no thread on Redis (an async
        BLPOP); on the other backends it runs in a thread of its own (``in_thread``)."""
        validate_seconds("timeout", timeout)
        if options.get("singleton"):
            raise InvalidOption("enqueue_and_wait cannot be combined with singleton=True")
        if self.journaled or tracing.active():
            return await in_thread(
                lambda: self.enqueue_and_wait(job_id, payload, timeout=timeout, **options)
            )
        job = self.build(job_id, payload, waiter=True, **options)
        home = self._home(job)
        await home._aregister()
        stored = await home.storage.aenqueue(home.name, job)
        if signals.job_enqueued.receivers:
            await sync_to_async(signals.enqueued)(Queue, self.name, [stored])
        if stored.state is JobState.COMPLETED:
            return self.serde_loads(stored.result)
        if stored.state in (JobState.FAILED, JobState.CANCELLED):
            raise JobFailed(job.job_id, decode_error(stored.error), stored.state.value)
        outcome = await home.storage.await_for_outcome(home.name, job.job_id, timeout)
        if outcome is None:
            raise Timeout(job.job_id, timeout)
        if outcome.state is JobState.COMPLETED:
            return self.serde_loads(outcome.result)
        raise JobFailed(job.job_id, decode_error(outcome.error), outcome.state.value)

    async def aget_status(self, job_id: str) -> JobStatus | None:
        record = await self.storage.aget_record(self.name, validate_job_id(job_id))
        return None if record is None else self._status(record)

    async def aget_result(self, job_id: str) -> JobResult | None:
        return self._result(await self.storage.aget_record(self.name, validate_job_id(job_id)))

    async def _aregister(self) -> None:
        if not self._registered:
            await self.storage.aregister_queue(self.name)
            self._registered = True

    def _store_waited(self, job: NewJob) -> StoredEnqueue:
        if self.journaled:
            return self._journal_and_send(job)
        self._register()
        return self.storage.enqueue(self.name, job)

    def _journal_and_send(self, job: NewJob) -> StoredEnqueue:
        """enqueue_and_wait in journal mode: the wait needs the job in Redis now, so inside a
        transaction (sent only at commit) it could never end, and a Redis error is raised
        (the entry stays: jobq_reconcile still sends the job)."""
        from django.db import connections

        from .journal import journal_alias, write

        using = journal_alias()
        if connections[using].in_atomic_block:
            raise InvalidOption(
                "enqueue_and_wait in journal mode cannot run inside a transaction: the job is "
                "sent when it commits, after the wait"
            )
        with transaction.atomic(using=using):
            write(self.name, [job], using)
        return self._send([job])[0]

    # -- managing ---------------------------------------------------------------------------

    def cancel(self, job_id: str, *, force: bool = False) -> CancelOutcome:
        """Cancel a job. Waiting: ``cancelled`` at once; it never runs. Running: ``requested``:
        within about a second its worker sets the job's ``is_cancelled()`` flag and, with
        ``force``, kills it (process pool: the child; async pool: the task; the thread pool
        cannot kill a thread, so there it stays cooperative); the attempt then ends
        ``cancelled`` whatever the handler returns. Otherwise why not: ``not_found``,
        ``completed``, ``failed``."""
        outcome = self.storage.request_cancel(self.name, validate_job_id(job_id), force=force)
        if outcome is CancelOutcome.CANCELLED and signals.job_cancelled.receivers:
            signals.send(signals.job_cancelled, Queue, queue=self.name, job_id=job_id,
                         worker_id=None)  # fmt: skip
        return outcome

    def change_run_at(
        self,
        job_id: str,
        run_at: dt.datetime | None = None,
        *,
        delay: int | dt.timedelta | None = None,
    ) -> ChangeOutcome:
        """Move a waiting job's due time to ``run_at`` (aware datetime) or ``delay`` from now.
        A time in the past makes it runnable now. Returns ``changed`` or why not."""
        if (run_at is None) == (delay is None):
            raise InvalidOption("give exactly one of run_at and delay")
        if run_at is not None:
            due = _epoch_ms("run_at", run_at)
        else:
            due = now_ms() + _duration_ms("delay", delay)  # type: ignore[arg-type]
        return self.storage.change(self.name, validate_job_id(job_id), run_at=due)

    def change_priority(self, job_id: str, priority: int) -> ChangeOutcome:
        """Give a waiting job a new priority (lower runs first); it keeps its FIFO place."""
        return self.storage.change(
            self.name, validate_job_id(job_id), priority=validate_priority(priority)
        )

    def promote(self, job_id: str) -> ChangeOutcome:
        """Run a scheduled or retrying job now instead of at its due time."""
        return self.storage.change(self.name, validate_job_id(job_id), run_at=0)

    def retry(self, job_id: str) -> RetryOutcome:
        """Run a failed or cancelled job again, from attempt 1, in its old place in line:
        ``retried``, or why not (``not_found``, ``waiting``, ``active``, ``completed``)."""
        return self.storage.retry(self.name, validate_job_id(job_id))

    def retry_many(self, job_ids: Iterable[str]) -> dict[str, RetryOutcome]:
        """``retry`` for each id (each its own atomic step), with every outcome."""
        ids = [validate_job_id(job_id) for job_id in job_ids]  # all refused before any runs
        return {job_id: self.storage.retry(self.name, job_id) for job_id in ids}

    # -- dead letters -----------------------------------------------------------------------

    def dead_letters(self, *, offset: int = 0, limit: int = 100) -> list[DeadLetter]:
        """Jobs that failed for good (attempts used up, ``PermanentError``, stalled too
        often), newest failure first. Each stays listed until it is retried, purged, or its
        ``result_ttl`` passes: give jobs a longer ``result_ttl`` to keep dead letters longer."""
        offset = validate_positive_int("offset", offset, minimum=0)
        limit = validate_positive_int("limit", limit)
        records = self.storage.dead_letters(self.name, offset, limit)
        return [DeadLetter(self._status(r), self._payload(r)) for r in records]

    def count_dead(self) -> int:
        return self.storage.count_dead(self.name)

    def retry_dead(self, job_ids: Iterable[str] | None = None, *, limit: int = 10_000) -> int:
        """Retry dead letters: the given ids, or (None) up to ``limit`` of the newest.
        Returns how many were requeued; an id that is no longer failed is left alone."""
        if job_ids is None:
            limit = validate_positive_int("limit", limit)
            job_ids = [r.job_id for r in self.storage.dead_letters(self.name, 0, limit)]
        outcomes = self.retry_many(job_ids)
        return sum(1 for o in outcomes.values() if o is RetryOutcome.RETRIED)

    def purge_dead(self, job_ids: Iterable[str] | None = None) -> int:
        """Delete dead letters (the given ids, or all); their ids can be enqueued again."""
        ids = None if job_ids is None else [validate_job_id(j) for j in job_ids]
        started = self._journal_clock()
        if started is None and not self._mirrored:
            return self.storage.purge_dead(self.name, ids)
        return self._forget(started, self._journal_storage().purge_dead_ids(self.name, ids))

    # -- failure handler calls --------------------------------------------------------------

    def failure_calls(self, *, offset: int = 0, limit: int = 100) -> list[PendingFailureCall]:
        """Failure-handler calls not yet done (waiting, running, or backing off after the
        failure handler raised), soonest due first: what an operator checks when a failure
        handler keeps failing (``last_error``)."""
        offset = validate_positive_int("offset", offset, minimum=0)
        limit = validate_positive_int("limit", limit)
        return [
            PendingFailureCall(
                job_id=c.job_id,
                payload=self._decoded(c.payload, c.content_type),
                error=decode_error(c.error),
                attempts=c.attempts,
                failed_at=ms_to_datetime(c.failed_at),  # type: ignore[arg-type]
                due_at=ms_to_datetime(c.due_at),  # type: ignore[arg-type]
                tries=c.tries,
                last_error=decode_error(c.last_error),
                worker=c.worker,
            )
            for c in self.storage.failure_calls(self.name, offset, limit)
        ]

    def count_failure_calls(self) -> int:
        return self.storage.count_failure_calls(self.name)

    # -- queue control ----------------------------------------------------------------------

    def pause(self) -> None:
        """Workers stop taking jobs from this queue; enqueues are still accepted."""
        self._register()
        self.storage.pause(self.name)

    def resume(self) -> None:
        self.storage.resume(self.name)

    def is_paused(self) -> bool:
        return self.storage.is_paused(self.name)

    def set_limits(
        self,
        *,
        rate_max: int | None = None,
        rate_window: int | dt.timedelta | None = None,
        group_rate_max: int | None = None,
        group_rate_window: int | dt.timedelta | None = None,
        concurrency: int | None = None,
    ) -> QueueLimits:
        """Replace this queue's flow-control limits, for every worker at once.

        ``rate_max`` jobs may start within any ``rate_window`` (ms or timedelta);
        ``group_rate_max`` per ``group`` key within ``group_rate_window``; ``concurrency``
        caps the jobs running at once across all workers. Omitted: no limit. Excess jobs
        wait; none fails."""
        limits = checked_limits(
            rate_max=rate_max, rate_window=rate_window, group_rate_max=group_rate_max,
            group_rate_window=group_rate_window, concurrency=concurrency,
        )  # fmt: skip
        self._register()
        self.storage.set_limits(self.name, limits)
        return limits

    def get_limits(self) -> QueueLimits:
        return self.storage.get_limits(self.name)

    def set_retention(
        self,
        retention: Retention | Mapping[str, Any] | None = None,
        **states: Mapping[str, Any] | Keep | None,
    ) -> Retention:
        """Replace this queue's retention of finished jobs, for every worker at once.

        ``q.set_retention(completed={"count": 1000}, failed={"age": timedelta(days=7)})``
        keeps the newest 1,000 completed jobs and failed ones for a week (a ``Retention`` or
        the settings' dict shape work too). A state left out keeps its records until their
        ``result_ttl``; no argument removes the policy. The steps that finish jobs remove a few
        of the oldest records each; the reaper removes the rest. A removed record is gone as
        if it had expired: its id may be enqueued again (docs/settings.md)."""
        if retention is not None and states:
            raise InvalidOption("give a Retention (or dict) or per-state keywords, not both")
        policy = parse_retention(states if retention is None else retention)
        self._register()
        self.storage.set_retention(self.name, policy)
        return policy

    def get_retention(self) -> Retention:
        return self.storage.get_retention(self.name)

    def drain(self, *, delayed: bool = True) -> int:
        """Cancel every waiting job (only the queued ones when ``delayed`` is False); running
        jobs finish. Returns how many were cancelled."""
        return self.storage.drain(self.name, delayed=_flag("delayed", delayed))

    def clean(
        self,
        older_than: int | dt.timedelta,
        *,
        states: Iterable[JobState | str] = ("completed", "failed", "cancelled"),
        limit: int = 10_000,
    ) -> int:
        """Delete finished jobs (of ``states``) that finished more than ``older_than`` (ms or
        timedelta) ago; their ids may be used again. Returns how many were deleted."""
        try:
            chosen = [JobState(s) for s in states]
        except ValueError as exc:
            raise InvalidOption(f"states: {exc}") from None
        if not chosen or any(s not in TERMINAL_STATES for s in chosen):
            raise InvalidOption("clean only removes finished jobs: completed, failed, cancelled")
        age, limit = _duration_ms("older_than", older_than), validate_positive_int("limit", limit)
        started = self._journal_clock()
        if started is None and not self._mirrored:
            return self.storage.clean(self.name, age, chosen, limit)
        return self._forget(
            started, self._journal_storage().clean_ids(self.name, age, chosen, limit)
        )

    def obliterate(self, *, force: bool = False) -> int:
        """Delete the queue and everything in it. Refuses while jobs run unless ``force``
        (their workers' verdicts are then refused). Returns how many jobs were deleted.

        With Redis, the queue's journal entries are deleted once Redis's keys are (an entry
        left behind would make ``jobq_reconcile`` re-create the job). Should Redis fail half
        way, the entries stay until obliterate is called again and completes."""
        started = self._journal_clock()
        removed = self.storage.obliterate(self.name, force=_flag("force", force))
        self._registered = False
        if started is not None:
            from .journal import forget

            forget(self.name, started)
        if hasattr(self.storage, "read_group"):  # a backend with a model mirror (Redis)
            self._forget_mirror_rows()
        if hasattr(self.storage, "obliterated"):  # reconcile may re-create again (fenced)
            self.storage.obliterated(self.name)
        return removed

    # Deleting jobs of a project that uses the journal deletes their journal entries too, even
    # through a Queue object not in journal mode: an entry left behind would make reconcile
    # re-create a job an operator deleted. The storage's ``*_ids`` variants say which jobs
    # went. A project without the journal never touches its table (like the reaper).

    def _journal_clock(self) -> int | None:
        """Now (the journal's clock, epoch ms) when the journal applies, else None."""
        if not self.storage.supports_journal or not (self.journaled or journal_in_settings()):
            return None
        from .journal import now_ms

        return now_ms()

    def _journal_storage(self) -> RedisStorage:
        from ..storage.redis.storage import RedisStorage

        assert isinstance(self.storage, RedisStorage)  # the one backend with a journal
        return self.storage

    @property
    def _mirrored(self) -> bool:
        """A backend with a model mirror (Redis): rows of deleted records must go too, since
        no event tells the mirror (the admin listed purged dead letters as failed)."""
        return hasattr(self.storage, "read_group") and jobq_settings()["MIRROR"]["ENABLED"]

    def _forget(self, started: int | None, job_ids: list[str]) -> int:
        """After records were deleted: their journal entries and mirror rows; how many."""
        if started is not None:
            self._forget_journaled(started, job_ids)
        if job_ids and self._mirrored:
            self._forget_mirror_rows(job_ids)
        return len(job_ids)

    def _forget_journaled(self, started: int, job_ids: list[str]) -> int:
        """Delete the entries of ``job_ids``, just deleted from Redis; returns how many jobs."""
        from .journal import forget

        forget(self.name, started, job_ids)
        return len(job_ids)

    def _forget_mirror_rows(self, job_ids: list[str] | None = None) -> None:
        """The model mirror of a Redis queue is what the admin shows: an obliterated queue (or
        deleted records, ``job_ids``, finished ones only) must disappear there too, not linger
        until retention deletes it."""
        conf = jobq_settings()["MIRROR"]
        if not conf["ENABLED"]:
            return
        from django.db import DatabaseError

        from ..models import Job

        rows = Job.objects.using(conf["DATABASE_ALIAS"]).filter(queue=self.name)
        if job_ids is not None:
            rows = rows.filter(job_id__in=job_ids, state__in=list(TERMINAL_STATES))
        try:
            rows.delete()
        except DatabaseError as exc:  # no mirror tables there: nothing to forget
            logger.debug("mirror rows of %s not deleted: %s", self.name, exc)

    def get_status(self, job_id: str) -> JobStatus | None:
        record = self.storage.get_record(self.name, validate_job_id(job_id))
        return None if record is None else self._status(record)

    def _status(self, record: JobRecord) -> JobStatus:
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
            lifo=record.lifo,
            group=record.group,
            dedup_key=record.dedup_key,
            has_successor=record.has_successor,
            progress=decode_progress(record.progress),
            logs=tuple((ms_to_datetime(at) or _EPOCH, line) for at, line in record.logs),
            task=task_name(record.content_type, record.payload),
        )

    def delete(self, job_ids: Iterable[str]) -> int:
        """Delete finished jobs' records now instead of at their ``result_ttl`` (an operator
        clearing history, or freeing ids for reuse); waiting and running jobs are left alone
        (cancel them first). Returns how many were deleted. The model mirror's rows of these
        jobs are removed too, since no event will tell it."""
        ids = [validate_job_id(job_id) for job_id in job_ids]
        started = self._journal_clock()
        if started is None and not self._mirrored:
            return self.storage.delete_finished(self.name, ids)
        return self._forget(started, self._journal_storage().delete_finished_ids(self.name, ids))

    def get_payload(self, job_id: str) -> Any:
        """The job's decoded payload while its record lives (None when unknown or expired)."""
        record = self.storage.get_record(self.name, validate_job_id(job_id))
        return None if record is None else self._payload(record)

    @staticmethod
    def _payload(record: JobRecord) -> Any:
        """The decoded payload; a payload that no longer decodes (written by hand, or by a
        serde since removed) is shown as its raw bytes rather than hiding the job."""
        if record.payload is None:
            return None
        return Queue._decoded(record.payload, record.content_type)

    @staticmethod
    def _decoded(payload: bytes, content_type: str) -> Any:
        try:
            value = serde_for(content_type).loads(payload)
        except Exception:  # any decoder error: the job must stay visible
            return payload
        return unwrap(content_type, value)[0]

    def get_result(self, job_id: str) -> JobResult | None:
        """The result (completed) or error (failed) while the record lives; ``None`` when the
        job is unknown or expired. For a job still running, the state with no value."""
        return self._result(self.storage.get_record(self.name, validate_job_id(job_id)))

    @staticmethod
    def _result(record: JobRecord | None) -> JobResult | None:
        if record is None:
            return None
        value = None
        if record.state is JobState.COMPLETED and record.result is not None:
            value = serde_for(record.content_type).loads(record.result)
        return JobResult(record.state, value, decode_error(record.error))

    def counts(self) -> dict[JobState, int]:
        return self.storage.counts(self.name)

    def events(
        self,
        since: str = "0",
        *,
        kinds: Iterable[str] | None = None,
        follow: bool = False,
        wait: float = 1.0,
        batch: int = 500,
    ) -> Iterator[Event]:
        """This queue's job transitions in order, after event id ``since`` ("0": the oldest
        kept). Each ``Event`` has ``id``, ``job_id``, ``kind`` (the state entered, or
        ``progress`` / ``log``), ``at`` (epoch ms) and ``worker``. ``kinds`` keeps only those
        kinds. Without ``follow`` the iterator ends once caught up; with it, it waits (``wait``
        seconds at a time) for new events until the caller stops iterating. Resume after a
        restart by passing the last handled event's ``id`` as ``since``. See
        docs/observability.md (a sharded queue: ``ShardedQueue._feed``)."""
        read, since, chosen, options = self._feed(since, kinds, follow, wait, batch)
        return iterate_pages(read, since, chosen, **options)

    def aevents(
        self,
        since: str = "0",
        *,
        kinds: Iterable[str] | None = None,
        follow: bool = False,
        wait: float = 1.0,
        batch: int = 500,
    ) -> AsyncIterator[Event]:
        """``events`` as an async iterator (``async for``): storage reads run in a thread."""
        read, since, chosen, options = self._feed(since, kinds, follow, wait, batch)
        return aiterate_pages(read, since, chosen, **options)

    def _feed(
        self, since: str, kinds: Iterable[str] | None, follow: bool, wait: float, batch: int
    ) -> tuple[PageReader, str, frozenset[str] | None, dict[str, Any]]:
        """The feed's reader and its arguments, checked before the iterator starts, so a bad
        argument fails at the call."""
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 < wait <= 60:
            raise InvalidOption(f"wait must be a number of seconds in (0, 60], got {wait!r}")
        options = {"follow": _flag("follow", follow), "wait": float(wait),
                   "batch": validate_positive_int("batch", batch)}  # fmt: skip
        read = partial(self.storage.read_events, self.name)
        return read, validate_since(since), validate_kinds(kinds), options

    # -- helpers ----------------------------------------------------------------------------

    def serde_loads(self, data: bytes | None) -> Any:
        return None if data is None else self.serde.loads(data)

    def _public(self, stored: StoredEnqueue) -> EnqueueResult:
        if stored.outcome is EnqueueOutcome.QUEUED and stored.error is None:  # nothing to decode
            return EnqueueResult(stored.outcome, stored.job_id, stored.state)
        result = None
        if stored.outcome is EnqueueOutcome.COMPLETED and stored.result is not None:
            result = self.serde.loads(stored.result)
        return EnqueueResult(
            stored.outcome, stored.job_id, stored.state, result, decode_error(stored.error)
        )


_EPOCH = dt.datetime.fromtimestamp(0, tz=dt.UTC)


def now_ms() -> int:
    return int(time.time() * 1000)


def _with_trace(options: dict[str, Any], carrier: Mapping[str, str]) -> dict[str, Any]:
    """``options`` with the trace context added to the job's envelope meta (when there is
    one: an empty carrier leaves the job plain)."""
    if not carrier:
        return options
    return {**options, "meta": {**(options.get("meta") or {}), tracing.TRACE_META: carrier}}


def _window(value: int | dt.timedelta | None) -> int | None:
    if isinstance(value, dt.timedelta):
        return int(value.total_seconds() * 1000)
    return value


def _shard_count(name: object, shards: int | None) -> int:
    """The shards a new Queue gets: the argument, else the setting (a name that is invalid
    or a partition's is left to ``__init__`` to refuse or to treat as one queue)."""
    if not isinstance(name, str) or "~" in name:
        if shards is not None and validate_shards(shards) > 1:
            raise InvalidOption(f"queue {name!r} is a partition: it cannot be sharded again")
        return 1
    count = configured_shards(name) if shards is None else validate_shards(shards)
    if count > 1:
        validate_sharded_name(name, count)
    return count


def checked_limits(
    *,
    rate_max: int | None = None,
    rate_window: int | dt.timedelta | None = None,
    group_rate_max: int | None = None,
    group_rate_window: int | dt.timedelta | None = None,
    concurrency: int | None = None,
) -> QueueLimits:
    """``set_limits``' arguments validated into ``QueueLimits`` (nothing written)."""
    limits = QueueLimits(
        rate_max=_limit("rate_max", rate_max),
        rate_window=_limit("rate_window", _window(rate_window), ms=True),
        group_rate_max=_limit("group_rate_max", group_rate_max),
        group_rate_window=_limit("group_rate_window", _window(group_rate_window), ms=True),
        concurrency=_limit("concurrency", concurrency),
    )
    for count, window in (("rate_max", "rate_window"),
                          ("group_rate_max", "group_rate_window")):  # fmt: skip
        if (getattr(limits, count) is None) != (getattr(limits, window) is None):
            raise InvalidOption(f"{count} and {window} go together")
    return limits


_queues: dict[str, Queue] = {}


def get_queue(name: str = "default") -> Queue:
    """A cached Queue on the configured storage (rebuilt when the storage changes)."""
    queue = _queues.get(name)
    if queue is None or queue.storage is not get_storage():
        queue = _queues[name] = Queue(name)
    return queue
