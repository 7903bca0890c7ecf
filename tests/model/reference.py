"""A reference model of one queue's job state machine, in plain Python.

It is deliberately naive (dicts and sorted lists, no indexes, no atomicity concerns) so that it
can be read against ``storage/base.py`` line by line; ``test_storage_model.py`` drives it and a
real backend with the same operations and compares them after every step. Each method returns
what the backend must answer, and updates the model as the backend must update itself.

What the model does not know, it records from the backend and then holds the backend to: the
value of a fencing token is the backend's choice, but a token, once seen for an id, must never
be seen again for that id (not after a re-creation either), and a verdict is accepted only
from the token of the current lease. Retention is the other such choice: when a backend removes
a finished record (in the finishing step on Redis and memory, in the reaper pass on all) is its
own, within bounds the model states (``retention_may_remove``, ``retention_must_have_removed``);
the test reads which records went and tells the model (``remove``).

Broadcasts (one message to every group) have their own model at the end of this file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django_jobq.job import (
    AckOutcome,
    CancelOutcome,
    ChangeOutcome,
    DedupMode,
    EnqueueOutcome,
    Keep,
    QueueLimits,
    Retention,
    RetryOutcome,
)
from django_jobq.states import GROUP_SCAN, TERMINAL_STATES, JobState

WAITING = (JobState.SCHEDULED, JobState.QUEUED, JobState.RETRYING)
LIVE = (JobState.SCHEDULED, JobState.QUEUED, JobState.ACTIVE, JobState.RETRYING)


@dataclass(frozen=True)
class Spec:
    """Everything of an enqueue that decides a job's future state."""

    job_id: str
    payload: bytes
    delay: int = 0
    priority: int = 0
    max_attempts: int = 3
    max_stalls: int = 1
    min_backoff: int = 1000
    max_backoff: int = 60_000
    result_ttl: int = 3_600_000
    dedup: tuple[str, DedupMode, int | None] | None = None  # key, mode, ttl
    group: str | None = None  # rate-limit group
    lifo: bool = False
    singleton: bool = False  # id active: become its blocked successor


def due_of(spec: Spec, now: int) -> int:
    """When a job enqueued now is due: ``now + delay``, and no earlier than ``now + ttl`` in
    debounce mode."""
    due = now + spec.delay
    if spec.dedup is not None and spec.dedup[1] is DedupMode.DEBOUNCE and spec.dedup[2]:
        due = max(due, now + spec.dedup[2])
    return due


@dataclass
class Lease:
    """A claim as a worker holds it; it stays in the worker's hands after it goes stale."""

    job_id: str
    token: int
    worker: str
    generation: int  # which incarnation of the id it was issued for


@dataclass
class Job:
    spec: Spec
    seq: int  # order key, fixed at enqueue
    generation: int
    payload: bytes = b""  # the spec's, until a debounced repeat replaces it
    state: JobState = JobState.QUEUED
    attempts: int = 0
    stalls: int = 0
    due: int = 0
    token: int | None = None  # of the current lease, while active
    worker: str | None = None
    deadline: int = 0
    result: bytes | None = None
    error: bool = False
    finished_at: int | None = None
    expires_at: int | None = None
    cancel_requested: bool = False
    holds_key: str | None = None  # dedup key taken at enqueue
    successor: Job | None = None  # a blocked singleton run of this id (its due: ``due``)
    priority: int = 0  # the spec's, until an operator changes it

    @property
    def order(self) -> tuple[int, int, int]:
        """Place among queued jobs: priority, then every LIFO job (newest first) before every
        FIFO job (oldest first)."""
        if self.spec.lifo:
            return (self.priority, 0, -self.seq)
        return (self.priority, 1, self.seq)


@dataclass
class Expected:
    outcome: object
    job_id: str | None = None
    state: JobState | None = None
    result: bytes | None = None


@dataclass
class Claim:
    """What a claim must do: the jobs it leases (best first), and what it answers."""

    jobs: list[Job]
    next_due_in: int | None
    capped: bool  # the concurrency cap was reached, before or by this claim


@dataclass
class ModelQueue:
    now: int
    jobs: dict[str, Job] = field(default_factory=dict)
    seq: int = 0
    generations: int = 0
    # dedup key -> (holder id, holder generation, mode, held until or None)
    keys: dict[str, tuple[str, int, DedupMode, int | None]] = field(default_factory=dict)
    tokens_seen: dict[str, set[int]] = field(default_factory=dict)
    limits: QueueLimits = field(default_factory=QueueLimits)
    group_claims: dict[str, list[int]] = field(default_factory=dict)  # group -> claim times
    retention: Retention = field(default_factory=Retention)
    # Per final state with a policy: the records that finished while it had one, in finish
    # order, as (id, generation); an entry whose record changed since is ignored.
    kept: dict[JobState, list[tuple[str, int]]] = field(default_factory=dict)
    # Finish times of finished records that expired by their result_ttl, per state, when the
    # backend still counts them toward a policy's count (``counts_expired``: Redis,
    # test_findings.py::test_retention_does_not_count_an_expired_record), so they widen what
    # it may remove.
    counts_expired: bool = False
    ghosts: dict[JobState, list[int]] = field(default_factory=dict)

    # -- reading -------------------------------------------------------------------------

    def live(self, job_id: str) -> Job | None:
        job = self.jobs.get(job_id)
        if job is not None and job.expires_at is not None and job.expires_at <= self.now:
            self._drop(job_id, expired=True)
            return None
        return job

    def _drop(self, job_id: str, expired: bool = False) -> None:
        """A finished record goes (expired or deleted): its id and dedup keys are free."""
        job = self.jobs.pop(job_id)
        if expired and self.counts_expired:
            self.ghosts.setdefault(job.state, []).append(job.finished_at or 0)

    def records(self) -> dict[str, Job]:
        for job_id in list(self.jobs):
            self.live(job_id)
        return self.jobs

    def counts(self) -> dict[JobState, int]:
        out = dict.fromkeys((*LIVE, JobState.BLOCKED), 0)
        for job in self.records().values():
            if job.state in out:
                out[job.state] += 1
            if job.successor is not None:
                out[JobState.BLOCKED] += 1
        return out

    def is_current(self, lease: Lease) -> bool:
        job = self.live(lease.job_id)
        return (
            job is not None
            and job.state is JobState.ACTIVE
            and job.generation == lease.generation
            and job.token == lease.token
        )

    # -- producer ------------------------------------------------------------------------

    def _key_holder(self, key: str) -> Job | None:
        held = self.keys.get(key)
        if held is None:
            return None
        holder_id, generation, mode, until = held
        holder = self.live(holder_id)
        if holder is None or holder.generation != generation:
            return None  # the holder's record is gone: the key is free
        if until is not None and self.now >= until:
            return None
        if mode is DedupMode.SIMPLE and holder.state in TERMINAL_STATES:
            return None
        return holder

    def _new_job(self, spec: Spec) -> Job:
        self.seq += 1
        self.generations += 1
        return Job(spec, self.seq, self.generations, payload=spec.payload, priority=spec.priority)

    def enqueue(self, spec: Spec) -> Expected:
        job = self.live(spec.job_id)
        if job is not None:
            if job.state is JobState.COMPLETED:
                return Expected(EnqueueOutcome.COMPLETED, job.spec.job_id, job.state, job.result)
            if job.state is JobState.ACTIVE and spec.singleton:
                if job.successor is not None:
                    return Expected(EnqueueOutcome.DUPLICATE, spec.job_id, JobState.BLOCKED)
                # The blocked successor: its own options, due time and order key; no dedup key.
                job.successor = self._new_job(spec)
                job.successor.state = JobState.BLOCKED
                job.successor.due = due_of(spec, self.now)
                return Expected(EnqueueOutcome.QUEUED, spec.job_id, JobState.BLOCKED)
            return Expected(EnqueueOutcome.DUPLICATE, job.spec.job_id, job.state)
        if spec.dedup is not None:
            key, _mode, ttl = spec.dedup
            holder = self._key_holder(key)
            if holder is not None:
                held_mode = self.keys[key][2]  # the rules of the mode the key was taken in
                if held_mode is not DedupMode.DEBOUNCE:
                    return Expected(EnqueueOutcome.DUPLICATE, holder.spec.job_id, holder.state)
                if holder.state in WAITING:
                    # Debounce: the waiting holder takes the repeat's payload and due time,
                    # and the key's window starts again.
                    holder.payload = spec.payload
                    self._set_due(holder, due_of(spec, self.now))
                    self.keys[key] = (*self.keys[key][:3], self.now + (ttl or 0))
                    return Expected(EnqueueOutcome.UPDATED, holder.spec.job_id, holder.state)
                # A debounce holder that runs or finished: the repeat is a new job.
        job = self._new_job(spec)
        self.jobs[spec.job_id] = job
        if spec.dedup is not None:
            key, mode, ttl = spec.dedup
            job.holds_key = key
            self.keys[key] = (
                spec.job_id,
                job.generation,
                mode,
                None if ttl is None else self.now + ttl,
            )
        self._set_due(job, due_of(spec, self.now))
        return Expected(EnqueueOutcome.QUEUED, spec.job_id, job.state)

    def _set_due(self, job: Job, due: int) -> None:
        job.due = due
        if due <= self.now:
            job.state = JobState.QUEUED
        elif job.state is not JobState.RETRYING:
            job.state = JobState.SCHEDULED

    # -- worker --------------------------------------------------------------------------

    def promote(self) -> int:
        promoted = 0
        for job in self.records().values():
            if job.state in (JobState.SCHEDULED, JobState.RETRYING) and job.due <= self.now:
                job.state = JobState.QUEUED
                promoted += 1
        return promoted

    def next_due_in(self) -> int | None:
        dues = [
            j.due for j in self.records().values()
            if j.state in (JobState.SCHEDULED, JobState.RETRYING)
        ]  # fmt: skip
        return None if not dues else max(min(dues) - self.now, 0)

    def active_count(self) -> int:
        return sum(1 for j in self.records().values() if j.state is JobState.ACTIVE)

    def _group_window(self, group: str) -> list[int]:
        """The group's claims within the sliding window ending now (a claim at ``t`` counts
        while ``now < t + window``)."""
        window = self.limits.group_rate_window or 0
        claims = [t for t in self.group_claims.get(group, []) if t > self.now - window]
        self.group_claims[group] = claims
        return claims

    def claim(self, count: int) -> Claim:
        """What a claim of ``count`` does: promote due jobs, then take the best queued ones
        within the limits. A candidate whose group spent its budget moves to scheduled, due
        when its group's oldest claim in the window leaves it (keeping its order key); at most
        ``count + GROUP_SCAN`` candidates are looked at. Call ``lease`` for each job taken."""
        self.promote()
        lim = self.limits
        budget = count
        if lim.concurrency is not None:
            budget = min(budget, lim.concurrency - self.active_count())
            if budget <= 0:  # None while jobs wait for the slot: the verdict wakes a worker
                queued = any(j.state is JobState.QUEUED for j in self.records().values())
                return Claim([], None if queued else self.next_due_in(), capped=True)
        queued = [j for j in self.records().values() if j.state is JobState.QUEUED]
        queued.sort(key=lambda j: j.order)
        grouped = lim.group_rate_max is not None and lim.group_rate_window is not None
        if not grouped:
            taken = queued[:budget]
        else:
            taken = []
            for job in queued[: budget + GROUP_SCAN]:
                if len(taken) >= budget:
                    break
                group = job.spec.group
                if group is not None:
                    window = self._group_window(group)
                    if len(window) >= lim.group_rate_max:
                        job.state = JobState.SCHEDULED
                        job.due = min(window) + lim.group_rate_window
                        continue
                    window.append(self.now)
                taken.append(job)
        capped = lim.concurrency is not None and self.active_count() + len(taken) >= lim.concurrency
        return Claim(taken, self.next_due_in(), capped)

    def lease(self, job: Job, token: int, worker: str, lease_ms: int) -> Lease:
        job.state = JobState.ACTIVE
        job.attempts += 1
        job.token = token
        job.worker = worker
        job.deadline = self.now + lease_ms
        self.tokens_seen.setdefault(job.spec.job_id, set()).add(token)
        return Lease(job.spec.job_id, token, worker, job.generation)

    def heartbeat(self, lease: Lease, lease_ms: int) -> bool:
        """True: the lease is still held (and extended)."""
        job = self.live(lease.job_id)
        if not self.is_current(lease) or job is None or job.worker != lease.worker:
            return False
        job.deadline = self.now + lease_ms
        return True

    def report(self, lease: Lease) -> bool:
        """Progress of the running attempt: accepted from the current lease only."""
        return self.is_current(lease)

    def _finish(self, job: Job, state: JobState) -> None:
        job.state = state
        job.finished_at = self.now
        job.expires_at = self.now + job.spec.result_ttl
        job.token = None
        job.cancel_requested = False

    def _end_run(self, job: Job, state: JobState) -> None:
        """An active run reached a final state. Its blocked successor, if any, takes over the
        id in the same step: a fresh run (attempts 0), queued or scheduled by its due time,
        with its own order key; the finished record is gone. Else the record is final and
        joins its state's retention index."""
        self._finish(job, state)
        succ = job.successor
        if succ is not None:
            job.successor = None
            self.jobs[job.spec.job_id] = succ
            self._set_due(succ, succ.due)
            return
        self._index_finished(job)

    def complete(self, lease: Lease, result: bytes) -> AckOutcome:
        if not self.is_current(lease):
            return AckOutcome.LEASE_LOST
        job = self.jobs[lease.job_id]
        job.result = result
        self._end_run(job, JobState.COMPLETED)
        return AckOutcome.COMPLETED

    def fail(self, lease: Lease, retry_in: int, permanent: bool) -> AckOutcome:
        if not self.is_current(lease):
            return AckOutcome.LEASE_LOST
        job = self.jobs[lease.job_id]
        job.error = True
        if permanent or job.attempts >= job.spec.max_attempts:
            self._end_run(job, JobState.FAILED)
            return AckOutcome.FAILED
        job.token = None
        job.state = JobState.RETRYING  # a successor stays blocked: the job is not finished
        job.due = self.now + retry_in
        return AckOutcome.RETRYING

    def release(self, lease: Lease) -> AckOutcome:
        if not self.is_current(lease):
            return AckOutcome.LEASE_LOST
        job = self.jobs[lease.job_id]
        job.attempts -= 1
        job.token = None
        job.state = JobState.QUEUED
        return AckOutcome.RELEASED

    def postpone(self, lease: Lease, delay: int) -> AckOutcome:
        """Rate limited: back to scheduled, due ``now + delay``, without using an attempt."""
        if not self.is_current(lease):
            return AckOutcome.LEASE_LOST
        job = self.jobs[lease.job_id]
        job.attempts -= 1
        job.token = None
        job.state = JobState.SCHEDULED
        job.due = self.now + delay
        return AckOutcome.POSTPONED

    def cancel_active(self, lease: Lease) -> AckOutcome:
        if not self.is_current(lease):
            return AckOutcome.LEASE_LOST
        job = self.jobs[lease.job_id]
        job.error = True
        self._end_run(job, JobState.CANCELLED)
        return AckOutcome.CANCELLED

    def reap(self) -> tuple[list[str], list[str], int]:
        """Expired leases back to queued (a stall, the attempt given back) or failed past
        ``max_stalls``; then due jobs promoted. Returns (requeued, failed, promoted). The
        retention pass that follows is the test's to read (``retention_must_have_removed``)."""
        requeued, failed = [], []
        for job in list(self.records().values()):
            if job.state is not JobState.ACTIVE or job.deadline > self.now:
                continue
            job.stalls += 1
            if job.stalls > job.spec.max_stalls:
                job.error = True
                self._end_run(job, JobState.FAILED)
                failed.append(job.spec.job_id)
            else:
                job.attempts -= 1
                job.token = None
                job.state = JobState.QUEUED
                requeued.append(job.spec.job_id)
        return sorted(requeued), sorted(failed), self.promote()

    # -- management ----------------------------------------------------------------------

    def cancel(self, job_id: str) -> CancelOutcome:
        job = self.live(job_id)
        if job is None:
            return CancelOutcome.NOT_FOUND
        if job.successor is not None:
            job.successor = None  # the successor is cancelled; the run it waits for goes on
            return CancelOutcome.CANCELLED
        if job.state is JobState.ACTIVE:
            return CancelOutcome.ACTIVE
        if job.state in TERMINAL_STATES:
            return CancelOutcome(job.state.value)
        self._finish(job, JobState.CANCELLED)
        self._index_finished(job)
        return CancelOutcome.CANCELLED

    def request_cancel(self, job_id: str) -> CancelOutcome:
        """An active job is marked for its worker to stop; anything else, and an id with a
        successor (the successor is what a cancel ends), gets what ``cancel`` does."""
        job = self.live(job_id)
        if job is not None and job.state is JobState.ACTIVE and job.successor is None:
            job.cancel_requested = True
            return CancelOutcome.REQUESTED
        return self.cancel(job_id)

    def change(self, job_id: str, run_at: int | None, priority: int | None) -> ChangeOutcome:
        """A waiting job's due time (<= now: queued; later: scheduled, a retrying job staying
        retrying) and priority (its order key kept); else its blocked successor's, applied
        when it is released."""
        job = self.live(job_id)
        if job is None:
            return ChangeOutcome.NOT_FOUND
        if job.state not in WAITING:
            job = job.successor
            if job is None:
                return ChangeOutcome(self.jobs[job_id].state.value)
            if run_at is not None:
                job.due = run_at
        elif run_at is not None:
            self._set_due(job, run_at)
        if priority is not None:
            job.priority = priority
        return ChangeOutcome.CHANGED

    def retry(self, job_id: str) -> RetryOutcome:
        job = self.live(job_id)
        if job is None:
            return RetryOutcome.NOT_FOUND
        if job.state in (JobState.ACTIVE, JobState.COMPLETED):
            return RetryOutcome(job.state.value)
        if job.state not in (JobState.FAILED, JobState.CANCELLED):
            return RetryOutcome.WAITING
        if job.holds_key is not None:
            held = self.keys.get(job.holds_key)
            if held is not None and held[:2] == (job_id, job.generation):
                if held[2] is DedupMode.SIMPLE:
                    del self.keys[job.holds_key]  # freed when it ended: a retry does not retake it
        index = self.kept.get(job.state, [])
        if (job_id, job.generation) in index:
            index.remove((job_id, job.generation))  # not finished any more
        job.attempts = job.stalls = 0
        job.error = False
        job.result = None
        job.finished_at = job.expires_at = None
        job.state = JobState.QUEUED
        return RetryOutcome.RETRIED

    def dead(self) -> list[str]:
        return sorted(j for j, job in self.records().items() if job.state is JobState.FAILED)

    def purge_dead(self, job_ids: list[str] | None) -> int:
        doomed = [j for j in self.dead() if job_ids is None or j in job_ids]
        for job_id in doomed:
            self._drop(job_id)
        return len(doomed)

    def delete_finished(self, job_ids: list[str]) -> int:
        doomed = [
            j for j in dict.fromkeys(job_ids)
            if (job := self.live(j)) is not None and job.state in TERMINAL_STATES
        ]  # fmt: skip
        for job_id in doomed:
            self._drop(job_id)
        return len(doomed)

    def has_active(self) -> bool:
        return any(j.state is JobState.ACTIVE for j in self.records().values())

    def forget_all(self) -> int:
        """Obliterate, or the backend lost the queue's data: every record, successor, key,
        limit, claim log and retention policy is gone. The tokens seen stay: the ids' history
        does not restart for the workers."""
        removed = len(self.records())
        self.jobs.clear()
        self.keys.clear()
        self.limits = QueueLimits()
        self.group_claims.clear()
        self.retention = Retention()
        self.kept.clear()
        self.ghosts.clear()
        return removed

    # -- retention of finished records ---------------------------------------------------

    def set_retention(self, retention: Retention) -> None:
        """From now on finished records of a state with a policy join its index; a state whose
        policy went keeps its records until their TTL."""
        self.retention = retention
        for state in list(self.kept):
            if getattr(retention, state.value) is None:
                del self.kept[state]

    def _index_finished(self, job: Job) -> None:
        if getattr(self.retention, job.state.value) is not None:
            self.kept.setdefault(job.state, []).append((job.spec.job_id, job.generation))

    def _of_state(self, state: JobState, indexed_only: bool) -> list[Job]:
        jobs = [j for j in self.records().values() if j.state is state]
        if indexed_only:
            index = self.kept.get(state, [])
            jobs = [j for j in jobs if (j.spec.job_id, j.generation) in index]
        return jobs

    @staticmethod
    def _past(keep: Keep, job: Job, others: list[int], now: int, strictly: bool) -> bool:
        """Whether ``job`` is past the policy, given the finish times of the ``others`` of its
        state: finished ``age`` ago or more, or ``count`` others finished after it (or,
        ``strictly`` False, at the same time: which one of a tie goes is the backend's
        choice)."""
        finished = job.finished_at or 0
        if keep.age is not None and finished <= now - keep.age:
            return True
        if keep.count is None:
            return False
        newer = [t for t in others if t > finished or (not strictly and t == finished)]
        return len(newer) >= keep.count

    def retention_may_remove(self) -> set[str]:
        """Finished records the queue's policy allows a backend to remove now: of a state
        with a policy, finished ``age`` ago or more, or not among the newest ``count`` (ties
        either way). Any record of the state counts: the database backend applies a new policy
        to records finished before it, Redis and memory only to those finished since. So do
        the ``ghosts``, expired records a backend still counts (see ``ghosts`` above)."""
        out = set()
        for state in TERMINAL_STATES:
            keep = getattr(self.retention, state.value)
            if keep is None:
                continue
            jobs = self._of_state(state, indexed_only=False)
            for j in jobs:
                others = [o.finished_at or 0 for o in jobs if o is not j]
                if self._past(keep, j, others + self.ghosts.get(state, []), self.now, False):
                    out.add(j.spec.job_id)
        return out

    def retention_must_have_removed(self) -> list[str]:
        """After a reaper pass (nothing left over its batch): records finished while their
        state had its policy that are still kept past it. Empty when the pass did its job."""
        out = []
        for state in TERMINAL_STATES:
            keep = getattr(self.retention, state.value)
            if keep is None:
                continue
            jobs = self._of_state(state, indexed_only=True)
            for j in jobs:
                if self._past(keep, j, [o.finished_at or 0 for o in jobs if o is not j],
                              self.now, True):  # fmt: skip
                    out.append(j.spec.job_id)
            if keep.count is not None and len(jobs) > keep.count:
                out += [f"{len(jobs)} {state} records kept, count {keep.count}"]
        return out

    def remove(self, job_ids: set[str]) -> None:
        """The backend's retention removed these finished records: they are gone as if
        expired (their ids and dedup keys free)."""
        for job_id in job_ids:
            job = self.jobs.pop(job_id)
            assert job.state in TERMINAL_STATES, f"{job_id}: removed while {job.state}"


# -- broadcasts ---------------------------------------------------------------------------------
# ``storage/broadcast_base.py``: an append-only log of messages; every group reads all of it
# with its own cursor, and each message goes to one worker of the group at a time, leased and
# fenced like a job.


@dataclass
class Message:
    seq: int  # publish order (the backend's position is recorded beside it)
    message_id: str
    payload: bytes
    published_at: int
    position: str = ""  # the backend's choice, recorded at publish


@dataclass
class Delivery:
    """One message as one group handles it."""

    message: Message
    state: str = "active"  # active | retrying | dead
    token: int = 0  # of the newest claim (the backend's value, recorded at claim)
    failures: int = 0  # failed attempts
    stalls: int = 0
    lease_until: int = 0
    due: int = 0  # retrying: when it is claimable again
    failed_at: int = 0


@dataclass
class Group:
    cursor: int  # seq of the last message it read
    missed: int = 0
    deliveries: dict[int, Delivery] = field(default_factory=dict)  # seq -> delivery


@dataclass
class ModelBroadcast:
    now: int
    messages: dict[int, Message] = field(default_factory=dict)  # seq -> message, oldest first
    last_seq: int = 0
    groups: dict[str, Group] = field(default_factory=dict)

    def held_by(self, message_id: str) -> Message | None:
        return next((m for m in self.messages.values() if m.message_id == message_id), None)

    def publish(
        self, items: list[tuple[str, bytes]], maxlen: int | None, max_age: int | None
    ) -> list[tuple[str, Message]]:
        """Append each message whose id no retained message holds, then drop the oldest past
        ``maxlen`` and every one published more than ``max_age`` ago. Returns per message the
        outcome and the message that holds its id."""
        out = []
        for message_id, payload in items:
            held = self.held_by(message_id)
            if held is not None:
                out.append(("duplicate", held))
                continue
            self.last_seq += 1
            m = self.messages[self.last_seq] = Message(self.last_seq, message_id, payload, self.now)
            out.append(("published", m))
        while self.messages:
            seq, oldest = next(iter(self.messages.items()))
            too_many = maxlen is not None and len(self.messages) > maxlen
            too_old = max_age is not None and oldest.published_at < self.now - max_age
            if not (too_many or too_old):
                break
            del self.messages[seq]
            for g in self.groups.values():
                d = g.deliveries.get(seq)
                if seq > g.cursor:  # never read: missed, and the group moves past it
                    g.missed += 1
                    g.cursor = seq
                elif d is not None and d.state != "dead":  # active or retrying: it ends
                    g.missed += 1
                    del g.deliveries[seq]
                # a dead letter keeps its own copy of the message
        return out

    def subscribe(self, group: str, start: str | int) -> bool:
        if group in self.groups:
            return False  # an existing group keeps its place
        if start == "now":
            cursor = self.last_seq
        elif start == "earliest":
            cursor = 0
        else:  # messages published at or after ``start`` are unread
            older = [s for s, m in self.messages.items() if m.published_at < int(start)]
            cursor = max(older, default=0)
        self.groups[group] = Group(cursor)
        return True

    def unsubscribe(self, group: str) -> bool:
        return self.groups.pop(group, None) is not None

    def claim(self, group: str, count: int, lease_ms: int, max_stalls: int) -> list[Delivery]:
        """Up to ``count`` deliveries, in this order: due retries (soonest due first), leases
        that lapsed (stalls + 1; past ``max_stalls`` a dead letter instead: at most as many as
        the claim has room for after the retries, in publish order), unread messages in
        publish order. The caller records each one's new token (``claimed``)."""
        g = self.groups[group]
        taken = sorted(
            (d for d in g.deliveries.values() if d.state == "retrying" and d.due <= self.now),
            key=lambda d: (d.due, d.message.seq),
        )[:count]
        lapsed = [
            d for _, d in sorted(g.deliveries.items())
            if d.state == "active" and d.lease_until <= self.now
        ]  # fmt: skip
        room = count - len(taken)
        for d in lapsed[:room]:
            if len(taken) >= count:
                break
            d.stalls += 1
            if d.stalls > max_stalls:
                d.state, d.failed_at = "dead", self.now
            else:
                taken.append(d)
        for seq, message in self.messages.items():
            if len(taken) >= count:
                break
            if seq > g.cursor:
                g.cursor = seq
                taken.append(g.deliveries.setdefault(seq, Delivery(message)))
        for d in taken:
            d.state, d.lease_until = "active", self.now + lease_ms
        return taken

    @staticmethod
    def claimed(d: Delivery, token: int) -> None:
        assert token > d.token, f"token {token} of {d.message.message_id} is not new"
        d.token = token

    def _held(self, group: str, seq: int, token: int) -> Delivery | None:
        g = self.groups.get(group)
        d = None if g is None else g.deliveries.get(seq)
        return d if d is not None and d.state == "active" and d.token == token else None

    def settle(self, group: str, seq: int, token: int, kind: str, retry_in: int) -> AckOutcome:
        d = self._held(group, seq, token)
        if d is None:
            return AckOutcome.LEASE_LOST
        if kind == "complete":
            del self.groups[group].deliveries[seq]
            return AckOutcome.COMPLETED
        if kind == "dead":
            d.state, d.failed_at, d.failures = "dead", self.now, d.failures + 1
            return AckOutcome.FAILED
        if kind == "retry":
            d.state, d.due, d.failures = "retrying", self.now + retry_in, d.failures + 1
            return AckOutcome.RETRYING
        d.state, d.due = "retrying", self.now  # release: back at once, no attempt used
        return AckOutcome.RELEASED

    def heartbeat(self, group: str, seq: int, token: int, lease_ms: int) -> bool:
        d = self._held(group, seq, token)
        if d is not None:
            d.lease_until = self.now + lease_ms
        return d is not None

    def delivery_state(self, group: str, message_id: str) -> tuple[str, int]:
        """(state, failed attempts) as ``BroadcastStore.delivery`` reports it."""
        g = self.groups[group]
        for d in g.deliveries.values():
            if d.message.message_id == message_id:
                return d.state, d.failures
        m = self.held_by(message_id)
        if m is None:
            return "unknown", 0
        return ("done" if m.seq <= g.cursor else "unread"), 0

    def status(self, group: str) -> tuple[int, int, int, int, int]:
        """lag, active, retrying, dead, missed."""
        g = self.groups[group]
        states = [d.state for d in g.deliveries.values()]
        lag = sum(1 for seq in self.messages if seq > g.cursor)
        return lag, states.count("active"), states.count("retrying"), states.count("dead"), g.missed

    def dead_letters(self, group: str) -> list[tuple[str, int]]:
        """(message id, attempts) of the group's dead letters, oldest failure first."""
        dead = [d for d in self.groups[group].deliveries.values() if d.state == "dead"]
        dead.sort(key=lambda d: (d.failed_at, d.message.seq))
        return [(d.message.message_id, d.failures) for d in dead]

    def retry_dead(self, group: str, seqs: set[int] | None) -> int:
        """Dead letters (those of ``seqs``, or all) back to retrying, due now, attempts reset;
        one whose message retention dropped stays dead."""
        moved = 0
        for seq, d in self.groups[group].deliveries.items():
            if d.state != "dead" or (seqs is not None and seq not in seqs):
                continue
            if seq not in self.messages:
                continue
            d.state, d.due, d.failures, d.stalls = "retrying", self.now, 0, 0
            moved += 1
        return moved

    def purge_dead(self, group: str) -> int:
        g = self.groups[group]
        dead = [seq for seq, d in g.deliveries.items() if d.state == "dead"]
        for seq in dead:
            del g.deliveries[seq]
        return len(dead)
