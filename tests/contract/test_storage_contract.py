"""The storage contract (``django_jobq/storage/base.py``), run against every backend.

Everything above storage (Queue API, worker, reaper, mirror, Django Tasks backend) relies only on
what these tests pin down, so a backend that passes them can be swapped in without the rest
noticing. The suite talks to ``Storage`` alone — never to Redis keys or to table rows — and
drives time with the injected fake clock, so that the same test means the same thing on the
in-memory, Redis, SQLite and PostgreSQL backends (see the ``storage`` fixture in conftest).
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from django_jobq.job import AckOutcome, CancelOutcome, EnqueueOutcome, JobOptions, NewJob
from django_jobq.states import JobState, can_transition
from django_jobq.storage.base import Ack

from ..helpers import PATIENCE, wait_until
from .conftest import LONG_WAIT

Q = "contract-q"
LEASE = 10_000
ERROR = b'{"type": "ValueError", "message": "boom"}'


def job(job_id: str, payload: bytes = b'{"n": 1}', **kwargs) -> NewJob:
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in JobOptions.__dataclass_fields__}
    return NewJob(job_id, payload, JobOptions(**options), **kwargs)


def claim_one(storage, queue: str = Q, worker: str = "w1"):
    jobs = storage.claim(queue, worker, 1, LEASE).jobs
    assert len(jobs) == 1, "expected one claimable job"
    return jobs[0]


# -- enqueue ----------------------------------------------------------------------------------


def test_new_job_is_queued_with_its_record(storage, clock):
    opts = {"max_attempts": 5, "result_ttl": 60_000, "priority": 7, "max_stalls": 2}
    stored = storage.enqueue(Q, job("a", b'{"x": 1}', content_type="msgpack", **opts))
    assert (stored.outcome, stored.job_id, stored.state) == (
        EnqueueOutcome.QUEUED, "a", JobState.QUEUED,
    )  # fmt: skip
    rec = storage.get_record(Q, "a")
    assert (rec.state, rec.attempts, rec.stalls) == (JobState.QUEUED, 0, 0)
    assert (rec.max_attempts, rec.result_ttl, rec.priority, rec.max_stalls) == (5, 60_000, 7, 2)
    assert (bytes(rec.payload), rec.content_type) == (b'{"x": 1}', "msgpack")
    assert abs(rec.created_at - clock.now) <= 1
    assert rec.result is None and rec.error is None and rec.finished_at is None


def test_unknown_job_has_no_record(storage):
    assert storage.get_record(Q, "nope") is None


def test_delayed_job_is_scheduled_and_not_claimable_until_due(storage, clock):
    stored = storage.enqueue(Q, job("later", delay=5_000))
    assert stored.state is JobState.SCHEDULED
    storage.enqueue(Q, job("at", run_at=clock.now + 8_000))
    assert storage.get_record(Q, "at").state is JobState.SCHEDULED
    batch = storage.claim(Q, "w1", 10, LEASE)
    assert batch.jobs == []
    assert 4_990 <= batch.next_due_in <= 5_000
    clock.advance(4_999)
    assert storage.claim(Q, "w1", 10, LEASE).jobs == []
    clock.advance(1)
    assert [j.job_id for j in storage.claim(Q, "w1", 10, LEASE).jobs] == ["later"]
    clock.advance(3_000)
    assert [j.job_id for j in storage.claim(Q, "w1", 10, LEASE).jobs] == ["at"]


def test_run_at_in_the_past_is_runnable_now(storage, clock):
    assert storage.enqueue(Q, job("past", run_at=clock.now - 60_000)).state is JobState.QUEUED
    assert claim_one(storage).job_id == "past"


def test_next_due_in_is_none_without_scheduled_jobs(storage):
    storage.enqueue(Q, job("a"))
    assert storage.claim(Q, "w1", 10, LEASE).next_due_in is None


def test_duplicate_id_writes_nothing_and_reports_the_existing_state(storage):
    storage.enqueue(Q, job("a", b'"first"', max_attempts=2, result_ttl=5_000))
    again = storage.enqueue(Q, job("a", b'"second"', max_attempts=9, result_ttl=9_000))
    assert (again.outcome, again.state) == (EnqueueOutcome.DUPLICATE, JobState.QUEUED)
    rec = storage.get_record(Q, "a")
    assert (bytes(rec.payload), rec.max_attempts, rec.result_ttl) == (b'"first"', 2, 5_000)
    assert len(storage.claim(Q, "w1", 10, LEASE).jobs) == 1
    assert storage.enqueue(Q, job("a")).state is JobState.ACTIVE


def test_duplicate_of_a_completed_job_returns_the_cached_result(storage):
    storage.enqueue(Q, job("a"))
    c = claim_one(storage)
    storage.complete(Q, "a", c.token, b'{"r": 42}')
    again = storage.enqueue(Q, job("a"))
    assert (again.outcome, again.state, bytes(again.result)) == (
        EnqueueOutcome.COMPLETED, JobState.COMPLETED, b'{"r": 42}',
    )  # fmt: skip


def test_duplicate_of_a_failed_job_returns_its_error(storage):
    storage.enqueue(Q, job("a", max_attempts=1))
    c = claim_one(storage)
    storage.fail(Q, "a", c.token, ERROR)
    again = storage.enqueue(Q, job("a"))
    assert (again.outcome, again.state) == (EnqueueOutcome.DUPLICATE, JobState.FAILED)
    assert b"boom" in bytes(again.error)


def test_enqueue_many_gives_per_item_results_in_order(storage):
    storage.enqueue(Q, job("old"))
    out = storage.enqueue_many(Q, [job("n1"), job("old"), job("n2"), job("n1"), job("s", delay=9)])
    assert [(r.job_id, r.outcome, r.state) for r in out] == [
        ("n1", EnqueueOutcome.QUEUED, JobState.QUEUED),
        ("old", EnqueueOutcome.DUPLICATE, JobState.QUEUED),
        ("n2", EnqueueOutcome.QUEUED, JobState.QUEUED),
        ("n1", EnqueueOutcome.DUPLICATE, JobState.QUEUED),  # repeated within the batch
        ("s", EnqueueOutcome.QUEUED, JobState.SCHEDULED),
    ]
    assert storage.counts(Q)[JobState.QUEUED] == 3


def test_queues_are_isolated(storage):
    storage.enqueue(Q, job("a"))
    storage.enqueue("other-q", job("a", b'"other"'))
    assert bytes(storage.get_record("other-q", "a").payload) == b'"other"'
    assert [j.job_id for j in storage.claim("other-q", "w1", 10, LEASE).jobs] == ["a"]
    assert storage.get_record(Q, "a").state is JobState.QUEUED


# -- claim ------------------------------------------------------------------------------------


def test_claim_takes_lowest_priority_first_then_fifo_and_respects_count(storage):
    for job_id, priority in [("p5a", 5), ("p0a", 0), ("pm3", -3), ("p0b", 0), ("p5b", 5)]:
        storage.enqueue(Q, job(job_id, priority=priority))
    first = storage.claim(Q, "w1", 3, LEASE).jobs
    assert [j.job_id for j in first] == ["pm3", "p0a", "p0b"]
    assert [j.job_id for j in storage.claim(Q, "w1", 10, LEASE).jobs] == ["p5a", "p5b"]
    assert storage.claim(Q, "w1", 10, LEASE).jobs == []


def test_claim_leases_with_a_new_token_and_counts_the_attempt(storage, clock):
    storage.enqueue(Q, job("a", b'"p"', max_attempts=4, min_backoff=10, max_backoff=99))
    c = claim_one(storage, worker="w9")
    assert (c.queue, c.job_id, bytes(c.payload), c.attempt, c.max_attempts) == (
        Q, "a", b'"p"', 1, 4,
    )  # fmt: skip
    assert (c.min_backoff, c.max_backoff, c.content_type) == (10, 99, "json")
    rec = storage.get_record(Q, "a")
    assert (rec.state, rec.attempts, rec.worker) == (JobState.ACTIVE, 1, "w9")
    assert abs(rec.started_at - clock.now) <= 1
    storage.release(Q, "a", c.token)
    again = claim_one(storage)
    assert again.token != c.token


def test_a_job_never_starts_before_it_was_created_nor_finishes_before_it_started(
    storage, clock, backend
):
    """The database backends stamp with the clock of whichever process writes: an idle
    worker that read its clock just before a job was committed (a loaded machine: CI saw
    25 ms), or a web host whose clock runs ahead of the worker's, would otherwise record a
    start before the creation. Here the claimer's and the completer's clocks run 50 ms
    behind. (Redis stamps every transition with its own clock inside atomic scripts, and
    the memory backend under its lock with one process's clock: neither can disagree with
    itself, so there a clock going back is the injected clock's fiction, not a case.)"""
    if backend not in ("sqlite", "postgres"):
        pytest.skip("one clock stamps every transition on this backend")
    storage.enqueue(Q, job("early"))
    created = storage.get_record(Q, "early").created_at
    clock.advance(-50)
    c = claim_one(storage)
    started = storage.get_record(Q, "early").started_at
    assert started >= created
    clock.advance(-50)
    assert storage.complete(Q, "early", c.token, b"1") is AckOutcome.COMPLETED
    rec = storage.get_record(Q, "early")
    assert rec.created_at <= rec.started_at <= rec.finished_at
    # The events say the same times as the row.
    at = {e.kind: e.at for e in storage.read_events(Q) if e.job_id == "early"}
    assert (at["active"], at["completed"]) == (rec.started_at, rec.finished_at)
    # The same through a worker's batch of verdicts (``ack_many``).
    storage.enqueue(Q, job("batched"))
    clock.advance(-50)
    c = claim_one(storage)
    clock.advance(-50)
    assert storage.ack_many(Q, [Ack("complete", "batched", c.token, b"1")]) == [
        AckOutcome.COMPLETED
    ]
    rec = storage.get_record(Q, "batched")
    assert rec.created_at <= rec.started_at <= rec.finished_at
    at = {e.kind: e.at for e in storage.read_events(Q) if e.job_id == "batched"}
    assert (at["active"], at["completed"]) == (rec.started_at, rec.finished_at)


def test_claim_on_an_empty_queue_is_empty(storage):
    batch = storage.claim("empty-q", "w1", 5, LEASE)
    assert batch.jobs == [] and batch.next_due_in is None


# -- complete / fail / release ------------------------------------------------------------------


def test_complete_stores_the_result(storage, clock):
    storage.enqueue(Q, job("a"))
    c = claim_one(storage)
    clock.advance(50)
    assert storage.complete(Q, "a", c.token, b'"done"') is AckOutcome.COMPLETED
    rec = storage.get_record(Q, "a")
    assert (rec.state, bytes(rec.result)) == (JobState.COMPLETED, b'"done"')
    assert abs(rec.finished_at - clock.now) <= 1
    assert storage.counts(Q)[JobState.COMPLETED] == 1


def test_verdicts_with_a_stale_token_change_nothing(storage):
    storage.enqueue(Q, job("a"))
    c = claim_one(storage)
    stale = c.token + 1000
    assert storage.complete(Q, "a", stale, b'"x"') is AckOutcome.LEASE_LOST
    assert storage.fail(Q, "a", stale, ERROR) is AckOutcome.LEASE_LOST
    assert storage.release(Q, "a", stale) is AckOutcome.LEASE_LOST
    assert storage.complete(Q, "ghost", 1, b'"x"') is AckOutcome.LEASE_LOST
    rec = storage.get_record(Q, "a")
    assert (rec.state, rec.result, rec.attempts) == (JobState.ACTIVE, None, 1)


def test_a_second_verdict_on_the_same_lease_is_refused(storage):
    storage.enqueue(Q, job("a"))
    c = claim_one(storage)
    assert storage.complete(Q, "a", c.token, b'"1"') is AckOutcome.COMPLETED
    assert storage.complete(Q, "a", c.token, b'"2"') is AckOutcome.LEASE_LOST
    assert storage.fail(Q, "a", c.token, ERROR) is AckOutcome.LEASE_LOST
    assert bytes(storage.get_record(Q, "a").result) == b'"1"'


def test_fail_with_attempts_left_retries_after_the_delay(storage, clock):
    storage.enqueue(Q, job("a", max_attempts=3))
    c = claim_one(storage)
    assert storage.fail(Q, "a", c.token, ERROR, retry_in=2_000) is AckOutcome.RETRYING
    rec = storage.get_record(Q, "a")
    assert rec.state is JobState.RETRYING and b"boom" in bytes(rec.error)
    assert storage.counts(Q)[JobState.RETRYING] == 1
    batch = storage.claim(Q, "w1", 5, LEASE)
    assert batch.jobs == [] and 1_990 <= batch.next_due_in <= 2_000
    clock.advance(2_000)
    again = claim_one(storage)
    assert again.attempt == 2


def test_attempts_exhausted_or_permanent_fails_for_good(storage):
    storage.enqueue(Q, job("a", max_attempts=2))
    storage.enqueue(Q, job("p", max_attempts=5))
    storage.fail(Q, "a", claim_one(storage).token, ERROR, retry_in=0)
    assert storage.fail(Q, "a", claim_one(storage).token, ERROR) is AckOutcome.FAILED
    p = claim_one(storage)
    assert storage.fail(Q, "p", p.token, ERROR, permanent=True) is AckOutcome.FAILED
    for job_id, attempts in (("a", 2), ("p", 1)):
        rec = storage.get_record(Q, job_id)
        assert (rec.state, rec.attempts) == (JobState.FAILED, attempts)
        assert b"boom" in bytes(rec.error) and rec.finished_at is not None
    assert storage.counts(Q)[JobState.FAILED] == 2


def test_release_requeues_without_using_an_attempt(storage):
    storage.enqueue(Q, job("a", max_attempts=1))
    c = claim_one(storage)
    assert storage.release(Q, "a", c.token) is AckOutcome.RELEASED
    rec = storage.get_record(Q, "a")
    assert (rec.state, rec.attempts) == (JobState.QUEUED, 0)
    assert claim_one(storage).attempt == 1  # max_attempts=1 still allows its one run


def test_ack_many_returns_outcomes_in_order(storage):
    for i in range(3):
        storage.enqueue(Q, job(f"j{i}", max_attempts=3))
    c = {j.job_id: j for j in storage.claim(Q, "w1", 3, LEASE).jobs}
    out = storage.ack_many(
        Q,
        [
            Ack("release", "j2", c["j2"].token),
            Ack("complete", "j0", c["j0"].token, b'"ok"'),
            Ack("fail", "j1", c["j1"].token, ERROR, retry_in=100),
        ],
    )
    assert out == [AckOutcome.RELEASED, AckOutcome.COMPLETED, AckOutcome.RETRYING]


def test_ack_many_checks_each_completion_on_its_own(storage):
    """A worker's batch of completions: a stale token, a repeat within the batch, a job with a
    waiter and a singleton run with a blocked successor are each settled by their own rules."""
    for i in range(4):
        storage.enqueue(Q, job(f"j{i}", waiter=(i == 2)))
    c = {j.job_id: j for j in storage.claim(Q, "w1", 4, LEASE).jobs}
    successor = storage.enqueue(Q, job("j3", b'"next"', singleton=True))
    assert successor.state is JobState.BLOCKED
    out = storage.ack_many(
        Q,
        [
            Ack("complete", "j0", c["j0"].token + 1, b'"stale"'),
            Ack("complete", "j1", c["j1"].token, b'"one"'),
            Ack("complete", "j1", c["j1"].token, b'"again"'),
            Ack("complete", "j2", c["j2"].token, b'"two"'),
            Ack("complete", "j3", c["j3"].token, b'"three"'),
        ],
    )
    assert out == [AckOutcome.LEASE_LOST, AckOutcome.COMPLETED, AckOutcome.LEASE_LOST,
                   AckOutcome.COMPLETED, AckOutcome.COMPLETED]  # fmt: skip
    assert storage.get_record(Q, "j0").state is JobState.ACTIVE
    assert bytes(storage.get_record(Q, "j1").result) == b'"one"'
    assert storage.wait_for_outcome(Q, "j2", 0).result == b'"two"'
    after = storage.get_record(Q, "j3")  # the successor took the id, queued and fresh
    assert (after.state, bytes(after.payload), after.attempts) == (JobState.QUEUED, b'"next"', 0)
    assert [j.job_id for j in storage.claim(Q, "w1", 5, LEASE).jobs] == ["j3"]


def test_enqueue_many_replaces_an_expired_record_and_keeps_order(storage, clock):
    storage.enqueue(Q, job("old", result_ttl=50))
    c = claim_one(storage)
    storage.complete(Q, "old", c.token, b"1")
    storage.enqueue(Q, job("live"))
    # "old" expires and frees its id: Redis by its own clock (PEXPIRE), the others by the
    # storage clock; move both.
    clock.advance(100)
    assert wait_until(lambda: storage.get_record(Q, "old") is None)
    ids = ["b", "old", "a", "live", "c"]
    out = storage.enqueue_many(Q, [job(i, waiter=True) for i in ids])
    assert [(r.job_id, r.outcome) for r in out] == [
        ("b", EnqueueOutcome.QUEUED), ("old", EnqueueOutcome.QUEUED),
        ("a", EnqueueOutcome.QUEUED), ("live", EnqueueOutcome.DUPLICATE),
        ("c", EnqueueOutcome.QUEUED),
    ]  # fmt: skip
    claimed = [j.job_id for j in storage.claim(Q, "w1", 10, LEASE).jobs]
    assert claimed == ["live", "b", "old", "a", "c"]  # FIFO: the existing job first


# -- heartbeat and stalled jobs -----------------------------------------------------------------


def test_heartbeat_extends_leases_so_the_reaper_leaves_them(storage, clock):
    storage.enqueue(Q, job("a"))
    c = claim_one(storage)
    clock.advance(LEASE - 1_000)
    assert storage.heartbeat(Q, "w1", [("a", c.token)], LEASE) == []
    clock.advance(LEASE - 1_000)  # past the first deadline, within the extended one
    report = storage.reap(Q)
    assert report.requeued == [] and storage.get_record(Q, "a").state is JobState.ACTIVE


def test_heartbeat_reports_leases_it_no_longer_holds(storage, clock):
    storage.enqueue(Q, job("a"))
    storage.enqueue(Q, job("b"))
    a, b = storage.claim(Q, "w1", 2, LEASE).jobs
    storage.complete(Q, b.job_id, b.token, b"1")
    lost = storage.heartbeat(
        Q, "w1", [(a.job_id, a.token), (b.job_id, b.token), ("ghost", 3)], LEASE
    )
    assert sorted(lost) == sorted([(b.job_id, b.token), ("ghost", 3)])
    assert storage.heartbeat(Q, "someone-else", [(a.job_id, a.token)], LEASE) == [
        (a.job_id, a.token)
    ]


def test_expired_lease_is_requeued_with_a_stall_and_the_attempt_given_back(storage, clock):
    storage.enqueue(Q, job("a", max_stalls=1))
    c = claim_one(storage)
    clock.advance(LEASE - 1)
    assert storage.reap(Q).requeued == []
    clock.advance(1)
    report = storage.reap(Q)
    assert report.requeued == ["a"] and report.failed == []
    rec = storage.get_record(Q, "a")
    assert (rec.state, rec.stalls, rec.attempts) == (JobState.QUEUED, 1, 0)
    # The stale worker's verdict is refused; the new attempt's wins.
    again = claim_one(storage, worker="w2")
    assert storage.complete(Q, "a", c.token, b'"stale"') is AckOutcome.LEASE_LOST
    assert storage.complete(Q, "a", again.token, b'"fresh"') is AckOutcome.COMPLETED
    assert bytes(storage.get_record(Q, "a").result) == b'"fresh"'


def test_stalling_past_max_stalls_fails_the_job(storage, clock):
    storage.enqueue(Q, job("a", max_stalls=1))
    claim_one(storage)
    clock.advance(LEASE)
    storage.reap(Q)
    claim_one(storage)
    clock.advance(LEASE)
    report = storage.reap(Q)
    assert report.failed == ["a"]
    rec = storage.get_record(Q, "a")
    assert (rec.state, rec.stalls) == (JobState.FAILED, 2)
    assert rec.error is not None


def test_reap_promotes_due_jobs(storage, clock):
    storage.enqueue(Q, job("a", delay=1_000))
    clock.advance(1_000)
    assert storage.reap(Q).promoted == 1
    assert storage.get_record(Q, "a").state is JobState.QUEUED


# -- cancel -----------------------------------------------------------------------------------


def test_cancel_in_each_state(storage, clock):
    storage.enqueue(Q, job("queued"))
    storage.enqueue(Q, job("scheduled", delay=60_000))
    storage.enqueue(Q, job("active"))
    storage.enqueue(Q, job("retrying"))
    storage.enqueue(Q, job("done"))
    storage.enqueue(Q, job("failed", max_attempts=1))
    storage.cancel(Q, "queued")  # so the claims below take the others
    claimed = {j.job_id: j for j in storage.claim(Q, "w1", 10, LEASE).jobs}
    storage.fail(Q, "retrying", claimed["retrying"].token, ERROR, retry_in=60_000)
    storage.complete(Q, "done", claimed["done"].token, b"1")
    storage.fail(Q, "failed", claimed["failed"].token, ERROR)

    assert storage.cancel(Q, "queued") is CancelOutcome.CANCELLED  # again: still cancelled
    assert storage.cancel(Q, "scheduled") is CancelOutcome.CANCELLED
    assert storage.cancel(Q, "retrying") is CancelOutcome.CANCELLED
    assert storage.cancel(Q, "active") is CancelOutcome.ACTIVE
    assert storage.cancel(Q, "done") is CancelOutcome.COMPLETED
    assert storage.cancel(Q, "failed") is CancelOutcome.FAILED
    assert storage.cancel(Q, "ghost") is CancelOutcome.NOT_FOUND
    for job_id in ("queued", "scheduled", "retrying"):
        assert storage.get_record(Q, job_id).state is JobState.CANCELLED
    assert storage.get_record(Q, "active").state is JobState.ACTIVE
    clock.advance(120_000)
    assert storage.claim(Q, "w1", 10, LEASE).jobs == []  # cancelled jobs never run


def test_a_cancelled_id_stays_deduplicated(storage):
    storage.enqueue(Q, job("a"))
    storage.cancel(Q, "a")
    again = storage.enqueue(Q, job("a"))
    assert (again.outcome, again.state) == (EnqueueOutcome.DUPLICATE, JobState.CANCELLED)
    assert storage.claim(Q, "w1", 10, LEASE).jobs == []


def test_finished_record_expires_after_its_ttl_and_frees_the_id(storage, clock):
    storage.enqueue(Q, job("done", result_ttl=50))
    storage.enqueue(Q, job("gone", result_ttl=50))
    storage.complete(Q, "done", claim_one(storage).token, b"1")
    storage.cancel(Q, "gone")
    # Redis expires by its own clock (PEXPIRE), the others by the storage clock: move both.
    clock.advance(100)
    time.sleep(0.12)
    storage.reap(Q)
    assert storage.get_record(Q, "done") is None
    assert storage.get_record(Q, "gone") is None
    assert storage.enqueue(Q, job("done")).outcome is EnqueueOutcome.QUEUED
    assert storage.cancel(Q, "gone") is CancelOutcome.NOT_FOUND


# -- waiting ------------------------------------------------------------------------------------


@pytest.mark.parametrize("finish", ["complete", "fail", "cancel"])
def test_wait_for_outcome_sees_a_completion_from_another_thread(live_storage, finish, wakeups_only):
    live_storage.enqueue(Q, job("a", max_attempts=1, waiter=True))

    def finisher():
        time.sleep(0.05)
        if finish == "cancel":
            live_storage.cancel(Q, "a")
            return
        c = live_storage.claim(Q, "w1", 1, LEASE).jobs[0]
        if finish == "complete":
            live_storage.complete(Q, "a", c.token, b'"r"')
        else:
            live_storage.fail(Q, "a", c.token, ERROR)

    t = threading.Thread(target=finisher)
    t.start()
    outcome = live_storage.wait_for_outcome(Q, "a", LONG_WAIT)
    t.join()
    expected = {"complete": JobState.COMPLETED, "fail": JobState.FAILED,
                "cancel": JobState.CANCELLED}[finish]  # fmt: skip
    assert outcome is not None and outcome.state is expected
    if finish == "complete":
        assert bytes(outcome.result) == b'"r"'
    if finish == "fail":
        assert b"boom" in bytes(outcome.error)


def test_wait_for_outcome_after_the_job_finished_returns_at_once(live_storage, wakeups_only):
    live_storage.enqueue(Q, job("a", waiter=True))
    c = live_storage.claim(Q, "w1", 1, LEASE).jobs[0]
    live_storage.complete(Q, "a", c.token, b'"r"')
    start = time.monotonic()
    outcome = live_storage.wait_for_outcome(Q, "a", LONG_WAIT)
    assert outcome.state is JobState.COMPLETED and time.monotonic() - start < PATIENCE


def test_wait_for_outcome_times_out_with_none(live_storage, wakeups_only):
    live_storage.enqueue(Q, job("a", waiter=True))
    start = time.monotonic()
    assert live_storage.wait_for_outcome(Q, "a", 0.2) is None
    assert 0.15 <= time.monotonic() - start < PATIENCE  # its own timeout, not a safety net's


def test_wait_for_jobs_wakes_on_an_enqueue_and_on_interrupt(live_storage, wakeups_only):
    live_storage.claim(Q, "w1", 1, LEASE)  # the worker's empty claim comes first
    threading.Timer(0.1, lambda: live_storage.enqueue(Q, job("a"))).start()
    start = time.monotonic()
    live_storage.wait_for_jobs([Q], LONG_WAIT, "w1")
    assert time.monotonic() - start < PATIENCE

    live_storage.claim(Q, "w2", 0, LEASE)
    threading.Timer(0.1, lambda: live_storage.interrupt_wait(["idle-q"], "w2")).start()
    start = time.monotonic()
    live_storage.wait_for_jobs(["idle-q"], LONG_WAIT, "w2")
    assert time.monotonic() - start < PATIENCE

    # With nothing happening the wait lasts its timeout. A backend may wake spuriously once
    # more for a commit it noticed late (SQLite's cross-process watcher sees the timer thread's
    # commit a poll later), so one of three quiet waits must last: a wait that never blocks fails.
    waited = []
    for _ in range(3):
        start = time.monotonic()
        live_storage.wait_for_jobs(["idle-q"], 0.2, "w3")
        waited.append(time.monotonic() - start)
        if waited[-1] >= 0.15:
            break
    assert max(waited) >= 0.15, waited


# -- events, counts, registries ----------------------------------------------------------------


def test_every_transition_appends_an_event_in_order(storage, clock):
    storage.enqueue(Q, job("a", max_attempts=2))
    c = claim_one(storage)
    storage.fail(Q, "a", c.token, ERROR, retry_in=10)
    clock.advance(10)
    c = claim_one(storage)
    storage.complete(Q, "a", c.token, b"1")
    storage.enqueue(Q, job("b"))
    storage.cancel(Q, "b")
    events = storage.read_events(Q)
    assert [(e.job_id, e.kind) for e in events] == [
        ("a", "queued"), ("a", "active"), ("a", "retrying"), ("a", "queued"), ("a", "active"),
        ("a", "completed"), ("b", "queued"), ("b", "cancelled"),
    ]  # fmt: skip
    assert events[1].worker == "w1"
    assert all(e.queue == Q for e in events)
    assert storage.read_events(Q, after=events[5].id) == events[6:]
    assert storage.read_events(Q, after=events[-1].id) == []
    assert len(storage.read_events(Q, count=3)) == 3


def test_read_events_blocks_until_one_arrives(live_storage):
    live_storage.enqueue(Q, job("first"))
    last = live_storage.read_events(Q)[-1].id
    threading.Timer(0.1, lambda: live_storage.enqueue(Q, job("second"))).start()
    events = live_storage.read_events(Q, after=last, block=5)
    assert [e.job_id for e in events] == ["second"]


def test_counts_by_state(storage, clock):
    storage.enqueue_many(Q, [job(f"q{i}") for i in range(3)])
    storage.enqueue(Q, job("s", delay=1_000))
    a, b = storage.claim(Q, "w1", 2, LEASE).jobs
    storage.complete(Q, a.job_id, a.token, b"1")
    storage.fail(Q, b.job_id, b.token, ERROR, retry_in=1_000)
    counts = storage.counts(Q)
    assert {s: counts[s] for s in (JobState.SCHEDULED, JobState.QUEUED, JobState.ACTIVE,
            JobState.RETRYING, JobState.COMPLETED, JobState.FAILED)} == {
        JobState.SCHEDULED: 1, JobState.QUEUED: 1, JobState.ACTIVE: 0, JobState.RETRYING: 1,
        JobState.COMPLETED: 1, JobState.FAILED: 0,
    }  # fmt: skip


def test_queue_registry(storage):
    storage.register_queue("zeta-q")
    storage.register_queue("alpha-q")
    storage.register_queue("alpha-q")
    assert [q for q in storage.list_queues() if q in ("alpha-q", "zeta-q")] == ["alpha-q", "zeta-q"]


def test_worker_registry_with_expiry(storage, clock):
    storage.register_worker("w-1", {"host": "h", "pid": 1, "queues": [Q], "concurrency": 4}, 5_000)
    storage.register_worker("w-2", {"host": "h", "pid": 2, "queues": [Q]}, 60_000)
    records = {r.worker_id: r for r in storage.list_workers()}
    assert set(records) == {"w-1", "w-2"}
    assert records["w-1"].info["concurrency"] == 4
    assert abs(records["w-1"].last_seen - clock.now) <= 1
    clock.advance(5_001)
    assert [r.worker_id for r in storage.list_workers()] == ["w-2"]
    storage.deregister_worker("w-2")
    assert storage.list_workers() == []


# -- concurrency (real clock, real threads) -----------------------------------------------------


def test_eight_threads_enqueueing_one_id_make_one_job(live_storage):
    barrier = threading.Barrier(8)
    outcomes: list[EnqueueOutcome] = []

    def go():
        barrier.wait()
        outcomes.append(live_storage.enqueue(Q, job("same")).outcome)

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(outcomes) == sorted([EnqueueOutcome.QUEUED] + [EnqueueOutcome.DUPLICATE] * 7)
    assert len(live_storage.claim(Q, "w1", 10, LEASE).jobs) == 1


def test_four_claimers_never_share_a_job(live_storage):
    live_storage.enqueue_many(Q, [job(f"j{i}") for i in range(200)])
    barrier = threading.Barrier(4)
    taken: list[list[str]] = [[] for _ in range(4)]

    def go(n):
        barrier.wait()
        while batch := live_storage.claim(Q, f"w{n}", 7, LEASE).jobs:
            taken[n] += [j.job_id for j in batch]

    threads = [threading.Thread(target=go, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    everything = [j for part in taken for j in part]
    assert len(everything) == 200 and len(set(everything)) == 200


def test_two_concurrent_verdicts_on_one_lease_only_one_counts(live_storage):
    live_storage.enqueue(Q, job("a"))
    c = live_storage.claim(Q, "w1", 1, LEASE).jobs[0]
    barrier = threading.Barrier(2)
    results: list[AckOutcome] = []

    def go(body):
        barrier.wait()
        results.append(live_storage.complete(Q, "a", c.token, body))

    threads = [threading.Thread(target=go, args=(b,)) for b in (b'"x"', b'"y"')]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == sorted([AckOutcome.COMPLETED, AckOutcome.LEASE_LOST])


# -- the state machine under random operations ---------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_random_operations_only_follow_allowed_transitions(storage, clock, seed):
    """A few hundred random operations; after each, every job's state must have moved along an
    edge of ``states.TRANSITIONS`` (or stayed), and ``counts`` must agree with the records."""
    rng = random.Random(seed)
    ids = [f"r{i}" for i in range(12)]
    seen: dict[str, JobState] = {}
    held: dict[str, int] = {}  # job id -> token of a lease we hold
    for _step in range(250):
        op = rng.choice(["enqueue", "enqueue", "claim", "complete", "fail", "release", "cancel",
                         "reap", "tick"])  # fmt: skip
        job_id = rng.choice(ids)
        if op == "enqueue":
            storage.enqueue(Q, job(job_id, max_attempts=2, max_stalls=1,
                                   delay=rng.choice([0, 0, 500])))  # fmt: skip
        elif op == "claim":
            for c in storage.claim(Q, "w1", rng.randint(1, 3), 2_000).jobs:
                held[c.job_id] = c.token
        elif op in ("complete", "fail", "release") and held:
            job_id = rng.choice(sorted(held))
            token = held.pop(job_id)
            if op == "complete":
                storage.complete(Q, job_id, token, b"1")
            elif op == "fail":
                storage.fail(Q, job_id, token, ERROR, retry_in=rng.choice([0, 300]),
                             permanent=rng.random() < 0.2)  # fmt: skip
            else:
                storage.release(Q, job_id, token)
        elif op == "cancel":
            storage.cancel(Q, job_id)
        elif op == "reap":
            storage.reap(Q)
        else:
            clock.advance(rng.choice([100, 700, 2_500]))
        records = {i: storage.get_record(Q, i) for i in ids}
        for i, rec in records.items():
            if rec is None:
                continue
            before = seen.get(i)
            if before is not None and before != rec.state:
                # A claim followed by a fail or stall can pass through a state within one step.
                assert can_transition(before, rec.state) or _two_steps(before, rec.state), (
                    f"{i}: {before} -> {rec.state} after {op}"
                )
            seen[i] = rec.state
        live = [r.state for r in records.values() if r is not None]
        counts = storage.counts(Q)
        for state in (JobState.QUEUED, JobState.ACTIVE, JobState.SCHEDULED, JobState.RETRYING):
            assert counts[state] == live.count(state), (state, op, counts)


def _two_steps(src: JobState, dst: JobState) -> bool:
    return any(can_transition(src, mid) and can_transition(mid, dst) for mid in JobState)
