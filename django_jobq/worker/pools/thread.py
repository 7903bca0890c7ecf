"""The default pool: handlers run on the worker's own handler threads."""

from __future__ import annotations

from typing import Any

from ...job import ClaimedJob, Job
from ...storage.base import Ack
from ...tasks.registry import HandlerRegistry
from ..execution import close_old_connections, execute, execute_batch


class ThreadRunner:
    """Runs a handler on the calling handler thread. A soft timeout sets the job's flag (the
    worker's watchdog does that); nothing can stop a thread from outside, hence no hard
    timeout here (the worker refuses such handlers on this pool)."""

    supports_hard_timeout = False

    def __init__(self, handlers: HandlerRegistry, storage: Any = None) -> None:
        self.handlers = handlers
        self.storage = storage  # where an atomic handler's completion is written
        self.keep_alias: str | None = None  # its connection, kept between jobs (atomic queues)

    def start(self, slots: int) -> None:
        """Nothing to start: the worker's handler threads are the pool."""

    def is_ready(self, slot: int) -> bool:
        return True

    def ready(self, slot: int) -> None:
        """A thread is always ready for its next job."""

    def run(self, slot: int, claimed: ClaimedJob, job: Job) -> Ack:
        try:
            return execute(claimed, self.handlers, job, storage=self.storage)
        finally:
            close_old_connections(self.keep_alias)

    def run_batch(self, slot: int, claimed: list[ClaimedJob], jobs: list[Job]) -> list[Ack]:
        try:
            return execute_batch(claimed, self.handlers, jobs)
        finally:
            close_old_connections()

    def thread_done(self) -> None:
        """A handler thread ends (the worker stops): close the connection kept for atomic
        jobs, which a thread that is gone can never close or reuse."""
        if self.keep_alias is not None:
            from django.db import connections

            connections[self.keep_alias].close()

    def kill(self, key: tuple[str, str, int]) -> None:
        """A thread cannot be killed: a forced cancel is cooperative here (the job's flag)."""

    def stop(self) -> None:
        """Handler threads are daemons; the worker has already released their jobs."""
