"""Running jobs in the test's own thread with the worker's rules: claim, ``execute``, verdict,
flow release, failure handlers, schedules, on the test mode's storage and clock.

The test's thread, not a worker thread, so handlers see what the test wrote in its (still open)
database transaction and raise into the same process the test inspects."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..conf import jobq_settings
from ..errors import ConfigurationError, JobQError
from ..job import PARKED_FLOOR, AckOutcome, ClaimedJob, FailureCall, Reporter
from ..queue import flows
from ..serde import serde_for
from ..storage.base import Ack
from ..tasks.registry import HandlerRegistry
from ..worker.execution import envelope_meta, execute, execute_batch, make_job
from ..worker.failures import FailureCaller
from .storage import CapturingStorage

logger = logging.getLogger("django_jobq.testing")
WORKER_ID = "jobq-test-mode"
# A claim's lease. The job runs synchronously right after its claim, so no lease can lapse in
# between unless a handler moves the test clock; a day keeps even that from reclaiming it.
LEASE_MS = 24 * 3600 * 1000
# Verdicts after which a flow child's parents may be released (as the worker's fast path).
_FINAL = frozenset({AckOutcome.COMPLETED, AckOutcome.FAILED, AckOutcome.CANCELLED})


class JobRunError(AssertionError):
    """``run_all(fail_fast=True)``: a job failed for good; the message holds its traceback."""


@dataclass(frozen=True)
class Run:
    """One attempt of one job (``kind="job"``), or one call of a failure handler
    (``kind="on_failure"``), and how it ended.

    ``outcome`` is the storage's verdict: ``completed``, ``retrying`` (it raised and will run
    again after its backoff), ``failed`` (for good: a dead letter), ``postponed``
    (``RateLimited``), ``cancelled``. A failure handler's call is ``completed`` or ``failed``
    (it raised, and is called again after the failure backoff)."""

    queue: str
    job_id: str
    attempt: int
    outcome: AckOutcome
    result: Any = None  # the handler's return value after serialisation (completed)
    error: dict[str, Any] | None = None  # {"type", "message", "traceback"} when it raised
    kind: str = "job"

    @property
    def ok(self) -> bool:
        return self.outcome is AckOutcome.COMPLETED

    def describe(self) -> str:
        what = "failure handler of" if self.kind == "on_failure" else "job"
        text = f"{what} {self.queue}/{self.job_id} attempt {self.attempt}: {self.outcome.value}"
        if self.error:
            text += f"\n{self.error.get('traceback') or self.error.get('message', '')}".rstrip()
        return text


class _RecordingFailureCaller(FailureCaller):
    """The worker's failure-handler runner, telling the test how each call ended."""

    runs: list[Run]

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
        super()._settle(queue, call, ok=ok, retry_in=retry_in, error=error, gave_up=gave_up)
        outcome = AckOutcome.COMPLETED if ok and not gave_up else AckOutcome.FAILED
        decoded = json.loads(error) if error else None
        self.runs.append(Run(queue, call.job_id, call.tries, outcome, None, decoded,
                             kind="on_failure"))  # fmt: skip


class InlineRunner:
    """Runs the jobs of a ``CapturingStorage`` in the calling thread."""

    def __init__(
        self, storage: CapturingStorage, handlers: HandlerRegistry, *, schedules: bool
    ) -> None:
        self.storage = storage
        self.handlers = handlers
        self.schedules = schedules
        self.history: list[Run] = []

    # -- public -----------------------------------------------------------------------------

    def run_all(
        self,
        queues: Sequence[str] | None = None,
        *,
        advance: bool = True,
        schedules: bool | None = None,
        max_runs: int = 1000,
        fail_fast: bool = False,
    ) -> list[Run]:
        """Run every job that is runnable, and the ones that become runnable meanwhile (a retry,
        a released flow parent, a failure handler's call), until none is left. With
        ``advance`` the clock moves on to each next due time (backoffs, delays, rate limits)
        instead of stopping there. Returns the runs in order."""
        runs: list[Run] = []
        while True:
            step = self._step(queues, schedules, advance=advance)
            if step is None:
                return runs
            runs += step
            self._check(runs, step, max_runs, fail_fast)

    def run_one(
        self, queue: str | None = None, *, advance: bool = True, schedules: bool | None = None
    ) -> Run | None:
        """Run the next job (of ``queue``, or of any queue), moving the clock to it when it is
        not due yet and ``advance`` is set. Returns its run, or None when nothing is left.
        Failure-handler calls that are due run first (they are not returned: see
        ``history``)."""
        step = self._step(None if queue is None else [queue], schedules, advance=advance, one=True)
        jobs = [r for r in step or [] if r.kind == "job"]
        return jobs[0] if jobs else None

    # -- one step ---------------------------------------------------------------------------

    def _step(
        self,
        queues: Sequence[str] | None,
        schedules: bool | None,
        *,
        advance: bool,
        one: bool = False,
    ) -> list[Run] | None:
        """Housekeeping, then one claim; if nothing was claimable, move the clock to the next
        due job (``advance``) and try again. None: nothing ran and nothing is due."""
        fire = self.schedules if schedules is None else schedules
        while True:
            if fire:
                self._fire_schedules()
            names = self._queues(queues)
            runs = self._housekeeping(names)
            ran, next_due = self._claim_and_run(names, one=one)
            runs += ran
            if ran or (runs and not one):
                return runs
            if not advance or next_due is None:
                return runs or None
            self.storage.test_clock.advance_to(next_due)

    def _queues(self, queues: Sequence[str] | None) -> list[str]:
        """The queues to run: the given ones, or every queue with jobs. A queue without a
        handler is refused, as a worker refuses to serve one (given), or when jobs wait on it
        (all): failing its jobs for want of a handler would only hide the mistake."""
        if queues is not None:
            missing = [q for q in queues if self.handlers.get(q) is None]
            if missing:
                raise ConfigurationError(f"no handler registered for queue(s) {missing}")
            return list(queues)
        names = self.storage.list_queues()
        orphans = [q for q in names if self.handlers.get(q) is None and self.storage.unfinished(q)]
        if orphans:
            raise ConfigurationError(
                f"jobs wait on queue(s) {orphans} that have no handler registered (a worker "
                "would refuse to serve them): register their handlers, or run only some queues"
                " with run_all(queues=[...])"
            )
        return [q for q in names if self.handlers.get(q) is not None]

    def _fire_schedules(self) -> None:
        """What the reaper does on each sweep: enqueue the schedules due on the test clock."""
        from ..schedules.core import fire_due

        fire_due(self.storage.test_clock.now(), storage=self.storage)

    def _housekeeping(self, names: list[str]) -> list[Run]:
        """What a worker's side threads do: release flow parents whose children finished, run
        due failure-handler calls."""
        for name in names:
            flows.resolve_parked(self.storage, name)
        caller = _RecordingFailureCaller.configured(
            self.storage, self.handlers, names, WORKER_ID, jobq_settings()["WORKER"]
        )
        caller.runs = []
        caller.apply_hooks()
        for name in caller.served:
            # Each call pending now, at most once: with a tiny failure_backoff a failure handler
            # that keeps raising is due again at once, and run_all's max_runs must see it.
            for _ in range(self.storage.count_failure_calls(name)):
                if not caller.run_due(name):
                    break
        self.history += caller.runs
        return caller.runs

    def _claim_and_run(self, names: list[str], *, one: bool) -> tuple[list[Run], int | None]:
        """Claim from the first queue (in name order) that has a runnable job and run it (a
        batch handler gets up to its batch size). Returns the runs and, when nothing was
        claimable, the epoch ms of the next due job (flow parents still parked excluded)."""
        next_due = None
        now = self.storage.test_clock()
        for name in names:
            size = 1 if one else (self.handlers.options(name).batch or 1)
            batch = self.storage.claim(name, WORKER_ID, size, LEASE_MS)
            if batch.jobs:
                return self._run(name, batch.jobs), None
            if batch.next_due_in is not None and now + batch.next_due_in < PARKED_FLOOR:
                due = now + batch.next_due_in
                next_due = due if next_due is None else min(next_due, due)
        return [], next_due

    def _run(self, name: str, claimed: list[ClaimedJob]) -> list[Run]:
        jobs = []
        for c in claimed:
            job = make_job(c, None)
            job.meta = envelope_meta(c)
            job.reporter = self._reporter(c)
            jobs.append(job)
        if self.handlers.options(name).batch:
            acks = execute_batch(claimed, self.handlers, jobs)
        else:
            acks = [execute(claimed[0], self.handlers, jobs[0])]
        outcomes = self.storage.ack_many(name, acks)
        runs = []
        for c, job, ack, outcome in zip(claimed, jobs, acks, outcomes, strict=True):
            runs.append(self._describe(c, ack, outcome))
            if outcome in _FINAL:
                for queue, job_id in flows.parents_of(job.meta):
                    flows.resolve(self.storage, queue, job_id)
        self.history += runs
        return runs

    def _reporter(self, claimed: ClaimedJob) -> Reporter:
        """job.set_progress / job.log, stored with the job as a worker stores them."""

        def report(progress: bytes | None, line: str | None) -> bool:
            return self.storage.report(
                claimed.queue, claimed.job_id, claimed.token, progress=progress, log=line
            )

        return report

    @staticmethod
    def _describe(claimed: ClaimedJob, ack: Ack, outcome: AckOutcome) -> Run:
        result = error = None
        if ack.kind == "complete":
            result = serde_for(claimed.content_type).loads(ack.body)
        elif ack.kind in ("fail", "cancel") and ack.body:
            error = json.loads(ack.body)
        return Run(claimed.queue, claimed.job_id, claimed.attempt, outcome, result, error)

    @staticmethod
    def _check(runs: list[Run], step: list[Run], max_runs: int, fail_fast: bool) -> None:
        if fail_fast:
            for run in step:
                if run.kind == "job" and run.outcome is AckOutcome.FAILED:
                    raise JobRunError(f"{run.describe()}\n(run_all(fail_fast=True))")
        if len(runs) >= max_runs:
            last = "\n".join(r.describe().splitlines()[0] for r in runs[-5:])
            raise JobQError(
                f"run_all stopped after {len(runs)} runs (max_runs): jobs keep making jobs, or a"
                f" failure handler keeps failing. The last runs:\n{last}"
            )
