"""Runs ``@subscriber`` handlers: a claim loop, handler threads, and a heartbeat.

A subscriber group is not a queue (it has a cursor, and its messages are claimed per group), so
the claims, verdicts and heartbeats are its own; the lifecycle (start, stop, the claim loop and
its idle wait, the grace period) is the job worker's (``lifecycle.py``). An idle worker blocks
on the backend's ``Waiter`` until a publish, not on a timer. The rules for a handler's outcome
are those of jobs (``execution.py``): success completes; ``PermanentError``, a malformed
payload, or the last allowed attempt makes a dead letter; any other error retries after the job
backoff (or the ``retry_in`` it asks for).

Where a handler runs is the job worker's choice too (``--pool``): on the handler threads
(``thread``), in a reused child process per slot (``process``: a hard timeout kills the child)
or on one event loop (``async``: a hard timeout cancels the task). Claims, verdicts and
heartbeats stay on the worker's threads whatever the pool, so a hung handler cannot stop its
lease from being extended, nor other slots or groups from being served.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import queue as stdqueue
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import CancelledError
from dataclasses import astuple, dataclass
from functools import partial
from typing import Any

from ..backend import get_storage
from ..conf import jobq_settings
from ..errors import ConfigurationError, HardTimeout, InvalidOption, PermanentError
from ..job import Job
from ..observability.metrics.tally import Tally
from ..observability.metrics.tally import current as metrics_tally
from ..storage.broadcast_base import BroadcastStore, Delivery, Settle, SettleKind
from ..worker.execution import _JITTER, backoff_ms, error_body, requested_retry_ms
from ..worker.lifecycle import RECONNECT_MAX, ServingLoop
from ..worker.pools import POOLS, ProcessRunner, Watchdog
from .core import Subscription

logger = logging.getLogger("django_jobq.subscribers")
MISSED_CHECK = 10.0  # s between looks at the served groups' missed counts


@dataclass(slots=True)
class _InFlight:
    sub: Subscription
    delivery: Delivery
    job: Job
    running: bool = False


def verdict(sub: Subscription, d: Delivery, exc: BaseException | None) -> Settle:
    """The verdict on one attempt: None for success, else the error it raised."""
    if exc is None:
        return Settle(SettleKind.COMPLETE, d.position, d.token)
    body = error_body(exc)
    if isinstance(exc, PermanentError) or d.attempt >= sub.max_attempts:
        return Settle(SettleKind.DEAD, d.position, d.token, error=body)
    delay = requested_retry_ms(exc)
    if delay is None:
        delay = backoff_ms(d.attempt, sub.min_backoff, sub.max_backoff, _JITTER)
    return Settle(SettleKind.RETRY, d.position, d.token, retry_in=delay, error=body)


class SubscriberWorker(ServingLoop):
    """Serves subscriber groups: ``run()`` until ``stop()``; ``start()`` runs it in a thread.

    ``idle_timeout``: longest idle wait before claiming again without a publish (retries that
    came due and lapsed leases are found by claims, not signalled)."""

    thread_name = "jobq-subscribers"

    def __init__(
        self,
        subscriptions: Sequence[Subscription],
        *,
        storage: Any = None,
        concurrency: int | None = None,
        lease: int | None = None,
        grace: float | None = None,
        worker_id: str | None = None,
        idle_timeout: float = 1.0,
        pool: str = "thread",
    ) -> None:
        if not subscriptions:
            raise ConfigurationError("a subscriber worker needs at least one subscription")
        if pool not in POOLS:
            raise InvalidOption(f"pool must be one of {POOLS}, got {pool!r}")
        hard = [s.label for s in subscriptions if s.hard_timeout is not None]
        if hard and pool == "thread":
            raise ConfigurationError(
                f"subscriber(s) {hard} have a hard_timeout, which the thread pool cannot enforce"
                " (a thread cannot be stopped from outside): run them with --pool process or"
                " --pool async"
            )
        self.pool = pool
        self._processes: ProcessRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        conf = jobq_settings()["WORKER"]
        self.subscriptions = list(subscriptions)
        self.storage = storage if storage is not None else get_storage()
        self.store: BroadcastStore = self.storage.broadcasts()
        self.concurrency = concurrency or conf["concurrency"]
        self.lease = lease or conf["lease"]
        self._init_loop(worker_id, conf["grace"] if grace is None else grace)
        self.idle_timeout = idle_timeout
        self.stats = {"completed": 0, "retried": 0, "dead": 0, "released": 0, "lost": 0}
        self._free = self.concurrency
        self._inflight: dict[tuple[str, str, str, int], _InFlight] = {}
        self._work: stdqueue.SimpleQueue[_InFlight | None] = stdqueue.SimpleQueue()
        self._acks: stdqueue.SimpleQueue[tuple[_InFlight, Settle] | None] = stdqueue.SimpleQueue()
        self._waiter = self.store.waiter(sorted({s.broadcast for s in self.subscriptions}))
        self._armed = False  # the waiter recorded where the logs stood (see _idle)
        #: Set while blocked waiting for a publish (tests and embedders can wait for idleness).
        self.idle = threading.Event()
        self._watchdog = Watchdog()
        self._tally: Tally | None = None
        self._started_ms = int(time.time() * 1000)
        self._beat_at: float | None = None
        self._served = {(s.broadcast, s.group) for s in self.subscriptions}
        self._missed: dict[tuple[str, str], int] = {}  # last missed count seen per group

    # -- lifecycle --------------------------------------------------------------------------

    def run(self) -> None:
        self._tally = metrics_tally()
        self._subscribe()
        self._check_missed()  # the baseline: what the groups missed before this worker
        self._start_pool()
        for i in range(self.concurrency):
            self._spawn(partial(self._handler_loop, i), f"jobq-subscriber-{i}")
        self._spawn(self._heartbeat_loop, "jobq-subscriber-heartbeat")
        self._spawn(self._ack_loop, "jobq-subscriber-acker")
        self._register_quietly()
        labels = [s.label for s in self.subscriptions]
        logger.info("subscriber worker %s serving %s", self.worker_id, labels)
        self.started.set()
        try:
            self._fetch_loop()
        finally:
            self._shutdown()
            self.stopped.set()

    def _start_pool(self) -> None:
        """The process pool's children (one per slot, started at once: their Django start-up
        runs in parallel) or the async pool's event loop."""
        if self.pool == "process":
            from ..tasks.registry import registry

            self._processes = ProcessRunner(registry)
            self._processes.start(self.concurrency)
        elif self.pool == "async":
            loop = self._loop = asyncio.new_event_loop()
            self._spawn(loop.run_forever, "jobq-subscriber-async")

    def _stop_pool(self) -> None:
        if self._processes is not None:
            self._processes.stop()
        if self._loop is not None:
            loop = self._loop

            def cancel_all() -> None:
                for task in asyncio.all_tasks(loop):
                    task.cancel()
                loop.call_soon(loop.stop)

            loop.call_soon_threadsafe(cancel_all)

    def _interrupt(self) -> None:
        self._waiter.interrupt()

    def metrics_snapshot(self) -> dict[str, float]:
        """Slots, busy slots and heartbeat age (s; -1 before the first), for metrics."""
        with self._cond:
            busy = len(self._inflight)
        beat = self._beat_at
        return {"slots": self.concurrency, "busy": busy,
                "heartbeat_age": -1.0 if beat is None else time.monotonic() - beat}  # fmt: skip

    def _subscribe(self) -> None:
        """Create missing groups at their ``start``; a storage blip here is retried."""
        pending = list(self.subscriptions)
        failures = 0
        while pending and not self._stopping.is_set():
            try:
                sub = pending[0]
                if self.store.subscribe(sub.broadcast, sub.group, sub.start):
                    logger.info("created group %s (start %s)", sub.label, sub.start)
                pending.pop(0)
            except Exception as exc:  # noqa: BLE001 - storage down: retry, never crash
                failures += 1
                logger.warning("could not create group %s yet: %s", pending[0].label, exc)
                self._stopping.wait(min(RECONNECT_MAX, 0.1 * 2**failures))

    # -- claiming ---------------------------------------------------------------------------

    def _idle(self, wait: float) -> None:
        """After an empty claim: arm the waiter and claim once more (a publish between the
        claim and the arm is seen by that claim); after a second empty one, block until a
        publish to a served broadcast, ``interrupt()`` or ``wait``."""
        if not self._armed:
            self._waiter.arm()
            self._armed = True
            return
        self._armed = False
        self.idle.set()
        try:
            self._waiter.wait(wait)
        finally:
            self.idle.clear()

    def _claim_round(self, rotation: int) -> tuple[int, float]:
        claimed, subs = 0, self.subscriptions
        for i in range(len(subs)):
            sub = subs[(rotation + i) % len(subs)]
            with self._cond:
                want = self._free
            if want <= 0:
                break
            got = self.store.claim(
                sub.broadcast, sub.group, self.worker_id, want, self.lease, sub.max_stalls
            )
            with self._cond:
                self._free -= len(got)
                entries = []
                for d in got:
                    job = Job(
                        id=d.message_id,
                        queue=sub.broadcast,
                        payload=None,
                        attempt=d.attempt,
                        max_attempts=sub.max_attempts,
                        token=d.token,
                        meta={"group": sub.group, "published_at": d.published_at},
                    )
                    job.reporter = self._reporter(d)
                    entry = _InFlight(sub, d, job)
                    self._inflight[(d.broadcast, d.group, d.position, d.token)] = entry
                    entries.append(entry)
            for entry in entries:
                self._work.put(entry)
            claimed += len(got)
        if claimed:
            self._armed = False
        return claimed, self.idle_timeout

    def _reporter(self, d: Delivery) -> Any:
        """``job.set_progress`` stores progress fenced by the token; ``job.log`` lines go to
        Python logging (a broadcast delivery keeps no log of its own)."""

        def report(progress: bytes | None, line: str | None) -> bool:
            if line is not None:
                logger.info("[%s:%s/%s] %s", d.broadcast, d.group, d.message_id, line)
            if progress is None:
                return True
            try:
                return self.store.report(d.broadcast, d.group, d.position, d.token, progress)
            except Exception as exc:  # noqa: BLE001 - progress is not worth failing for
                logger.warning("progress of %s not stored: %s", d.message_id, exc)
                return True

        return report

    # -- running ----------------------------------------------------------------------------

    def _handler_loop(self, slot: int) -> None:
        while True:
            if self._processes is not None:
                self._processes.ready(slot)  # a child restarting after a kill delays no message
            entry = self._work.get()
            if entry is None:
                return
            with self._cond:
                if self._key(entry) not in self._inflight:
                    continue  # released by shutdown before it started
                entry.running = True
            self._acks.put((entry, self._run(entry, slot)))

    @staticmethod
    def _key(entry: _InFlight) -> tuple[str, str, str, int]:
        d = entry.delivery
        return (d.broadcast, d.group, d.position, d.token)

    def _run(self, entry: _InFlight, slot: int) -> Settle:
        sub, d, job = entry.sub, entry.delivery, entry.job
        timer = None
        if sub.timeout is not None:
            timer = self._watchdog.schedule(sub.timeout, partial(self._expire, entry))
        try:
            if self._processes is not None:
                return self._run_in_child(entry, slot)
            if self._loop is not None:
                call = _deliver_async(sub, d, job)
                try:
                    return asyncio.run_coroutine_threadsafe(call, self._loop).result()
                except CancelledError as exc:  # the loop stopped (shutdown past the grace)
                    return verdict(sub, d, exc)
            return deliver(sub, d, job)
        finally:
            if timer is not None:
                self._watchdog.cancel(timer)

    def _run_in_child(self, entry: _InFlight, slot: int) -> Settle:
        """Process pool: the slot's child runs ``deliver`` (``_deliver_in_child``); past the
        group's ``hard_timeout`` it is killed, and the attempt fails like any other."""
        assert self._processes is not None
        sub, d, job = entry.sub, entry.delivery, entry.job
        try:
            fields = self._processes.call(slot, f"{__name__}:_deliver_in_child", job,
                                          astuple(d), sub.hard_timeout)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - HardTimeout, ChildDied: a failed attempt
            logger.warning("[%s/%s] attempt %d/%d: the child process was stopped: %s",
                           sub.label, d.message_id, d.attempt, sub.max_attempts, exc)  # fmt: skip
            return verdict(sub, d, exc)
        kind, position, token, retry_in, error = fields
        return Settle(SettleKind(kind), position, token, retry_in, error)

    @staticmethod
    def _expire(entry: _InFlight) -> None:
        """Past the subscriber's ``timeout``: ask the handler to stop (``job.is_cancelled()``),
        as a job's soft timeout does; a thread cannot be stopped from outside."""
        logger.warning("[%s/%s] past its %gs timeout; asking the handler to stop",
                       entry.sub.label, entry.delivery.message_id, entry.sub.timeout)  # fmt: skip
        entry.job.cancel_event.set()

    def _ack_loop(self) -> None:
        """Sends verdicts in batches, one call per group (as the job worker's acker): under
        load many handlers finish while one call is on the wire, and they share the next."""
        done = False
        while not done:
            items = [self._acks.get()]
            while len(items) < 1000:
                try:
                    items.append(self._acks.get_nowait())
                except stdqueue.Empty:
                    break
            done = None in items
            batches: dict[tuple[str, str], list[tuple[_InFlight, Settle]]] = defaultdict(list)
            for item in items:
                if item is not None:
                    d = item[0].delivery
                    batches[(d.broadcast, d.group)].append(item)
            for (name, group), batch in batches.items():
                self._send(name, group, batch)

    def _send(self, name: str, group: str, batch: list[tuple[_InFlight, Settle]]) -> None:
        failures = 0
        while True:
            try:
                outcomes = self.store.settle(name, group, [v for _, v in batch])
                break
            except Exception as exc:  # noqa: BLE001 - keep the verdicts; the lease decides
                failures += 1
                if failures > 100:
                    logger.error("giving up on %d verdicts of %s:%s: %s", len(batch), name,
                                 group, exc)  # fmt: skip
                    outcomes = [None] * len(batch)  # type: ignore[list-item]
                    break
                logger.warning("storing %d verdicts failed (%s); retrying", len(batch), exc)
                time.sleep(min(RECONNECT_MAX, 0.05 * 2**failures))
        names = {"completed": "completed", "retrying": "retried", "failed": "dead",
                 "released": "released"}  # fmt: skip
        counted: dict[str, int] = defaultdict(int)
        with self._cond:
            for (entry, _), outcome in zip(batch, outcomes, strict=True):
                key = names.get(str(outcome), "lost")
                self.stats[key] += 1
                counted[key] += 1
                if self._inflight.pop(self._key(entry), None) is not None:
                    self._free += 1
            self._cond.notify_all()
        if self._tally is not None:
            for key, n in counted.items():
                self._tally.delivered(name, group, key, n)

    # -- heartbeat --------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        last_check = 0.0
        while not self.stopped.wait(self.lease / 3000):
            if time.monotonic() - last_check >= MISSED_CHECK:
                last_check = time.monotonic()
                self._check_missed()
            self._register_quietly()
            with self._cond:
                leases: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
                for name, group, position, token in self._inflight:
                    leases[(name, group)].append((position, token))
            for (name, group), held in leases.items():
                try:
                    lost = set(self.store.heartbeat(name, group, held, self.lease))
                except Exception as exc:  # noqa: BLE001
                    logger.warning("subscriber heartbeat failed (%s); leases may lapse", exc)
                    continue
                for position, token in held:
                    if position in lost:
                        with self._cond:
                            entry = self._inflight.get((name, group, position, token))
                        if entry is not None:
                            logger.warning(
                                "[%s:%s] lease of %s lost; asking the handler to stop",
                                name,
                                group,
                                entry.delivery.message_id,
                            )
                            entry.job.cancel_event.set()

    def _register_quietly(self) -> None:
        """The worker registry (the admin's Workers page, the API's workers list) lists a
        subscriber worker with the groups it serves; a storage blip waits for the next beat."""
        info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": [],
            "groups": [s.label for s in self.subscriptions],
            "concurrency": self.concurrency,
            "pool": self.pool,
            "in_flight": len(self._inflight),
            "started": self._started_ms,
            "completed": self.stats["completed"],
            "failed": self.stats["dead"],
            **{k: v for k, v in self.stats.items() if k not in ("completed", "dead")},
        }
        try:
            self.storage.register_worker(self.worker_id, info, int(self.lease))
            self._beat_at = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - the next heartbeat registers it
            logger.warning("could not register subscriber worker %s: %s", self.worker_id, exc)

    def _check_missed(self) -> None:
        """Log when a served group fell (further) behind the retention: the messages it
        missed are gone for it, and nothing else in a worker's log would say so."""
        for name in {s.broadcast for s in self.subscriptions}:
            try:
                statuses = self.store.status(name)
            except Exception as exc:  # noqa: BLE001 - a figure for operators, not a failure
                logger.debug("status of %s not read: %s", name, exc)
                continue
            for st in statuses:
                key = (name, st.group)
                if key in self._served and st.missed > self._missed.get(key, st.missed):
                    logger.warning(
                        "[%s:%s] fell behind the retention: %d messages dropped before it "
                        "handled them (%d in all); raise maxlen/max_age or add workers",
                        name, st.group, st.missed - self._missed[key], st.missed,
                    )  # fmt: skip
                self._missed[key] = st.missed

    # -- shutdown ---------------------------------------------------------------------------

    def _shutdown(self) -> None:
        deadline = time.monotonic() + (0 if self._hurry.is_set() else self.grace)
        with self._cond:
            unstarted = [e for e in self._inflight.values() if not e.running]
            for entry in unstarted:
                self._inflight.pop(self._key(entry))
        for entry in unstarted:
            self._release(entry)
        for entry in self._drain(deadline):
            entry.job.cancel_event.set()
            self._release(entry)
        for _ in range(self.concurrency):
            self._work.put(None)
        self._stop_pool()
        self._acks.put(None)
        for thread in self._threads:
            if thread.name == "jobq-subscriber-acker":
                thread.join(10)
        self._watchdog.stop()
        try:
            self._waiter.close()
            self.storage.deregister_worker(self.worker_id)
        except Exception as exc:  # noqa: BLE001 - its registration expires by itself
            logger.warning("could not deregister subscriber worker %s: %s", self.worker_id, exc)
        logger.info("subscriber worker %s stopped: %s", self.worker_id, self.stats)

    def _release(self, entry: _InFlight) -> None:
        d = entry.delivery
        try:
            self.store.settle(
                d.broadcast, d.group, [Settle(SettleKind.RELEASE, d.position, d.token)]
            )
        except Exception as exc:  # noqa: BLE001 - the lease lapses and another worker takes it
            logger.warning("could not release %s: %s", d.message_id, exc)


def _decode(sub: Subscription, d: Delivery, job: Job) -> Settle | None:
    """Set ``job.payload``; a dead letter when the bytes cannot be decoded (never retried:
    they will not decode better next time)."""
    from ..serde import serde_for

    try:
        job.payload = serde_for(d.content_type).loads(d.payload)
    except Exception as exc:  # noqa: BLE001 - malformed bytes must not stop the worker
        logger.error("[%s/%s] malformed payload: %s", sub.label, d.message_id, exc)
        return Settle(
            SettleKind.DEAD, d.position, d.token, error=error_body(exc, "MalformedPayload")
        )
    return None


def _failed(sub: Subscription, d: Delivery, exc: BaseException) -> Settle:
    logger.warning("[%s/%s] attempt %d/%d failed: %s: %s", sub.label, d.message_id, d.attempt,
                   sub.max_attempts, type(exc).__name__, exc)  # fmt: skip
    return verdict(sub, d, exc)


def deliver(sub: Subscription, d: Delivery, job: Job) -> Settle:
    """Run ``sub``'s handler on one delivery and return the verdict; never raises. An
    ``async def`` handler runs on a private loop and is cancelled past ``sub.timeout``."""
    bad = _decode(sub, d, job)
    if bad is not None:
        return bad
    try:
        result = sub.func(job)
        if inspect.isawaitable(result):
            asyncio.run(_awaited(result, sub.timeout))
    except BaseException as exc:  # noqa: BLE001 - a handler's SystemExit must not kill us
        return _failed(sub, d, exc)
    return verdict(sub, d, None)


async def _deliver_async(sub: Subscription, d: Delivery, job: Job) -> Settle:
    """``deliver`` on the async pool's loop: a coroutine handler is awaited there (a plain one
    runs in the loop's thread pool, so it cannot block the loop), cancelled past its soft
    ``timeout`` (``TimeoutError``) or its ``hard_timeout`` (``HardTimeout``), whichever
    comes first; either way the attempt fails and retries like any other failure."""
    bad = _decode(sub, d, job)
    if bad is not None:
        return bad
    coro = inspect.iscoroutinefunction(sub.func)
    limits = [t for t in (sub.timeout if coro else None, sub.hard_timeout) if t is not None]
    limit = min(limits) if limits else None
    try:
        call = sub.func(job) if coro else asyncio.to_thread(sub.func, job)
        await asyncio.wait_for(call, limit)
    except TimeoutError as exc:
        job.cancel_event.set()
        if sub.hard_timeout is not None and limit == sub.hard_timeout:
            hard = HardTimeout(f"still running after the hard timeout of {sub.hard_timeout:g}s")
            return _failed(sub, d, hard)
        return _failed(sub, d, exc)
    except BaseException as exc:  # noqa: BLE001 - includes a handler's CancelledError
        return _failed(sub, d, exc)
    return verdict(sub, d, None)


def _deliver_in_child(args: tuple, report: Any, cancel_event: threading.Event) -> tuple:
    """A process-pool child's side of ``_run_in_child`` (``pools/child.py`` calls it): the
    child's own registry holds the same subscribers (its Django set-up autodiscovered them)."""
    from .core import subscribers

    d = Delivery(*args)
    sub = subscribers.get(d.broadcast, d.group)
    if sub is None:
        exc = ConfigurationError(f"no subscriber for {d.broadcast}:{d.group} in the child")
        return astuple(Settle(SettleKind.DEAD, d.position, d.token, error=error_body(exc)))
    job = Job(id=d.message_id, queue=d.broadcast, payload=None, attempt=d.attempt,
              max_attempts=sub.max_attempts, token=d.token,
              meta={"group": d.group, "published_at": d.published_at})  # fmt: skip
    job.cancel_event = cancel_event
    job.reporter = report
    settle = deliver(sub, d, job)
    return (settle.kind.value, settle.position, settle.token, settle.retry_in, settle.error)


async def _awaited(awaitable: Any, timeout: float | None = None) -> Any:
    """An ``async def`` subscriber runs on a loop of its own; past ``timeout`` it is cancelled
    (a coroutine, unlike a thread, can be stopped from outside)."""
    return await asyncio.wait_for(awaitable, timeout)
