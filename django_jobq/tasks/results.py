"""Waiting on a canvas: what ``chain(...)``, ``group(...)`` and ``chord(...)`` return.

``.get(timeout)`` (``await .aget(timeout)``) returns the canvas' result: a chain's last step's,
a group's list in the group's order, a chord's callback's. A failure raises ``CanvasFailed``
naming the member that failed, not the later steps that failed because of it; no outcome in
time raises ``CanvasTimeout`` naming the members still unfinished. ``.status()`` tells where
the whole canvas stands.

How it waits: on the jobs whose outcome *is* the result (a chain's last step, a chord's
callback: a flow parent fails as soon as a child failed, so one wait covers every member; a
group's members one after another, in order, as Celery's ``GroupResult.get`` does). Each wait
is the storage's own blocking ``wait_for_outcome`` (Redis: a ``BLPOP`` on the job's done list;
PostgreSQL: ``LISTEN/NOTIFY``; memory: a condition), after one read of the record, so an
outcome that came before the wait is never waited for. Redis pushes a job's outcome only to
waiters registered when it was enqueued, so the canvas registers one for each job it will wait
on (what ``enqueue_and_wait`` does): one ``get`` per handle blocks; a second concurrent waiter
of one handle still returns, from the record, when its timeout ends.

Only on a failure are the other members read, to name the one that failed first (a chain's
earliest failed step, a chord's first failed member in the group's order).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import JobFailed, JobNotFound, Timeout
from ..job import (
    EnqueueOutcome,
    EnqueueResult,
    FinalOutcome,
    JobRecord,
    JobStatus,
    decode_error,
    final_outcome,
)
from ..states import TERMINAL_STATES, JobState
from ..validation import validate_seconds

CHAIN, GROUP, CHORD = "chain", "group", "chord"
_CHILD_FAILED = "ChildFailed"


@dataclass(frozen=True, slots=True)
class Member:
    """One call of a canvas: where its job is and what it runs. ``role`` reads as English
    ("step 2 of 3", "member 1 of 2", "callback")."""

    queue: str
    job_id: str
    task: str
    role: str


@dataclass(frozen=True, slots=True)
class MemberStatus:
    member: Member
    status: JobStatus | None  # None: no record (not stored yet, or expired after result_ttl)

    @property
    def state(self) -> JobState | None:
        return None if self.status is None else self.status.state


@dataclass(frozen=True, slots=True)
class CanvasStatus:
    """Where a canvas stands: ``state`` is ``"completed"`` (its result is there),
    ``"failed"`` (a member failed or was cancelled: ``get`` raises), ``"running"`` (a member
    started or finished), ``"waiting"`` (none has started) or ``"unknown"`` (no member has a
    record: not stored yet, or every record expired)."""

    kind: str
    state: str
    members: tuple[MemberStatus, ...]

    @property
    def completed(self) -> int:
        return sum(m.state is JobState.COMPLETED for m in self.members)

    @property
    def total(self) -> int:
        return len(self.members)

    @property
    def failed(self) -> tuple[MemberStatus, ...]:
        bad = (JobState.FAILED, JobState.CANCELLED)
        return tuple(m for m in self.members if m.state in bad)


class CanvasFailed(JobFailed):
    """A member of a canvas failed for good or was cancelled. ``member`` names it (queue, job
    id, task, role); ``error`` is its error; ``kind`` is "chain", "group" or "chord"."""

    def __init__(self, kind: str, member: Member, error: dict[str, Any] | None, state: str):
        super().__init__(member.job_id, error, state)
        self.kind = kind
        self.member = member
        self.queue = member.queue
        self.task = member.task
        kind_of_error = self.error.get("type")
        reason = f"{kind_of_error}: " if kind_of_error else ""
        reason += self.error.get("message") or "(no message)"
        self.args = (
            f"{kind} failed: its {member.role} (task {member.task!r}, job "
            f"{member.queue}/{member.job_id}) {state}: {reason}",
        )


class CanvasTimeout(Timeout):
    """No result within the timeout; ``pending`` lists the members not finished then (the
    canvas keeps running)."""

    def __init__(self, kind: str, awaited: Member, timeout: float, pending: Sequence[Member]):
        super().__init__(awaited.job_id, timeout)
        self.kind = kind
        self.pending = tuple(pending)
        names = ", ".join(f"{m.role} ({m.task}, {m.queue}/{m.job_id})" for m in pending[:5])
        more = f" and {len(pending) - 5} more" if len(pending) > 5 else ""
        self.args = (
            f"no result for the {kind} within {timeout}s (it keeps running); unfinished: "
            f"{names or 'none'}{more}",
        )


class CanvasResult:
    """The handle of an enqueued canvas. For a chain or chord it also reads as the
    ``EnqueueResult`` of the job whose result is the canvas' (``job_id``, ``outcome``,
    ``state``), as ``.enqueue()`` returned before it had a handle."""

    def __init__(
        self,
        kind: str,
        members: Sequence[Member],
        queues: dict[str, Any],
        awaited: Sequence[int],
        enqueued: EnqueueResult | None = None,
    ) -> None:
        self.kind = kind
        self.members = tuple(members)
        self._queues = queues  # queue name -> Queue (its storage and serde)
        self._awaited = tuple(awaited)  # indexes of the members whose results make the result
        self._enqueued = enqueued

    def __repr__(self) -> str:
        return f"<CanvasResult {self.kind} of {len(self.members)}>"

    # The EnqueueResult of the result's job (chain, chord).
    @property
    def job_id(self) -> str:
        return self.members[self._awaited[-1]].job_id

    @property
    def outcome(self) -> EnqueueOutcome | None:
        return None if self._enqueued is None else self._enqueued.outcome

    @property
    def state(self) -> JobState | None:
        return None if self._enqueued is None else self._enqueued.state

    # -- waiting ----------------------------------------------------------------------------

    def get(self, timeout: float) -> Any:
        """Block up to ``timeout`` seconds for the canvas' result.

        Raises:
            CanvasFailed: a member failed for good or was cancelled (it is named).
            CanvasTimeout: no result in time; the canvas keeps running.
        """
        deadline = time.monotonic() + validate_seconds("timeout", timeout)
        values = []
        for index in self._awaited:
            member = self.members[index]
            outcome = self._outcome(member, deadline)
            if outcome is None:
                raise CanvasTimeout(self.kind, member, timeout, self._pending())
            if outcome.state is not JobState.COMPLETED:
                raise self._failure(index, outcome)
            values.append(self._queues[member.queue].serde_loads(outcome.result))
        return values if self.kind == GROUP else values[0]

    wait = get  # the same call, for readers of ``enqueue_and_wait``

    async def aget(self, timeout: float) -> Any:
        """``get`` for async code: on Redis the wait is an async ``BLPOP`` (no thread held),
        elsewhere a thread of its own (``Storage.await_for_outcome``)."""
        deadline = time.monotonic() + validate_seconds("timeout", timeout)
        values = []
        for index in self._awaited:
            member = self.members[index]
            outcome = await self._aoutcome(member, deadline)
            if outcome is None:
                raise CanvasTimeout(self.kind, member, timeout, await self._apending())
            if outcome.state is not JobState.COMPLETED:
                raise await _in_thread(self._failure, index, outcome)
            values.append(self._queues[member.queue].serde_loads(outcome.result))
        return values if self.kind == GROUP else values[0]

    def _home(self, member: Member) -> tuple[Any, str]:
        """(storage, physical queue) holding ``member``: a sharded queue's partition."""
        home = self._queues[member.queue].locate(member.job_id)
        return home.storage, home.name

    def _outcome(self, member: Member, deadline: float) -> FinalOutcome | None:
        storage, where = self._home(member)
        record = storage.get_record(where, member.job_id)
        if (finished := final_outcome(_require(record, member))) is not None:
            return finished
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        return storage.wait_for_outcome(where, member.job_id, remaining)

    async def _aoutcome(self, member: Member, deadline: float) -> FinalOutcome | None:
        queue = self._queues[member.queue]
        if getattr(queue, "shards", 1) > 1:  # finding the partition reads storage: a thread
            storage, where = await _in_thread(self._home, member)
        else:
            storage, where = queue.storage, queue.name
        record = await storage.aget_record(where, member.job_id)
        if (finished := final_outcome(_require(record, member))) is not None:
            return finished
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        return await storage.await_for_outcome(where, member.job_id, remaining)

    def _failure(self, index: int, outcome: FinalOutcome) -> CanvasFailed:
        """The error naming the member that failed. A flow parent that failed because a child
        did (``ChildFailed``) points at its members: the first of them in canvas order that
        failed or was cancelled is the cause (a chain's later steps only followed it)."""
        error = decode_error(outcome.error)
        culprit, state = self.members[index], outcome.state.value
        if self.kind != GROUP and str((error or {}).get("type", "")).endswith(_CHILD_FAILED):
            for member in self.members[:index]:
                storage, where = self._home(member)
                record = storage.get_record(where, member.job_id)
                if record is not None and record.state in (JobState.FAILED, JobState.CANCELLED):
                    culprit, state, error = member, record.state.value, decode_error(record.error)
                    break
        return CanvasFailed(self.kind, culprit, error, state)

    # -- status -----------------------------------------------------------------------------

    def status(self) -> CanvasStatus:
        """Every member's ``JobStatus`` (one read each) and the canvas' overall state."""
        found = [self._queues[m.queue].get_status(m.job_id) for m in self.members]
        return self._summary(found)

    async def astatus(self) -> CanvasStatus:
        found = [await self._queues[m.queue].aget_status(m.job_id) for m in self.members]
        return self._summary(found)

    def _summary(self, found: list[JobStatus | None]) -> CanvasStatus:
        members = tuple(MemberStatus(m, s) for m, s in zip(self.members, found, strict=True))
        states = [m.state for m in members]
        if all(states[i] is JobState.COMPLETED for i in self._awaited):
            state = "completed"
        elif any(s in (JobState.FAILED, JobState.CANCELLED) for s in states):
            state = "failed"
        elif all(s is None for s in states):
            state = "unknown"
        elif any(s in (JobState.ACTIVE, JobState.COMPLETED) for s in states):
            state = "running"
        else:
            state = "waiting"
        return CanvasStatus(self.kind, state, members)

    def _pending(self) -> list[Member]:
        return [m.member for m in self.status().members if m.state not in TERMINAL_STATES]

    async def _apending(self) -> list[Member]:
        return [m.member for m in (await self.astatus()).members
                if m.state not in TERMINAL_STATES]  # fmt: skip


class GroupResult(list, CanvasResult):  # type: ignore[misc]
    """A group's handle: the list of its members' ``EnqueueResult`` (what ``.enqueue()``
    returned before), plus ``get`` / ``aget`` / ``status`` of the whole group."""

    def __init__(
        self, members: Sequence[Member], queues: dict[str, Any], results: list[EnqueueResult]
    ) -> None:
        list.__init__(self, results)
        CanvasResult.__init__(self, GROUP, members, queues, range(len(members)))

    def __repr__(self) -> str:
        return f"<GroupResult of {len(self.members)}: {list.__repr__(self)}>"

    __hash__ = None  # type: ignore[assignment]  # a list: mutable


async def _in_thread(func: Any, *args: Any) -> Any:
    from asgiref.sync import sync_to_async

    return await sync_to_async(func)(*args)


def _require(record: JobRecord | None, member: Member) -> JobRecord:
    """A handle exists only after its members were stored, so a missing record was deleted:
    its ``result_ttl`` ran out, retention removed it, or an operator did. Waiting would only
    run out the caller's timeout on an answer that can no longer come."""
    if record is None:
        raise JobNotFound(
            f"{member.queue}/{member.job_id} has no record any more (its result_ttl ran out, "
            "or retention or an operator removed it): its result cannot be read"
        )
    return record
