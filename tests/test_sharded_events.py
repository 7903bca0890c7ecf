"""The merged event feed of a sharded queue (``ShardedQueue.events`` / ``aevents``), on every
backend: every partition's events exactly once, each partition's order kept, and a composite
cursor from which any reader resumes with exactly the rest."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_jobq.errors import InvalidOption
from django_jobq.job import Event
from django_jobq.queue import Queue
from django_jobq.queue.sharded import ShardedQueue
from django_jobq.queue.sharded_events import encode_cursor, parse_cursor

from .helpers import wait_until
from .test_sharding import ids_in, settings_for, unique

SHARDS = 3


def sharded(storage) -> ShardedQueue:
    queue = Queue(unique("shev"), storage=storage, shards=SHARDS)
    assert isinstance(queue, ShardedQueue)
    return queue


def step(queue: ShardedQueue, partition: int, outcome: str = "complete") -> None:
    """Claim one job of ``partition`` and settle it (completed, or failed for good)."""
    storage, name = queue.storage, queue.partition_names[partition]
    (job,) = storage.claim(name, "feed-worker", 1, 60_000).jobs
    if outcome == "complete":
        storage.complete(name, job.job_id, job.token, b"1")
    else:
        storage.fail(name, job.job_id, job.token, b'{"message": "no"}', permanent=True)


def by_partition(queue: ShardedQueue, merged: list[Event], since: str = "0") -> list[list]:
    """The merged events split back per partition (the position that moved in the cursor),
    as (partition's own event id, job, kind)."""
    out: list[list] = [[] for _ in range(queue.shards)]
    before = parse_cursor(since, queue.shards)
    for event in merged:
        after = parse_cursor(event.id, queue.shards)
        moved = [i for i in range(queue.shards) if after[i] != before[i]]
        assert len(moved) == 1, (before, after)  # one event moves one partition's position
        out[moved[0]].append((after[moved[0]], event.job_id, event.kind))
        before = after
    return out


def per_partition(queue: ShardedQueue) -> list[list]:
    return [[(e.id, e.job_id, e.kind) for e in queue.partition(i).events()]
            for i in range(queue.shards)]  # fmt: skip


def test_merged_feed_has_every_partition_event_once_in_partition_order(live_storage):
    queue = sharded(live_storage)
    for p in range(SHARDS):
        queue.enqueue_many([(j, p) for j in ids_in(p, SHARDS, 2, f"m{p}-")])
    step(queue, 0)
    step(queue, 2, "fail")
    merged = list(queue.events(batch=2))  # pages smaller than a partition's share
    assert by_partition(queue, merged) == per_partition(queue)
    assert len(merged) == 6 + 2 + 2
    assert {e.queue for e in merged} == {queue.name}


def test_events_are_merged_by_time_across_partitions(live_storage):
    queue = sharded(live_storage)
    ids = {p: iter(ids_in(p, SHARDS, 2, f"t{p}-")) for p in range(SHARDS)}
    for p in (2, 0, 1, 2, 0):
        queue.enqueue(next(ids[p]), 1)
    ats = [e.at for e in queue.events()]
    assert ats == sorted(ats)


def test_kinds_filter_and_resume_from_the_last_event_seen(live_storage):
    queue = sharded(live_storage)
    first, second = ids_in(0, SHARDS, 1, "k")[0], ids_in(1, SHARDS, 1, "k")[0]
    queue.enqueue(first, 1)
    queue.enqueue(second, 1)
    step(queue, 1)
    done = list(queue.events(kinds=["completed"]))
    assert [(e.job_id, e.kind) for e in done] == [(second, "completed")]
    step(queue, 0)
    rest = list(queue.events(since=done[-1].id))
    assert [(e.job_id, e.kind) for e in rest] == [(first, "active"), (first, "completed")]


def test_follow_waits_on_every_partition_for_new_events(live_storage):
    """The reader waits as long as it may (``wait=60``) and still sees an event of whichever
    partition gets one: the wait covers them all (a wait on one partition at a time would
    hold the reader past the test's patience on the memory backend)."""
    queue = sharded(live_storage)
    seen: list[Event] = []

    def consume():
        for event in queue.events(follow=True, wait=60):
            seen.append(event)
            if len(seen) == SHARDS:
                return

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    jobs = [ids_in(p, SHARDS, 1, "f")[0] for p in (2, 0, 1)]
    for n, job in enumerate(jobs, 1):  # one event in each partition, the reader waiting
        queue.enqueue(job, None)
        assert wait_until(lambda n=n: len(seen) == n), (n, seen)
    reader.join(10)
    assert [e.job_id for e in seen] == jobs


def test_aevents_gives_the_same_events(live_storage):
    queue = sharded(live_storage)
    for p in range(SHARDS):
        queue.enqueue(ids_in(p, SHARDS, 1, "a")[0], p)
    step(queue, 1)

    async def collect():
        return [e async for e in queue.aevents(batch=2)]

    assert asyncio.run(collect()) == list(queue.events())


def test_resume_from_any_cursor_gives_exactly_the_rest(live_storage, backend):
    """Property: whatever the enqueues, claims and verdicts across partitions, and wherever a
    reader stopped (page size too), resuming from its last cursor gives exactly the events
    after it: the whole feed is the prefix read plus the rest, with nothing lost or repeated."""

    @given(
        ops=st.lists(st.tuples(st.sampled_from(["enqueue", "complete", "fail"]),
                               st.integers(0, SHARDS - 1)), min_size=1, max_size=14),
        cut=st.integers(0, 60),
        batch=st.integers(1, 4),
    )  # fmt: skip
    @settings_for(backend)
    def check(ops, cut, batch):
        queue = sharded(live_storage)
        waiting = [0] * SHARDS
        made = [0] * SHARDS
        for op, p in ops:
            if op == "enqueue":
                made[p] += 1
                queue.enqueue(ids_in(p, SHARDS, made[p], f"h{p}-")[-1], None)
                waiting[p] += 1
            elif waiting[p]:
                step(queue, p, op)
                waiting[p] -= 1
        whole = list(queue.events(batch=batch))
        assert by_partition(queue, whole) == per_partition(queue)
        cut = min(cut, len(whole))
        since = whole[cut - 1].id if cut else "0"
        rest = list(queue.events(since=since, batch=batch))
        assert [(e.job_id, e.kind, e.at) for e in rest] == [
            (e.job_id, e.kind, e.at) for e in whole[cut:]
        ]
        assert by_partition(queue, rest, since) == [
            part[len(first):] for part, first in zip(
                per_partition(queue), by_partition(queue, whole[:cut]), strict=True)
        ]  # fmt: skip
        queue.obliterate(force=True)

    check()


BAD_CURSORS = [
    "",
    "1700000000000-0",  # a plain id: a position in one partition only
    "s2:0,0",  # another shard count
    "s4:0,0,0,0",
    "s3:0,0",  # too few positions
    "s3:0,0,0,0",
    "s3:0,x,0",
    "s3:0,,0",
    "s3:0,0,0 ",
    "s03:0,0,0",
    "s3;0,0,0",
    "3:0,0,0",
    "s3:" + ",".join(["1" * 30] * 3),
    "s" * 5000,
    None,
    3,
]


@pytest.mark.parametrize("bad", BAD_CURSORS)
def test_a_malformed_cursor_is_refused_at_the_call(bad):
    from django_jobq.storage.memory import MemoryStorage

    queue = sharded(MemoryStorage())
    with pytest.raises(InvalidOption, match="since"):
        queue.events(since=bad)
    with pytest.raises(InvalidOption, match="since"):
        queue.aevents(since=bad)


def test_cursor_round_trips():
    positions = ["0", "1700000000000-0", "42"]
    assert parse_cursor(encode_cursor(positions), 3) == positions
    assert parse_cursor("0", 3) == ["0", "0", "0"]


def test_the_default_wait_over_several_queues_returns_the_first_event(live_storage):
    """``Storage.read_events_many`` as a backend without its own wait has it (a slice on each
    queue in turn): an event in any queue ends the wait, and every queue is in the answer."""
    from django_jobq.storage.base import Storage

    queue = sharded(live_storage)
    answer: list[dict] = []
    positions = dict.fromkeys(queue.partition_names, "0")
    reader = threading.Thread(
        target=lambda: answer.append(Storage.read_events_many(live_storage, positions, 10, 30)),
        daemon=True,
    )
    reader.start()
    job = ids_in(2, SHARDS, 1, "d")[0]
    queue.enqueue(job, 1)
    reader.join(30)
    (got,) = answer
    assert set(got) == set(queue.partition_names)
    assert [(e.job_id, e.kind) for e in got[queue.partition_names[2]]] == [(job, "queued")]
