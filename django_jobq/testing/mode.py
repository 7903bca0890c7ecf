"""The test mode: while it is on, every ``get_queue()``, ``@handler`` queue and Tasks-backend
queue of the project uses one in-memory storage on a test clock, and the test runs the jobs
in its own thread when it chooses. See docs/testing.md."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.test.utils import TestContextDecorator

from .. import backend
from ..errors import ConfigurationError
from ..job import DeadLetter, JobResult, JobStatus, PendingFailureCall
from ..queue.core import Queue
from ..tasks.registry import HandlerRegistry, registry
from .runner import InlineRunner, Run
from .storage import CapturingStorage, EnqueuedJob, TestClock

_active: JobQTestMode | None = None
_ANY: Any = object()


class JobQTestMode:
    """What a test sees of its jobs: the ones its code enqueued, and running them on demand.

    Use it through the ``jobq`` pytest fixture or ``jobq_test_mode()``. Args:
        handlers: the registry whose handlers run the jobs (default: the project's).
        schedules: fire due ``Schedule`` rows when running jobs (needs database access).
    """

    __test__ = False

    def __init__(self, *, handlers: HandlerRegistry = registry, schedules: bool = True) -> None:
        self.clock = TestClock()
        self.storage = CapturingStorage(self.clock)
        self.runner = InlineRunner(self.storage, handlers, schedules=schedules)

    def start(self) -> JobQTestMode:
        """Put the project on this mode's storage (``get_storage()`` returns it)."""
        global _active
        if _active is not None:
            raise ConfigurationError("a jobq test mode is already on (they do not nest)")
        _active = self
        backend.set_test_storage(self.storage)
        return self

    def stop(self) -> None:
        global _active
        if _active is self:
            backend.set_test_storage(None)
            _active = None

    def __enter__(self) -> JobQTestMode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what was enqueued ------------------------------------------------------------------

    def enqueued(self, queue: str | None = None) -> list[EnqueuedJob]:
        """Jobs stored since the test mode started (of ``queue``, or all), oldest first,
        whatever became of them since; ``clear()`` forgets them."""
        return self.storage.captured(queue)

    def queue(self, name: str = "default") -> Queue:
        """The queue as the code under test gets it from ``get_queue(name)``."""
        from ..queue.core import get_queue

        return get_queue(name)

    # -- running ----------------------------------------------------------------------------

    def run_all(
        self,
        queues: Sequence[str] | None = None,
        *,
        advance: bool = True,
        schedules: bool | None = None,
        max_runs: int = 1000,
        fail_fast: bool = False,
    ) -> list[Run]:
        """Run every runnable job in this thread, and what becomes runnable meanwhile
        (retries, released flow parents, new jobs enqueued by handlers, failure handlers,
        due schedules), until nothing is left; returns the runs in order.

        Args:
            queues: only these queues (default: every queue with jobs; a queue with waiting
                jobs and no handler is an error, as a worker would refuse to serve it).
            advance: move the test clock to each next due time (backoffs, delays, rate
                limits) instead of stopping where nothing is due now.
            schedules: fire due schedules (default: as the test mode was started).
            max_runs: stop with an error after this many runs (a job that enqueues itself).
            fail_fast: raise ``JobRunError`` with its traceback when a job fails for good.
        """
        return self.runner.run_all(queues, advance=advance, schedules=schedules,
                                   max_runs=max_runs, fail_fast=fail_fast)  # fmt: skip

    def run_one(
        self, queue: str | None = None, *, advance: bool = True, schedules: bool | None = None
    ) -> Run | None:
        """Run the next job (one attempt); None when no job is left. See ``run_all``."""
        return self.runner.run_one(queue, advance=advance, schedules=schedules)

    def fire_schedules(self) -> list[str]:
        """Enqueue the schedules due on the test clock now; returns the stored job ids."""
        from ..schedules.core import fire_due

        return fire_due(self.clock.now(), storage=self.storage)

    @property
    def results(self) -> list[Run]:
        """Every run since the test mode started (or ``clear()``), oldest first."""
        return list(self.runner.history)

    def result(self, queue: str, job_id: str) -> JobResult | None:
        """The job's state and result (or error), as ``Queue.get_result`` gives it."""
        return self.queue(queue).get_result(job_id)

    def status(self, queue: str, job_id: str) -> JobStatus | None:
        return self.queue(queue).get_status(job_id)

    def dead_letters(self, queue: str) -> list[DeadLetter]:
        """Jobs of ``queue`` that failed for good, newest first."""
        return self.queue(queue).dead_letters()

    def failure_calls(self, queue: str) -> list[PendingFailureCall]:
        """Failure-handler calls not done yet (a failure handler that raised waits for its
        backoff: ``advance()`` past it and run again)."""
        return self.queue(queue).failure_calls()

    def clear(self) -> None:
        """Forget every job, queue setting and run so far (the clock stays where it is)."""
        for name in self.storage.list_queues():
            self.storage.obliterate(name, force=True)
        self.storage.forget_captured()
        self.runner.history.clear()

    # -- the clock --------------------------------------------------------------------------

    def now(self) -> dt.datetime:
        """The test clock's time (real time plus what the test advanced)."""
        return self.clock.now()

    def advance(self, by: float | dt.timedelta) -> dt.datetime:
        """Move the test clock forward by ``by`` seconds (or a timedelta). Jobs that become
        due run at the next ``run_all`` / ``run_one``."""
        return self.clock.advance(by)

    def advance_to(self, when: dt.datetime) -> dt.datetime:
        return self.clock.advance_to(when)

    # -- assertions -------------------------------------------------------------------------

    def assert_enqueued(
        self,
        queue: str,
        *,
        id: str | None = None,  # noqa: A002 - the name the job has everywhere else
        payload: Any = _ANY,
        count: int | None = None,
    ) -> list[EnqueuedJob]:
        """Assert that jobs matching ``id`` / ``payload`` were enqueued on ``queue`` (exactly
        ``count`` of them when given, else at least one); returns them. The message lists
        what was enqueued instead."""
        jobs = self.enqueued(queue)
        found = [j for j in jobs if (id is None or j.id == id)
                 and (payload is _ANY or j.payload == payload)]  # fmt: skip
        if (count is None and found) or (count is not None and len(found) == count):
            return found
        wanted = ", ".join(
            f"{k}={v!r}" for k, v in (("id", id), ("payload", payload)) if v not in (None, _ANY)
        )
        expected = f"{count} job(s)" if count is not None else "a job"
        raise AssertionError(
            f"expected {expected} on queue {queue!r}{' with ' + wanted if wanted else ''},"
            f" found {len(found)}. Enqueued on {queue!r}: {_listing(jobs)}"
            f"{self._elsewhere(queue)}"
        )

    def assert_not_enqueued(self, queue: str | None = None) -> None:
        """Assert that nothing was enqueued (on ``queue``, or anywhere)."""
        jobs = self.enqueued(queue)
        if jobs:
            where = f"on queue {queue!r}" if queue else "anywhere"
            raise AssertionError(f"expected no job {where}, found {len(jobs)}: {_listing(jobs)}")

    def assert_no_failures(self) -> None:
        """Assert that no run so far raised (no retry, no dead letter, no failing failure
        handler); the message has each traceback."""
        bad = [r for r in self.runner.history if r.error is not None]
        if bad:
            details = "\n\n".join(r.describe() for r in bad)
            raise AssertionError(f"{len(bad)} run(s) raised:\n\n{details}")

    def _elsewhere(self, queue: str) -> str:
        others = sorted({j.queue for j in self.enqueued()} - {queue})
        return f" (jobs were enqueued on {others})" if others else ""


def _listing(jobs: list[EnqueuedJob]) -> str:
    if not jobs:
        return "none"
    shown = "; ".join(f"{j.queue}/{j.id} payload={j.payload!r}" for j in jobs[:10])
    return shown + (f"; and {len(jobs) - 10} more" if len(jobs) > 10 else "")


class jobq_test_mode(TestContextDecorator):  # noqa: N801 - used like override_settings
    """Turn the test mode on: a context manager (``with jobq_test_mode() as jobq:``), a
    decorator of a test function, or of a ``unittest.TestCase`` class (each test then has its
    own mode as ``self.jobq``). Arguments: ``JobQTestMode``'s."""

    def __init__(self, *, handlers: HandlerRegistry = registry, schedules: bool = True) -> None:
        super().__init__(attr_name="jobq")
        self.handlers = handlers
        self.schedules = schedules
        self._modes: list[JobQTestMode] = []

    def enable(self) -> JobQTestMode:
        mode = JobQTestMode(handlers=self.handlers, schedules=self.schedules).start()
        self._modes.append(mode)
        return mode

    def disable(self) -> None:
        self._modes.pop().stop()

    # django-stubs types TestContextDecorator for isolate_apps (it returns Apps there).
    def __enter__(self) -> JobQTestMode:  # type: ignore[override]
        return self.enable()
