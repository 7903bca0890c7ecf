"""A worker's verdict batch (``ack_many``) on every backend: each verdict is lease-checked on its
own and the outcomes come back in the order sent, however the backend groups them."""

from __future__ import annotations

import pytest

from django_jobq.job import AckOutcome, EnqueueOutcome, JobOptions, NewJob
from django_jobq.states import JobState
from django_jobq.storage.base import Ack

from .private_redis import PrivateRedis

Q = "acks"


def test_mixed_batch_keeps_order_and_checks_each_lease(storage):
    for i in range(6):
        storage.enqueue(Q, NewJob(f"j{i}", b"1", JobOptions(max_attempts=3)))
    jobs = {j.job_id: j for j in storage.claim(Q, "w", 6, 30_000).jobs}
    acks = [
        Ack("complete", "j0", jobs["j0"].token, b'"r0"'),
        Ack("complete", "j1", jobs["j1"].token + 1, b'"stale"'),  # someone else's lease
        Ack("fail", "j2", jobs["j2"].token, b'{"type": "E", "message": "x"}', retry_in=5000),
        Ack("complete", "j3", jobs["j3"].token, b'"r3"'),
        Ack("release", "j4", jobs["j4"].token),
        Ack("complete", "missing", 1, b'"?"'),
        Ack("complete", "j5", jobs["j5"].token, b'"r5"'),
    ]
    assert storage.ack_many(Q, acks) == [
        AckOutcome.COMPLETED, AckOutcome.LEASE_LOST, AckOutcome.RETRYING, AckOutcome.COMPLETED,
        AckOutcome.RELEASED, AckOutcome.LEASE_LOST, AckOutcome.COMPLETED,
    ]  # fmt: skip
    states = {i: storage.get_record(Q, f"j{i}").state for i in range(6)}
    assert states == {
        0: JobState.COMPLETED, 1: JobState.ACTIVE, 2: JobState.RETRYING, 3: JobState.COMPLETED,
        4: JobState.QUEUED, 5: JobState.COMPLETED,
    }  # fmt: skip
    assert storage.get_record(Q, "j3").result == b'"r3"'
    assert storage.get_record(Q, "j1").result is None


def test_a_large_batch_of_completions_spans_several_chunks(storage):
    storage.enqueue_many(Q, [NewJob(f"b{i}", b"1", JobOptions()) for i in range(1203)])
    claimed = []
    while batch := storage.claim(Q, "w", 500, 30_000).jobs:
        claimed += batch
    outcomes = storage.ack_many(
        Q, [Ack("complete", j.job_id, j.token, f'"{j.job_id}"'.encode()) for j in claimed]
    )
    assert len(outcomes) == 1203 and set(outcomes) == {AckOutcome.COMPLETED}
    assert storage.counts(Q)[JobState.COMPLETED] == 1203
    assert storage.get_record(Q, "b1202").result == b'"b1202"'


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test alone: SCRIPT FLUSH on the shared one pulled scripts from
    under other tests running beside it (a chaos run's read failed on NOSCRIPT so)."""
    server = PrivateRedis(tmp_path / "redis")
    yield server.client
    server.stop()


def test_batched_calls_survive_a_script_flush(own_redis):
    """After a Redis restart or SCRIPT FLUSH the cached scripts are gone: both the pipelined
    (ack) and the streamed (bulk enqueue) paths reload them and run every call once."""
    from django_jobq.storage.redis.storage import RedisStorage

    redis_client = own_redis
    storage = RedisStorage(redis_client, prefix="flush")
    redis_client.script_flush()
    out = storage.enqueue_many(Q, [NewJob(f"f{i}", b"1", JobOptions()) for i in range(250)])
    assert {r.outcome for r in out} == {EnqueueOutcome.QUEUED}
    claimed = storage.claim(Q, "w", 300, 30_000).jobs
    assert len(claimed) == 250
    redis_client.script_flush()
    acks = [Ack("complete", j.job_id, j.token, b"1") for j in claimed]
    assert set(storage.ack_many(Q, acks)) == {AckOutcome.COMPLETED}
    assert storage.counts(Q)[JobState.COMPLETED] == 250
