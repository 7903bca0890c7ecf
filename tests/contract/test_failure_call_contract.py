"""Failure-handler calls (``set_failure_hook``, ``claim_failure_calls``, ``settle_failure_call``,
``count_failure_calls``, ``failure_calls``), on every backend with the fake clock."""

from __future__ import annotations

import json

import pytest

from django_jobq.job import JobOptions, NewJob
from django_jobq.states import JobState

from .test_scheduling_contract import claim_one, job

Q = "onfail-q"
ERROR = b'{"type": "ValueError", "message": "boom"}'
LEASE = 30_000


def fail_for_good(storage, job_id: str, payload: bytes = b'{"n": 1}', **options) -> None:
    storage.enqueue(Q, job(job_id, payload, max_attempts=1, **options))
    claimed = claim_one(storage, Q)
    assert claimed.job_id == job_id
    storage.fail(Q, job_id, claimed.token, ERROR)


@pytest.fixture
def hooked(storage):
    storage.set_failure_hook(Q, True)
    return storage


def test_the_hook_is_off_until_set_and_can_be_cleared(storage):
    assert storage.failure_hook(Q) is False
    storage.set_failure_hook(Q, True)
    assert storage.failure_hook(Q) is True
    storage.set_failure_hook(Q, False)
    assert storage.failure_hook(Q) is False


def test_no_call_is_recorded_while_the_hook_is_off(storage):
    fail_for_good(storage, "a")
    assert storage.count_failure_calls(Q) == 0
    assert storage.claim_failure_calls(Q, "w1", 10, LEASE) == []


def test_a_permanent_failure_records_one_call_with_a_copy_of_the_job(hooked, clock):
    fail_for_good(hooked, "a", b'{"to": "x"}')
    assert hooked.count_failure_calls(Q) == 1
    [call] = hooked.claim_failure_calls(Q, "w1", 10, LEASE)
    assert (call.queue, call.job_id, bytes(call.payload), call.content_type) == (
        Q, "a", b'{"to": "x"}', "json",
    )  # fmt: skip
    assert json.loads(call.error)["message"] == "boom"
    assert (call.attempts, call.failed_at, call.tries) == (1, clock.now, 1)
    assert call.due_at == clock.now + LEASE and call.last_error is None
    assert call.worker == "w1"
    assert hooked.failure_calls(Q)[0].worker == "w1"


def test_a_permanent_error_and_a_stalled_out_job_both_record_a_call(hooked, clock):
    hooked.enqueue(Q, job("perm", max_attempts=5))
    hooked.fail(Q, "perm", claim_one(hooked, Q).token, ERROR, permanent=True)
    hooked.enqueue(Q, job("stall", max_stalls=0))
    claim_one(hooked, Q)
    clock.advance(60_000)
    assert hooked.reap(Q).failed == ["stall"]
    calls = {c.job_id: c for c in hooked.claim_failure_calls(Q, "w1", 10, LEASE)}
    assert set(calls) == {"perm", "stall"}
    assert json.loads(calls["stall"].error)["type"] == "Stalled"


def test_retrying_completed_and_cancelled_jobs_record_no_call(hooked):
    hooked.enqueue(Q, job("r", max_attempts=3))
    hooked.fail(Q, "r", claim_one(hooked, Q).token, ERROR, retry_in=1000)
    hooked.enqueue(Q, job("ok"))
    hooked.complete(Q, "ok", claim_one(hooked, Q).token, b"1")
    hooked.enqueue(Q, job("cx"))
    hooked.cancel(Q, "cx")
    hooked.enqueue(Q, job("cx-running"))
    claimed = claim_one(hooked, Q)
    hooked.cancel_active(Q, "cx-running", claimed.token, ERROR)
    assert hooked.count_failure_calls(Q) == 0


def test_a_claimed_call_is_leased_until_its_lease_ends(hooked, clock):
    fail_for_good(hooked, "a")
    [first] = hooked.claim_failure_calls(Q, "w1", 10, LEASE)
    assert hooked.claim_failure_calls(Q, "w2", 10, LEASE) == []
    clock.advance(LEASE)
    [again] = hooked.claim_failure_calls(Q, "w2", 10, LEASE)
    assert (again.call_id, again.tries, again.worker) == (first.call_id, 2, "w2")


def test_a_successful_call_is_deleted(hooked):
    fail_for_good(hooked, "a")
    [call] = hooked.claim_failure_calls(Q, "w1", 10, LEASE)
    assert hooked.settle_failure_call(Q, call, ok=True) is True
    assert hooked.count_failure_calls(Q) == 0 and hooked.failure_calls(Q) == []


def test_a_failed_call_is_due_again_after_its_backoff_with_the_error_kept(hooked, clock):
    fail_for_good(hooked, "a")
    [call] = hooked.claim_failure_calls(Q, "w1", 10, LEASE)
    handler_error = b'{"type": "OSError", "message": "smtp down"}'
    assert hooked.settle_failure_call(Q, call, ok=False, retry_in_ms=60_000, error=handler_error)
    clock.advance(59_999)
    assert hooked.claim_failure_calls(Q, "w1", 10, LEASE) == []
    [pending] = hooked.failure_calls(Q)
    assert (pending.tries, pending.due_at) == (1, clock.now + 1)
    assert json.loads(pending.last_error)["message"] == "smtp down"
    clock.advance(1)
    [again] = hooked.claim_failure_calls(Q, "w1", 10, LEASE)
    assert again.tries == 2


def test_a_stale_holder_cannot_settle_a_call_a_later_claim_took(hooked, clock):
    fail_for_good(hooked, "a")
    [stale] = hooked.claim_failure_calls(Q, "w1", 10, LEASE)
    clock.advance(LEASE)
    [current] = hooked.claim_failure_calls(Q, "w2", 10, LEASE)
    assert hooked.settle_failure_call(Q, stale, ok=True) is False
    assert hooked.settle_failure_call(Q, stale, ok=False, retry_in_ms=0) is False
    assert hooked.count_failure_calls(Q) == 1
    [pending] = hooked.failure_calls(Q)
    assert pending.due_at == clock.now + LEASE  # the newer lease was not moved
    assert hooked.settle_failure_call(Q, current, ok=True) is True
    assert hooked.count_failure_calls(Q) == 0


def test_settling_a_call_twice_is_refused_the_second_time(hooked):
    fail_for_good(hooked, "a")
    [call] = hooked.claim_failure_calls(Q, "w1", 10, LEASE)
    assert hooked.settle_failure_call(Q, call, ok=True) is True
    assert hooked.settle_failure_call(Q, call, ok=True) is False


def test_claims_take_due_calls_oldest_first_up_to_count(hooked, clock):
    for name in ("c0", "c1", "c2"):
        fail_for_good(hooked, name)
        clock.advance(10)
    assert [c.job_id for c in hooked.claim_failure_calls(Q, "w1", 2, LEASE)] == ["c0", "c1"]
    assert [c.job_id for c in hooked.claim_failure_calls(Q, "w1", 2, LEASE)] == ["c2"]


def test_an_operator_retry_then_a_second_failure_is_a_second_call(hooked):
    fail_for_good(hooked, "a")
    assert hooked.retry(Q, "a").value == "retried"
    hooked.fail(Q, "a", claim_one(hooked, Q).token, ERROR)
    calls = hooked.claim_failure_calls(Q, "w1", 10, LEASE)
    assert [c.job_id for c in calls] == ["a", "a"]
    assert calls[0].call_id != calls[1].call_id


def test_a_purged_id_enqueued_anew_and_failed_again_is_a_second_call(hooked):
    fail_for_good(hooked, "a", b'{"n": 1}')
    assert hooked.purge_dead(Q, ["a"]) == 1
    fail_for_good(hooked, "a", b'{"n": 2}')
    payloads = sorted(bytes(c.payload) for c in hooked.failure_calls(Q))
    assert payloads == [b'{"n": 1}', b'{"n": 2}']


def test_the_call_outlives_the_job_record(hooked):
    fail_for_good(hooked, "a")
    assert hooked.delete_finished(Q, ["a"]) == 1  # as its result_ttl would (Redis: real time)
    assert hooked.get_record(Q, "a") is None
    [call] = hooked.claim_failure_calls(Q, "w1", 10, LEASE)
    assert (call.job_id, bytes(call.payload)) == ("a", b'{"n": 1}')


def test_a_singleton_successor_taking_the_id_keeps_the_failed_runs_call(hooked):
    hooked.enqueue(Q, job("s", b'{"run": 1}', singleton=True, max_attempts=1))
    claimed = claim_one(hooked, Q)
    hooked.enqueue(Q, job("s", b'{"run": 2}', singleton=True))  # blocked successor
    hooked.fail(Q, "s", claimed.token, ERROR)
    assert hooked.get_record(Q, "s").state is JobState.QUEUED  # the successor took the id
    [call] = hooked.claim_failure_calls(Q, "w1", 10, LEASE)
    assert (call.job_id, bytes(call.payload)) == ("s", b'{"run": 1}')


def test_calls_stay_pending_after_the_hook_is_cleared(hooked):
    fail_for_good(hooked, "a")
    hooked.set_failure_hook(Q, False)
    fail_for_good(hooked, "b")
    assert [c.job_id for c in hooked.claim_failure_calls(Q, "w1", 10, LEASE)] == ["a"]


def test_msgpack_payload_bytes_and_content_type_are_copied_exactly(hooked):
    raw = b"\x81\xa1n\x01"
    hooked.enqueue(Q, NewJob("m", raw, JobOptions(max_attempts=1), content_type="msgpack"))
    hooked.fail(Q, "m", claim_one(hooked, Q).token, ERROR)
    [call] = hooked.claim_failure_calls(Q, "w1", 10, LEASE)
    assert (bytes(call.payload), call.content_type) == (raw, "msgpack")


def test_failure_calls_page_soonest_due_first(hooked, clock):
    for name in ("p0", "p1", "p2"):
        fail_for_good(hooked, name)
        clock.advance(10)
    assert [c.job_id for c in hooked.failure_calls(Q, offset=1, limit=1)] == ["p1"]
    assert hooked.failure_calls(Q, offset=3) == []


def test_obliterate_removes_pending_calls(hooked):
    fail_for_good(hooked, "a")
    hooked.obliterate(Q)
    assert hooked.count_failure_calls(Q) == 0
