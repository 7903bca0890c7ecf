"""Model-based test of the storage state machine, on every backend.

A ``hypothesis.stateful`` rule machine drives one queue of a real backend (memory, Redis,
SQLite, PostgreSQL; time from the fake clock) and the plain-Python model of
``reference.py`` with the same operations: enqueue with the options that decide state, claim,
heartbeat, complete, fail, release, cancel of waiting and running jobs, operator retry, lease
expiry and reap, purge and delete of finished records, obliterate, and the loss of the
queue's data followed by re-enqueues of the same ids. Workers keep every lease they were ever
given and send verdicts with old ones too. After each step the backend must agree with the
model record by record and in its counts, and these invariants must hold:

* a verdict (complete, fail, release, cancel, heartbeat) is accepted only from the token of
  the job's current lease: never from a stale worker, not even after the id was re-created;
* a job id never gets a token it had before, across re-creation too (fencing);
* at most one lease of a job is held at any time;
* per-state counts equal the records.

Size: ``settings`` below. CI runs a fixed (derandomized) set of examples; ``JOBQ_MODEL_LONG=1``
runs many more from a random seed (print it with ``--hypothesis-show-statistics``, or pass
``--hypothesis-seed``); docs/reliability.md records the long run.
"""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_jobq.errors import QueueBusy
from django_jobq.job import DedupMode, JobOptions, NewJob
from django_jobq.states import JobState
from tests.conftest import FakeClock, make_storage

from .data_loss import expire_records, lose_queue
from .reference import LIVE, Lease, ModelQueue, Spec

LONG = os.environ.get("JOBQ_MODEL_LONG") == "1"
IDS = ("a", "b", "c", "d.1")
WORKERS = ("w1", "w2")
LEASES_MS = (1_000, 5_000)
ERROR = b'{"type": "ValueError", "message": "boom"}'

# CI: about 60 s for the four backends on a 2-core machine (a PostgreSQL step is a few
# committed transactions); the long run: JOBQ_MODEL_LONG=1, sized by JOBQ_MODEL_EXAMPLES.
CI_EXAMPLES = {"memory": 150, "redis": 60, "sqlite": 20, "postgres": 15}


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


specs = st.builds(
    Spec,
    job_id=st.sampled_from(IDS),
    payload=st.sampled_from([b'{"n": 1}', b'"x"', b"[]"]),
    delay=st.sampled_from([0, 0, 0, 700, 4_000]),
    priority=st.sampled_from([0, 0, -5, 5]),
    max_attempts=st.integers(1, 3),
    max_stalls=st.integers(0, 1),
    min_backoff=st.sampled_from([0, 500]),
    max_backoff=st.sampled_from([500, 2_000]),
    # Redis expires records by its own clock: TTLs stay far above a real example's length
    # and expiry is driven by the fake clock (expire_records).
    result_ttl=st.sampled_from([60_000, 300_000]),
    dedup=st.none()
    | st.tuples(
        st.sampled_from(["k1", "k2"]),
        st.sampled_from([DedupMode.SIMPLE, DedupMode.THROTTLE]),
        st.sampled_from([None, 3_000]),
    ).filter(lambda d: d[1] is DedupMode.SIMPLE or d[2] is not None),
)


def new_job(spec: Spec) -> NewJob:
    from django_jobq.job import Dedup

    options = JobOptions(
        max_attempts=spec.max_attempts, result_ttl=spec.result_ttl,
        min_backoff=spec.min_backoff, max_backoff=spec.max_backoff,
        max_stalls=spec.max_stalls, priority=spec.priority,
    )  # fmt: skip
    dedup = None if spec.dedup is None else Dedup(*spec.dedup)
    return NewJob(spec.job_id, spec.payload, options, delay=spec.delay, dedup=dedup)


def backoff(spec: Spec, attempt: int) -> int:
    """What a worker asks for (``execution.py``): exponential from min_backoff, capped."""
    return min(spec.max_backoff, spec.min_backoff * 2 ** max(attempt - 1, 0))


class StorageMachine(RuleBasedStateMachine):
    storage = None  # set per backend by the test below
    clock: FakeClock

    def __init__(self) -> None:
        super().__init__()
        self.q = f"model-{uuid.uuid4().hex[:12]}"  # hypothesis examples share no state
        self.model = ModelQueue(now=self.clock.now)
        self.leases: list[Lease] = []  # every lease ever given, stale ones included
        self.last_specs: dict[str, Spec] = {}

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

    # -- rules ---------------------------------------------------------------------------
    # Hypothesis picks among rules evenly, so there are few of them (a claim and a verdict
    # each get a fifth of the steps) and each picks its variant from its arguments.

    @rule(specs_=st.lists(specs, min_size=1, max_size=3), many=st.booleans())
    def enqueue(self, specs_: list[Spec], many: bool) -> None:
        if not many:
            for spec in specs_:
                self._enqueue(spec)
            return
        expected = [self.model.enqueue(s) for s in specs_]
        got = self.storage.enqueue_many(self.q, [new_job(s) for s in specs_])
        assert [(g.outcome, g.job_id, g.state) for g in got] == [
            (e.outcome, e.job_id, e.state) for e in expected
        ], f"enqueue_many {specs_}"
        for spec, e in zip(specs_, expected, strict=True):
            if e.outcome == "queued":
                self.last_specs[spec.job_id] = spec

    @rule(worker=st.sampled_from(WORKERS), count=st.integers(1, 3),
          lease_ms=st.sampled_from(LEASES_MS))  # fmt: skip
    def claim(self, worker: str, count: int, lease_ms: int) -> None:
        wanted = self.model.claim_order(count)
        batch = self.storage.claim(self.q, worker, count, lease_ms)
        assert [c.job_id for c in batch.jobs] == [j.spec.job_id for j in wanted], "claim order"
        for job, claimed in zip(wanted, batch.jobs, strict=True):
            seen = self.model.tokens_seen.get(job.spec.job_id, set())
            assert claimed.token not in seen, (
                f"token {claimed.token} of {job.spec.job_id!r} was given out before: a stale "
                "worker holding it would pass the fence"
            )
            self.leases.append(self.model.lease(job, claimed.token, worker, lease_ms))
            spec = job.spec
            assert (claimed.attempt, claimed.max_attempts, bytes(claimed.payload)) == (
                job.attempts, spec.max_attempts, spec.payload,
            )  # fmt: skip
            assert (claimed.min_backoff, claimed.max_backoff) == (
                spec.min_backoff, spec.max_backoff,
            )  # fmt: skip
        if len(batch.jobs) < count:
            assert batch.next_due_in == self.model.next_due_in(), "next_due_in"

    @precondition(lambda self: self.leases)
    @rule(
        kind=st.sampled_from(["complete", "fail", "release", "heartbeat", "cancel_active"]),
        pick=st.integers(0, 10_000),
        permanent=st.booleans(),
        lease_ms=st.sampled_from(LEASES_MS),
    )
    def verdict(self, kind: str, pick: int, permanent: bool, lease_ms: int) -> None:
        """A worker reports on a lease it holds, or held once (a stale worker)."""
        lease = self.leases[pick % len(self.leases)]
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
        elif kind == "heartbeat":
            held = self.model.heartbeat(lease, lease_ms)
            lost = self.storage.heartbeat(q, lease.worker, [(job_id, token)], lease_ms)
            expected, got = held, lost == []
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

    @rule(
        op=st.sampled_from([
            "cancel", "cancel_running", "retry", "purge_dead", "purge_all", "delete_finished",
            "obliterate", "lose_data_and_recreate",
        ]),
        ids=st.lists(st.sampled_from(IDS), min_size=1, max_size=2),
        force=st.booleans(),
    )  # fmt: skip
    def operator(self, op: str, ids: list[str], force: bool) -> None:
        q, job_id = self.q, ids[0]
        if op == "cancel":
            assert self.storage.cancel(q, job_id) == self.model.cancel(job_id), op
        elif op == "cancel_running":
            self._cancel_running(job_id)
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

    def _lose_data_and_recreate(self) -> None:
        """The backend loses the queue (Redis restarted empty); the journal's reconcile then
        enqueues again every job it had been told of: the same ids, the same options."""
        resend = [self.last_specs[j] for j in sorted(self.model.records()) if j in self.last_specs]
        self.model.forget_all()
        lose_queue(self.storage, self.q)
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
                spec.max_attempts, spec.max_stalls, spec.priority, spec.result_ttl,
            )  # fmt: skip
            assert bytes(rec.payload) == spec.payload
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
        assert {s: counts[s] for s in LIVE} == expected, "counts of live states"
        states = [self.storage.get_record(self.q, j) for j in IDS]
        for state in (JobState.COMPLETED, JobState.FAILED):
            records = sum(1 for r in states if r is not None and r.state is state)
            assert counts[state] >= records, f"{state} count below the records"
        assert self.storage.count_dead(self.q) == len(self.model.dead()), "dead letters"

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
    run_state_machine_as_test(machine, settings=size(backend))
