"""Running one claimed job: decode, call the handler, turn the outcome into a storage verdict.

Kept apart from the worker's threading so the rules (what is permanent, how long to back off)
are plain functions that tests call directly.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import hashlib
import inspect
import json
import logging
import random
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import (
    ChildFailed,
    ConfigurationError,
    HardTimeout,
    PermanentError,
    RateLimited,
    RetryDecision,
    SerializationError,
)
from ..job import PARKED_MS, AckOutcome, ChildOutcome, ClaimedJob, Job
from ..queue.core import collecting_follow_ups
from ..queue.journal import decode_job, encode_options
from ..serde import TASK_META, is_enveloped, serde_for, storable_text, unwrap
from ..states import JobState
from ..storage.base import Ack
from ..tasks.registry import HandlerRegistry
from ..validation import MAX_DURATION_MS, is_seconds, logical_name

logger = logging.getLogger("django_jobq.worker")
MAX_ERROR_BYTES = 16 * 1024
BACKOFF_JITTER = 0.25  # a retry waits between base and base * 1.25, spreading thundering herds


def backoff_ms(attempt: int, min_backoff: int, max_backoff: int, rng: random.Random) -> int:
    """Exponential backoff after failed ``attempt`` (1-based): min * 2^(attempt-1), capped at
    max, plus up to 25 % jitter (still capped), so retries of a burst do not arrive together."""
    base = min(max_backoff, min_backoff * 2 ** min(max(attempt - 1, 0), 62))
    return int(min(max_backoff, base * (1 + BACKOFF_JITTER * rng.random())))


def requested_retry_ms(exc: BaseException) -> int | None:
    """A delay the error asks for through ``retry_in`` (seconds) or ``retry_at`` (datetime or
    epoch seconds), or None to use the backoff."""
    # NaN and infinities (from a library's own error, say) fall back to the backoff instead
    # of crashing the verdict with int(nan).
    retry_in = getattr(exc, "retry_in", None)
    if is_seconds(retry_in):
        return _bounded_ms(retry_in)
    retry_at = getattr(exc, "retry_at", None)
    if isinstance(retry_at, dt.datetime):
        retry_at = retry_at.timestamp()
    if is_seconds(retry_at):
        return _bounded_ms(retry_at - time.time())
    return None


def _bounded_ms(seconds: float) -> int:
    return min(MAX_DURATION_MS, max(0, int(seconds * 1000)))


def error_body(exc: BaseException, kind: str | None = None) -> bytes:
    """JSON error record, always JSON whatever the payload serde, so operators can read it."""
    tb = "".join(traceback.format_exception(exc))
    record = {
        "type": kind or f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": storable_text(str(exc)[:4096]),
        "traceback": storable_text(tb[-MAX_ERROR_BYTES:]),
    }
    return json.dumps(record).encode()


# One generator for every job's retry jitter: seeding a new Random per job cost more than
# running a no-op handler (measured ~11-25 us a job in the drain profile).
_JITTER = random.Random()  # noqa: S311 - jitter, not security


def make_job(claimed: ClaimedJob, payload: Any) -> Job:
    return Job(
        id=claimed.job_id,
        queue=logical_name(claimed.queue),  # handlers see the queue users named
        payload=payload,
        attempt=claimed.attempt,
        max_attempts=claimed.max_attempts,
        token=claimed.token,
    )


@dataclass(slots=True)
class Prepared:
    """A claimed job ready to call: its handler, the Job it receives, the serde of its result."""

    func: Any
    job: Job
    serde: Any
    label: str
    atomic: bool | str = False


def prepare(
    claimed: ClaimedJob, registry: HandlerRegistry, job: Job | None = None
) -> Prepared | Ack:
    """Decode the payload and find the handler; an Ack instead when the job cannot run at all
    (malformed payload, no handler): those fail permanently, since retrying would not help."""
    label = f"[{claimed.queue}/{claimed.job_id}]"
    meta: dict[str, Any] = {}
    try:
        serde = serde_for(claimed.content_type)
        payload = serde.loads(claimed.payload)
        if is_enveloped(claimed.content_type):
            payload, meta = unwrap(claimed.content_type, payload)
    except Exception as exc:  # malformed bytes must not take the worker down
        logger.error("%s malformed payload, failing it: %s", label, exc)
        return Ack("fail", claimed.job_id, claimed.token, error_body(exc, "MalformedPayload"),
                   permanent=True)  # fmt: skip
    task_name = meta.get(TASK_META) if meta else None
    atomic: bool | str = False
    if task_name is not None:  # a task function's job: run by its name, not by its queue
        func = registry.task_runner(task_name)
        found = registry.task(task_name) if func is not None else None
        atomic = found.atomic if found is not None else False
        if func is None:
            unknown = LookupError(f"no task named {task_name!r} is registered in this worker")
            logger.error("%s %s", label, unknown)
            return Ack("fail", claimed.job_id, claimed.token, error_body(unknown, "UnknownTask"),
                       permanent=True)  # fmt: skip
    else:
        func = registry.get(claimed.queue)
        atomic = registry.options(claimed.queue).atomic
    if func is None:
        missing = LookupError(f"no handler registered for queue {claimed.queue!r}")
        logger.error("%s %s", label, missing)
        return Ack("fail", claimed.job_id, claimed.token, error_body(missing, "NoHandler"),
                   permanent=True)  # fmt: skip
    if job is None:
        job = make_job(claimed, payload)
    else:
        job.payload = payload
    job.meta = meta
    flow = meta.get("flow")
    if isinstance(flow, dict):
        held = _flow_parent(claimed, flow, job, label)
        if held is not None:
            return held
    logger.debug("%s starting attempt %d/%d", label, claimed.attempt, claimed.max_attempts)
    return Prepared(func, job, serde, label, atomic)


def _flow_parent(claimed: ClaimedJob, flow: dict[str, Any], job: Job, label: str) -> Ack | None:
    """A flow parent gets its children's outcomes; None: run the handler. A parent started
    before its children finished (an operator's "run now") is parked again; one whose child
    failed, under ``on_child_failure="fail"``, fails for good without running."""
    results = flow.get("results")
    if not isinstance(results, list):
        logger.warning("%s flow parent started before its children finished: parked again", label)
        wait = max(0, PARKED_MS - int(time.time() * 1000))
        return Ack("postpone", claimed.job_id, claimed.token, retry_in=wait)
    job.children = tuple(
        ChildOutcome(logical_name(str(r[0])), str(r[1]), JobState(r[2]), r[3], r[4])
        for r in results
    )
    bad = [c for c in job.children if not c.ok]
    if bad and flow.get("on_child_failure", "fail") == "fail":
        first = bad[0]
        reason = (first.error or {}).get("message") or first.state.value
        exc = ChildFailed(
            f"{len(bad)} of {len(job.children)} children did not complete;"
            f" {first.queue}/{first.job_id} {first.state.value}: {reason}"
        )
        logger.warning("%s %s", label, exc)
        return Ack("fail", claimed.job_id, claimed.token, error_body(exc), permanent=True)
    return None


def envelope_meta(claimed: ClaimedJob) -> dict[str, Any]:
    """A claimed job's per-job settings (``serde.py``); {} for a plain job, at no cost. The
    worker reads them once per job into ``Job.meta`` for timeouts and the flow fast path."""
    if not is_enveloped(claimed.content_type):
        return {}
    try:
        value = serde_for(claimed.content_type).loads(claimed.payload)
    except Exception:  # noqa: BLE001 - malformed: prepare() fails it; no settings apply
        return {}
    return unwrap(claimed.content_type, value)[1]


def job_timeouts(
    queue: str, registry: HandlerRegistry, meta: dict[str, Any]
) -> tuple[float | None, float | None]:
    """(soft, hard) timeout of one job in seconds: its own (``enqueue(..., timeout=,
    hard_timeout=)``, from its envelope's ``meta``) over its handler's."""
    options = registry.options(queue)
    if not meta:
        return options.timeout, options.hard_timeout
    return (_positive(meta.get("timeout"), options.timeout),
            _positive(meta.get("hard_timeout"), options.hard_timeout))  # fmt: skip


def _positive(value: Any, default: float | None) -> float | None:
    if is_seconds(value) and value > 0:
        return float(value)
    return default


def error_verdict(
    claimed: ClaimedJob, exc: BaseException, label: str, rng: random.Random | None = None
) -> Ack:
    """The verdict for a handler that raised: permanent, postponed, or a retry with backoff."""
    if isinstance(exc, RetryDecision):  # a task's retry policy ruled (tasks/policy.py)
        if exc.permanent:
            logger.warning("%s failed permanently (retry policy): %s", label, exc.error)
            return Ack("fail", claimed.job_id, claimed.token, error_body(exc.error),
                       permanent=True)  # fmt: skip
        exc = exc.error if exc.retry_in is None else _Delayed(exc.error, exc.retry_in)
    if isinstance(exc, PermanentError):
        logger.warning("%s failed permanently: %s", label, exc)
        return Ack("fail", claimed.job_id, claimed.token, error_body(exc), permanent=True)
    if isinstance(exc, RateLimited):
        # Not a failure of the job: it goes back to waiting and keeps its attempt.
        wait_ms = _bounded_ms(exc.retry_in)
        logger.info("%s rate limited, runs again in %d ms", label, wait_ms)
        return Ack("postpone", claimed.job_id, claimed.token, retry_in=wait_ms,
                   queue_wide=exc.queue_wide)  # fmt: skip
    delay = requested_retry_ms(exc)
    if isinstance(exc, _Delayed):
        exc = exc.error
    if delay is None:
        delay = backoff_ms(
            claimed.attempt, claimed.min_backoff, claimed.max_backoff, rng or _JITTER
        )
    logger.warning(
        "%s attempt %d/%d failed: %s: %s", label, claimed.attempt, claimed.max_attempts,
        type(exc).__name__, exc, exc_info=logger.isEnabledFor(logging.DEBUG),
    )  # fmt: skip
    return Ack("fail", claimed.job_id, claimed.token, error_body(exc), retry_in=delay)


class _Delayed(Exception):  # noqa: N818 - internal carrier, never recorded
    """A retried failure whose wait the task's backoff chose (``retry_in``, seconds)."""

    def __init__(self, error: BaseException, retry_in: float) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_in = retry_in


def result_verdict(claimed: ClaimedJob, prepared: Prepared, result: Any) -> Ack:
    try:
        body = prepared.serde.dumps(result)
    except SerializationError as exc:
        logger.error("%s result is not serialisable: %s", prepared.label, exc)
        return Ack("fail", claimed.job_id, claimed.token, error_body(exc, "BadResult"),
                   permanent=True)  # fmt: skip
    logger.debug("%s completed", prepared.label)
    return Ack("complete", claimed.job_id, claimed.token, body)


def execute(
    claimed: ClaimedJob,
    registry: HandlerRegistry,
    job: Job | None = None,
    rng: random.Random | None = None,
    storage: Any = None,
) -> Ack:
    """Run the handler for ``claimed`` and return the verdict to send to storage.

    Never raises: a malformed payload, a missing handler or an unserialisable result fails the
    job permanently (retrying would not help); any other error retries with backoff. An
    ``async def`` handler runs to completion on a private event loop here (the async pool
    runs them many at a time instead: ``execute_async``). An atomic handler runs in a
    transaction with its completion, written through ``storage`` (``execute_atomic``).
    """
    prepared = prepare(claimed, registry, job)
    if isinstance(prepared, Ack):
        return prepared
    if prepared.atomic:
        return execute_atomic(claimed, prepared, storage, rng)
    try:
        result = prepared.func(prepared.job)
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
    except BaseException as exc:  # noqa: BLE001 - a handler's SystemExit must not kill a worker
        return error_verdict(claimed, exc, prepared.label, rng)
    return result_verdict(claimed, prepared, result)


class _Undone(Exception):  # noqa: N818 - not an error: the verdict that rolls the run back
    def __init__(self, ack: Ack) -> None:
        super().__init__(ack.kind)
        self.ack = ack


def execute_atomic(
    claimed: ClaimedJob, prepared: Prepared, storage: Any, rng: random.Random | None = None
) -> Ack:
    """Run an ``atomic=True`` handler inside ``transaction.atomic()`` on the database of its
    queue's storage and write the job's completion in that same transaction: the handler's
    writes and the completion commit together, or neither does. Why this gives exactly-once
    effects: a worker killed before the commit leaves neither (the lease expires, the retry
    runs on clean state), one killed after it leaves a completed job that is never run again.

    The completion is fenced as any other: if the lease was reclaimed meanwhile (its token no
    longer matches), storage refuses it and this run's writes roll back with it, so a stale
    run never adds its effects beside the newer run's. A raised error rolls the writes back
    and fails the attempt (retry, backoff) as for any handler. Returns a settled verdict (the
    worker sends it nowhere) or the failure to send.

    Redis cannot join a Django transaction: there the transaction records the outcome in the
    ledger instead (``run_with_ledger``)."""
    from django.db import transaction

    if not getattr(storage, "supports_transactional_enqueue", False):
        return run_with_ledger(claimed, prepared, storage, rng)
    alias = storage.using
    problem = None
    if isinstance(prepared.atomic, str) and prepared.atomic != alias:
        problem = ConfigurationError(
            f"the handler writes to database {prepared.atomic!r}; its job's completion is"
            f" written to {alias!r}, so the two cannot commit together"
        )
    if problem is not None:  # manage.py check says so before a worker starts
        return Ack("fail", claimed.job_id, claimed.token, error_body(problem), permanent=True)
    try:
        with transaction.atomic(using=alias):
            # SQLite: take its write lock first, as the backend's own transactions do. A
            # deferred transaction that reads, then writes, fails at once ("database is
            # locked") when another connection committed in between; holding the lock,
            # atomic runs wait their turn instead. PostgreSQL: nothing.
            storage._write_lock()
            result = prepared.func(prepared.job)
            if inspect.isawaitable(result):
                raise TypeError("an atomic handler must not return an awaitable")
            ack = result_verdict(claimed, prepared, result)
            if ack.kind != "complete":  # an unserialisable result: fail, writes rolled back
                raise _Undone(ack)
            outcome = storage.ack_many(claimed.queue, [ack])[0]
            if outcome is not AckOutcome.COMPLETED:  # the lease was lost: roll back
                logger.warning("%s %s: its writes were rolled back", prepared.label, outcome)
                raise _Undone(dataclasses.replace(ack, settled=outcome))
    except _Undone as undone:
        return undone.ack
    except BaseException as exc:  # noqa: BLE001 - as in execute
        return error_verdict(claimed, exc, prepared.label, rng)
    return dataclasses.replace(ack, settled=AckOutcome.COMPLETED)


def ledger_alias(atomic: bool | str) -> str:
    """The database of the outcome ledger: the one the handler writes to (``atomic="alias"``),
    else ``JOBQ["DATABASE_ALIAS"]``."""
    from ..conf import jobq_settings

    return atomic if isinstance(atomic, str) else jobq_settings()["DATABASE_ALIAS"]


def run_with_ledger(
    claimed: ClaimedJob, prepared: Prepared, storage: Any, rng: random.Random | None = None
) -> Ack:
    """``atomic=True`` on Redis: the handler's transaction also inserts the job's outcome
    (``JobOutcome``) with its result; the Redis completion follows the commit. A worker killed
    between the two leaves a committed outcome and an active job: its lease expires, the
    reaper requeues it, and the next run finds the outcome and acknowledges it with the stored
    result without calling the handler. Two runs of one job committing at once (a lease
    taken over) meet on the ledger's unique key: the second's transaction rolls back, writes
    included, and it acknowledges the first's result. Returns the verdict to send (never a
    settled one: Redis must still hear of it)."""
    from django.db import IntegrityError, transaction

    from ..models import JobOutcome

    if not getattr(storage, "supports_multiprocess", True):  # the memory backend
        problem = ConfigurationError(
            "atomic=True needs the database or the Redis backend, not"
            f" {type(storage).__name__} (nothing outlives its process to record an outcome in)"
        )
        return Ack("fail", claimed.job_id, claimed.token, error_body(problem), permanent=True)
    record = storage.get_record(claimed.queue, claimed.job_id)
    if record is None or record.state is not JobState.ACTIVE:  # gone, or reclaimed already
        return Ack("complete", claimed.job_id, claimed.token, settled=AckOutcome.LEASE_LOST)
    alias = ledger_alias(prepared.atomic)
    key = {"queue": claimed.queue, "job_id": claimed.job_id, "created_ms": record.created_at,
           "digest": hashlib.blake2b(claimed.payload, digest_size=16).hexdigest()}  # fmt: skip
    ledger = JobOutcome.objects.using(alias).filter(**key)

    def recorded() -> Ack | None:
        row = ledger.values_list("result", "follow_ups").first()
        if row is None:
            return None
        logger.info("%s outcome committed by an earlier run: acknowledged", prepared.label)
        send_follow_ups(storage, row[1])  # the earlier run may have died before sending them
        return Ack("complete", claimed.job_id, claimed.token, bytes(row[0]))

    if (earlier := recorded()) is not None:
        return earlier
    try:
        with transaction.atomic(using=alias), collecting_follow_ups(storage) as follow_ups:
            result = prepared.func(prepared.job)
            if inspect.isawaitable(result):
                raise TypeError("an atomic handler must not return an awaitable")
            ack = result_verdict(claimed, prepared, result)
            if ack.kind != "complete":
                raise _Undone(ack)
            now = int(time.time() * 1000)
            sent = [
                {"queue": queue, "job_id": job.job_id, "content_type": job.content_type,
                 "payload": base64.b64encode(job.payload).decode(),
                 "options": encode_options(job, now)}
                for queue, job in follow_ups
            ]  # fmt: skip
            try:
                kept = dt.timedelta(milliseconds=record.result_ttl)
                with transaction.atomic(using=alias):  # a savepoint: PostgreSQL aborts else
                    JobOutcome.objects.using(alias).create(
                        **key,
                        result=ack.body,
                        follow_ups=sent,
                        expires_at=dt.datetime.now(dt.UTC) + kept,
                    )
            except IntegrityError:
                raise _Undone(ack) from None  # another run's outcome: roll this one back
    except _Undone as undone:
        if undone.ack.kind == "complete":
            return recorded() or dataclasses.replace(undone.ack, settled=AckOutcome.LEASE_LOST)
        return undone.ack
    except BaseException as exc:  # noqa: BLE001 - as in execute
        return error_verdict(claimed, exc, prepared.label, rng)
    send_follow_ups(storage, sent)
    return ack


def send_follow_ups(storage: Any, follow_ups: list[dict[str, Any]]) -> None:
    """Enqueue an outcome's follow-up jobs (after its commit, and again from a run that found
    the outcome: their ids make a second send a duplicate, not a second job)."""
    for f in follow_ups:
        job = decode_job(f["job_id"], base64.b64decode(f["payload"]), f["content_type"],
                         f["options"])  # fmt: skip
        storage.register_queue(f["queue"])
        storage.enqueue(f["queue"], job)


def prune_outcomes(alias: str, limit: int = 1000) -> int:
    """Delete up to ``limit`` ledger rows past their job's result TTL (the reaper's pass)."""
    from django.utils import timezone

    from ..models import JobOutcome

    rows = JobOutcome.objects.using(alias)
    pks = list(rows.filter(expires_at__lt=timezone.now()).values_list("pk", flat=True)[:limit])
    return rows.filter(pk__in=pks).delete()[0] if pks else 0


def close_old_connections(keep: str | None = None) -> None:
    """After a handler, as Django does after a request: close the database connections the
    handler's thread opened that ``CONN_MAX_AGE`` does not keep (all of them by default) or
    that broke. Why: a worker thread lives for days, so without this every handler thread
    that ever touched the ORM holds a connection of its own for good (``-c 128`` against
    PostgreSQL's ``max_connections`` of 100), and with Django's connection pool a held
    connection is never returned to it. A thread that opened none pays a dictionary lookup.
    Called by the pools, on their own threads, never by ``execute``: the test runner runs jobs
    in the caller's thread, inside the test's transaction, which a close would break.

    ``keep``: an alias whose connection stays open unless it broke: the queue's database for
    a worker serving ``atomic=True`` handlers, which need it for every job (opening one per
    job cost ~10 ms each, a tenth of the drain rate). At most one per handler thread, which
    the connection budget (``checks.connection_budget``) already counts."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if conn.alias == keep and not conn.errors_occurred and not conn.in_atomic_block:
            continue
        conn.close_if_unusable_or_obsolete()


def _closing(func: Any, job: Job) -> Any:
    """A plain handler run by the async pool, in the thread ``asyncio.to_thread`` lends it."""
    try:
        return func(job)
    finally:
        close_old_connections()


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


async def execute_async(
    claimed: ClaimedJob,
    registry: HandlerRegistry,
    job: Job | None = None,
    hard_timeout: float | None = None,
) -> Ack:
    """``execute`` on the caller's event loop: a coroutine handler is awaited (a plain one runs
    in a thread, so it cannot block the loop). Past ``hard_timeout`` seconds the handler is
    cancelled and the attempt fails with ``HardTimeout`` (retried as the policy says)."""
    prepared = prepare(claimed, registry, job)
    if isinstance(prepared, Ack):
        return prepared
    func, handler_job = prepared.func, prepared.job
    try:
        if inspect.iscoroutinefunction(func):
            call = func(handler_job)
        else:
            call = asyncio.to_thread(_closing, func, handler_job)
        result = await asyncio.wait_for(call, hard_timeout)
    except TimeoutError:
        handler_job.cancel_event.set()
        exc = HardTimeout(f"still running after the hard timeout of {hard_timeout}s")
        return error_verdict(claimed, exc, prepared.label)
    except BaseException as exc:  # noqa: BLE001 - includes a handler's CancelledError
        return error_verdict(claimed, exc, prepared.label)
    return result_verdict(claimed, prepared, result)


def execute_batch(
    claimed: Sequence[ClaimedJob], registry: HandlerRegistry, jobs: Sequence[Job] | None = None
) -> list[Ack]:
    """Run a batch handler once for several jobs of one queue; one verdict per job, in order.

    Jobs that cannot run (malformed payload) get their verdict without joining the call. The
    handler returns a list with one result per job it was given; an exception instance in it
    fails that job alone. An exception raised by the call, or a result list of the wrong shape,
    fails every job of the call, each by its own attempt count and backoff.
    """
    acks: list[Ack | None] = [None] * len(claimed)
    ready: list[tuple[int, Prepared]] = []
    for i, c in enumerate(claimed):
        prepared = prepare(c, registry, jobs[i] if jobs is not None else None)
        if isinstance(prepared, Ack):
            acks[i] = prepared
        else:
            ready.append((i, prepared))
    if ready:
        func = ready[0][1].func
        try:
            results = func([p.job for _, p in ready])
            if inspect.isawaitable(results):
                results = asyncio.run(_awaited(results))
            if not isinstance(results, list | tuple) or len(results) != len(ready):
                raise TypeError(
                    f"a batch handler must return a list of {len(ready)} results, "
                    f"got {type(results).__name__}"
                    + (f" of {len(results)}" if isinstance(results, list | tuple) else "")
                )
        except BaseException as exc:  # noqa: BLE001 - as in execute
            for i, p in ready:
                acks[i] = error_verdict(claimed[i], exc, p.label)
        else:
            for (i, p), result in zip(ready, results, strict=True):
                if isinstance(result, BaseException):
                    acks[i] = error_verdict(claimed[i], result, p.label)
                else:
                    acks[i] = result_verdict(claimed[i], p, result)
    return [ack for ack in acks if ack is not None]
