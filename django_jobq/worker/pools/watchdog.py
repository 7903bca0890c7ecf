"""One thread for every soft timeout of a worker: a per-job timer thread would cost more than a
no-op job, and most jobs finish long before their timeout."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable


class Watchdog:
    """Calls ``callback`` at a monotonic deadline unless the handle is cancelled first."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []  # (deadline, handle), first deadline first
        # Handles scheduled and neither fired nor cancelled. A cancel drops its handle here
        # and the heap entry is dropped when it comes first; a cancel after the callback
        # fired (a job that ended just past its deadline) finds nothing and keeps nothing.
        self._live: dict[int, Callable[[], None]] = {}
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def schedule(self, delay: float, callback: Callable[[], None]) -> int:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="jobq-watchdog", daemon=True)
                self._thread.start()
            handle = next(self._seq)
            heapq.heappush(self._heap, (time.monotonic() + delay, handle))
            self._live[handle] = callback
            if self._heap[0][1] == handle:
                # Only a new first deadline changes when the thread must wake (it sleeps
                # until the first one): a call per job adds no thread wake-up per job.
                self._cond.notify()
            return handle

    def cancel(self, handle: int) -> None:
        with self._cond:
            self._live.pop(handle, None)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if self._heap and self._heap[0][1] not in self._live:  # cancelled
                        heapq.heappop(self._heap)
                        continue
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    if wait is not None and wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._stopped:
                    return
                _, handle = heapq.heappop(self._heap)
                callback = self._live.pop(handle)
            callback()
