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

from ...errors import JobCancelled
from ...job import ClaimedJob, Job
from ...storage.base import Ack
from ...tasks.registry import HandlerRegistry
from ..execution import error_verdict, execute_async, job_timeouts


class AsyncRunner:
    supports_hard_timeout = True  # the task is cancelled at the hard timeout

    def __init__(self, handlers: HandlerRegistry) -> None:
        self.handlers = handlers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: dict[tuple[str, str, int], asyncio.Task] = {}  # touched on the loop only

    def start(self, slots: int) -> None:
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="jobq-async", daemon=True)
        self._thread.start()

    def submit(self, claimed: ClaimedJob, job: Job, done: Callable[[Ack], None]) -> None:
        """Start the job on the loop; ``done`` gets its verdict (from the loop's thread)."""
        loop = self._loop
        assert loop is not None, "start() first"
        hard = job_timeouts(claimed.queue, self.handlers, job.meta)[1]
        key = (claimed.queue, claimed.job_id, claimed.token)

        def finished(task: asyncio.Task) -> None:
            self._tasks.pop(key, None)
            if task.cancelled():  # killed before its first step ran
                ack = error_verdict(claimed, JobCancelled("cancelled before it started"), "")
            else:
                ack = task.result()
            done(ack)

        def begin() -> None:
            task = loop.create_task(execute_async(claimed, self.handlers, job, hard))
            self._tasks[key] = task
            task.add_done_callback(finished)

        loop.call_soon_threadsafe(begin)

    def kill(self, key: tuple[str, str, int]) -> None:
        """Cancel one running job's task (``Queue.cancel(..., force=True)``)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(lambda: (t := self._tasks.get(key)) and t.cancel())

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
