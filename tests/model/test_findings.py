"""Where the backends disagreed with each other or with the spec, as the model tests found it:
one smallest reproduction each, run on every backend. A backend that still disagrees is a
strict expected failure there (``open_on``, with the reason): a fix makes it pass, and then
the mark must go, with the machine's allowance for it in ``test_storage_model.py``,
``test_broadcast_model.py``, ``reference.py`` or ``transitions.py``. The rest were fixed
(CHANGELOG, Fixed) and stay as regression tests.

Each test states the rule as the spec gives it (``storage/base.py``,
``storage/broadcast_base.py``, docs/scheduling.md, docs/settings.md, docs/broadcast.md), or,
where the spec says nothing, what most backends do, and runs on the backends that do otherwise.
"""

from __future__ import annotations

import pytest

from django_jobq.job import (
    AckOutcome,
    JobOptions,
    Keep,
    NewJob,
    QueueLimits,
    Retention,
)
from django_jobq.states import JobState
from django_jobq.storage.broadcast_base import NewMessage, Settle, SettleKind
from django_jobq.storage.broadcast_base import Retention as Bounds
from tests.conftest import BACKENDS

from .data_loss import expire_records
from .transitions import TransitionLog

Q = "findings-q"
LEASE = 60_000
REDIS = ("redis", "redis-cluster")
DATABASES = ("sqlite", "postgres")
ALL = ("memory", *REDIS, *DATABASES)


def finding(*, open_on: tuple[str, ...] = (), reason: str = "", **xfail):
    """Run on every backend this run tests (``JOBQ_TEST_BACKENDS``); a strict expected
    failure, for ``reason``, on those of ``open_on``."""
    mark = pytest.mark.xfail(strict=True, reason=reason, **xfail)
    params = [pytest.param(k, marks=mark) if k in open_on else k for k in ALL if k in BACKENDS]
    return pytest.mark.parametrize("backend", params, indirect=True)


def job(job_id: str, result_ttl: int = 300_000, **kw) -> NewJob:
    return NewJob(job_id, b"1", JobOptions(result_ttl=result_ttl), **kw)


def finish(storage, clock, job_id: str, result_ttl: int = 300_000) -> None:
    """Enqueue ``job_id``, claim it and complete it, 10 ms after the previous step."""
    clock.advance(10)
    storage.enqueue(Q, job(job_id, result_ttl))
    (claimed,) = storage.claim(Q, "w", 1, LEASE).jobs
    assert storage.complete(Q, job_id, claimed.token, b"1") is AckOutcome.COMPLETED


def kept(storage, ids: str) -> list[str]:
    return [i for i in ids if storage.get_record(Q, i) is not None]


# -- flow control ------------------------------------------------------------------------------


@finding()
def test_a_claim_at_the_concurrency_cap_answers_no_due_time_only_with_jobs_queued(storage):
    """Found by the model test, fixed: at the concurrency cap memory answered next_due_in
    None whatever was waiting, Redis and the database the next due time when nothing was
    queued (they check the cap only when a job is). The spec (base.py, claim) now says what
    three of them did: None only while jobs are queued (the verdict that frees a slot wakes
    a worker for those), else the next due time, as any claim that found too few jobs."""
    storage.set_limits(Q, QueueLimits(concurrency=1))
    storage.enqueue(Q, job("a"))
    storage.enqueue(Q, job("b", delay=5_000))
    assert [c.job_id for c in storage.claim(Q, "w", 1, LEASE).jobs] == ["a"]
    batch = storage.claim(Q, "w", 1, LEASE)  # the cap is reached; b is not due yet
    assert (batch.jobs, batch.next_due_in) == ([], 5_000)
    storage.enqueue(Q, job("c"))
    batch = storage.claim(Q, "w", 1, LEASE)  # c waits for the slot
    assert (batch.jobs, batch.next_due_in) == ([], None)


@finding()
def test_a_claim_that_takes_the_last_slot_answers_the_next_due_time(storage):
    """Found by the model test, fixed: A claim that takes the last free slot and gets fewer
    jobs than asked: Redis and the database answer the next due time, as every claim that
    found too few jobs does; memory answers None. The spec (base.py, claim) says nothing of
    this case."""
    storage.set_limits(Q, QueueLimits(concurrency=1))
    storage.enqueue(Q, job("a"))
    storage.enqueue(Q, job("b", delay=5_000))
    batch = storage.claim(Q, "w", 2, LEASE)
    assert ([c.job_id for c in batch.jobs], batch.next_due_in) == (["a"], 5_000)


@finding()
def test_a_group_over_a_lowered_budget_is_due_when_its_oldest_claim_leaves(storage, clock):
    """Found by the model test, fixed: base.py, claim: a candidate whose group spent its
    budget is due 'when its group's oldest claim in the window leaves it' (memory and
    Redis). The database makes it due when the claim whose exit brings the group under its
    budget leaves, which differs once the window holds more claims than the budget (a
    lowered group_rate_max)."""
    storage.set_limits(Q, QueueLimits(group_rate_max=2, group_rate_window=30_000))
    start = clock.now
    for job_id in ("a", "b"):
        storage.enqueue(Q, job(job_id, group="g"))
        assert len(storage.claim(Q, "w", 1, LEASE).jobs) == 1
        clock.advance(1_000)
    storage.set_limits(Q, QueueLimits(group_rate_max=1, group_rate_window=30_000))
    storage.enqueue(Q, job("c", group="g"))
    assert storage.claim(Q, "w", 1, LEASE).jobs == []
    record = storage.get_record(Q, "c")
    assert (record.state, record.run_at) == (JobState.SCHEDULED, start + 30_000)


@finding()
def test_a_claim_on_a_paused_queue_promotes_nothing(storage, clock):
    """Found by the model test, fixed: A claim on a paused queue: Redis and the database
    leave due scheduled jobs scheduled (they return before promoting); memory promotes them
    to queued (event 'queued'), then claims nothing. base.py lists promotion first and
    'paused: claims nothing' without saying which."""
    storage.enqueue(Q, job("a", delay=1_000))
    storage.pause(Q)
    clock.advance(2_000)
    assert storage.claim(Q, "w", 1, LEASE).jobs == []
    assert storage.get_record(Q, "a").state is JobState.SCHEDULED


# -- the event stream and the spec of transitions ----------------------------------------------


@finding()
def test_a_change_that_moves_no_due_time_makes_no_transition(storage):
    """Found by the model test, fixed: memory emits an event of the job's current state for
    a change that moves no due time: change(priority=) of a queued job ('queued': queued ->
    queued), change() of a blocked successor ('blocked': blocked -> blocked), an enqueue
    update of a queued job's data. Neither move is in states.TRANSITIONS, and Redis and the
    database emit nothing for them."""
    events = TransitionLog(storage, Q)
    storage.enqueue(Q, job("a"))
    events.observe()
    assert storage.change(Q, "a", priority=5) == "changed"
    events.observe()  # every move it shows must be declared


# -- retention of finished records -------------------------------------------------------------


@finding()
def test_retention_reports_no_removal_of_a_record_that_expired(storage, clock):
    """Found by the model test, fixed: memory's retention index keeps a record that expired
    until someone reads it (the expiry is lazy), and a later finish then 'removes' it: a
    'removed' event for a record get_record already called gone. Redis and the database
    emit none."""
    storage.set_retention(Q, Retention(completed=Keep(count=1)))
    finish(storage, clock, "a", result_ttl=1_000)
    clock.advance(2_000)  # a expired; nobody read it since
    expire_records(storage, Q, ["a"])  # (Redis expires by its own clock)
    finish(storage, clock, "b")
    assert [e.job_id for e in storage.read_events(Q) if e.kind == "removed"] == []


@finding()
def test_retention_does_not_count_a_deleted_record(storage, clock):
    """Found by the model test, fixed: docs/settings.md: count keeps the newest n records
    of the state. memory counts a record delete_finished (or purge_dead, clean) took toward
    n until the reaper passes its index entry, so the next finish removes a record within
    the newest n. Redis and the database keep it."""
    storage.set_retention(Q, Retention(completed=Keep(count=2)))
    finish(storage, clock, "a")
    finish(storage, clock, "b")
    assert storage.delete_finished(Q, ["b"]) == 1
    finish(storage, clock, "c")
    storage.reap(Q)
    assert kept(storage, "abc") == ["a", "c"]


@finding(
    open_on=REDIS,
    reason="docs/settings.md: count keeps the newest n records of the state. Redis still "
    "counts a newer record that expired by its result_ttl (its index entry stays until the "
    "reaper reaches it at the head), so an older record within the newest n is removed "
    "(memory and the database were fixed: they no longer count it).",
)
def test_retention_does_not_count_an_expired_record(storage, clock):
    storage.set_retention(Q, Retention(completed=Keep(count=2)))
    finish(storage, clock, "a")
    finish(storage, clock, "b", result_ttl=1_000)
    clock.advance(2_000)
    expire_records(storage, Q, ["b"])  # (Redis expires by its own clock)
    assert storage.get_record(Q, "b") is None
    finish(storage, clock, "c")
    storage.reap(Q)
    assert kept(storage, "abc") == ["a", "c"]


@finding()
def test_a_run_its_successor_replaced_does_not_count_toward_retention(storage, clock):
    """Found by the model test, fixed: A run that a singleton successor replaced is no
    finished record of the id any more (memory and Redis do not index it for retention).
    The database keeps it as a hidden row (<id>~<pk>) that its reaper counts toward the
    count, and removes a record within the newest n instead."""
    storage.set_retention(Q, Retention(completed=Keep(count=1)))
    finish(storage, clock, "a")
    clock.advance(10)
    storage.enqueue(Q, job("b"))
    (run,) = storage.claim(Q, "w", 1, LEASE).jobs
    storage.enqueue(Q, job("b", singleton=True))
    assert storage.complete(Q, "b", run.token, b"1") is AckOutcome.COMPLETED  # b: queued again
    storage.reap(Q)
    assert storage.get_record(Q, "a") is not None


# -- broadcasts --------------------------------------------------------------------------------

B = "findings-bc"


def publish(store, *ids: str, maxlen: int | None = None):
    return store.publish(B, [NewMessage(i, b"1", "json") for i in ids], Bounds(maxlen=maxlen))


@finding()
def test_a_group_subscribed_again_fences_off_its_old_workers(storage):
    """Found by the model test, fixed: broadcast_base.py: only the holder of a delivery's
    newest token may settle it. A group unsubscribed and subscribed again started its tokens
    from 1 again on every backend, so a worker still holding a lease of the old group settled
    the new group's delivery of the same message. A delivery's token is now max(previous + 1,
    token_base()), as a job's starts from the clock."""
    store = storage.broadcasts()
    store.subscribe(B, "g", "earliest")
    publish(store, "m")
    (old,) = store.claim(B, "g", "w1", 1, LEASE, 1)
    store.unsubscribe(B, "g")
    store.subscribe(B, "g", "earliest")
    (new,) = store.claim(B, "g", "w2", 1, LEASE, 1)
    assert new.position == old.position
    verdict = Settle(SettleKind.COMPLETE, old.position, old.token)
    assert store.settle(B, "g", [verdict]) == [AckOutcome.LEASE_LOST]


@finding()
def test_a_claim_looks_at_no_more_lapsed_leases_than_it_has_room_for(storage, clock):
    """Found by the model test, fixed: A group's claim takes over lapsed leases after the
    due retries: Redis and the database look at no more of them than the claim has room for
    (a lease past max_stalls, made a dead letter, uses that room too); memory goes on
    through every lapsed lease until it has taken count, making each one past max_stalls a
    dead letter. broadcast_base.py does not bound it."""
    store = storage.broadcasts()
    store.subscribe(B, "g", "earliest")
    publish(store, "m1", "m2")
    assert len(store.claim(B, "g", "w1", 2, 1_000, 0)) == 2
    clock.advance(1_001)  # both leases lapse
    assert store.claim(B, "g", "w2", 1, 1_000, 0) == []  # max_stalls 0: the first is dead
    (status,) = store.status(B)
    assert (status.active, status.dead) == (1, 1)


@finding()
def test_lapsed_leases_are_taken_over_in_publish_order(storage, clock):
    """Found by the model test, fixed: a group's claim with less room than lapsed leases
    took them over in publish order on memory and the database, in the order the leases
    lapsed on Redis (its lease ZSET). Publish order on every backend now (broadcast_base.py,
    claim)."""
    store = storage.broadcasts()
    store.subscribe(B, "g", "earliest")
    publish(store, "m1", "m2")
    assert [d.message_id for d in store.claim(B, "g", "w1", 1, 5_000, 1)] == ["m1"]
    assert [d.message_id for d in store.claim(B, "g", "w1", 1, 1_000, 1)] == ["m2"]
    clock.advance(6_000)  # both lapsed, m2's first
    assert [d.message_id for d in store.claim(B, "g", "w2", 1, 1_000, 1)] == ["m1"]


@finding()
def test_delivery_of_a_dead_letter_whose_message_was_dropped(storage):
    """Found by the model test, fixed: docs/broadcast.md: a dead letter keeps its own copy of
    a message retention dropped, and stays. delivery() of it answered 'dead' on memory and
    the database; Redis looked the id up among retained messages only and answered
    'unknown'."""
    store = storage.broadcasts()
    store.subscribe(B, "g", "earliest")
    publish(store, "m1", maxlen=1)
    (d,) = store.claim(B, "g", "w1", 1, LEASE, 1)
    store.settle(B, "g", [Settle(SettleKind.DEAD, d.position, d.token, error=b"{}")])
    publish(store, "m2", maxlen=1)  # drops m1
    assert [x.message_id for x in store.dead_letters(B, "g")] == ["m1"]
    assert store.delivery(B, "g", "m1").state == "dead"


@finding()
def test_a_single_duplicate_publish_applies_the_retention(storage):
    """Found by the model test, fixed: broadcast_base.py, publish: append the new messages,
    then apply retention, in one step. The database's single-message path returns at a
    duplicate before applying it (its several-message path and the other backends apply
    it)."""
    store = storage.broadcasts()
    publish(store, "m1", "m2", "m3")
    assert publish(store, "m1", maxlen=2)[0].outcome == "duplicate"
    assert store.length(B) == 2
