"""Sequences the model-based test found, replayed step by step on every backend.

Each one is a few rule calls of ``StorageMachine`` with the agreement checks after every step,
so it fails with the same message as the random run did, in a second, whatever examples
hypothesis happens to draw. They all concern fencing: a job id that gets a new record (the
queue's data lost and re-sent, the finished record expired or deleted, the queue obliterated)
must not hand out a token it handed out before, or the worker still holding that old token
passes the fence.
"""

from __future__ import annotations

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
    step(*args, **kwargs)
    m.records_agree()
    m.counts_equal_the_records()
    m.one_lease_per_job()


def stale_verdicts(m: StorageMachine, stale: int) -> None:
    """Every verdict of the stale lease (index ``stale``) must be refused."""
    for kind in ("heartbeat", "complete", "fail", "release", "cancel_active"):
        checked(m, m.verdict, kind, stale, False, 5_000)


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
    checked(m, m.verdict, "complete", 0, False, 5_000)
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
    checked(m, m.verdict, "fail", 1, True, 5_000)  # failed for good
    checked(m, m.operator, "purge_all", ["a"], False)
    checked(m, m.enqueue, [A], False)
    checked(m, m.claim, "w1", 1, 5_000)
    stale_verdicts(m, 0)
    stale_verdicts(m, 1)
