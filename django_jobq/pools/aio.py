"""The async pool: ``async def`` handlers, many jobs in flight on one event loop thread.

Why one loop beside the worker's threads rather than an async worker: claiming, heart-beating
and acknowledging stay the same code for every pool (and stay off the loop, so a handler that
blocks the loop by mistake still cannot stop leases from being extended). Plain handlers served
by this pool run in the loop's thread pool so they cannot block it either.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from ..execution import execute_async
from ..job import ClaimedJob, Job
from ..registry import HandlerRegistry
from ..storage.base import Ack


class AsyncRunner:
    supports_hard_timeout = True  # the task is cancelled at the hard timeout

    def __init__(self, handlers: HandlerRegistry) -> None:
        self.handlers = handlers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, slots: int) -> None:
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="jobq-async", daemon=True)
        self._thread.start()

    def submit(
        self, claimed: ClaimedJob, job: Job, done: Callable[[ClaimedJob, Ack], None]
    ) -> None:
        """Start the job on the loop; ``done`` gets its verdict (from the loop's thread)."""
        assert self._loop is not None, "start() first"
        hard = self.handlers.options(claimed.queue).hard_timeout
        coro = execute_async(claimed, self.handlers, job, hard)
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)

        def finished(f: Any) -> None:
            if not f.cancelled():  # cancelled by stop(): the worker released the job already
                done(claimed, f.result())

        future.add_done_callback(finished)

    def stop(self) -> None:
        """Cancel what still runs (its job was released by the worker past the grace period)."""
        loop = self._loop
        if loop is None:
            return

        def cancel_all() -> None:
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.call_soon(loop.stop)

        loop.call_soon_threadsafe(cancel_all)
        if self._thread is not None:
            self._thread.join(5)
        self._loop = None
