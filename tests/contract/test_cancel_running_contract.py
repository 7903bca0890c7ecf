"""Cancelling a running job (``request_cancel``, ``cancel_requests``, ``cancel_active``), on
every backend with the fake clock."""

from __future__ import annotations

from django_jobq.job import AckOutcome, CancelOutcome, RetryOutcome
from django_jobq.states import JobState
from django_jobq.storage.base import Ack

from .test_scheduling_contract import claim_one, job

Q = "cancel-q"
BODY = b'{"type": "JobCancelled", "message": "cancelled while running"}'


def test_an_active_job_is_marked_and_its_worker_finds_the_mark(storage):
    storage.enqueue(Q, job("run"))
    claimed = claim_one(storage, Q)
    assert storage.cancel_requests(Q, [("run", claimed.token)]) == {}
    assert storage.request_cancel(Q, "run") is CancelOutcome.REQUESTED
    assert storage.get_record(Q, "run").state is JobState.ACTIVE  # it runs until stopped
    assert storage.cancel_requests(Q, [("run", claimed.token)]) == {("run", claimed.token): False}
    assert storage.request_cancel(Q, "run", force=True) is CancelOutcome.REQUESTED
    assert storage.cancel_requests(Q, [("run", claimed.token)]) == {("run", claimed.token): True}


def test_a_stale_token_sees_no_request(storage):
    storage.enqueue(Q, job("run"))
    claimed = claim_one(storage, Q)
    storage.request_cancel(Q, "run")
    assert storage.cancel_requests(Q, [("run", claimed.token + 1), ("nope", 1)]) == {}


def test_request_cancel_of_a_waiting_job_cancels_it_at_once(storage):
    storage.enqueue(Q, job("wait"))
    storage.enqueue(Q, job("later", delay=60_000))
    assert storage.request_cancel(Q, "wait") is CancelOutcome.CANCELLED
    assert storage.request_cancel(Q, "later", force=True) is CancelOutcome.CANCELLED
    assert storage.get_record(Q, "wait").state is JobState.CANCELLED
    assert storage.request_cancel(Q, "nope") is CancelOutcome.NOT_FOUND


def test_cancel_active_ends_the_attempt_cancelled(storage):
    storage.enqueue(Q, job("c", max_attempts=5, waiter=True))
    claimed = claim_one(storage, Q)
    storage.request_cancel(Q, "c")
    assert storage.cancel_active(Q, "c", claimed.token, BODY) is AckOutcome.CANCELLED
    record = storage.get_record(Q, "c")
    assert (record.state, record.attempts) == (JobState.CANCELLED, 1)
    assert b"JobCancelled" in bytes(record.error)
    assert storage.dead_letters(Q) == []  # cancelled is not failed
    outcome = storage.wait_for_outcome(Q, "c", 1)
    assert outcome is not None and outcome.state is JobState.CANCELLED
    assert storage.cancel_active(Q, "c", claimed.token, BODY) is AckOutcome.LEASE_LOST


def test_cancel_verdicts_go_through_ack_many(storage):
    storage.enqueue(Q, job("a"))
    storage.enqueue(Q, job("b"))
    a, b = claim_one(storage, Q), claim_one(storage, Q)
    outcomes = storage.ack_many(
        Q, [Ack("cancel", "a", a.token, BODY), Ack("complete", "b", b.token, b"1")]
    )
    assert outcomes == [AckOutcome.CANCELLED, AckOutcome.COMPLETED]


def test_a_retried_cancelled_job_starts_without_the_mark(storage):
    storage.enqueue(Q, job("r"))
    claimed = claim_one(storage, Q)
    storage.request_cancel(Q, "r", force=True)
    storage.cancel_active(Q, "r", claimed.token, BODY)
    assert storage.retry(Q, "r") is RetryOutcome.RETRIED
    again = claim_one(storage, Q)
    assert storage.cancel_requests(Q, [("r", again.token)]) == {}


def test_the_mark_outlives_a_stall_so_the_next_attempt_stops_too(storage, clock):
    storage.enqueue(Q, job("s", max_stalls=3))
    claim_one(storage, Q)
    storage.request_cancel(Q, "s")
    clock.advance(60_000)
    storage.reap(Q)
    again = claim_one(storage, Q)
    assert storage.cancel_requests(Q, [("s", again.token)]) == {("s", again.token): False}
