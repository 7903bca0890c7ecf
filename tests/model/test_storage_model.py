"""Model-based test of the storage state machine, on every backend.

A ``hypothesis.stateful`` rule machine drives one queue of a real backend (memory, Redis,
Redis Cluster, SQLite, PostgreSQL; time from the fake clock) and the plain-Python model of
``reference.py`` with the same operations, and compares them after every step. It covers:

* enqueue, one by one or in one ``enqueue_many``, with the options that decide state: delay,
  priority, LIFO (``lifo=True``: before every FIFO job of its priority, newest first),
  attempts, stalls, backoff, result TTL, rate-limit ``group``, ``singleton`` (while the id
  runs, a blocked successor, which takes the id over, queued or scheduled, in the step that
  ends the run; a cancel cancels it), dedup keys in simple, throttle and debounce mode (a
  debounced repeat gives the waiting holder its payload and due time and restarts the key's
  window); every example starts with a few jobs;
* claim, under the queue's limits (the ``configure`` rule): the queue-wide concurrency cap
  and group rate limits (``QueueLimits(group_rate_max, group_rate_window)``: a candidate of a
  group that spent its budget moves to scheduled, due when the group's oldest claim leaves
  the window; a claim looks at no more than ``count + GROUP_SCAN`` candidates, which the
  flood puts to the test with one group's backlog longer than that); a claim may end the
  first job it got at once, as a worker does;
* the worker's verdicts: heartbeat, progress report, complete, fail (retry or for good),
  release, postpone (rate limited: back to scheduled), cancel of the running attempt;
* time passing (leases, backoffs, due times, group windows and TTLs run out) and the reaper
  (stalls, promotion, retention);
* the operator: cancel, cancel of a running job (request, then its worker ends it), change of
  a waiting job's due time and priority, retry, purge and delete of finished records,
  obliterate, and the loss of the queue's data followed by re-enqueues of the same ids;
* retention (``configure``: ``set_retention`` with ``Keep(count=, age=)`` per final state),
  applied by the finishing steps on Redis and memory and by every reaper pass; which records
  a backend removes, and when, is its own choice within the policy's bounds: the test reads
  which went and holds that to the model's bounds (``retention_may_remove``, and after a
  reaper pass ``retention_must_have_removed``).

Workers keep every lease they were ever given and send verdicts with old ones too. After each
step the backend must agree with the model record by record (state, attempts, stalls,
options, priority, payload, group, LIFO, successor, due and finish times) and in its counts,
and these invariants must hold:

* every transition the backend makes is declared in ``django_jobq.states.TRANSITIONS``: the
  queue's event stream is read after every step and each move it shows checked, also each of
  the several moves of one step (a claim promotes due jobs, moves a group's candidates to
  scheduled and leases others; a finish releases a successor), per incarnation of an id (a
  record created again starts from new); and the history the events tell must end where the
  records are (no move without its event). See ``transitions.py``;
* a verdict (complete, fail, release, postpone, cancel, heartbeat, report) is accepted only
  from the token of the job's current lease: never from a stale worker, not even after the id
  was re-created;
* a job id never gets a token it had before, across re-creation too (fencing);
* at most one lease of a job is held at any time;
* per-state counts (blocked successors too) equal the records (on the database backends the
  triggers' counts also equal a count of the rows); retention removes only records
  past the policy (each with a ``removed`` event on Redis and memory), and after a reaper pass
  none that finished under it is left past it.

``test_model_replays.py`` replays fixed sequences through the same machine: the minimal ones
found so far, and a tour that makes every transition ``TRANSITIONS`` declares on each backend
(so the check is known to see them all, and fails when the spec lacks one). Broadcasts have
their own machine: ``test_broadcast_model.py``. Where the backends disagree with each other
or with the spec, ``test_findings.py`` holds the smallest reproduction as an expected failure,
and the machine does not assert on that answer (each such place names the finding).

Size: ``settings`` below. CI runs a fixed (derandomized) set of examples; ``JOBQ_MODEL_LONG=1``
runs many more from a random seed (print it with ``--hypothesis-show-statistics``, or pass
``--hypothesis-seed``); docs/reliability.md records the long run. ``JOBQ_MODEL_COVERAGE=1``
prints how often each transition was seen (with ``-s``, without ``-n``).
"""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_jobq.errors import QueueBusy
from django_jobq.job import Dedup, DedupMode, JobOptions, Keep, NewJob, QueueLimits, Retention
from django_jobq.states import GROUP_SCAN, TERMINAL_STATES, JobState
from django_jobq.storage.database import DatabaseStorage
from django_jobq.storage.redis import RedisStorage
from tests.conftest import FakeClock, make_storage

from . import transitions
from .data_loss import expire_records, lose_queue
from .reference import WAITING, Lease, ModelQueue, Spec
from .transitions import TransitionLog

LONG = os.environ.get("JOBQ_MODEL_LONG") == "1"
IDS = ("a", "b", "c", "d.1")
WORKERS = ("w1", "w2")
LEASES_MS = (1_000, 5_000)
ERROR = b'{"type": "ValueError", "message": "boom"}'
POSTPONE_MS = 700
# Group windows far above a real example's length: Redis also expires a group's claim log by
# its own clock (PEXPIRE), which must never be the one that frees a group here.
GROUP_WINDOW = 30_000
# The flood: one group's backlog longer than a claim may look at.
FLOOD = [
    Spec(f"f{i:03d}", b'"f"', priority=-5, max_attempts=1, result_ttl=60_000, group="g1")
    for i in range(GROUP_SCAN + 5)
]

# What a worker says of a job it ran (besides heartbeats and progress reports).
VERDICTS = ("complete", "fail", "release", "cancel_active", "postpone")
# The states an operator's action is aimed at, when it is aimed (``operator``).
TARGETS = {
    "cancel": (*WAITING, JobState.ACTIVE),
    "cancel_running": (JobState.ACTIVE,),
    "change": WAITING,
    "retry": (JobState.FAILED, JobState.CANCELLED),
    "retry_dead": (JobState.FAILED,),
    "purge_dead": (JobState.FAILED,),
    "delete_finished": TERMINAL_STATES,
}

# CI: about 1.5 minutes for tests/model on the five backends with -n 3 on a 2-core machine (a
# PostgreSQL step is a few committed transactions); the long run: JOBQ_MODEL_LONG=1, sized by
# JOBQ_MODEL_EXAMPLES.
CI_EXAMPLES = {"memory": 300, "redis": 120, "redis-cluster": 30, "sqlite": 40, "postgres": 35}


def size(backend: str) -> settings:
    examples = 1000 if LONG else CI_EXAMPLES.get(backend, 20)
    return settings(
        max_examples=int(os.environ.get("JOBQ_MODEL_EXAMPLES", examples)),
        stateful_step_count=60 if LONG else 30,
        deadline=None,
        # CI replays the same examples every run: it never fails on a new random one.
        derandomize=not LONG,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        database=None,  # a failure is reported with its steps; no example store in the checkout
        report_multiple_bugs=False,
        # Shrinking a failure costs minutes (of committed transactions, on the databases): CI
        # reports the failing sequence as found; the long run shrinks it, and test_model_replays
        # keeps the minimal sequences found so far.
        phases=list(Phase) if LONG else [Phase.explicit, Phase.reuse, Phase.generate],
    )


dedups = st.none() | st.none() | st.tuples(
    st.sampled_from(["k1", "k2"]),
    st.sampled_from([DedupMode.SIMPLE, DedupMode.THROTTLE]),
    st.sampled_from([None, 3_000]),
).filter(lambda d: d[1] is DedupMode.SIMPLE or d[2] is not None) | st.tuples(
    # A key of its own: what a repeat in another mode does to a held key is no rule of the spec.
    st.just("kd"), st.just(DedupMode.DEBOUNCE), st.sampled_from([1_000, 3_000]),
)  # fmt: skip

specs = st.builds(
    Spec,
    job_id=st.sampled_from(IDS),
    payload=st.sampled_from([b'{"n": 1}', b'"x"', b"[]"]),
    delay=st.sampled_from([0, 0, 0, 700, 4_000]),
    priority=st.sampled_from([0, 0, -5, 5]),
    max_attempts=st.sampled_from([3, 1, 2]),
    max_stalls=st.integers(0, 1),
    min_backoff=st.sampled_from([0, 500]),
    max_backoff=st.sampled_from([500, 2_000]),
    # Redis expires records by its own clock: TTLs stay far above a real example's length
    # and expiry is driven by the fake clock (expire_records).
    result_ttl=st.sampled_from([60_000, 300_000]),
    dedup=dedups,
    group=st.sampled_from([None, None, "g1", "g2"]),
    lifo=st.sampled_from([False, False, True]),
    singleton=st.sampled_from([False, True]),
)

keeps = st.none() | st.builds(
    Keep, count=st.sampled_from([None, 1, 2]), age=st.sampled_from([None, 5_000])
).filter(lambda k: k.count is not None or k.age is not None)


def new_job(spec: Spec) -> NewJob:
    options = JobOptions(
        max_attempts=spec.max_attempts, result_ttl=spec.result_ttl,
        min_backoff=spec.min_backoff, max_backoff=spec.max_backoff,
        max_stalls=spec.max_stalls, priority=spec.priority,
    )  # fmt: skip
    dedup = None if spec.dedup is None else Dedup(*spec.dedup)
    return NewJob(
        spec.job_id, spec.payload, options, delay=spec.delay, dedup=dedup, group=spec.group,
        lifo=spec.lifo, singleton=spec.singleton,
    )  # fmt: skip


def backoff(spec: Spec, attempt: int) -> int:
    """What a worker asks for (``execution.py``): exponential from min_backoff, capped."""
    return min(spec.max_backoff, spec.min_backoff * 2 ** max(attempt - 1, 0))


class StorageMachine(RuleBasedStateMachine):
    storage = None  # set per backend by the test below
    clock: FakeClock

    def __init__(self) -> None:
        super().__init__()
        self.q = f"model-{uuid.uuid4().hex[:12]}"  # hypothesis examples share no state
        self.model = ModelQueue(
            now=self.clock.now, counts_expired=isinstance(self.storage, RedisStorage)
        )
        self.leases: list[Lease] = []  # every lease ever given, stale ones included
        self.last_specs: dict[str, Spec] = {}
        self.events = TransitionLog(self.storage, self.q)
        self.moves: set[tuple[JobState, JobState]] = set()  # every transition seen, checked
        self.flooded = False

    # -- helpers ---------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            self.storage.obliterate(self.q, force=True)
        finally:
            super().teardown()

    def _enqueue(self, spec: Spec) -> None:
        expected = self.model.enqueue(spec)
        got = self.storage.enqueue(self.q, new_job(spec))
        assert (got.outcome, got.job_id, got.state) == (
            expected.outcome, expected.job_id, expected.state,
        ), f"enqueue {spec}"  # fmt: skip
        if expected.result is not None:
            assert bytes(got.result) == expected.result
        if expected.outcome == "queued":
            self.last_specs[spec.job_id] = spec

    def _enqueue_many(self, specs_: list[Spec]) -> None:
        expected = [self.model.enqueue(s) for s in specs_]
        got = self.storage.enqueue_many(self.q, [new_job(s) for s in specs_])
        assert [(g.outcome, g.job_id, g.state) for g in got] == [
            (e.outcome, e.job_id, e.state) for e in expected
        ], f"enqueue_many {specs_}"
        for spec, e in zip(specs_, expected, strict=True):
            if e.outcome == "queued":
                self.last_specs[spec.job_id] = spec

    def _step_done(self, reaped: bool = False) -> None:
        """After every step: learn which finished records the backend's retention removed
        (held to the policy), then read the step's events and check each move."""
        gone: set[str] = set()
        may = self.model.retention_may_remove()
        if may:
            gone = {j for j in may if self.storage.get_record(self.q, j) is None}
            self.model.remove(gone)
        if reaped:
            late = self.model.retention_must_have_removed()
            assert not late, f"after a reaper pass, kept past the policy: {late}"
        before = {j for j, h in self.events.ids.items() if h.state is not None}
        self.moves |= {(src, dst) for _, src, dst in self.events.observe() if src is not None}
        removed = {
            j for j in before
            if self.events.ids.get(j) is not None and self.events.ids[j].state is None
        }  # fmt: skip
        assert removed <= may, f"retention removed {removed - may}, past the policy: {may}"
        if not isinstance(self.storage, DatabaseStorage):
            # Redis and memory emit 'removed' per removal (the database deletes a row's events
            # with the row).
            assert gone <= removed, f"removed without a 'removed' event: {gone - removed}"
        self._histories_agree()

    def _histories_agree(self) -> None:
        records = self.model.records()
        for job_id in set(records) | set(self.events.ids):
            job = records.get(job_id)
            self.events.agree(
                job_id,
                None if job is None else job.state,
                job is not None and job.successor is not None,
            )

    # -- rules ---------------------------------------------------------------------------
    # Hypothesis picks among rules evenly, so there are few of them (a claim and a verdict
    # each get a sixth or so of the steps) and each picks its variant from its arguments.

    @initialize(specs_=st.lists(specs, min_size=2, max_size=4))
    def start(self, specs_: list[Spec]) -> None:
        """Every example starts with a few jobs (hypothesis may leave the enqueue rule out of
        an example: it tries subsets of the rules)."""
        self._enqueue_many(specs_)
        self._step_done()

    @rule(specs_=st.lists(specs, min_size=1, max_size=3), many=st.booleans())
    def enqueue(self, specs_: list[Spec], many: bool) -> None:
        if many:
            self._enqueue_many(specs_)
        else:
            for spec in specs_:
                self._enqueue(spec)
        self._step_done()

    @rule(
        worker=st.sampled_from(WORKERS),
        count=st.integers(1, 3),
        lease_ms=st.sampled_from(LEASES_MS),
        then=st.sampled_from([None, None, *VERDICTS]),
        permanent=st.booleans(),
    )
    def claim(
        self,
        worker: str,
        count: int,
        lease_ms: int,
        then: str | None = None,
        permanent: bool = False,
    ) -> None:
        """A worker claims, and (``then``) ends the first job it got at once: one step, each
        of its moves checked."""
        wanted = self.model.claim(count)
        batch = self.storage.claim(self.q, worker, count, lease_ms)
        assert [c.job_id for c in batch.jobs] == [j.spec.job_id for j in wanted.jobs], "claim order"
        for job, claimed in zip(wanted.jobs, batch.jobs, strict=True):
            seen = self.model.tokens_seen.get(job.spec.job_id, set())
            assert claimed.token not in seen, (
                f"token {claimed.token} of {job.spec.job_id!r} was given out before: a stale "
                "worker holding it would pass the fence"
            )
            self.leases.append(self.model.lease(job, claimed.token, worker, lease_ms))
            spec = job.spec
            assert (claimed.attempt, claimed.max_attempts, bytes(claimed.payload)) == (
                job.attempts, spec.max_attempts, job.payload,
            )  # fmt: skip
            assert (claimed.min_backoff, claimed.max_backoff) == (
                spec.min_backoff, spec.max_backoff,
            )  # fmt: skip
        if len(batch.jobs) < count:
            assert batch.next_due_in == wanted.next_due_in, "next_due_in"
        if then is not None and batch.jobs:
            self._verdict(then, self.leases[-len(batch.jobs)], permanent, lease_ms)
        self._step_done()

    @precondition(lambda self: self.leases)
    @rule(
        kind=st.sampled_from([*VERDICTS, "heartbeat", "report"]),
        pick=st.integers(0, 10_000),
        stale=st.booleans(),
        permanent=st.booleans(),
        lease_ms=st.sampled_from(LEASES_MS),
    )
    def verdict(self, kind: str, pick: int, stale: bool, permanent: bool, lease_ms: int) -> None:
        """A worker reports on a lease it holds, or (``stale``, or when none is current) on
        any lease it held once (a stale worker)."""
        current = [le for le in self.leases if self.model.is_current(le)]
        leases = self.leases if stale or not current else current
        self._verdict(kind, leases[pick % len(leases)], permanent, lease_ms)
        self._step_done()

    def _verdict(self, kind: str, lease: Lease, permanent: bool, lease_ms: int) -> None:
        q, job_id, token = self.q, lease.job_id, lease.token
        if kind == "complete":
            result = b'{"r": %d}' % token
            expected = self.model.complete(lease, result)
            got = self.storage.complete(q, job_id, token, result)
        elif kind == "fail":
            job = self.model.live(job_id)
            retry_in = backoff(job.spec, job.attempts) if job is not None else 0
            expected = self.model.fail(lease, retry_in, permanent)
            got = self.storage.fail(q, job_id, token, ERROR, retry_in=retry_in,
                                    permanent=permanent)  # fmt: skip
        elif kind == "release":
            expected = self.model.release(lease)
            got = self.storage.release(q, job_id, token)
        elif kind == "postpone":
            expected = self.model.postpone(lease, POSTPONE_MS)
            got = self.storage.postpone(q, job_id, token, POSTPONE_MS)
        elif kind == "heartbeat":
            held = self.model.heartbeat(lease, lease_ms)
            lost = self.storage.heartbeat(q, lease.worker, [(job_id, token)], lease_ms)
            expected, got = held, lost == []
        elif kind == "report":
            expected = self.model.report(lease)
            got = self.storage.report(q, job_id, token, progress=b'{"done": 1}')
        else:
            expected = self.model.cancel_active(lease)
            got = self.storage.cancel_active(q, job_id, token, ERROR)
        stale = "stale" if expected in ("lease_lost", False) else "current"
        assert got == expected, f"{kind} with a {stale} lease {lease}: got {got}"

    @rule(ms=st.sampled_from([1, 499, 1_000, 4_000, 61_000, 301_000]), reap=st.booleans())
    def time_passes(self, ms: int, reap: bool) -> None:
        """The clock moves (leases and backoffs run out, records expire); the reaper runs."""
        before = {j for j, job in self.model.jobs.items() if job.expires_at is not None}
        self.clock.advance(ms)
        self.model.now = self.clock.now
        expire_records(self.storage, self.q, before - set(self.model.records()))
        if reap:
            requeued, failed, _promoted = self.model.reap()
            report = self.storage.reap(self.q)
            assert (sorted(report.requeued), sorted(report.failed)) == (requeued, failed), "reap"
        self._step_done(reaped=reap)

    @rule(
        op=st.sampled_from([
            "cancel", "cancel_running", "change", "retry", "retry_dead", "purge_dead",
            "purge_all", "delete_finished", "obliterate", "lose_data_and_recreate",
        ]),
        ids=st.lists(st.sampled_from(IDS), min_size=1, max_size=2),
        force=st.booleans(),
        targeted=st.sampled_from([True, True, False]),
        pick=st.integers(0, 10_000),
    )  # fmt: skip
    def operator(
        self, op: str, ids: list[str], force: bool, targeted: bool = False, pick: int = 0
    ) -> None:
        """An operator's action on ``ids`` or (``targeted``) on a job it applies to."""
        if targeted and op in TARGETS:
            fit = sorted(j for j, job in self.model.records().items() if job.state in TARGETS[op])
            if fit:
                ids = [fit[pick % len(fit)], *ids[1:]]
        op = "retry" if op == "retry_dead" else op  # (a retry aimed at a dead letter)
        q, job_id = self.q, ids[0]
        if op == "cancel":
            assert self.storage.cancel(q, job_id) == self.model.cancel(job_id), op
        elif op == "cancel_running":
            self._cancel_running(job_id)
        elif op == "change":
            self._change(job_id, pick)
        elif op == "retry":
            assert self.storage.retry(q, job_id) == self.model.retry(job_id), op
        elif op in ("purge_dead", "purge_all"):
            which = ids if op == "purge_dead" else None
            assert self.storage.purge_dead(q, which) == self.model.purge_dead(which), op
        elif op == "delete_finished":
            assert self.storage.delete_finished(q, ids) == self.model.delete_finished(ids), op
        elif op == "obliterate":
            self._obliterate(force)
        else:
            self._lose_data_and_recreate()
        self._step_done()

    @rule(
        what=st.sampled_from(["limits", "retention"]),
        group_max=st.sampled_from([None, 1, 2]),
        concurrency=st.sampled_from([None, None, 1, 2]),
        flood=st.sampled_from([False, False, True]),
        completed=keeps,
        failed=keeps,
        cancelled=keeps,
    )
    def configure(
        self,
        what: str,
        group_max: int | None,
        concurrency: int | None,
        flood: bool,
        completed: Keep | None,
        failed: Keep | None,
        cancelled: Keep | None,
    ) -> None:
        """The queue's settings: flow control (group rate limits, the concurrency cap), or the
        retention of finished records (all None: no policy). With group limits, once per
        example, the flood: one group's backlog longer than a claim looks at (``count +
        GROUP_SCAN``), so that once its budget is spent a claim moves that many candidates to
        scheduled and stops there."""
        if what == "limits":
            limits = QueueLimits(
                group_rate_max=group_max,
                group_rate_window=None if group_max is None else GROUP_WINDOW,
                concurrency=concurrency,
            )
            self.storage.set_limits(self.q, limits)
            self.model.limits = limits
            assert self.storage.get_limits(self.q) == limits
            if flood and group_max is not None and not self.flooded:
                self.flooded = True
                self._enqueue_many(FLOOD)
        else:
            policy = Retention(completed=completed, failed=failed, cancelled=cancelled)
            self.storage.set_retention(self.q, None if policy.empty else policy)
            self.model.set_retention(policy)
            assert self.storage.get_retention(self.q) == policy
        self._step_done()

    def _change(self, job_id: str, pick: int) -> None:
        """An operator moves a waiting job's due time (to now, or later), or leaves it, with
        or without a new priority. A change that moves nothing (a queued job made due now, a
        new priority alone) makes no transition: no event (test_findings.py::
        test_a_change_that_moves_no_due_time_makes_no_transition)."""
        job = self.model.live(job_id)
        if job is None or job.state not in WAITING:
            return
        later = self.model.now + (500, 3_000)[pick % 2]
        run_at = (later, self.model.now, None)[pick % 3]
        priority = (None, -5, 5)[(pick // 3) % 3] if run_at is not None else (-5, 5)[pick % 2]
        expected = self.model.change(job_id, run_at, priority)
        got = self.storage.change(self.q, job_id, run_at=run_at, priority=priority)
        assert got == expected, f"change {job_id} run_at={run_at} priority={priority}"

    def _cancel_running(self, job_id: str) -> None:
        """An operator stops a job wherever it is; a running one is stopped by its worker."""
        expected = self.model.request_cancel(job_id)
        assert self.storage.request_cancel(self.q, job_id) == expected, f"request_cancel {job_id}"
        if expected != "requested":
            return
        lease = next(le for le in self.leases if le.job_id == job_id and self.model.is_current(le))
        marks = self.storage.cancel_requests(self.q, [(lease.job_id, lease.token)])
        assert marks == {(lease.job_id, lease.token): False}, "cancel_requests"
        got = self.storage.cancel_active(self.q, job_id, lease.token, ERROR)
        assert got == self.model.cancel_active(lease) == "cancelled", "cancel_active"

    def _obliterate(self, force: bool) -> None:
        if self.model.has_active() and not force:
            with pytest.raises(QueueBusy):
                self.storage.obliterate(self.q)
            return
        expected = self.model.forget_all()
        assert self.storage.obliterate(self.q, force=force) == expected, "obliterate"
        self.events.restart()

    def _lose_data_and_recreate(self) -> None:
        """The backend loses the queue (Redis restarted empty); the journal's reconcile then
        enqueues again every job it had been told of: the same ids, the same options."""
        resend = [self.last_specs[j] for j in sorted(self.model.records()) if j in self.last_specs]
        self.model.forget_all()
        lose_queue(self.storage, self.q)
        self.events.restart()
        for spec in resend:
            self._enqueue(spec)

    # -- agreement and invariants ----------------------------------------------------------

    @invariant()
    def records_agree(self) -> None:
        for job_id in IDS:
            job = self.model.live(job_id)
            rec = self.storage.get_record(self.q, job_id)
            if job is None:
                assert rec is None, f"{job_id}: the backend still has {rec}"
                continue
            assert rec is not None, f"{job_id}: the backend lost it (model: {job.state})"
            spec = job.spec
            assert (rec.state, rec.attempts, rec.stalls) == (job.state, job.attempts, job.stalls), (
                f"{job_id}: state/attempts/stalls"
            )
            assert (rec.max_attempts, rec.max_stalls, rec.priority, rec.result_ttl) == (
                spec.max_attempts, spec.max_stalls, job.priority, spec.result_ttl,
            )  # fmt: skip
            assert (rec.lifo, rec.group) == (spec.lifo, spec.group), f"{job_id}: lifo/group"
            assert bytes(rec.payload) == job.payload, f"{job_id}: payload"
            assert rec.has_successor == (job.successor is not None), f"{job_id}: successor"
            if job.state is JobState.COMPLETED:
                assert bytes(rec.result) == job.result
            if job.state in (JobState.FAILED, JobState.RETRYING):
                assert rec.error is not None, f"{job_id}: {job.state} without its error"
            if job.state is JobState.ACTIVE:
                assert rec.worker == job.worker
            if job.state in (JobState.SCHEDULED, JobState.RETRYING):
                assert rec.run_at == job.due, f"{job_id}: due time"
            if job.finished_at is not None:
                assert rec.finished_at == job.finished_at, f"{job_id}: finish time"

    @invariant()
    def counts_equal_the_records(self) -> None:
        counts = self.storage.counts(self.q)
        expected = self.model.counts()
        assert {s: counts[s] for s in expected} == expected, "counts of live states"
        states = [self.storage.get_record(self.q, j) for j in IDS]
        for state in (JobState.COMPLETED, JobState.FAILED):
            records = sum(1 for r in states if r is not None and r.state is state)
            assert counts[state] >= records, f"{state} count below the records"
        assert self.storage.count_dead(self.q) == len(self.model.dead()), "dead letters"
        if isinstance(self.storage, DatabaseStorage):  # the triggers' counts are the rows'
            rows = self.storage._jobs().filter(queue=self.q).values_list("state", flat=True)
            held = {state: 0 for state in counts}
            for state in rows:
                held[JobState(state)] += 1
            assert counts == held, "StateCount against the rows"

    @invariant()
    def one_lease_per_job(self) -> None:
        """Heartbeat every lease ever given, extending nothing (each to its own deadline):
        exactly the model's current leases are held, so no job has two and no stale token
        passes."""
        by_worker: dict[str, list[Lease]] = {}
        for lease in self.leases:
            job = self.model.live(lease.job_id)
            if job is not None and job.deadline > self.model.now:
                by_worker.setdefault(lease.worker, []).append(lease)
        for worker, leases in by_worker.items():
            for lease in leases:
                job = self.model.jobs[lease.job_id]
                held = self.model.is_current(lease) and job.worker == worker
                lost = self.storage.heartbeat(
                    self.q, worker, [(lease.job_id, lease.token)], job.deadline - self.model.now
                )
                assert (lost == []) == held, f"lease {lease} held={held}, backend lost={lost}"
        current = [
            job_id
            for job_id, _ in {
                (le.job_id, le.token) for le in self.leases if self.model.is_current(le)
            }
        ]
        assert len(current) == len(set(current)), "two current leases of one job"


@pytest.mark.slow
def test_storage_agrees_with_the_model(backend, request):
    clock = FakeClock()
    machine = type(
        f"StorageMachine_{backend}",
        (StorageMachine,),
        {"storage": make_storage(backend, request, clock), "clock": clock},
    )
    try:
        run_state_machine_as_test(machine, settings=size(backend))
    finally:
        if os.environ.get("JOBQ_MODEL_COVERAGE") == "1":
            seen = sorted(transitions.SEEN.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))
            print(f"\ntransitions seen on {backend}:")
            for (src, dst), n in seen:
                print(f"  {src:>9} -> {dst:<9} {n}")
