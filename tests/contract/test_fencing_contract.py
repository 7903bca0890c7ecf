"""Fencing tokens never repeat for a job id, even when its record is lost and created again.

A worker still running a claim of a job whose record was lost (obliterated, deleted after its
TTL, Redis restarted empty) must not pass its verdict off as one of the new record's claims:
``complete``, ``fail``, ``release``, ``heartbeat`` and ``report`` of the old claim are refused,
and the new claim's are accepted. Every backend; the worker id is the same for both claims, so
only the token tells them apart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from django_jobq.job import AckOutcome, JobOptions, NewJob
from django_jobq.queue import Queue
from django_jobq.queue.journal import reconcile
from django_jobq.states import JobState
from django_jobq.storage.redis.storage import RedisStorage

from ..private_redis import PrivateRedis

Q = "fencing-q"
LEASE = 10_000
WORKER = "w1"
ERROR = b'{"type": "ValueError", "message": "boom"}'
VERDICTS = ["complete", "fail", "release", "heartbeat", "report"]


def new_job(job_id: str) -> NewJob:
    return NewJob(job_id, b'{"n": 1}', JobOptions())


def claim(storage, queue: str = Q):
    jobs = storage.claim(queue, WORKER, 1, LEASE).jobs
    assert len(jobs) == 1, "expected one claimable job"
    return jobs[0]


def verdict_accepted(storage, kind: str, claimed, queue: str = Q) -> bool:
    """Send one write of ``claimed``'s attempt; True when the storage accepted it."""
    job_id, token = claimed.job_id, claimed.token
    if kind == "complete":
        return storage.complete(queue, job_id, token, b'"r"') is AckOutcome.COMPLETED
    if kind == "fail":
        return storage.fail(queue, job_id, token, ERROR, permanent=True) is AckOutcome.FAILED
    if kind == "release":
        return storage.release(queue, job_id, token) is AckOutcome.RELEASED
    if kind == "heartbeat":
        return storage.heartbeat(queue, WORKER, [(job_id, token)], LEASE) == []
    return storage.report(queue, job_id, token, progress=b"0.5") is True


@pytest.mark.parametrize("kind", VERDICTS)
def test_a_claim_of_an_obliterated_job_cannot_write_to_the_job_created_again(storage, kind):
    storage.enqueue(Q, new_job("x"))
    old = claim(storage)
    storage.obliterate(Q, force=True)  # the record is gone while the old claim still runs
    storage.enqueue(Q, new_job("x"))
    new = claim(storage)

    assert new.token != old.token
    assert not verdict_accepted(storage, kind, old)
    rec = storage.get_record(Q, "x")
    assert (rec.state, rec.attempts, rec.progress) == (JobState.ACTIVE, 1, None)
    assert verdict_accepted(storage, kind, new)


def test_tokens_of_one_record_only_grow(storage, clock):
    storage.enqueue(Q, new_job("x"))
    tokens = []
    for _ in range(5):
        c = claim(storage)
        tokens.append(c.token)
        storage.release(Q, "x", c.token)
    assert tokens == sorted(tokens) and len(set(tokens)) == 5


def test_a_job_deleted_after_its_ttl_and_enqueued_again_gets_new_tokens(storage, clock):
    """The other way an id comes back: its finished record was cleaned, a producer sends it
    again, while a worker whose lease had expired still runs the first attempt."""
    storage.enqueue(Q, new_job("x"))
    stale = claim(storage)
    clock.advance(LEASE)
    assert storage.reap(Q).requeued == ["x"]
    second = claim(storage)
    storage.complete(Q, "x", second.token, b'"done"')
    clock.advance(1)
    assert storage.clean(Q, 0) == 1
    storage.enqueue(Q, new_job("x"))
    third = claim(storage)

    for old in (stale, second):
        assert old.token != third.token
        assert storage.complete(Q, "x", old.token, b'"stale"') is AckOutcome.LEASE_LOST
    assert storage.complete(Q, "x", third.token, b'"fresh"') is AckOutcome.COMPLETED
    assert bytes(storage.get_record(Q, "x").result) == b'"fresh"'


# -- Redis losing its data ----------------------------------------------------------------------


@pytest.fixture
def private_redis(tmp_path: Path):
    server = PrivateRedis(tmp_path / "redis")
    yield server
    server.stop()


@pytest.mark.redis
@pytest.mark.parametrize("kind", VERDICTS)
def test_after_redis_lost_its_data_a_stale_claims_verdict_is_refused(private_redis, kind):
    storage = RedisStorage(private_redis.client, prefix="fence")
    storage.enqueue(Q, new_job("x"))
    old = claim(storage)
    private_redis.client.flushall()  # Redis restarted empty (or from an older AOF)
    storage.enqueue(Q, new_job("x"))  # the producer sends it again
    new = claim(storage)

    assert not verdict_accepted(storage, kind, old)
    assert storage.get_record(Q, "x").state is JobState.ACTIVE
    assert verdict_accepted(storage, kind, new)


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_job_reconcile_recreated_refuses_the_lost_runs_complete(private_redis, settings):
    settings.JOBQ = {
        **settings.JOBQ,
        "BACKEND": "redis",
        "PREFIX": "fence",
        "JOURNAL": {"DATABASE_ALIAS": "default", "MIN_AGE": 0},
        "MIRROR": {"ENABLED": False, "DATABASE_ALIAS": "default"},
    }
    storage = RedisStorage(private_redis.client, prefix="fence")
    Queue(Q, storage=storage, durability="journal").enqueue("x", {"n": 1})
    worker_a = claim(storage)
    private_redis.client.flushall()
    assert reconcile(storage, [Q], min_age=0)[Q].recreated == 1
    worker_b = claim(storage)

    assert storage.complete(Q, "x", worker_a.token, b'"a"') is AckOutcome.LEASE_LOST
    assert storage.get_record(Q, "x").state is JobState.ACTIVE
    assert storage.complete(Q, "x", worker_b.token, b'"b"') is AckOutcome.COMPLETED
    assert bytes(storage.get_record(Q, "x").result) == b'"b"'


# -- a clock that stepped back ------------------------------------------------------------------

AHEAD = 9_000_000_000_000_000_000  # a token taken by a clock far ahead (past a double's 2^53)


@pytest.mark.redis
def test_redis_continues_a_token_above_the_clock_exactly(private_redis):
    """A record whose token is above what the clock gives now (the clock stepped back) gets
    previous + 1, computed exactly in 64 bits (a Lua number would round it)."""
    storage = RedisStorage(private_redis.client, prefix="fence")
    storage.enqueue(Q, new_job("x"))
    private_redis.client.hset(storage.keys(Q).job("x"), "token", AHEAD)
    first = claim(storage)
    storage.release(Q, "x", first.token)
    second = claim(storage)
    assert (first.token, second.token) == (AHEAD + 1, AHEAD + 2)
    assert storage.complete(Q, "x", AHEAD + 1, b'"stale"') is AckOutcome.LEASE_LOST
    assert storage.complete(Q, "x", second.token, b'"ok"') is AckOutcome.COMPLETED


DB_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("backend", DB_BACKENDS)
def test_the_database_continues_a_token_above_the_clock(storage):
    storage.enqueue(Q, new_job("x"))
    storage.Job.objects.using(storage.using).filter(queue=Q, job_id="x").update(token=AHEAD)
    first = claim(storage)
    storage.release(Q, "x", first.token)
    assert (first.token, claim(storage).token) == (AHEAD + 1, AHEAD + 2)
