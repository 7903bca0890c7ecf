"""A dedup key keeps the rules of the mode it was taken in, whatever mode a later enqueue of
the same key names. Found by the model-based test (tests/model) on Redis, where the later
enqueue's mode decided: a throttle key whose holder was cancelled let a simple-mode enqueue
through, while every other backend answered ``duplicate`` until the key's TTL ran out."""

from __future__ import annotations

import pytest

from django_jobq.job import Dedup, DedupMode, EnqueueOutcome, JobOptions, NewJob
from django_jobq.states import JobState

Q = "dedup-modes"


def new(job_id: str, dedup: Dedup) -> NewJob:
    return NewJob(job_id, b"1", JobOptions(max_attempts=1), dedup=dedup)


@pytest.mark.parametrize("later", [DedupMode.SIMPLE, DedupMode.THROTTLE])
def test_a_throttle_key_stays_held_after_its_holder_was_cancelled(storage, clock, later):
    assert storage.enqueue(Q, new("a", Dedup("k", DedupMode.THROTTLE, 3000))).outcome is (
        EnqueueOutcome.QUEUED
    )
    storage.cancel(Q, "a")
    ttl = 3000 if later is DedupMode.THROTTLE else None
    got = storage.enqueue(Q, new("b", Dedup("k", later, ttl)))
    assert (got.outcome, got.job_id, got.state) == (
        EnqueueOutcome.DUPLICATE, "a", JobState.CANCELLED,
    )  # fmt: skip
    clock.advance(3001)  # the throttle window is over: the key is free
    got = storage.enqueue(Q, new("c", Dedup("k", later, ttl)))
    assert (got.outcome, got.job_id) == (EnqueueOutcome.QUEUED, "c")


def test_a_simple_key_is_free_once_its_holder_finished(storage):
    storage.enqueue(Q, new("a", Dedup("k", DedupMode.SIMPLE, None)))
    storage.cancel(Q, "a")
    got = storage.enqueue(Q, new("b", Dedup("k", DedupMode.THROTTLE, 3000)))
    assert (got.outcome, got.job_id) == (EnqueueOutcome.QUEUED, "b")
