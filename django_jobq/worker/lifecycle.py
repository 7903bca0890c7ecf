"""The serving lifecycle shared by the job worker (``worker.py``) and the subscriber worker
(``subscribers.py``): identity, ``start``/``stop``/``stopping``, the claim loop that backs off
from an unreachable storage and blocks on a wake-up signal when idle, and the grace period
of shutdown.

Both loops are the same machine with different storage calls: a fetcher claims up to the free
slots, handler threads run what it claimed, and stopping first stops the claims, then waits up
to ``grace`` for in-flight work. Keeping that machine in one place means a fix to one (a lost
wake-up, a shutdown that hangs) is a fix to both.
"""

from __future__ import annotations

import abc
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from ..conf import configured_retention
from ..validation import logical_name, validate_job_id

logger = logging.getLogger("django_jobq.worker")
_retention_log = logging.getLogger("django_jobq.retention")
# Longest pause between retries of a storage that does not answer (claims and verdicts). A
# Redis restart takes about a second: a longer cap would leave a worker idle for seconds after
# the server is back; a retry costs one refused connection, so retrying every second is cheap.
RECONNECT_MAX = 1.0


def default_worker_id(worker_id: str | None = None) -> str:
    """``host-pid-random``: unique per process, readable on the Workers page."""
    host = socket.gethostname().replace(":", "-")
    return validate_job_id(worker_id or f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"[-128:])


class ServingLoop(abc.ABC):
    """Base of a worker: subclasses provide ``_claim_round``, ``_idle``, ``_interrupt`` and
    ``run``; they keep ``_inflight`` (keyed entries) and ``_free`` (free slots) under ``_cond``.
    """

    thread_name = "jobq-worker"

    def _init_loop(self, worker_id: str | None, grace: float) -> None:
        self.worker_id = default_worker_id(worker_id)
        self.grace = grace
        self._cond = threading.Condition()
        self._free = 0
        self._inflight: dict[Any, Any] = {}
        self._stopping = threading.Event()
        self._hurry = threading.Event()  # second signal: skip the grace period
        self._threads: list[threading.Thread] = []
        self.started = threading.Event()
        self.stopped = threading.Event()

    # -- lifecycle --------------------------------------------------------------------------

    @abc.abstractmethod
    def run(self) -> None:
        """Serve until stopped, in the calling thread (each subclass starts its own threads)."""

    def start(self) -> threading.Thread:
        """Run in a background thread (embedding, tests); returns once the worker is serving."""
        thread = threading.Thread(target=self.run, name=f"{self.thread_name}-{self.worker_id}")
        thread.daemon = True
        thread.start()
        self.started.wait(10)
        return thread

    def stop(self, *, hurry: bool = False) -> None:
        """Stop claiming. In-flight work gets ``grace`` seconds (none when ``hurry``)."""
        if hurry:
            self._hurry.set()
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        try:
            self._interrupt()
        except Exception as exc:  # storage down: the wait ends at its timeout anyway
            logger.debug("could not interrupt the claim wait: %s", exc)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _spawn(self, target: Callable[[], Any], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- the claim loop ---------------------------------------------------------------------

    @abc.abstractmethod
    def _claim_round(self, rotation: int) -> tuple[int, float]:
        """Claim up to the free slots; returns (claimed, how long to wait when none)."""

    @abc.abstractmethod
    def _idle(self, wait: float) -> float | None:
        """Block up to ``wait`` s or until there may be something to claim. A loop whose wait
        also claims as it wakes (``Storage.wait_and_claim``) has dispatched what it claimed
        and returns how long its next wait may be; the loop then waits again instead of
        claiming (a claim that left work behind re-armed the wake-up, so that wait returns
        at once). None: only waited, claim next."""

    def _interrupt(self) -> None:  # noqa: B027 - optional: a loop whose wait ends by itself
        """End a blocked ``_idle`` now (called by ``stop`` from another thread)."""

    def _fetch_loop(self) -> None:
        rotation, failures = 0, 0
        next_wait: float | None = None  # set: the last wait claimed too; wait again this long
        while not self._stopping.is_set():
            with self._cond:
                while self._free <= 0 and not self._stopping.is_set():
                    self._cond.wait()
            if self._stopping.is_set():
                return
            if next_wait is None:
                try:
                    claimed, wait = self._claim_round(rotation)
                    failures = 0
                except Exception as exc:  # storage unreachable: back off, never crash
                    failures += 1
                    # Capped (RECONNECT_MAX): a longer pause would delay the restart of
                    # processing by as much after the storage comes back; a claim a second
                    # costs nothing.
                    delay = min(RECONNECT_MAX, 0.1 * 2**failures)
                    logger.warning("claim failed (%s); retrying in %.1fs", exc, delay)
                    self._stopping.wait(delay)
                    continue
                rotation += 1
                if claimed:
                    continue
            else:
                wait = next_wait
            try:
                next_wait = self._idle(wait)
            except Exception as exc:
                next_wait = None
                logger.warning("wait for work failed (%s)", exc)
                self._stopping.wait(0.5)

    # -- shutdown ---------------------------------------------------------------------------

    def _drain(self, deadline: float) -> list[Any]:
        """Wait until in-flight work is done, ``deadline`` (monotonic) passes or a hurry; then
        take what is left out of ``_inflight`` and return it for the caller to release."""
        with self._cond:
            if self._inflight:
                logger.info("waiting up to %.1fs for %d in flight", self.grace,
                            len(self._inflight))  # fmt: skip
            while self._inflight and not self._hurry.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(min(remaining, 0.5))
            leftovers = list(self._inflight.values())
            self._inflight.clear()
        return leftovers


def apply_configured_retention(storage: Any, queues: Iterable[str]) -> None:
    """Write each queue's configured policy to storage (workers and the reaper at start). A
    storage blip is logged: the policy stored earlier still holds."""
    for name in queues:
        # A partition of a sharded queue keeps its logical queue's policy (a count is kept
        # per partition: docs/scaling.md).
        retention = configured_retention(logical_name(name))
        if retention is None:
            continue
        try:
            storage.set_retention(name, retention)
        except Exception as exc:  # storage blip: the policy stored earlier still holds
            _retention_log.warning("could not apply the retention of queue %s: %s", name, exc)
