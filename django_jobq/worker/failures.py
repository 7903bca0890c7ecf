"""Running failure handlers: a worker's own thread claims due failure calls, runs them, settles.

Storage records a call in the same atomic step that fails a job for good (see ``Storage``'s
failure-call methods), so a crash can never lose one; this side only has to run each at least
once. Calls are leased like jobs: a worker killed while a failure handler runs leaves the call to
be claimed again when its lease ends, so a failure handler may run twice for one failure and
must be idempotent. A failure handler that raises is retried with a long exponential backoff
(one minute doubling to a day by default) until it succeeds, unless its retry policy
(``retry_on`` / ``dont_retry_on``, or a ``PermanentError``) gives up on that error.

Who is told: the call is a copy of the failed job's payload, so a task function's job still
names its task (envelope ``meta["task"]``). Its task's own failure handler runs when it has one,
else the queue's (``HandlerRegistry.failure_target``); a call for which neither exists here
(the hook is on for another task of the queue) is dropped, as if the hook had been off.

A thread of its own rather than the handler pool: failure handlers are rare and may be slow
(paging someone, writing a ticket), and they must never hold a slot or delay a verdict.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import threading
from collections.abc import Sequence
from typing import Any, Self

from ..errors import ConfigurationError, JobQError, PermanentError
from ..job import FailedJob, FailureCall, decode_error, ms_to_datetime
from ..serde import serde_for, unwrap
from ..storage.base import Storage
from ..tasks.registry import FailureHandler, HandlerRegistry
from ..validation import is_seconds, validate_positive_ms
from .execution import backoff_ms, error_body

logger = logging.getLogger("django_jobq.worker")
# Calls claimed at once per queue. One: calls run one after another, and a call claimed behind
# a slow one would spend its lease waiting (and be claimed again elsewhere). Calls are rare, so
# a round trip each costs nothing that matters.
CLAIM_BATCH = 1


def _validated(conf: dict[str, Any]) -> tuple[int, int, int, float]:
    """(lease ms, min backoff ms, max backoff ms, poll s) from worker settings."""
    try:
        lease = validate_positive_ms("failure_lease", conf["failure_lease"])
        low = validate_positive_ms("failure_backoff", conf["failure_backoff"])
        high = validate_positive_ms("failure_max_backoff", conf["failure_max_backoff"])
    except JobQError as exc:
        raise ConfigurationError(f"JOBQ['WORKER']: {exc}") from exc
    if high < low:
        raise ConfigurationError("JOBQ['WORKER']: failure_max_backoff is below failure_backoff")
    poll = conf["failure_poll"]
    if not is_seconds(poll) or poll <= 0:
        raise ConfigurationError(f"JOBQ['WORKER']: failure_poll must be > 0 s, got {poll!r}")
    return lease, low, high, float(poll)


class FailureCaller:
    """Claims and runs the failure calls of the queues a worker serves with a failure handler."""

    def __init__(
        self,
        storage: Storage,
        handlers: HandlerRegistry,
        queues: Sequence[str],
        worker_id: str,
        *,
        lease_ms: int,
        backoff: tuple[int, int],
        poll: float,
    ) -> None:
        self.storage = storage
        self.handlers = handlers
        self.queues = list(queues)
        self.worker_id = worker_id
        self.lease_ms = lease_ms
        self.min_backoff, self.max_backoff = backoff
        self.poll = poll
        self.stats = {"ok": 0, "failed": 0, "fenced": 0, "gave_up": 0, "dropped": 0}
        self._rng = random.Random()  # noqa: S311 - jitter, not security

    @classmethod
    def configured(
        cls,
        storage: Storage,
        handlers: HandlerRegistry,
        queues: Sequence[str],
        worker_id: str,
        conf: dict[str, Any],
        *,
        lease_ms: int | None = None,
        backoff: tuple[int, int] | None = None,
        poll: float | None = None,
    ) -> Self:
        """From ``JOBQ["WORKER"]`` (``conf``), with the worker's own overrides when given."""
        conf = dict(conf)
        if lease_ms is not None:
            conf["failure_lease"] = lease_ms
        if backoff is not None:
            conf["failure_backoff"], conf["failure_max_backoff"] = backoff
        if poll is not None:
            conf["failure_poll"] = poll
        lease, low, high, every = _validated(conf)
        return cls(storage, handlers, queues, worker_id, lease_ms=lease, backoff=(low, high),
                   poll=every)  # fmt: skip

    @property
    def served(self) -> list[str]:
        """The queues whose failure calls this worker runs: those with a failure handler of
        their own or of a task routed to them."""
        return [q for q in self.queues if self.handlers.has_failure_handler(q)]

    def apply_hooks(self) -> None:
        """Turn each served queue's hook on when this worker has a failure handler for it (the
        queue's, or a task's routed there), off when it has none: the worker that starts last
        decides (a deploy sets it as it rolls out). Pending calls are kept either way."""
        for name in self.queues:
            enabled = self.handlers.has_failure_handler(name)
            try:
                self.storage.set_failure_hook(name, enabled)
            except Exception as exc:  # storage blip: the hook stored earlier still holds
                logger.warning("could not set the failure hook of queue %s: %s", name, exc)

    def run(self, stop: threading.Event) -> None:
        """Until ``stop`` is set: run every due call, then wait ``poll`` seconds."""
        while not stop.is_set():
            busy = False
            for name in self.served:
                try:
                    busy |= self.run_due(name) > 0
                except Exception as exc:  # storage unreachable: try again next round
                    logger.warning("failure calls of %s not claimed: %s", name, exc)
            if not busy:
                stop.wait(self.poll)

    def run_due(self, queue: str) -> int:
        """Claim up to ``CLAIM_BATCH`` due calls of ``queue`` and run them; returns how many
        were claimed (``run`` comes back at once while there are any)."""
        calls = self.storage.claim_failure_calls(queue, self.worker_id, CLAIM_BATCH,
                                                 self.lease_ms)  # fmt: skip
        for call in calls:
            self._run_one(queue, call)
        return len(calls)

    def _run_one(self, queue: str, call: FailureCall) -> None:
        payload, job, error = self._arguments(call)
        target = self.handlers.failure_target(queue, job.task)
        if target is None:
            self._no_handler(queue, call, job)
            return
        func, policy = target
        label = f"[{queue}/{call.job_id}]"
        try:
            _invoke(func, payload, job, error)
        except BaseException as exc:  # noqa: BLE001 - a failure handler must not end the worker
            if _gives_up(policy, exc):
                logger.error(
                    "%s failure handler raised %s (call %d), which its policy does not retry:"
                    " giving up on this call (the dead letter stays): %s",
                    label, type(exc).__name__, call.tries, exc, exc_info=exc,
                )  # fmt: skip
                self._settle(queue, call, ok=True, retry_in=0, error=error_body(exc),
                             gave_up=True)  # fmt: skip
                return
            retry_in = self._retry_in(queue, call, exc, policy)
            logger.warning(
                "%s failure handler raised (call %d), calling it again in %d s: %s: %s",
                label, call.tries, retry_in // 1000, type(exc).__name__, exc,
            )  # fmt: skip
            self._settle(queue, call, ok=False, retry_in=retry_in, error=error_body(exc))
            return
        logger.info("%s failure handler done (call %d)", label, call.tries)
        self._settle(queue, call, ok=True, retry_in=0, error=None)

    def _no_handler(self, queue: str, call: FailureCall, job: FailedJob) -> None:
        """No failure handler here for this call. While the queue has none at all (it was
        unregistered since the claim) the call goes back to waiting for a worker that has one;
        when other jobs of the queue have one, this job's task has none: the call is dropped,
        as if the hook had been off for it."""
        keep = not self.handlers.has_failure_handler(queue)
        try:
            self.storage.settle_failure_call(queue, call, ok=not keep, retry_in_ms=0, error=None)
        except Exception as exc:  # the lease ends and the call is looked at again
            logger.warning("[%s/%s] failure call not settled: %s", queue, call.job_id, exc)
            return
        if not keep:
            self.stats["dropped"] += 1
            logger.info("[%s/%s] task %r has no failure handler here: its call is dropped",
                        queue, call.job_id, job.task)  # fmt: skip

    def _retry_in(self, queue: str, call: FailureCall, exc: BaseException, policy: Any) -> int:
        """ms until the next call: the failure handler's own backoff (``on_failure(...,
        backoff=)``) when it has one, else the worker's exponential one."""
        backoff = None if policy is None else policy.backoff
        if backoff is not None:
            try:
                return int(backoff.seconds(call.tries, exc, self._rng) * 1000)
            except Exception:  # a broken custom backoff: the worker's own applies
                logger.exception("[%s/%s] failure handler backoff failed", queue, call.job_id)
        return backoff_ms(call.tries, self.min_backoff, self.max_backoff, self._rng)

    def _settle(
        self,
        queue: str,
        call: FailureCall,
        *,
        ok: bool,
        retry_in: int,
        error: bytes | None,
        gave_up: bool = False,
    ) -> None:
        """``ok``: the call is done (deleted), also when the policy ``gave_up`` on it; else it
        waits ``retry_in`` ms, keeping ``error`` for operators."""
        try:
            settled = self.storage.settle_failure_call(
                queue, call, ok=ok, retry_in_ms=retry_in, error=error
            )
        except Exception as exc:  # the lease ends and the call runs again: at least once
            logger.warning("[%s/%s] failure call not settled: %s", queue, call.job_id, exc)
            return
        if not settled:
            self.stats["fenced"] += 1
            logger.warning(
                "[%s/%s] failure handler outlived its lease of %d ms: another claim runs it"
                " again", queue, call.job_id, self.lease_ms,
            )  # fmt: skip
        else:
            self.stats["gave_up" if gave_up else "ok" if ok else "failed"] += 1

    @staticmethod
    def _arguments(call: FailureCall) -> tuple[Any, FailedJob, dict[str, Any]]:
        """(payload, job, error) as the failure handler gets them. The payload is the one the
        handler got (an enveloped job's without its envelope; a task's ``{"args", "kwargs"}``),
        and ``job.task`` names its task. A payload that does not decode (the job may have
        failed for exactly that) is passed as its raw bytes."""
        raw = bytes(call.payload)
        task = None
        try:
            payload, meta = unwrap(call.content_type, serde_for(call.content_type).loads(raw))
        except Exception:  # any decoder error: the call must still run
            payload = raw
        else:
            task = meta.get("task") if isinstance(meta.get("task"), str) else None
        job = FailedJob(
            id=call.job_id, queue=call.queue, attempts=call.attempts,
            failed_at=ms_to_datetime(call.failed_at),  # type: ignore[arg-type]
            content_type=call.content_type, raw_payload=raw, tries=call.tries, task=task,
        )  # fmt: skip
        error = decode_error(bytes(call.error)) or {"type": "Unknown", "message": ""}
        return payload, job, error


def _gives_up(policy: Any, exc: BaseException) -> bool:
    """Whether a failure handler's exception ends its call instead of a retry: a
    ``PermanentError`` always, else as its policy's ``retry_on`` / ``dont_retry_on`` say.
    ``SystemExit`` & co. are not the handler's verdict: the call is retried."""
    if not isinstance(exc, Exception):
        return False
    if isinstance(exc, PermanentError):
        return True
    if policy is None:
        return False
    return isinstance(exc, policy.dont_retry_on) or bool(
        policy.retry_on and not isinstance(exc, policy.retry_on)
    )


def _invoke(func: FailureHandler, payload: Any, job: FailedJob, error: dict[str, Any]) -> None:
    result = func(payload, job, error)
    if inspect.isawaitable(result):
        asyncio.run(_awaited(result))


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
