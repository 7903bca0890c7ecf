"""The scheduling and flow-control contract (issue 4 in ``django_jobq/storage/base.py``), run
against every backend.

Like ``test_storage_contract.py`` this suite talks to ``Storage`` alone and drives time with the
injected fake clock, so one test means the same thing on every backend. Where ``base.py`` leaves
a choice open, the test pins the behaviour a job-queue user would expect, so that every
backend makes the same choice (the less obvious ones are marked "Decision:").
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from django_jobq.errors import QueueBusy
from django_jobq.job import (
    AckOutcome,
    CancelOutcome,
    ChangeOutcome,
    Dedup,
    DedupMode,
    EnqueueOutcome,
    JobOptions,
    JobUpdate,
    NewJob,
    QueueLimits,
    RunAtUpdate,
)
from django_jobq.states import TERMINAL_STATES, JobState, can_transition
from django_jobq.storage.base import Ack

from ..helpers import PATIENCE
from .conftest import LONG_WAIT

Q = "sched-q"
LEASE = 10_000
ERROR = b'{"type": "ValueError", "message": "boom"}'


def job(job_id: str, payload: bytes = b'{"n": 1}', **kwargs) -> NewJob:
    """A NewJob; JobOptions fields go to its options, ``update`` may be a dict of JobUpdate
    fields and ``dedup`` a ``(key, mode, ttl)`` tuple, the rest are NewJob fields."""
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in JobOptions.__dataclass_fields__}
    if isinstance(kwargs.get("update"), dict):
        kwargs["update"] = JobUpdate(**kwargs["update"])
    if isinstance(kwargs.get("dedup"), tuple):
        key, mode, ttl = kwargs["dedup"]
        kwargs["dedup"] = Dedup(key, DedupMode(mode), ttl)
    return NewJob(job_id, payload, JobOptions(**options), **kwargs)


def claim_ids(storage, count: int = 100, queue: str = Q, worker: str = "w1") -> list[str]:
    return [j.job_id for j in storage.claim(queue, worker, count, LEASE).jobs]


def claim_one(storage, queue: str = Q, worker: str = "w1"):
    jobs = storage.claim(queue, worker, 1, LEASE).jobs
    assert len(jobs) == 1, "expected one claimable job"
    return jobs[0]


def state(storage, job_id: str) -> JobState:
    return storage.get_record(Q, job_id).state


def kinds(storage, job_id: str | None = None) -> list[tuple[str, str]]:
    return [(e.job_id, e.kind) for e in storage.read_events(Q) if job_id in (None, e.job_id)]


def stored(result) -> tuple[EnqueueOutcome, str, JobState]:
    return (result.outcome, result.job_id, result.state)


# -- ordering ---------------------------------------------------------------------------------


def test_lifo_jobs_run_before_fifo_jobs_of_their_priority_newest_first(storage):
    storage.enqueue(Q, job("f1"))
    storage.enqueue(Q, job("l1", lifo=True))
    storage.enqueue(Q, job("y", priority=1, lifo=True))
    storage.enqueue(Q, job("f2"))
    storage.enqueue(Q, job("l2", lifo=True))
    storage.enqueue(Q, job("x", priority=-1))
    storage.enqueue(Q, job("l3", lifo=True))
    assert claim_ids(storage, 2) == ["x", "l3"]
    assert claim_ids(storage) == ["l2", "l1", "f1", "f2", "y"]


def test_record_carries_the_scheduling_fields(storage):
    storage.enqueue(
        Q, job("a", lifo=True, group="cust-1", dedup=("k1", "simple", None), min_backoff=7,
               max_backoff=70)
    )  # fmt: skip
    rec = storage.get_record(Q, "a")
    assert (rec.lifo, rec.group, rec.dedup_key) == (True, "cust-1", "k1")
    assert (rec.min_backoff, rec.max_backoff, rec.has_successor) == (7, 70, False)
    storage.enqueue(Q, job("b"))
    rec = storage.get_record(Q, "b")
    assert (rec.lifo, rec.group, rec.dedup_key, rec.has_successor) == (False, None, None, False)


def test_a_promoted_job_keeps_the_place_it_got_at_enqueue(storage, clock):
    storage.enqueue(Q, job("early-delayed", delay=1_000))
    storage.enqueue(Q, job("q1"))
    storage.enqueue(Q, job("urgent-delayed", delay=1_000, priority=-1))
    storage.enqueue(Q, job("q2"))
    storage.enqueue(Q, job("late-delayed", delay=1_000))
    clock.advance(1_000)
    assert claim_ids(storage) == ["urgent-delayed", "early-delayed", "q1", "q2", "late-delayed"]


def test_released_and_stalled_jobs_keep_their_place(storage, clock):
    for job_id in ("a", "b", "c", "d"):
        storage.enqueue(Q, job(job_id))
    a, b = storage.claim(Q, "w1", 2, LEASE).jobs
    storage.release(Q, "b", b.token)
    clock.advance(LEASE)
    assert storage.reap(Q).requeued == ["a"]
    assert claim_ids(storage) == ["a", "b", "c", "d"]


def test_retried_and_postponed_jobs_keep_their_place(storage, clock):
    for job_id in ("a", "b", "c"):
        storage.enqueue(Q, job(job_id))
    a, b = storage.claim(Q, "w1", 2, LEASE).jobs
    storage.fail(Q, "a", a.token, ERROR, retry_in=500)
    storage.postpone(Q, "b", b.token, 500)
    storage.enqueue(Q, job("d"))
    clock.advance(500)
    assert claim_ids(storage) == ["a", "b", "c", "d"]


def test_a_priority_change_keeps_the_fifo_place(storage):
    storage.enqueue(Q, job("a", priority=1))
    storage.enqueue(Q, job("b"))
    storage.enqueue(Q, job("c"))
    storage.enqueue(Q, job("d", priority=1))
    assert storage.change(Q, "c", priority=1) is ChangeOutcome.CHANGED
    assert storage.change(Q, "d", priority=-1) is ChangeOutcome.CHANGED
    assert storage.get_record(Q, "c").priority == 1
    assert claim_ids(storage) == ["d", "b", "a", "c"]


def test_a_lifo_job_stays_lifo_through_a_priority_change(storage):
    storage.enqueue(Q, job("f"))
    storage.enqueue(Q, job("l-old", lifo=True, priority=3))
    storage.enqueue(Q, job("l-new", lifo=True))
    storage.change(Q, "l-old", priority=0)
    assert claim_ids(storage) == ["l-new", "l-old", "f"]


# -- update of a waiting job -----------------------------------------------------------------


def test_update_data_replaces_payload_and_content_type(storage):
    storage.enqueue(Q, job("a", b'"old"'))
    again = storage.enqueue(Q, job("a", b'"new"', content_type="msgpack", update={"data": True}))
    assert stored(again) == (EnqueueOutcome.UPDATED, "a", JobState.QUEUED)
    rec = storage.get_record(Q, "a")
    assert (bytes(rec.payload), rec.content_type) == (b'"new"', "msgpack")
    c = claim_one(storage)
    assert (bytes(c.payload), c.content_type) == (b'"new"', "msgpack")


def test_update_without_flags_is_a_plain_duplicate(storage):
    storage.enqueue(Q, job("a", b'"old"'))
    again = storage.enqueue(Q, job("a", b'"new"', max_attempts=9))
    assert stored(again) == (EnqueueOutcome.DUPLICATE, "a", JobState.QUEUED)
    assert bytes(storage.get_record(Q, "a").payload) == b'"old"'


def test_update_run_at_yes_moves_the_due_time_both_ways(storage, clock):
    storage.enqueue(Q, job("q"))
    storage.enqueue(Q, job("s", delay=5_000))
    yes = {"run_at": RunAtUpdate.YES}
    pushed = storage.enqueue(Q, job("q", delay=3_000, update=yes))
    assert stored(pushed) == (EnqueueOutcome.UPDATED, "q", JobState.SCHEDULED)
    assert storage.get_record(Q, "q").run_at == clock.now + 3_000
    assert kinds(storage, "q")[-1] == ("q", "scheduled")
    now = storage.enqueue(Q, job("s", update=yes))
    assert stored(now) == (EnqueueOutcome.UPDATED, "s", JobState.QUEUED)
    assert kinds(storage, "s")[-1] == ("s", "queued")
    earlier = storage.enqueue(Q, job("q", run_at=clock.now + 1_000, update=yes))
    assert stored(earlier) == (EnqueueOutcome.UPDATED, "q", JobState.SCHEDULED)
    assert claim_ids(storage) == ["s"]
    clock.advance(999)
    assert claim_ids(storage) == []
    clock.advance(1)
    assert claim_ids(storage) == ["q"]


def test_update_run_at_if_later_and_if_earlier(storage, clock):
    storage.enqueue(Q, job("s", delay=5_000))
    storage.enqueue(Q, job("q"))
    later, earlier = {"run_at": RunAtUpdate.IF_LATER}, {"run_at": RunAtUpdate.IF_EARLIER}
    # Not later / not earlier: nothing to change, so a duplicate that writes nothing.
    assert storage.enqueue(Q, job("s", delay=4_000, update=later)).outcome is (
        EnqueueOutcome.DUPLICATE
    )
    assert storage.enqueue(Q, job("s", delay=6_000, update=earlier)).outcome is (
        EnqueueOutcome.DUPLICATE
    )
    assert storage.get_record(Q, "s").run_at == clock.now + 5_000
    assert stored(storage.enqueue(Q, job("s", delay=6_000, update=later))) == (
        EnqueueOutcome.UPDATED, "s", JobState.SCHEDULED,
    )  # fmt: skip
    assert storage.get_record(Q, "s").run_at == clock.now + 6_000
    assert stored(storage.enqueue(Q, job("s", delay=2_000, update=earlier))) == (
        EnqueueOutcome.UPDATED, "s", JobState.SCHEDULED,
    )  # fmt: skip
    assert storage.get_record(Q, "s").run_at == clock.now + 2_000
    assert stored(storage.enqueue(Q, job("s", update=earlier))) == (
        EnqueueOutcome.UPDATED, "s", JobState.QUEUED,
    )  # fmt: skip
    # A queued job is due "now": nothing is earlier, anything in the future is later.
    assert storage.enqueue(Q, job("q", update=earlier)).outcome is EnqueueOutcome.DUPLICATE
    assert storage.enqueue(Q, job("q", delay=1_000, update=earlier)).outcome is (
        EnqueueOutcome.DUPLICATE
    )
    assert stored(storage.enqueue(Q, job("q", delay=1_000, update=later))) == (
        EnqueueOutcome.UPDATED, "q", JobState.SCHEDULED,
    )  # fmt: skip


def test_update_of_a_retrying_job(storage, clock):
    storage.enqueue(Q, job("a", max_attempts=2, min_backoff=10, max_backoff=20))
    storage.fail(Q, "a", claim_one(storage).token, ERROR, retry_in=5_000)
    out = storage.enqueue(
        Q, job("a", b'"v2"', delay=8_000, max_attempts=5, min_backoff=100, max_backoff=900,
               update={"data": True, "run_at": RunAtUpdate.YES, "max_attempts": True,
                       "backoff": True, "reset_counts": True})
    )  # fmt: skip
    assert stored(out) == (EnqueueOutcome.UPDATED, "a", JobState.RETRYING)  # stays retrying
    rec = storage.get_record(Q, "a")
    assert (rec.state, rec.run_at, rec.attempts, rec.max_attempts) == (
        JobState.RETRYING, clock.now + 8_000, 0, 5,
    )  # fmt: skip
    assert (rec.min_backoff, rec.max_backoff, bytes(rec.payload)) == (100, 900, b'"v2"')
    clock.advance(5_000)
    assert claim_ids(storage) == []
    clock.advance(3_000)
    c = claim_one(storage)
    assert (c.attempt, c.max_attempts, c.min_backoff, c.max_backoff) == (1, 5, 100, 900)
    assert bytes(c.payload) == b'"v2"'


def test_update_of_a_retrying_job_to_now_queues_it(storage):
    storage.enqueue(Q, job("a", max_attempts=2))
    storage.fail(Q, "a", claim_one(storage).token, ERROR, retry_in=60_000)
    out = storage.enqueue(Q, job("a", update={"run_at": RunAtUpdate.YES}))
    assert stored(out) == (EnqueueOutcome.UPDATED, "a", JobState.QUEUED)
    assert claim_one(storage).attempt == 2


def test_reset_counts_clears_attempts_and_stalls(storage, clock):
    storage.enqueue(Q, job("a", max_stalls=1))
    claim_one(storage)
    clock.advance(LEASE)
    storage.reap(Q)
    assert storage.get_record(Q, "a").stalls == 1
    out = storage.enqueue(Q, job("a", update={"reset_counts": True}))
    assert out.outcome is EnqueueOutcome.UPDATED
    assert storage.get_record(Q, "a").stalls == 0
    # Decision: an update whose fields already hold the new values has nothing to change
    # and is a duplicate (same payload, same max_attempts, counts already 0).
    for update in ({"reset_counts": True}, {"data": True}, {"max_attempts": True},
                   {"backoff": True}):  # fmt: skip
        out = storage.enqueue(Q, job("a", update=update))
        assert stored(out) == (EnqueueOutcome.DUPLICATE, "a", JobState.QUEUED), update


def test_update_never_touches_an_active_or_finished_job(storage):
    storage.enqueue(Q, job("a", b'"old"'))
    storage.enqueue(Q, job("done"))
    storage.enqueue(Q, job("gone", max_attempts=1))
    storage.enqueue(Q, job("cancelled"))
    storage.cancel(Q, "cancelled")
    claimed = {c.job_id: c for c in storage.claim(Q, "w1", 3, LEASE).jobs}
    storage.complete(Q, "done", claimed["done"].token, b'"r"')
    storage.fail(Q, "gone", claimed["gone"].token, ERROR)
    everything = {"data": True, "run_at": RunAtUpdate.YES, "max_attempts": True,
                  "backoff": True, "reset_counts": True}  # fmt: skip
    active = storage.enqueue(Q, job("a", b'"new"', delay=500, max_attempts=9, update=everything))
    assert stored(active) == (EnqueueOutcome.DUPLICATE, "a", JobState.ACTIVE)
    rec = storage.get_record(Q, "a")
    assert (rec.state, bytes(rec.payload), rec.max_attempts, rec.attempts) == (
        JobState.ACTIVE, b'"old"', 3, 1,
    )  # fmt: skip
    done = storage.enqueue(Q, job("done", update=everything))
    assert (done.outcome, done.state, bytes(done.result)) == (
        EnqueueOutcome.COMPLETED, JobState.COMPLETED, b'"r"',
    )  # fmt: skip
    assert storage.enqueue(Q, job("gone", update=everything)).outcome is EnqueueOutcome.DUPLICATE
    assert storage.get_record(Q, "gone").state is JobState.FAILED
    out = storage.enqueue(Q, job("cancelled", update=everything))
    assert (out.outcome, out.state) == (EnqueueOutcome.DUPLICATE, JobState.CANCELLED)


# -- singleton ----------------------------------------------------------------------------------


def test_singleton_of_an_active_id_stores_a_blocked_successor(storage, clock):
    storage.enqueue(Q, job("s", b'"run-1"'))
    first = claim_one(storage)
    out = storage.enqueue(Q, job("s", b'"run-2"', singleton=True))
    assert stored(out) == (EnqueueOutcome.QUEUED, "s", JobState.BLOCKED)
    assert kinds(storage, "s")[-1] == ("s", "blocked")
    assert storage.counts(Q)[JobState.BLOCKED] == 1
    rec = storage.get_record(Q, "s")
    assert (rec.state, rec.has_successor, bytes(rec.payload)) == (
        JobState.ACTIVE, True, b'"run-1"',
    )  # fmt: skip
    again = storage.enqueue(Q, job("s", b'"run-3"', singleton=True))
    assert stored(again) == (EnqueueOutcome.DUPLICATE, "s", JobState.BLOCKED)
    assert storage.claim(Q, "w2", 10, LEASE).jobs == []  # never two runs of one id
    clock.advance(100)
    assert storage.complete(Q, "s", first.token, b'"r1"') is AckOutcome.COMPLETED
    rec = storage.get_record(Q, "s")
    assert (rec.state, rec.attempts, rec.stalls, rec.has_successor) == (
        JobState.QUEUED, 0, 0, False,
    )  # fmt: skip
    assert (bytes(rec.payload), rec.result) == (b'"run-2"', None)
    assert abs(rec.created_at - clock.now) <= 1  # created when it took over the id
    assert kinds(storage, "s")[-2:] == [("s", "completed"), ("s", "queued")]
    counts = storage.counts(Q)
    assert (counts[JobState.BLOCKED], counts[JobState.QUEUED], counts[JobState.COMPLETED]) == (
        0, 1, 1,
    )  # fmt: skip
    second = claim_one(storage)
    assert (second.job_id, bytes(second.payload), second.attempt) == ("s", b'"run-2"', 1)
    assert second.token != first.token
    assert storage.complete(Q, "s", first.token, b'"late"') is AckOutcome.LEASE_LOST
    assert storage.heartbeat(Q, "w1", [("s", first.token)], LEASE) == [("s", first.token)]
    assert storage.get_record(Q, "s").state is JobState.ACTIVE


def test_singleton_successor_takes_its_own_options_due_time_and_order_key(storage, clock):
    storage.enqueue(Q, job("s", max_attempts=1))
    first = claim_one(storage)
    storage.enqueue(Q, job("s", b'"next"', singleton=True, max_attempts=4, priority=2,
                           delay=5_000))  # fmt: skip
    storage.enqueue(Q, job("later-p2", priority=2))
    clock.advance(1_000)
    storage.complete(Q, "s", first.token, b"1")
    rec = storage.get_record(Q, "s")
    assert (rec.state, rec.run_at, rec.max_attempts, rec.priority) == (
        JobState.SCHEDULED, clock.now + 4_000, 4, 2,
    )  # fmt: skip
    assert kinds(storage, "s")[-1] == ("s", "scheduled")
    assert claim_ids(storage) == ["later-p2"]
    clock.advance(4_000)
    storage.enqueue(Q, job("even-later-p2", priority=2))
    assert claim_ids(storage) == ["s", "even-later-p2"]


def test_singleton_successor_due_in_the_past_is_queued_in_its_place(storage, clock):
    storage.enqueue(Q, job("s"))
    first = claim_one(storage)
    storage.enqueue(Q, job("s", singleton=True, delay=1_000))
    storage.enqueue(Q, job("other"))
    clock.advance(2_000)
    storage.complete(Q, "s", first.token, b"1")
    assert state(storage, "s") is JobState.QUEUED
    assert claim_ids(storage) == ["s", "other"]  # its order key is from its enqueue


def test_singleton_update_applies_to_the_successor(storage):
    storage.enqueue(Q, job("s", b'"run-1"'))
    first = claim_one(storage)
    storage.enqueue(Q, job("s", b'"run-2"', singleton=True))
    out = storage.enqueue(Q, job("s", b'"run-3"', singleton=True, update={"data": True}))
    assert stored(out) == (EnqueueOutcome.UPDATED, "s", JobState.BLOCKED)
    assert bytes(storage.get_record(Q, "s").payload) == b'"run-1"'  # the active run's
    # Without singleton the id rules see an active job: an update never touches it.
    out = storage.enqueue(Q, job("s", b'"run-4"', update={"data": True}))
    assert stored(out) == (EnqueueOutcome.DUPLICATE, "s", JobState.ACTIVE)
    storage.complete(Q, "s", first.token, b"1")
    assert bytes(claim_one(storage).payload) == b'"run-3"'


def test_singleton_of_a_waiting_or_finished_id_follows_the_id_rules(storage):
    storage.enqueue(Q, job("w"))
    out = storage.enqueue(Q, job("w", singleton=True))
    assert stored(out) == (EnqueueOutcome.DUPLICATE, "w", JobState.QUEUED)
    out = storage.enqueue(Q, job("w", b'"v2"', singleton=True, update={"data": True}))
    assert stored(out) == (EnqueueOutcome.UPDATED, "w", JobState.QUEUED)
    storage.complete(Q, "w", claim_one(storage).token, b'"r"')
    out = storage.enqueue(Q, job("w", singleton=True))
    assert (out.outcome, out.state, bytes(out.result)) == (
        EnqueueOutcome.COMPLETED, JobState.COMPLETED, b'"r"',
    )  # fmt: skip
    out = storage.enqueue(Q, job("fresh", singleton=True))
    assert stored(out) == (EnqueueOutcome.QUEUED, "fresh", JobState.QUEUED)
    assert storage.counts(Q)[JobState.BLOCKED] == 0


def test_singleton_successor_waits_while_the_active_job_retries(storage, clock):
    storage.enqueue(Q, job("s", b'"run-1"', max_attempts=2, max_stalls=1))
    first = claim_one(storage)
    storage.enqueue(Q, job("s", b'"run-2"', singleton=True))
    storage.fail(Q, "s", first.token, ERROR, retry_in=100)
    rec = storage.get_record(Q, "s")
    assert (rec.state, rec.has_successor) == (JobState.RETRYING, True)
    assert storage.counts(Q)[JobState.BLOCKED] == 1
    clock.advance(100)
    retry = claim_one(storage)
    assert (bytes(retry.payload), retry.attempt) == (b'"run-1"', 2)
    clock.advance(LEASE)  # a stall that requeues is not final either
    assert storage.reap(Q).requeued == ["s"]
    assert storage.get_record(Q, "s").has_successor
    third = claim_one(storage)
    assert bytes(third.payload) == b'"run-1"'
    assert storage.claim(Q, "w2", 10, LEASE).jobs == []
    assert storage.fail(Q, "s", third.token, ERROR) is AckOutcome.FAILED
    rec = storage.get_record(Q, "s")
    assert (rec.state, bytes(rec.payload), rec.attempts, rec.stalls, rec.error) == (
        JobState.QUEUED, b'"run-2"', 0, 0, None,
    )  # fmt: skip
    assert storage.counts(Q)[JobState.FAILED] == 1


def test_singleton_successor_replaces_a_job_that_stalled_out(storage, clock):
    storage.enqueue(Q, job("s", b'"run-1"', max_stalls=0))
    claim_one(storage)
    storage.enqueue(Q, job("s", b'"run-2"', singleton=True))
    clock.advance(LEASE)
    assert storage.reap(Q).failed == ["s"]
    rec = storage.get_record(Q, "s")
    assert (rec.state, bytes(rec.payload), rec.stalls, rec.has_successor) == (
        JobState.QUEUED, b'"run-2"', 0, False,
    )  # fmt: skip
    assert bytes(claim_one(storage).payload) == b'"run-2"'


def test_postpone_keeps_the_successor_blocked(storage, clock):
    storage.enqueue(Q, job("s", b'"run-1"'))
    first = claim_one(storage)
    storage.enqueue(Q, job("s", b'"run-2"', singleton=True))
    assert storage.postpone(Q, "s", first.token, 1_000) is AckOutcome.POSTPONED
    rec = storage.get_record(Q, "s")
    assert (rec.state, rec.has_successor) == (JobState.SCHEDULED, True)
    clock.advance(1_000)
    again = claim_one(storage)
    assert bytes(again.payload) == b'"run-1"'
    storage.complete(Q, "s", again.token, b"1")
    assert bytes(claim_one(storage).payload) == b'"run-2"'


def test_cancel_of_an_id_with_a_successor_cancels_the_successor_only(storage):
    storage.enqueue(Q, job("s"))
    first = claim_one(storage)
    storage.enqueue(Q, job("s", b'"run-2"', singleton=True))
    assert storage.cancel(Q, "s") is CancelOutcome.CANCELLED
    rec = storage.get_record(Q, "s")
    assert (rec.state, rec.has_successor) == (JobState.ACTIVE, False)
    assert storage.counts(Q)[JobState.BLOCKED] == 0
    assert storage.cancel(Q, "s") is CancelOutcome.ACTIVE  # nothing left to cancel
    assert storage.complete(Q, "s", first.token, b'"r"') is AckOutcome.COMPLETED
    assert state(storage, "s") is JobState.COMPLETED
    assert claim_ids(storage) == []


def test_change_applies_to_the_blocked_successor(storage, clock):
    storage.enqueue(Q, job("s"))
    first = claim_one(storage)
    storage.enqueue(Q, job("s", singleton=True))
    storage.enqueue(Q, job("other"))
    assert storage.change(Q, "s", run_at=clock.now + 3_000) is ChangeOutcome.CHANGED
    assert storage.change(Q, "s", priority=-5) is ChangeOutcome.CHANGED
    rec = storage.get_record(Q, "s")
    assert (rec.state, rec.priority) == (JobState.ACTIVE, 0)  # the active run is untouched
    storage.complete(Q, "s", first.token, b"1")
    rec = storage.get_record(Q, "s")
    assert (rec.state, rec.priority, rec.run_at) == (JobState.SCHEDULED, -5, clock.now + 3_000)
    assert claim_ids(storage) == ["other"]
    clock.advance(3_000)
    storage.enqueue(Q, job("newer"))
    assert claim_ids(storage) == ["s", "newer"]


def test_waiter_of_the_active_run_gets_its_outcome_not_the_successors(live_storage):
    live_storage.enqueue(Q, job("s", waiter=True))
    first = live_storage.claim(Q, "w1", 1, LEASE).jobs[0]
    live_storage.enqueue(Q, job("s", b'"run-2"', singleton=True))
    timer = threading.Timer(0.1, live_storage.complete, (Q, "s", first.token, b'"r1"'))
    timer.start()
    outcome = live_storage.wait_for_outcome(Q, "s", 5)
    timer.join()
    assert outcome is not None
    assert (outcome.state, bytes(outcome.result)) == (JobState.COMPLETED, b'"r1"')
    assert live_storage.get_record(Q, "s").state is JobState.QUEUED  # the successor


# -- change -------------------------------------------------------------------------------------


def test_change_run_at_of_a_scheduled_job(storage, clock):
    storage.enqueue(Q, job("s", delay=5_000))
    assert storage.change(Q, "s", run_at=clock.now + 9_000) is ChangeOutcome.CHANGED
    assert storage.get_record(Q, "s").run_at == clock.now + 9_000
    assert kinds(storage, "s")[-1] == ("s", "scheduled")
    clock.advance(5_000)
    assert claim_ids(storage) == []
    assert storage.change(Q, "s", run_at=clock.now + 1_000) is ChangeOutcome.CHANGED
    batch = storage.claim(Q, "w1", 5, LEASE)
    assert batch.jobs == [] and 990 <= batch.next_due_in <= 1_000
    assert storage.change(Q, "s", run_at=0) is ChangeOutcome.CHANGED  # promote
    assert state(storage, "s") is JobState.QUEUED
    assert kinds(storage, "s")[-1] == ("s", "queued")
    assert claim_ids(storage) == ["s"]


def test_change_run_at_of_a_queued_job(storage, clock):
    storage.enqueue(Q, job("a"))
    storage.enqueue(Q, job("b"))
    assert storage.change(Q, "a", run_at=clock.now + 1_000) is ChangeOutcome.CHANGED
    rec = storage.get_record(Q, "a")
    assert (rec.state, rec.run_at) == (JobState.SCHEDULED, clock.now + 1_000)
    assert kinds(storage, "a")[-1] == ("a", "scheduled")
    assert claim_ids(storage) == ["b"]
    storage.enqueue(Q, job("c"))
    assert storage.change(Q, "c", run_at=clock.now) is ChangeOutcome.CHANGED  # already queued
    assert state(storage, "c") is JobState.QUEUED
    clock.advance(1_000)
    assert claim_ids(storage) == ["a", "c"]


def test_change_run_at_of_a_retrying_job(storage, clock):
    storage.enqueue(Q, job("r", max_attempts=3))
    storage.fail(Q, "r", claim_one(storage).token, ERROR, retry_in=1_000)
    assert storage.change(Q, "r", run_at=clock.now + 5_000) is ChangeOutcome.CHANGED
    rec = storage.get_record(Q, "r")
    assert (rec.state, rec.run_at) == (JobState.RETRYING, clock.now + 5_000)
    clock.advance(1_000)
    assert claim_ids(storage) == []
    assert storage.change(Q, "r", run_at=clock.now - 1) is ChangeOutcome.CHANGED
    assert state(storage, "r") is JobState.QUEUED
    assert claim_one(storage).attempt == 2


def test_change_priority_of_a_scheduled_job_applies_when_it_is_due(storage, clock):
    storage.enqueue(Q, job("s", delay=1_000))
    storage.enqueue(Q, job("q"))
    storage.change(Q, "s", priority=5)
    clock.advance(1_000)
    assert claim_ids(storage) == ["q", "s"]


def test_change_outcomes_of_jobs_that_are_not_waiting(storage):
    for job_id in ("active", "done", "failed", "cancelled"):
        storage.enqueue(Q, job(job_id, max_attempts=1))
    storage.cancel(Q, "cancelled")
    claimed = {c.job_id: c for c in storage.claim(Q, "w1", 3, LEASE).jobs}
    storage.complete(Q, "done", claimed["done"].token, b"1")
    storage.fail(Q, "failed", claimed["failed"].token, ERROR)
    expected = {"active": ChangeOutcome.ACTIVE, "done": ChangeOutcome.COMPLETED,
                "failed": ChangeOutcome.FAILED, "cancelled": ChangeOutcome.CANCELLED,
                "ghost": ChangeOutcome.NOT_FOUND}  # fmt: skip
    for job_id, outcome in expected.items():
        assert storage.change(Q, job_id, run_at=0) is outcome, job_id
        assert storage.change(Q, job_id, priority=3) is outcome, job_id
    assert storage.get_record(Q, "active").priority == 0


# -- dedup keys ---------------------------------------------------------------------------------


def test_simple_dedup_key_is_held_until_the_holder_finishes(storage):
    first = storage.enqueue(Q, job("a", dedup=("k", "simple", None)))
    assert stored(first) == (EnqueueOutcome.QUEUED, "a", JobState.QUEUED)
    repeat = storage.enqueue(Q, job("b", b'"other"', dedup=("k", "simple", None)))
    assert stored(repeat) == (EnqueueOutcome.DUPLICATE, "a", JobState.QUEUED)
    assert storage.get_record(Q, "b") is None
    c = claim_one(storage)
    assert storage.enqueue(Q, job("b", dedup=("k", "simple", None))).state is JobState.ACTIVE
    storage.fail(Q, "a", c.token, ERROR, retry_in=0)  # retrying: still held
    assert stored(storage.enqueue(Q, job("b", dedup=("k", "simple", None)))) == (
        EnqueueOutcome.DUPLICATE, "a", JobState.RETRYING,
    )  # fmt: skip
    storage.complete(Q, "a", claim_one(storage).token, b"1")
    free = storage.enqueue(Q, job("b", dedup=("k", "simple", None)))
    assert stored(free) == (EnqueueOutcome.QUEUED, "b", JobState.QUEUED)
    assert storage.get_record(Q, "b").dedup_key == "k"
    storage.cancel(Q, "b")  # cancelled is final too
    assert storage.enqueue(Q, job("c", dedup=("k", "simple", None))).outcome is (
        EnqueueOutcome.QUEUED
    )


def test_simple_dedup_key_with_ttl_is_free_when_the_ttl_passes(storage, clock):
    storage.enqueue(Q, job("a", delay=60_000, dedup=("k", "simple", 1_000)))
    clock.advance(999)
    assert storage.enqueue(Q, job("b", dedup=("k", "simple", 1_000))).job_id == "a"
    clock.advance(1)
    out = storage.enqueue(Q, job("b", dedup=("k", "simple", 1_000)))
    assert stored(out) == (EnqueueOutcome.QUEUED, "b", JobState.QUEUED)
    assert state(storage, "a") is JobState.SCHEDULED  # the old holder is not touched


def test_dedup_keys_are_per_queue_and_checked_after_the_id(storage):
    storage.enqueue(Q, job("a", dedup=("k", "simple", None)))
    assert storage.enqueue("other-q", job("b", dedup=("k", "simple", None))).outcome is (
        EnqueueOutcome.QUEUED
    )
    # The id rules come first: the same id is a duplicate of itself, whatever its key.
    out = storage.enqueue(Q, job("a", dedup=("k2", "simple", None)))
    assert stored(out) == (EnqueueOutcome.DUPLICATE, "a", JobState.QUEUED)
    assert storage.enqueue(Q, job("c", dedup=("k2", "simple", None))).outcome is (
        EnqueueOutcome.QUEUED
    )


def test_throttle_key_is_held_for_its_ttl_whatever_the_holder_does(storage, clock):
    assert storage.enqueue(Q, job("a", dedup=("t", "throttle", 1_000))).outcome is (
        EnqueueOutcome.QUEUED
    )
    storage.complete(Q, "a", claim_one(storage).token, b'"r"')
    clock.advance(999)
    # Decision: a throttled repeat is DUPLICATE even when the holder completed.
    out = storage.enqueue(Q, job("b", dedup=("t", "throttle", 1_000)))
    assert stored(out) == (EnqueueOutcome.DUPLICATE, "a", JobState.COMPLETED)
    assert storage.get_record(Q, "b") is None
    clock.advance(1)
    out = storage.enqueue(Q, job("b", dedup=("t", "throttle", 1_000)))
    assert stored(out) == (EnqueueOutcome.QUEUED, "b", JobState.QUEUED)
    # The window counts from the holder's enqueue, not from the repeats.
    clock.advance(600)
    assert storage.enqueue(Q, job("c", dedup=("t", "throttle", 1_000))).job_id == "b"
    clock.advance(400)
    assert storage.enqueue(Q, job("c", dedup=("t", "throttle", 1_000))).job_id == "c"
    assert state(storage, "b") is JobState.QUEUED


def test_debounce_replaces_the_waiting_holder_and_restarts_the_window(storage, clock):
    t0 = clock.now
    first = storage.enqueue(Q, job("a", b'"v1"', dedup=("d", "debounce", 1_000)))
    assert stored(first) == (EnqueueOutcome.QUEUED, "a", JobState.SCHEDULED)
    assert storage.get_record(Q, "a").run_at == t0 + 1_000
    clock.advance(500)
    out = storage.enqueue(Q, job("b", b'"v2"', content_type="msgpack",
                                 dedup=("d", "debounce", 1_000)))  # fmt: skip
    assert stored(out) == (EnqueueOutcome.UPDATED, "a", JobState.SCHEDULED)
    assert storage.get_record(Q, "b") is None
    rec = storage.get_record(Q, "a")
    assert (bytes(rec.payload), rec.content_type, rec.run_at) == (b'"v2"', "msgpack", t0 + 1_500)
    clock.advance(999)
    assert claim_ids(storage) == []
    # 1499 ms after the first enqueue, 999 after the latest: the window is still open.
    out = storage.enqueue(Q, job("c", b'"v3"', delay=2_000, dedup=("d", "debounce", 1_000)))
    assert stored(out) == (EnqueueOutcome.UPDATED, "a", JobState.SCHEDULED)
    assert storage.get_record(Q, "a").run_at == clock.now + 2_000  # the repeat's due time
    clock.advance(2_000)
    c = claim_one(storage)
    assert (c.job_id, bytes(c.payload), c.attempt) == ("a", b'"v3"', 1)


def test_debounce_when_the_holder_no_longer_waits_stores_a_new_job(storage, clock):
    storage.enqueue(Q, job("a", b'"v1"', dedup=("d", "debounce", 1_000)))
    assert storage.change(Q, "a", run_at=0) is ChangeOutcome.CHANGED  # runs early,
    running = claim_one(storage)
    clock.advance(10)  # so its window (until +1000) is still open while it is active
    out = storage.enqueue(Q, job("b", b'"v2"', dedup=("d", "debounce", 1_000)))
    assert stored(out) == (EnqueueOutcome.QUEUED, "b", JobState.SCHEDULED)
    assert storage.get_record(Q, "b").dedup_key == "d"
    out = storage.enqueue(Q, job("c", b'"v3"', dedup=("d", "debounce", 1_000)))
    assert stored(out) == (EnqueueOutcome.UPDATED, "b", JobState.SCHEDULED)  # b holds it now
    rec = storage.get_record(Q, "a")
    assert (rec.state, bytes(rec.payload)) == (JobState.ACTIVE, b'"v1"')
    storage.complete(Q, "a", running.token, b"1")
    storage.change(Q, "b", run_at=0)
    b = claim_one(storage)
    assert (b.job_id, bytes(b.payload)) == ("b", b'"v3"')
    storage.complete(Q, "b", b.token, b"1")
    clock.advance(10)  # b's window is open, but b has finished
    out = storage.enqueue(Q, job("e", dedup=("d", "debounce", 1_000)))
    assert stored(out) == (EnqueueOutcome.QUEUED, "e", JobState.SCHEDULED)


def test_key_of_a_cleaned_or_expired_holder_is_free(storage, clock):
    storage.enqueue(Q, job("a", dedup=("t", "throttle", 60_000)))
    storage.complete(Q, "a", claim_one(storage).token, b"1")
    assert storage.enqueue(Q, job("b", dedup=("t", "throttle", 60_000))).job_id == "a"
    assert storage.clean(Q, 0) == 1
    out = storage.enqueue(Q, job("b", dedup=("t", "throttle", 60_000)))
    assert stored(out) == (EnqueueOutcome.QUEUED, "b", JobState.QUEUED)

    storage.enqueue(Q, job("x", result_ttl=50, dedup=("s", "throttle", 60_000)))
    storage.cancel(Q, "x")
    # Redis expires by its own clock (PEXPIRE), the others by the storage clock: move both.
    clock.advance(100)
    time.sleep(0.12)
    storage.reap(Q)
    assert storage.get_record(Q, "x") is None
    out = storage.enqueue(Q, job("y", dedup=("s", "throttle", 60_000)))
    assert stored(out) == (EnqueueOutcome.QUEUED, "y", JobState.QUEUED)


# -- limits -------------------------------------------------------------------------------------


def test_limits_round_trip(storage):
    assert storage.get_limits(Q) == QueueLimits()
    limits = QueueLimits(rate_max=5, rate_window=1_000, group_rate_max=2,
                         group_rate_window=500, concurrency=3)  # fmt: skip
    storage.set_limits(Q, limits)
    assert storage.get_limits(Q) == limits
    assert storage.get_limits("other-q") == QueueLimits()
    storage.set_limits(Q, QueueLimits(concurrency=1))  # replaces all of them
    assert storage.get_limits(Q) == QueueLimits(concurrency=1)


def test_concurrency_caps_the_active_jobs_of_the_queue(storage, clock):
    storage.enqueue_many(Q, [job(f"j{i}") for i in range(6)])
    storage.enqueue(Q, job("later", delay=100))
    first = claim_one(storage)
    storage.set_limits(Q, QueueLimits(concurrency=3))
    batch = storage.claim(Q, "w2", 10, LEASE)
    assert [j.job_id for j in batch.jobs] == ["j1", "j2"]  # 3 - 1 already active
    capped = storage.claim(Q, "w3", 10, LEASE)
    assert capped.jobs == [] and capped.next_due_in is None  # a verdict wakes, not a time
    storage.complete(Q, first.job_id, first.token, b"1")
    j3 = claim_one(storage, worker="w3")
    assert j3.job_id == "j3"
    storage.fail(Q, "j1", batch.jobs[0].token, ERROR, retry_in=0)
    storage.release(Q, "j3", j3.token)
    assert claim_ids(storage, worker="w4") == ["j1", "j3"]  # j2 + these two: the cap
    assert claim_ids(storage, worker="w4") == []
    storage.set_limits(Q, QueueLimits())
    clock.advance(100)
    assert claim_ids(storage) == ["j4", "j5", "later"]


# Rate windows of a minute in these tests: Redis drops a queue's claim log when no claim has
# refreshed it for one window of *its own* clock (PEXPIRE), while the test moves the storage
# clock by hand; a window shorter than a slow machine's pause between two calls would lose
# claims that the test clock still counts.
WINDOW = 60_000


def test_rate_limit_counts_claims_in_a_sliding_window(storage, clock):
    storage.set_limits(Q, QueueLimits(rate_max=3, rate_window=WINDOW))
    storage.enqueue_many(Q, [job(f"j{i}") for i in range(10)])
    assert len(storage.claim(Q, "w1", 2, LEASE).jobs) == 2
    clock.advance(WINDOW * 2 // 5)
    batch = storage.claim(Q, "w1", 10, LEASE)
    assert len(batch.jobs) == 1
    spent = storage.claim(Q, "w2", 10, LEASE)
    # until the t0 claims leave
    assert spent.jobs == [] and spent.next_due_in == WINDOW * 3 // 5
    clock.advance(WINDOW * 3 // 5 - 1)
    assert storage.claim(Q, "w1", 10, LEASE).jobs == []
    clock.advance(1)
    batch = storage.claim(Q, "w1", 10, LEASE)
    assert len(batch.jobs) == 2
    # the claim made 2/5 of a window after t0 leaves next
    assert storage.claim(Q, "w1", 10, LEASE).next_due_in == WINDOW * 2 // 5


def test_rate_limit_is_never_exceeded_in_any_window(storage, clock):
    rng = random.Random(7)
    storage.set_limits(Q, QueueLimits(rate_max=4, rate_window=WINDOW))
    storage.enqueue_many(Q, [job(f"j{i}") for i in range(60)])
    starts: list[int] = []
    for _ in range(200):
        batch = storage.claim(Q, "w1", rng.randint(1, 3), LEASE)
        starts += [clock.now] * len(batch.jobs)
        for c in batch.jobs:
            storage.complete(Q, c.job_id, c.token, b"1")
        clock.advance(rng.choice([0, 50, 130, 400]) * WINDOW // 1_000)
    assert len(starts) > 20  # the limit let work through
    for t in starts:
        assert sum(1 for s in starts if t <= s < t + WINDOW) <= 4


def test_group_rate_limit_defers_only_the_groups_over_budget(storage, clock):
    storage.set_limits(Q, QueueLimits(group_rate_max=2, group_rate_window=WINDOW))
    t0 = clock.now
    for job_id, group in [("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("n1", None),
                          ("a4", "A"), ("b2", "B"), ("b3", "B")]:  # fmt: skip
        storage.enqueue(Q, job(job_id, group=group))
    batch = storage.claim(Q, "w1", 10, LEASE)
    assert [j.job_id for j in batch.jobs] == ["a1", "a2", "b1", "n1", "b2"]
    for job_id in ("a3", "a4", "b3"):
        rec = storage.get_record(Q, job_id)
        assert (rec.state, rec.run_at) == (JobState.SCHEDULED, t0 + WINDOW)
        assert kinds(storage, job_id)[-1] == (job_id, "scheduled")
    assert batch.next_due_in == WINDOW
    clock.advance(WINDOW // 2)
    storage.enqueue(Q, job("a5", group="A"))
    storage.enqueue(Q, job("c1", group="C"))
    assert claim_ids(storage) == ["c1"]
    assert storage.get_record(Q, "a5").run_at == t0 + WINDOW
    clock.advance(WINDOW // 2)
    # Enqueue order kept across groups; a5 (the last of A) waits for the next window.
    assert claim_ids(storage) == ["a3", "a4", "b3"]
    assert storage.get_record(Q, "a5").run_at == clock.now + WINDOW


def test_group_limit_counts_the_claims_of_one_call(storage, clock):
    storage.set_limits(Q, QueueLimits(group_rate_max=1, group_rate_window=300))
    storage.enqueue_many(Q, [job(f"g{i}", group="G") for i in range(3)])
    assert claim_ids(storage) == ["g0"]
    clock.advance(300)
    assert claim_ids(storage) == ["g1"]
    clock.advance(300)
    assert claim_ids(storage) == ["g2"]


# -- pause, postpone ------------------------------------------------------------------------------


def test_pause_stops_claims_but_not_enqueues_or_verdicts(storage):
    storage.enqueue(Q, job("a"))
    running = claim_one(storage)
    assert storage.is_paused(Q) is False
    storage.pause(Q)
    assert storage.is_paused(Q) is True
    assert storage.is_paused("other-q") is False
    assert storage.enqueue(Q, job("b")).outcome is EnqueueOutcome.QUEUED
    storage.enqueue(Q, job("c", delay=0))
    batch = storage.claim(Q, "w1", 10, LEASE)
    assert batch.jobs == [] and batch.next_due_in is None
    assert storage.complete(Q, "a", running.token, b"1") is AckOutcome.COMPLETED
    assert storage.cancel(Q, "c") is CancelOutcome.CANCELLED
    storage.resume(Q)
    assert storage.is_paused(Q) is False
    assert claim_ids(storage) == ["b"]


def test_postpone_reschedules_without_using_an_attempt(storage, clock):
    storage.enqueue(Q, job("a", max_attempts=1))
    for _ in range(3):
        c = claim_one(storage)
        assert c.attempt == 1
        assert storage.postpone(Q, "a", c.token, 2_000) is AckOutcome.POSTPONED
        rec = storage.get_record(Q, "a")
        assert (rec.state, rec.attempts, rec.run_at) == (JobState.SCHEDULED, 0, clock.now + 2_000)
        assert kinds(storage, "a")[-1] == ("a", "postponed")
        batch = storage.claim(Q, "w1", 10, LEASE)
        assert batch.jobs == [] and batch.next_due_in == 2_000
        assert storage.postpone(Q, "a", c.token, 10) is AckOutcome.LEASE_LOST
        clock.advance(2_000)
    c = claim_one(storage)
    assert storage.complete(Q, "a", c.token, b"1") is AckOutcome.COMPLETED


def test_postpone_with_a_stale_token_changes_nothing(storage):
    storage.enqueue(Q, job("a"))
    c = claim_one(storage)
    assert storage.postpone(Q, "a", c.token + 1_000, 500) is AckOutcome.LEASE_LOST
    assert storage.postpone(Q, "ghost", 1, 500, queue_wide=True) is AckOutcome.LEASE_LOST
    assert state(storage, "a") is JobState.ACTIVE
    storage.enqueue(Q, job("b"))
    assert claim_ids(storage) == ["b"]  # a refused queue-wide postpone blocks nothing


def test_queue_wide_postpone_holds_every_claim_until_then(storage, clock):
    for job_id in ("a", "b", "c"):
        storage.enqueue(Q, job(job_id))
    a = claim_one(storage)
    out = storage.ack_many(Q, [Ack("postpone", "a", a.token, retry_in=3_000, queue_wide=True)])
    assert out == [AckOutcome.POSTPONED]
    assert storage.is_paused(Q) is False  # a postponement is not a pause
    batch = storage.claim(Q, "w2", 10, LEASE)
    assert batch.jobs == [] and batch.next_due_in == 3_000
    clock.advance(1_000)
    batch = storage.claim(Q, "w2", 10, LEASE)
    assert batch.jobs == [] and batch.next_due_in == 2_000
    clock.advance(2_000)
    assert claim_ids(storage) == ["a", "b", "c"]


def test_a_shorter_queue_wide_postpone_does_not_cut_a_longer_one(storage, clock):
    for job_id in ("a", "b", "c"):
        storage.enqueue(Q, job(job_id))
    a, b = storage.claim(Q, "w1", 2, LEASE).jobs
    storage.postpone(Q, "a", a.token, 5_000, queue_wide=True)
    storage.postpone(Q, "b", b.token, 1_000, queue_wide=True)
    clock.advance(1_000)
    assert claim_ids(storage) == []  # Decision: the queue waits for the latest deadline
    clock.advance(4_000)
    assert claim_ids(storage) == ["a", "b", "c"]


# -- drain, clean, obliterate ---------------------------------------------------------------------


def _mixed_queue(storage) -> None:
    """queued q1 q2, scheduled s, retrying r, active x with a blocked successor, completed d."""
    storage.enqueue(Q, job("x"))
    storage.enqueue(Q, job("r", max_attempts=2))
    storage.enqueue(Q, job("d"))
    claimed = {c.job_id: c for c in storage.claim(Q, "w1", 3, LEASE).jobs}
    storage.fail(Q, "r", claimed["r"].token, ERROR, retry_in=60_000)
    storage.complete(Q, "d", claimed["d"].token, b"1")
    storage.enqueue(Q, job("x", singleton=True))
    storage.enqueue(Q, job("q1", waiter=True))
    storage.enqueue(Q, job("q2"))
    storage.enqueue(Q, job("s", delay=60_000))


def test_drain_queued_only(storage):
    _mixed_queue(storage)
    assert storage.drain(Q, delayed=False) == 2
    assert [state(storage, i) for i in ("q1", "q2", "s", "r", "x", "d")] == [
        JobState.CANCELLED, JobState.CANCELLED, JobState.SCHEDULED, JobState.RETRYING,
        JobState.ACTIVE, JobState.COMPLETED,
    ]  # fmt: skip
    assert storage.get_record(Q, "x").has_successor
    outcome = storage.wait_for_outcome(Q, "q1", 1)
    assert outcome is not None and outcome.state is JobState.CANCELLED
    assert ("q1", "cancelled") in kinds(storage)


def test_drain_with_delayed_cancels_every_waiting_job_and_successor(storage, clock):
    _mixed_queue(storage)
    assert storage.drain(Q) == 5
    assert [state(storage, i) for i in ("q1", "q2", "s", "r", "x", "d")] == [
        JobState.CANCELLED, JobState.CANCELLED, JobState.CANCELLED, JobState.CANCELLED,
        JobState.ACTIVE, JobState.COMPLETED,
    ]  # fmt: skip
    assert storage.get_record(Q, "x").has_successor is False
    counts = storage.counts(Q)
    assert [counts[s] for s in (JobState.QUEUED, JobState.SCHEDULED, JobState.RETRYING,
                                JobState.BLOCKED, JobState.ACTIVE)] == [0, 0, 0, 0, 1]  # fmt: skip
    assert storage.drain(Q) == 0
    clock.advance(120_000)
    assert claim_ids(storage) == []


def test_clean_deletes_old_finished_records_of_the_given_states(storage, clock):
    storage.enqueue(Q, job("done"))
    storage.enqueue(Q, job("failed", max_attempts=1))
    storage.enqueue(Q, job("cancelled"))
    storage.enqueue(Q, job("waiting", delay=60_000))
    storage.cancel(Q, "cancelled")
    claimed = {c.job_id: c for c in storage.claim(Q, "w1", 2, LEASE).jobs}
    storage.complete(Q, "done", claimed["done"].token, b"1")
    storage.fail(Q, "failed", claimed["failed"].token, ERROR)
    storage.enqueue(Q, job("running"))
    claim_one(storage)
    clock.advance(999)
    assert storage.clean(Q, 1_000) == 0
    clock.advance(1)
    assert storage.clean(Q, 1_000, [JobState.COMPLETED, JobState.CANCELLED]) == 2
    assert storage.get_record(Q, "done") is None and storage.get_record(Q, "cancelled") is None
    assert state(storage, "failed") is JobState.FAILED
    assert storage.clean(Q, 1_000) == 1
    assert state(storage, "waiting") is JobState.SCHEDULED
    assert state(storage, "running") is JobState.ACTIVE
    for job_id in ("done", "failed", "cancelled"):
        assert storage.enqueue(Q, job(job_id)).outcome is EnqueueOutcome.QUEUED


def test_clean_respects_its_limit(storage):
    storage.enqueue_many(Q, [job(f"c{i}") for i in range(3)])
    for i in range(3):
        storage.cancel(Q, f"c{i}")
    assert storage.clean(Q, 0, limit=2) == 2
    assert storage.clean(Q, 0, limit=2) == 1
    assert storage.clean(Q, 0) == 0


def test_obliterate_refuses_while_jobs_run_unless_forced(storage):
    storage.enqueue(Q, job("a"))
    storage.enqueue(Q, job("b"))
    running = claim_one(storage)
    with pytest.raises(QueueBusy):
        storage.obliterate(Q)
    assert state(storage, "a") is JobState.ACTIVE and state(storage, "b") is JobState.QUEUED
    assert storage.obliterate(Q, force=True) == 2
    assert storage.complete(Q, "a", running.token, b"1") is AckOutcome.LEASE_LOST
    assert storage.get_record(Q, "a") is None


def test_obliterate_removes_everything_of_the_queue(storage, clock):
    storage.register_queue(Q)
    storage.register_queue("other-q")
    storage.enqueue("other-q", job("keep"))
    _mixed_queue(storage)
    storage.enqueue(Q, job("k", dedup=("key", "throttle", 60_000)))
    storage.pause(Q)
    storage.set_limits(Q, QueueLimits(concurrency=5))
    assert storage.obliterate(Q, force=True) == 7  # records; the successor is not one
    assert Q not in storage.list_queues() and "other-q" in storage.list_queues()
    for job_id in ("x", "r", "d", "q1", "q2", "s", "k"):
        assert storage.get_record(Q, job_id) is None
    assert storage.read_events(Q) == []
    assert all(n == 0 for n in storage.counts(Q).values())
    assert storage.is_paused(Q) is False
    assert storage.get_limits(Q) == QueueLimits()
    assert Q not in storage.list_queues()  # reads do not bring it back
    assert state_of(storage, "other-q", "keep") is JobState.QUEUED
    out = storage.enqueue(Q, job("k2", dedup=("key", "throttle", 60_000)))
    assert stored(out) == (EnqueueOutcome.QUEUED, "k2", JobState.QUEUED)
    assert claim_ids(storage) == ["k2"]


def state_of(storage, queue: str, job_id: str) -> JobState:
    return storage.get_record(queue, job_id).state


# -- blocking wake-ups (real clock) ---------------------------------------------------------------


def _waits_its_timeout(storage, queues, worker: str) -> bool:
    """One of three quiet waits lasts its timeout (see the wait test of the storage suite)."""
    for _ in range(3):
        start = time.monotonic()
        storage.wait_for_jobs(queues, 0.2, worker)
        if time.monotonic() - start >= 0.15:
            return True
    return False


def test_a_paused_queue_does_not_wake_workers_until_resumed(live_storage, wakeups_only):
    live_storage.pause(Q)
    live_storage.enqueue(Q, job("a"))
    assert live_storage.claim(Q, "w1", 1, LEASE).jobs == []
    assert _waits_its_timeout(live_storage, [Q], "w1")
    threading.Timer(0.1, live_storage.resume, (Q,)).start()
    start = time.monotonic()
    live_storage.wait_for_jobs([Q], LONG_WAIT, "w1")
    assert time.monotonic() - start < PATIENCE
    assert [j.job_id for j in live_storage.claim(Q, "w1", 1, LEASE).jobs] == ["a"]


def test_a_verdict_that_frees_a_concurrency_slot_wakes_a_worker(live_storage, wakeups_only):
    live_storage.set_limits(Q, QueueLimits(concurrency=1))
    live_storage.enqueue(Q, job("a"))
    live_storage.enqueue(Q, job("b"))
    a = live_storage.claim(Q, "w1", 1, LEASE).jobs[0]
    assert live_storage.claim(Q, "w2", 1, LEASE).jobs == []
    assert _waits_its_timeout(live_storage, [Q], "w2")
    threading.Timer(0.1, live_storage.complete, (Q, "a", a.token, b"1")).start()
    start = time.monotonic()
    live_storage.wait_for_jobs([Q], LONG_WAIT, "w2")
    assert time.monotonic() - start < PATIENCE
    assert [j.job_id for j in live_storage.claim(Q, "w2", 1, LEASE).jobs] == ["b"]


# -- the state machine under random operations -----------------------------------------------------


def test_new_transitions_are_in_the_table():
    for src, dst in [
        (JobState.ACTIVE, JobState.SCHEDULED),  # postpone; a successor due later
        (JobState.QUEUED, JobState.SCHEDULED),  # change / update run_at; group limit
        (JobState.BLOCKED, JobState.QUEUED),
        (JobState.BLOCKED, JobState.SCHEDULED),
        (JobState.BLOCKED, JobState.CANCELLED),
    ]:
        assert can_transition(src, dst), (src, dst)
    assert not can_transition(JobState.COMPLETED, JobState.QUEUED)
    assert not can_transition(JobState.CANCELLED, JobState.SCHEDULED)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_scheduling_operations_only_follow_allowed_transitions(storage, clock, seed):
    """Random enqueues (singleton, update, lifo, group, dedup), claims under limits, verdicts
    (postpone too), changes, drains and cleans; every record only moves along
    ``states.TRANSITIONS`` and ``counts`` agrees with the records (blocked: successors)."""
    rng = random.Random(seed)
    ids = [f"r{i}" for i in range(10)]
    seen: dict[str, JobState] = {}
    held: dict[str, int] = {}
    ops = ["enqueue", "enqueue", "enqueue", "claim", "claim", "complete", "fail", "release",
           "postpone", "cancel", "change", "reap", "tick", "tick", "limits", "pause", "drain",
           "clean"]  # fmt: skip
    for _step in range(400):
        op = rng.choice(ops)
        job_id = rng.choice(ids)
        if op == "enqueue":
            update = rng.choice(
                [
                    None,
                    {"data": True},
                    {"run_at": RunAtUpdate.YES},
                    {"run_at": RunAtUpdate.IF_EARLIER},
                    {"reset_counts": True},
                ]
            )
            dedup = rng.choice([None, None, ("k", "simple", None), ("t", "throttle", 800),
                                ("d", "debounce", 300)])  # fmt: skip
            storage.enqueue(Q, job(
                job_id, rng.choice([b'"a"', b'"b"']), max_attempts=2, max_stalls=1,
                delay=rng.choice([0, 0, 500]), singleton=rng.random() < 0.4, update=update,
                lifo=rng.random() < 0.2, group=rng.choice([None, "g1", "g2"]), dedup=dedup,
                priority=rng.choice([0, 0, 1]),
            ))  # fmt: skip
        elif op == "claim":
            for c in storage.claim(Q, "w1", rng.randint(1, 3), 2_000).jobs:
                if c.job_id in held:  # never two runs of one id: the older lease is gone
                    old = (c.job_id, held[c.job_id])
                    assert storage.heartbeat(Q, "w1", [old], 2_000) == [old], c.job_id
                held[c.job_id] = c.token
        elif op in ("complete", "fail", "release", "postpone") and held:
            job_id = rng.choice(sorted(held))
            token = held.pop(job_id)
            if op == "complete":
                storage.complete(Q, job_id, token, b"1")
            elif op == "fail":
                storage.fail(Q, job_id, token, ERROR, retry_in=rng.choice([0, 300]),
                             permanent=rng.random() < 0.2)  # fmt: skip
            elif op == "release":
                storage.release(Q, job_id, token)
            else:
                storage.postpone(Q, job_id, token, rng.choice([0, 400]),
                                 queue_wide=rng.random() < 0.2)  # fmt: skip
        elif op == "cancel":
            storage.cancel(Q, job_id)
        elif op == "change":
            if rng.random() < 0.5:
                storage.change(Q, job_id, run_at=clock.now + rng.choice([-100, 0, 600]))
            else:
                storage.change(Q, job_id, priority=rng.choice([-1, 0, 2]))
        elif op == "reap":
            storage.reap(Q)
        elif op == "limits":
            storage.set_limits(Q, rng.choice([
                QueueLimits(), QueueLimits(concurrency=2),
                QueueLimits(group_rate_max=1, group_rate_window=700),
                QueueLimits(rate_max=3, rate_window=1_000),
            ]))  # fmt: skip
        elif op == "pause":
            (storage.resume if storage.is_paused(Q) else storage.pause)(Q)
        elif op == "drain":
            if rng.random() < 0.3:
                storage.drain(Q, delayed=rng.random() < 0.5)
        elif op == "clean":
            storage.clean(Q, rng.choice([0, 1_000]))
        else:
            clock.advance(rng.choice([100, 700, 2_500]))
        records = {i: storage.get_record(Q, i) for i in ids}
        for i, rec in records.items():
            if rec is None:
                seen.pop(i, None)  # cleaned: the id starts afresh
                continue
            before = seen.get(i)
            if before is not None and before != rec.state:
                assert can_transition(before, rec.state) or _two_steps(before, rec.state), (
                    f"{i}: {before} -> {rec.state} after {op}"
                )
            seen[i] = rec.state
            if rec.has_successor:
                assert rec.state not in TERMINAL_STATES, i
        live = [r for r in records.values() if r is not None]
        counts = storage.counts(Q)
        for s in (JobState.QUEUED, JobState.ACTIVE, JobState.SCHEDULED, JobState.RETRYING):
            assert counts[s] == sum(1 for r in live if r.state is s), (s, op, counts)
        assert counts[JobState.BLOCKED] == sum(1 for r in live if r.has_successor), (op, counts)


def _two_steps(src: JobState, dst: JobState) -> bool:
    return any(can_transition(src, mid) and can_transition(mid, dst) for mid in JobState)
