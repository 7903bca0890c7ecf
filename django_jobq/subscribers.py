"""Runs ``@subscriber`` handlers: a claim loop, handler threads, and a heartbeat.

Kept apart from ``worker.py``: a subscriber group is not a queue (it has a cursor, and its
messages are claimed per group), so it gets its own small loop, which ``runworker`` runs beside
the job worker. The rules for a handler's outcome are those of jobs (``execution.py``): success
completes; ``PermanentError``, a malformed payload, or the last allowed attempt makes a dead
letter; any other error retries after the job backoff (or the ``retry_in`` it asks for).
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
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .broadcast import Subscription
from .conf import get_storage, jobq_settings
from .errors import ConfigurationError, PermanentError
from .execution import _JITTER, backoff_ms, error_body, requested_retry_ms
from .job import Job
from .storage.broadcast_base import BroadcastStore, Delivery, Settle, SettleKind
from .validation import validate_job_id

logger = logging.getLogger("django_jobq.subscribers")
RECONNECT_MAX = 1.0  # s: longest pause between claims of a storage that does not answer
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


class SubscriberWorker:
    """Serves subscriber groups: ``run()`` until ``stop()``; ``start()`` runs it in a thread."""

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
    ) -> None:
        if not subscriptions:
            raise ConfigurationError("a subscriber worker needs at least one subscription")
        conf = jobq_settings()["WORKER"]
        self.subscriptions = list(subscriptions)
        self.storage = storage if storage is not None else get_storage()
        self.store: BroadcastStore = self.storage.broadcasts()
        self.concurrency = concurrency or conf["concurrency"]
        self.lease = lease or conf["lease"]
        self.grace = conf["grace"] if grace is None else grace
        host = socket.gethostname().replace(":", "-")
        self.worker_id = validate_job_id(
            worker_id or f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"[-128:]
        )
        self.idle_timeout = idle_timeout
        self.stats = {"completed": 0, "retried": 0, "dead": 0, "released": 0, "lost": 0}
        self._cond = threading.Condition()
        self._free = self.concurrency
        self._inflight: dict[tuple[str, str, str, int], _InFlight] = {}
        self._work: stdqueue.SimpleQueue[_InFlight | None] = stdqueue.SimpleQueue()
        self._acks: stdqueue.SimpleQueue[tuple[_InFlight, Settle] | None] = stdqueue.SimpleQueue()
        self._acker = threading.Thread(target=self._ack_loop, name="jobq-subscriber-acker",
                                       daemon=True)  # fmt: skip
        self._stopping = threading.Event()
        self._hurry = threading.Event()
        self._threads: list[threading.Thread] = []
        self.started = threading.Event()
        self.stopped = threading.Event()
        self._served = {(s.broadcast, s.group) for s in self.subscriptions}
        self._missed: dict[tuple[str, str], int] = {}  # last missed count seen per group

    # -- lifecycle --------------------------------------------------------------------------

    def run(self) -> None:
        self._subscribe()
        self._check_missed()  # the baseline: what the groups missed before this worker
        for i in range(self.concurrency):
            self._spawn(self._handler_loop, f"jobq-subscriber-{i}")
        self._spawn(self._heartbeat_loop, "jobq-subscriber-heartbeat")
        self._acker.start()
        labels = [s.label for s in self.subscriptions]
        logger.info("subscriber worker %s serving %s", self.worker_id, labels)
        self.started.set()
        try:
            self._fetch_loop()
        finally:
            self._shutdown()
            self.stopped.set()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="jobq-subscribers", daemon=True)
        thread.start()
        self.started.wait(10)
        return thread

    def stop(self, *, hurry: bool = False) -> None:
        if hurry:
            self._hurry.set()
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

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

    def _fetch_loop(self) -> None:
        rotation, failures = 0, 0
        while not self._stopping.is_set():
            with self._cond:
                while self._free <= 0 and not self._stopping.is_set():
                    self._cond.wait()
            if self._stopping.is_set():
                return
            try:
                claimed = self._claim_round(rotation)
                failures = 0
            except Exception as exc:  # noqa: BLE001 - storage unreachable: back off
                failures += 1
                delay = min(RECONNECT_MAX, 0.1 * 2**failures)
                logger.warning("subscriber claim failed (%s); retrying in %.1fs", exc, delay)
                self._stopping.wait(delay)
                continue
            rotation += 1
            if not claimed:
                self._idle()

    def _idle(self) -> None:
        """Block until a publish (one broadcast served) or a short poll (several)."""
        names = {s.broadcast for s in self.subscriptions}
        try:
            if len(names) == 1:
                self.store.wait(next(iter(names)), self.idle_timeout)
            else:
                self._stopping.wait(min(self.idle_timeout, 0.05))
        except Exception as exc:  # noqa: BLE001
            logger.warning("subscriber wait failed (%s)", exc)
            self._stopping.wait(0.5)

    def _claim_round(self, rotation: int) -> int:
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
        return claimed

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

    def _handler_loop(self) -> None:
        while (entry := self._work.get()) is not None:
            with self._cond:
                if self._key(entry) not in self._inflight:
                    continue  # released by shutdown before it started
                entry.running = True
            self._acks.put((entry, self._run(entry)))

    @staticmethod
    def _key(entry: _InFlight) -> tuple[str, str, str, int]:
        d = entry.delivery
        return (d.broadcast, d.group, d.position, d.token)

    def _run(self, entry: _InFlight) -> Settle:
        from .queue import serde_for

        sub, d, job = entry.sub, entry.delivery, entry.job
        label = f"[{sub.label}/{d.message_id}]"
        try:
            job.payload = serde_for(d.content_type).loads(d.payload)
        except Exception as exc:  # noqa: BLE001 - malformed bytes must not stop the worker
            logger.error("%s malformed payload: %s", label, exc)
            body = error_body(exc, "MalformedPayload")
            return Settle(SettleKind.DEAD, d.position, d.token, error=body)
        try:
            result = sub.func(job)
            if inspect.isawaitable(result):
                asyncio.run(_awaited(result))
        except BaseException as exc:  # noqa: BLE001 - a handler's SystemExit must not kill us
            logger.warning(
                "%s attempt %d/%d failed: %s: %s",
                label,
                d.attempt,
                sub.max_attempts,
                type(exc).__name__,
                exc,
            )
            return verdict(sub, d, exc)
        return verdict(sub, d, None)

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
        with self._cond:
            for (entry, _), outcome in zip(batch, outcomes, strict=True):
                self.stats[names.get(str(outcome), "lost")] += 1
                if self._inflight.pop(self._key(entry), None) is not None:
                    self._free += 1
            self._cond.notify_all()

    # -- heartbeat --------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        last_check = 0.0
        while not self.stopped.wait(self.lease / 3000):
            if time.monotonic() - last_check >= MISSED_CHECK:
                last_check = time.monotonic()
                self._check_missed()
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
        with self._cond:
            while self._inflight and not self._hurry.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(min(remaining, 0.5))
            leftovers = list(self._inflight.values())
            self._inflight.clear()
        for entry in leftovers:
            entry.job.cancel_event.set()
            self._release(entry)
        for _ in self._threads:
            self._work.put(None)
        self._acks.put(None)
        if self._acker.is_alive():
            self._acker.join(10)
        logger.info("subscriber worker %s stopped: %s", self.worker_id, self.stats)

    def _release(self, entry: _InFlight) -> None:
        d = entry.delivery
        try:
            self.store.settle(
                d.broadcast, d.group, [Settle(SettleKind.RELEASE, d.position, d.token)]
            )
        except Exception as exc:  # noqa: BLE001 - the lease lapses and another worker takes it
            logger.warning("could not release %s: %s", d.message_id, exc)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
