"""Redis-only properties of the scheduling backend (issue 4) that the contract suite, which
only talks to ``Storage``, cannot see: score layout, keys and hash tags, what the hot path
writes, the enqueue combiner with the new options, batching of drain / clean / obliterate,
wake-up markers and TTLs of the helper keys. Everything runs on the real Redis."""

from __future__ import annotations

import threading

import pytest

from django_jobq.job import (
    AckOutcome,
    Dedup,
    DedupMode,
    EnqueueOutcome,
    JobOptions,
    JobUpdate,
    NewJob,
    QueueLimits,
    RunAtUpdate,
)
from django_jobq.states import JobState
from django_jobq.storage.base import Ack
from django_jobq.storage.redis import storage as redis_storage_mod
from django_jobq.storage.redis.keys import QueueKeys
from django_jobq.storage.redis.storage import RedisStorage

from .test_redis_combiner import run_threads, slow_calls

pytestmark = pytest.mark.redis

Q = "rsched"
LEASE = 10_000


@pytest.fixture
def storage(redis_client, redis_prefix, clock) -> RedisStorage:
    return RedisStorage(redis_client, prefix=redis_prefix, clock=clock)


def job(job_id: str, payload: bytes = b"1", **kwargs) -> NewJob:
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in JobOptions.__dataclass_fields__}
    return NewJob(job_id, payload, JobOptions(**options), **kwargs)


def claim_ids(storage: RedisStorage, count: int = 100, worker: str = "w1") -> list[str]:
    return [c.job_id for c in storage.claim(Q, worker, count, LEASE).jobs]


def test_scores_stay_exact_and_ordered_at_the_priority_bounds(storage, redis_client):
    k = storage.keys(Q)
    order = [
        ("lo-fifo-1", -1000, False), ("lo-lifo-1", -1000, True), ("lo-fifo-2", -1000, False),
        ("lo-lifo-2", -1000, True), ("hi-fifo-1", 1000, False), ("hi-lifo-1", 1000, True),
        ("hi-lifo-2", 1000, True), ("hi-fifo-2", 1000, False),
    ]  # fmt: skip
    for job_id, priority, lifo in order:
        storage.enqueue(Q, job(job_id, priority=priority, lifo=lifo))
    for job_id, priority, lifo in order:
        seq = int(redis_client.hget(k.job(job_id), "seq"))
        expected = priority * 2**43 + 2**42 + (-seq if lifo else seq)
        assert abs(expected) < 2**53
        assert redis_client.zscore(k.queued, job_id) == expected, job_id
    assert claim_ids(storage) == [
        "lo-lifo-2", "lo-lifo-1", "lo-fifo-1", "lo-fifo-2",
        "hi-lifo-2", "hi-lifo-1", "hi-fifo-1", "hi-fifo-2",
    ]  # fmt: skip


def test_a_plain_enqueue_sends_and_writes_what_it_did_before_scheduling(storage, redis_client):
    """The hot path: no scheduling set in the call, no new fields in the record."""
    plain = [job("p1"), job("p2", delay=1_000, priority=3)]
    name, _keys, args = storage._enqueue_call(Q, plain)
    assert name == "enqueue" and args[2] == 2  # two option sets of ten items
    assert args[3 + 20 :] == ["p1", b"1", 1, "p2", b"1", 2]
    storage.enqueue_many(Q, plain)
    fields = {f.decode() for f in redis_client.hkeys(storage.keys(Q).job("p1"))}
    assert fields == {
        "state", "payload", "ctype", "max_attempts", "result_ttl", "min_backoff",
        "max_backoff", "max_stalls", "priority", "seq", "created",
    }  # fmt: skip
    _, _, args = storage._enqueue_call(Q, [job("l", lifo=True), job("g", group="G")])
    assert args[2] == 3  # one option set, two scheduling sets
    assert args[-4:] == ["l", b"1", "1:2", "g", b"1", "1:3"][-4:]


def test_an_update_in_the_same_call_as_the_store_leaves_one_index_entry(storage, redis_client):
    k = storage.keys(Q)
    yes = JobUpdate(run_at=RunAtUpdate.YES)
    debounce = Dedup("d", DedupMode.DEBOUNCE, 500)
    out = storage.enqueue_many(
        Q,
        [
            job("a"),
            job("a", delay=2_000, update=yes),  # queued -> scheduled within the call
            job("s", delay=2_000),
            job("s", update=yes),  # scheduled -> queued within the call
            job("d1", b"v1", dedup=debounce),
            job("d2", b"v2", delay=3_000, dedup=debounce),  # moves d1 within the call
        ],
    )
    assert [(o.outcome, o.job_id, o.state) for o in out] == [
        (EnqueueOutcome.QUEUED, "a", JobState.QUEUED),
        (EnqueueOutcome.UPDATED, "a", JobState.SCHEDULED),
        (EnqueueOutcome.QUEUED, "s", JobState.SCHEDULED),
        (EnqueueOutcome.UPDATED, "s", JobState.QUEUED),
        (EnqueueOutcome.QUEUED, "d1", JobState.SCHEDULED),
        (EnqueueOutcome.UPDATED, "d1", JobState.SCHEDULED),
    ]  # fmt: skip
    queued = {m.decode() for m in redis_client.zrange(k.queued, 0, -1)}
    scheduled = {m.decode(): s for m, s in redis_client.zrange(k.scheduled, 0, -1, withscores=True)}
    assert queued == {"s"}
    assert scheduled == {"a": storage.clock() + 2_000, "d1": storage.clock() + 3_000}
    assert bytes(storage.get_record(Q, "d1").payload) == b"v2"


def test_combined_enqueues_with_scheduling_options_match_one_by_one_calls(storage):
    sizes = slow_calls(storage, 0.002)
    results: dict[str, list] = {}
    lock = threading.Lock()

    def produce(i: int) -> None:
        for n in range(30):
            key = f"k{n % 5}"
            new = job(f"t{i}-{n}", dedup=Dedup(key), lifo=n % 2 == 0, group=f"g{i % 2}")
            plain = job(f"plain{i}-{n}")
            for j in (new, plain):
                r = storage.enqueue(Q, j)
                with lock:
                    results.setdefault(key if j is new else j.job_id, []).append(r)

    run_threads(10, produce)
    assert max(sizes) > 1, "no call was combined: the test did not exercise the combiner"
    for n in range(5):
        got = results[f"k{n}"]
        holders = [r.job_id for r in got if r.outcome is EnqueueOutcome.QUEUED]
        assert len(holders) == 1, got  # one job took the key, every other answer names it
        assert {r.job_id for r in got} == set(holders)
        rec = storage.get_record(Q, holders[0])
        assert rec.dedup_key == f"k{n}" and rec.lifo == (int(holders[0].split("-")[1]) % 2 == 0)
    plains = [r for key, rs in results.items() if key.startswith("plain") for r in rs]
    assert len(plains) == 300 and all(r.outcome is EnqueueOutcome.QUEUED for r in plains)


def test_ack_many_settles_successors_and_simple_dedup_keys(storage, redis_client):
    k = storage.keys(Q)
    storage.enqueue(Q, job("s", b"run-1", waiter=True))
    storage.enqueue(Q, job("d", dedup=Dedup("key")))
    storage.enqueue(Q, job("f", max_attempts=1))
    claimed = {c.job_id: c for c in storage.claim(Q, "w1", 3, LEASE).jobs}
    storage.enqueue(Q, job("s", b"run-2", singleton=True))
    storage.enqueue(Q, job("f", b"f-2", singleton=True))
    assert redis_client.exists(k.dedup("key"), k.succ("s"), k.succ("f")) == 3
    out = storage.ack_many(
        Q,
        [
            Ack("complete", "s", claimed["s"].token, b"r1"),
            Ack("complete", "d", claimed["d"].token, b"r"),
            Ack("fail", "f", claimed["f"].token, b'{"type": "E"}'),
        ],
    )
    assert out == [AckOutcome.COMPLETED, AckOutcome.COMPLETED, AckOutcome.FAILED]
    assert redis_client.exists(k.dedup("key"), k.succ("s"), k.succ("f")) == 0
    assert redis_client.scard(k.blocked) == 0
    # The waiter of the first run gets its outcome, although the successor holds the id now.
    outcome = storage.wait_for_outcome(Q, "s", 1)
    assert (outcome.state, bytes(outcome.result)) == (JobState.COMPLETED, b"r1")
    assert sorted(claim_ids(storage)) == ["f", "s"]
    assert storage.counts(Q)[JobState.FAILED] == 1


def test_a_simple_key_that_passed_to_another_job_is_not_freed_by_the_old_holder(
    storage, redis_client, clock
):
    k = storage.keys(Q)
    storage.enqueue(Q, job("a", dedup=Dedup("key", ttl=1_000)))
    a = storage.claim(Q, "w1", 1, LEASE).jobs[0]
    clock.advance(1_000)
    assert storage.enqueue(Q, job("b", dedup=Dedup("key"))).outcome is EnqueueOutcome.QUEUED
    storage.complete(Q, "a", a.token, b"1")
    assert redis_client.get(k.dedup("key")) == b"0:b"
    assert storage.enqueue(Q, job("c", dedup=Dedup("key"))).job_id == "b"


def test_dedup_keys_with_a_ttl_are_collected_by_redis(storage, redis_client):
    k = storage.keys(Q)
    storage.enqueue(Q, job("t", dedup=Dedup("t", DedupMode.THROTTLE, 5_000)))
    storage.enqueue(Q, job("s", dedup=Dedup("s")))
    grace = 60_000  # DEDUP_GRACE in common.lua
    assert 5_000 < redis_client.pttl(k.dedup("t")) <= 5_000 + grace
    assert redis_client.pttl(k.dedup("s")) == -1  # held until the holder finishes


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_a_delayed_job_due_before_every_scheduled_one_wakes_idle_workers(
    storage, redis_client, many
):
    """An idle worker blocks until the earliest due time its last claim saw: a job due before
    it must leave a wake-up marker, a later one none (a marker costs every idle worker a claim)."""
    k = storage.keys(Q)

    def put(*jobs: NewJob) -> int:
        redis_client.delete(k.wake)
        if many:
            storage.enqueue_many(Q, list(jobs))
        else:
            for one in jobs:
                storage.enqueue(Q, one)
        return redis_client.llen(k.wake)

    assert put(job("a", delay=60_000)) == 1  # the first scheduled job
    assert put(job("b", delay=120_000)) == 0  # due after "a": the worker wakes for "a" first
    assert put(job("c", delay=30_000)) == 1  # due before "a"
    assert put(job("d", delay=90_000), job("e", delay=10_000)) == 1  # "e" is the earliest
    assert put(job("f", delay=500_000), job("g", delay=400_000)) == 0
    assert [c.job_id for c in storage.claim(Q, "w1", 10, LEASE).jobs] == []


def test_a_concurrency_capped_claim_sets_a_flag_instead_of_waking_and_a_verdict_wakes(
    storage, redis_client
):
    k = storage.keys(Q)
    storage.set_limits(Q, QueueLimits(concurrency=1))
    for i in range(3):
        storage.enqueue(Q, job(f"j{i}"))
    redis_client.delete(k.wake)
    first = storage.claim(Q, "w1", 5, LEASE).jobs
    assert len(first) == 1
    assert redis_client.llen(k.wake) == 0  # nobody else could claim: no wake-up
    assert redis_client.exists(k.capped) == 1
    assert storage.claim(Q, "w2", 5, LEASE).jobs == []
    out = storage.ack_many(Q, [Ack("complete", first[0].job_id, first[0].token, b"1")])
    assert out == [AckOutcome.COMPLETED]
    assert redis_client.llen(k.wake) == 1 and redis_client.exists(k.capped) == 0


def test_a_paused_or_rate_limited_claim_pushes_no_wake_marker(storage, redis_client, clock):
    k = storage.keys(Q)
    for i in range(4):
        storage.enqueue(Q, job(f"j{i}"))
    storage.pause(Q)
    redis_client.delete(k.wake)
    assert storage.claim(Q, "w1", 1, LEASE).jobs == []
    assert redis_client.llen(k.wake) == 0  # idle workers would spin on a paused queue
    storage.resume(Q)
    assert redis_client.llen(k.wake) == 1
    storage.set_limits(Q, QueueLimits(rate_max=2, rate_window=1_000))
    redis_client.delete(k.wake)
    assert len(storage.claim(Q, "w1", 1, LEASE).jobs) == 1
    assert redis_client.llen(k.wake) == 1  # budget left: the next worker may claim
    redis_client.delete(k.wake)
    assert len(storage.claim(Q, "w1", 5, LEASE).jobs) == 1
    assert redis_client.llen(k.wake) == 0  # budget spent: the claimer is told when to return
    assert 0 < redis_client.pttl(k.rate) <= 1_000


def test_group_candidates_are_scanned_in_bounded_steps(storage, redis_client, monkeypatch):
    monkeypatch.setattr(redis_storage_mod, "GROUP_SCAN", 2)
    k = storage.keys(Q)
    storage.set_limits(Q, QueueLimits(group_rate_max=1, group_rate_window=60_000))
    storage.enqueue_many(Q, [job(f"a{i}", group="A") for i in range(10)] + [job("b", group="B")])
    assert claim_ids(storage, 1) == ["a0"]
    # count 1 + 2 more candidates per call; each moves the spent group's jobs to scheduled
    # and leaves a wake-up, so idle workers carry the scan on.
    seen = []
    for _ in range(10):
        redis_client.delete(k.wake)
        got = claim_ids(storage, 1)
        seen.append((got, redis_client.zcard(k.scheduled)))
        if got:
            break
        assert redis_client.llen(k.wake) == 1
    assert seen == [([], 3), ([], 6), ([], 9), (["b"], 9)]
    assert 0 < redis_client.pttl(k.group_rate("A")) <= 60_000


def test_drain_and_clean_work_in_batches(storage, monkeypatch):
    monkeypatch.setattr(redis_storage_mod, "DRAIN_CHUNK", 3)
    monkeypatch.setattr(redis_storage_mod, "SCAN_CHUNK", 4)
    storage.enqueue_many(Q, [job(f"q{i}") for i in range(7)])
    storage.enqueue_many(Q, [job(f"s{i}", delay=1_000) for i in range(4)])
    assert storage.drain(Q, delayed=False) == 7
    assert storage.drain(Q) == 4
    assert storage.counts(Q)[JobState.SCHEDULED] == 0
    assert storage.clean(Q, 0, limit=5) == 5
    assert storage.clean(Q, 0) == 6
    assert storage.clean(Q, 0) == 0


def test_every_key_stays_inside_the_queue_hash_tag(storage, redis_client, redis_prefix, clock):
    storage.set_limits(Q, QueueLimits(rate_max=5, rate_window=1_000, group_rate_max=1,
                                      group_rate_window=1_000, concurrency=1))  # fmt: skip
    storage.enqueue(Q, job("a", group="cust-1", dedup=Dedup("k", DedupMode.THROTTLE, 1_000)))
    storage.enqueue(Q, job("b", group="cust-1", lifo=True))
    a = storage.claim(Q, "w1", 5, LEASE).jobs[0]
    storage.enqueue(Q, job("a", singleton=True))
    storage.enqueue(Q, job("c", waiter=True))
    storage.postpone(Q, "a", a.token, 100, queue_wide=True)
    storage.pause(Q)
    tag = "{" + f"{redis_prefix}:{Q}" + "}:"
    keys = {key.decode() for key in redis_client.scan_iter(match="*" + redis_prefix + "*")}
    assert keys and all(key.startswith(tag) for key in keys), keys
    assert QueueKeys.for_queue(redis_prefix, Q).group_rate("cust-1") in keys


def test_obliterate_deletes_only_its_own_queue(storage, redis_client, redis_prefix):
    """A queue whose name starts with another's keeps its keys (the SCAN pattern is exact)."""
    other = Q + "-2"
    for queue in (Q, other):
        storage.register_queue(queue)
        storage.enqueue(queue, job("a", dedup=Dedup("k")))
        storage.enqueue(queue, job("b", delay=1_000))
        storage.set_limits(queue, QueueLimits(concurrency=2))
    assert storage.obliterate(Q) == 2
    left = {key.decode() for key in redis_client.scan_iter(match="*" + redis_prefix + "*")}
    # Only an empty event stream that remembers its last id (a reader of the old queue is
    # told its events are gone: EventsLost), and the obliteration generation (reconcile's
    # fence: a re-creation read before this obliterate is refused).
    tag = "{" + f"{redis_prefix}:{Q}" + "}"
    assert sorted(key for key in left if key.startswith(tag)) == [tag + ":events",
                                                                 tag + ":generation"]  # fmt: skip
    # Odd until the caller (Queue.obliterate) has deleted the journal entries too and says so.
    assert redis_client.get(tag + ":generation") == b"1"
    storage.obliterated(Q)
    assert redis_client.get(tag + ":generation") == b"2"
    assert redis_client.xlen(tag + ":events") == 0
    assert storage.get_limits(other) == QueueLimits(concurrency=2)
    assert storage.list_queues() == [other]
    assert storage.enqueue(other, job("c", dedup=Dedup("k"))).job_id == "a"


def test_get_records_reads_the_scheduling_fields(storage):
    storage.enqueue(Q, job("a", lifo=True, group="g", dedup=Dedup("k", DedupMode.THROTTLE, 50)))
    storage.claim(Q, "w1", 1, LEASE)
    storage.enqueue(Q, job("a", singleton=True))
    rec = storage.get_records(Q, ["a"])["a"]
    assert (rec.lifo, rec.group, rec.dedup_key, rec.has_successor) == (True, "g", "k", True)
