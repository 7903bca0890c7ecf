"""Sequences the model-based test found, replayed step by step on every backend.

Each one is a few rule calls of ``StorageMachine`` with the agreement checks after every step,
so it fails with the same message as the random run did, in a second, whatever examples
hypothesis happens to draw. They all concern fencing: a job id that gets a new record (the
queue's data lost and re-sent, the finished record expired or deleted, the queue obliterated)
must not hand out a token it handed out before, or the worker still holding that old token
passes the fence.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from django_jobq import states
from django_jobq.states import JobState
from tests.conftest import FakeClock, make_storage

from .reference import Spec
from .test_storage_model import StorageMachine

A = Spec("a", b'{"n": 1}', max_attempts=2, result_ttl=60_000)


def machine(backend: str, request) -> StorageMachine:
    clock = FakeClock()
    cls = type(
        f"Replay_{backend}",
        (StorageMachine,),
        {"storage": make_storage(backend, request, clock), "clock": clock},
    )
    m = cls()
    request.addfinalizer(m.teardown)
    return m


def checked(m: StorageMachine, step, *args, **kwargs) -> None:
    step(*args, **kwargs)  # each step also checks the transitions its events show
    m.records_agree()
    m.counts_equal_the_records()
    m.one_lease_per_job()


def stale_verdicts(m: StorageMachine, stale: int) -> None:
    """Every verdict of the stale lease (index ``stale``) must be refused."""
    for kind in ("heartbeat", "complete", "fail", "release", "cancel_active"):
        checked(m, m.verdict, kind, stale, True, False, 5_000)


def test_a_stale_worker_is_fenced_off_after_the_queue_was_lost_and_re_sent(backend, request):
    m = machine(backend, request)
    checked(m, m.enqueue, [A], False)
    checked(m, m.claim, "w1", 1, 5_000)
    checked(m, m.operator, "lose_data_and_recreate", ["a"], False)
    checked(m, m.claim, "w2", 1, 5_000)  # a token of its own, not w1's again
    stale_verdicts(m, 0)


def test_a_stale_worker_is_fenced_off_after_the_record_expired_and_the_id_came_back(
    backend, request
):
    m = machine(backend, request)
    checked(m, m.enqueue, [A], False)
    checked(m, m.claim, "w1", 1, 5_000)
    checked(m, m.verdict, "complete", 0, True, False, 5_000)
    checked(m, m.time_passes, 61_000, False)  # past result_ttl: the id is free again
    checked(m, m.enqueue, [A], False)
    checked(m, m.claim, "w2", 1, 5_000)
    stale_verdicts(m, 0)


def test_a_stale_worker_is_fenced_off_after_a_forced_obliterate(backend, request):
    m = machine(backend, request)
    checked(m, m.enqueue, [A], False)
    checked(m, m.claim, "w1", 1, 5_000)
    checked(m, m.operator, "obliterate", ["a"], True)
    checked(m, m.enqueue, [A], False)
    checked(m, m.claim, "w2", 1, 5_000)
    stale_verdicts(m, 0)


def test_a_stale_worker_is_fenced_off_after_its_dead_letter_was_purged(backend, request):
    m = machine(backend, request)
    checked(m, m.enqueue, [A], False)
    checked(m, m.claim, "w1", 1, 5_000)
    checked(m, m.time_passes, 5_000, True)  # stalled: queued again, w1 keeps its lease
    checked(m, m.claim, "w2", 1, 5_000)
    checked(m, m.verdict, "fail", 1, True, True, 5_000)  # failed for good
    checked(m, m.operator, "purge_all", ["a"], False)
    checked(m, m.enqueue, [A], False)
    checked(m, m.claim, "w1", 1, 5_000)
    stale_verdicts(m, 0)
    stale_verdicts(m, 1)


# -- a tour of the state machine -----------------------------------------------------------------


def tour(m: StorageMachine) -> None:
    """Steps of the machine that make every transition ``states.TRANSITIONS`` declares, each
    checked against it as the events show it (``StorageMachine._step_done``)."""
    a, b = Spec("a", b'"a"', max_attempts=3), Spec("b", b'"b"', delay=700)
    c, d = Spec("c", b'"c"', delay=4_000), Spec("d.1", b'"d"', max_attempts=3, min_backoff=500)
    # no claim, 1 s lease, no verdict; and with a verdict on the job claimed
    claim = (m.claim, "w1", 1, 1_000, None, False)

    checked(m, m.enqueue, [a, b, c], False)  # new -> queued, new -> scheduled
    checked(m, m.claim, "w1", 1, 1_000, "complete", False)  # queued -> active -> completed
    checked(m, m.operator, "change", ["b"], False, False, 0)  # scheduled -> scheduled
    checked(m, m.operator, "cancel", ["c"], False, False, 0)  # scheduled -> cancelled
    checked(m, m.time_passes, 4_000, False)
    checked(m, m.claim, "w1", 1, 1_000, "fail", False)  # scheduled -> queued; -> retrying
    checked(m, m.operator, "change", ["b"], False, False, 0)  # retrying -> retrying
    checked(m, m.time_passes, 4_000, False)
    checked(m, m.claim, "w1", 1, 1_000, "fail", True)  # retrying -> queued; -> failed
    checked(m, m.operator, "retry", ["b"], False, False, 0)  # failed -> queued
    checked(m, m.claim, "w1", 1, 1_000, "cancel_active", False)  # active -> cancelled
    checked(m, m.operator, "retry", ["b"], False, False, 0)  # cancelled -> queued
    checked(m, m.operator, "cancel", ["b"], False, False, 0)  # queued -> cancelled

    checked(m, m.enqueue, [d], False)
    checked(m, m.claim, "w2", 1, 1_000, "release", False)  # active -> queued
    checked(m, m.claim, "w2", 1, 1_000, "postpone", False)  # active -> scheduled
    checked(m, m.time_passes, 1_000, False)
    checked(m, m.claim, "w2", 1, 1_000, "fail", False)  # -> retrying
    checked(m, m.operator, "cancel", ["d.1"], False, False, 0)  # retrying -> cancelled

    # Singletons: a successor released queued, released scheduled, cancelled.
    checked(m, m.operator, "delete_finished", ["a", "c"], False, False, 0)
    checked(m, m.enqueue, [a], False)
    checked(m, *claim)
    checked(m, m.enqueue, [replace(a, singleton=True)], False)  # new -> blocked
    checked(m, m.verdict, "complete", 0, False, False, 1_000)  # blocked -> queued
    checked(m, *claim)
    checked(m, m.enqueue, [replace(a, singleton=True, delay=700)], False)
    checked(m, m.verdict, "complete", 0, False, False, 1_000)  # blocked -> scheduled
    checked(m, m.time_passes, 1_000, False)
    checked(m, *claim)
    checked(m, m.enqueue, [replace(a, singleton=True)], False)
    checked(m, m.operator, "cancel", ["a"], False, False, 0)  # blocked -> cancelled

    # A group over its budget: its next candidate moves to scheduled.
    checked(m, m.configure, "limits", 1, None, False, None, None, None)
    g = [Spec(i, b'"g"', group="g1") for i in ("b", "c")]
    checked(m, m.operator, "delete_finished", ["b", "c"], False, False, 0)
    checked(m, m.enqueue, g, True)
    checked(m, m.claim, "w1", 2, 1_000, None, False)  # queued -> active, queued -> scheduled
    checked(m, m.time_passes, 1_000, True)  # the leases stall: active -> queued


def test_a_tour_makes_every_declared_transition(backend, request):
    m = machine(backend, request)
    tour(m)
    assert set(states.TRANSITIONS) - m.moves == set(), "declared, never seen"


ACTIVE, CANCELLED, FAILED, QUEUED = (
    JobState.ACTIVE, JobState.CANCELLED, JobState.FAILED, JobState.QUEUED,
)  # fmt: skip


@pytest.mark.parametrize("gone", [(ACTIVE, CANCELLED), (FAILED, QUEUED)], ids=str)
def test_the_check_fails_on_a_transition_the_spec_lacks(request, monkeypatch, gone):
    """The check reads the spec: without a transition, the tour that makes it fails."""
    monkeypatch.setattr(states, "TRANSITIONS", states.TRANSITIONS - {gone})
    with pytest.raises(AssertionError, match="does not declare"):
        tour(machine("memory", request))


def test_a_claim_looks_at_no_more_than_count_plus_group_scan_candidates(backend, request):
    """The flood: a group's backlog longer than ``count + GROUP_SCAN`` before a job of no
    group. Once the group spent its budget, a claim moves that many candidates to scheduled
    and stops, short of the job behind them; the next claim gets to it."""
    m = machine(backend, request)
    checked(m, m.enqueue, [Spec("a", b'"a"')], False)  # priority 0: behind the flood (-5)
    checked(m, m.configure, "limits", 1, None, True, None, None, None)  # group max 1, flood
    checked(m, m.claim, "w1", 1, 5_000)  # f000: the group's budget is spent
    checked(m, m.claim, "w1", 1, 5_000)  # looks at 1 + GROUP_SCAN of the group: none claimed
    assert [le.job_id for le in m.leases] == ["f000"]
    scheduled = [j for j, job in m.model.records().items() if job.state is JobState.SCHEDULED]
    assert len(scheduled) == 1 + states.GROUP_SCAN
    checked(m, m.claim, "w1", 1, 5_000)  # the rest of the flood to scheduled, then a
    assert [le.job_id for le in m.leases] == ["f000", "a"]
