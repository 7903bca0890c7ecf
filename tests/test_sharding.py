"""Sharded queues (docs/scaling.md): one logical queue over N partitions, on every backend.

Routing is stable and keeps every per-id step in one partition; reads and controls aggregate
the partitions; workers take from them in turn; raising the shard count loses nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
import zlib

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from redis.crc import key_slot

from django_jobq.errors import (
    ConfigurationError,
    InvalidOption,
    InvalidQueueName,
)
from django_jobq.job import CancelOutcome, ChangeOutcome, EnqueueOutcome, RetryOutcome
from django_jobq.queue import Queue
from django_jobq.queue.sharded import ShardedQueue
from django_jobq.queue.sharding import collapse, route, served_queues
from django_jobq.states import JobState
from django_jobq.storage.redis.keys import QueueKeys
from django_jobq.tasks import task
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.validation import (
    MAX_SHARDS,
    logical_name,
    parse_partition,
    partition_name,
    partition_names,
    validate_physical_queue_name,
    validate_queue_name,
)
from django_jobq.worker import Worker

from .helpers import running_workers, wait_until


def unique(stem: str = "shq") -> str:
    return f"{stem}{uuid.uuid4().hex[:8]}"


def ids_in(partition: int, count: int, n: int, stem: str = "j") -> list[str]:
    """``n`` job ids that route to ``partition`` of ``count``."""
    out, i = [], 0
    while len(out) < n:
        if route(f"{stem}{i}", count) == partition:
            out.append(f"{stem}{i}")
        i += 1
    return out


def waiting(queue: Queue) -> int:
    counts = queue.counts()
    return sum(counts.get(s, 0) for s in (JobState.QUEUED, JobState.SCHEDULED,
                                          JobState.ACTIVE, JobState.RETRYING))  # fmt: skip


# -- names, routing, settings (no backend) ---------------------------------------------------


def test_partition_names_cannot_be_user_queue_names():
    name = partition_name("orders", 1, 3)
    assert name == "orders~1of3" and parse_partition(name) == ("orders", 1, 3)
    with pytest.raises(InvalidQueueName):
        validate_queue_name(name)  # "~" is refused in every name a user gives
    assert validate_physical_queue_name(name) == name
    for forged in ("orders~3of3", "orders~01of3", "orders~0of65", "orders~x", "~0of2", "a~0of2~"):
        with pytest.raises(InvalidQueueName):
            validate_physical_queue_name(forged)


def test_one_shard_is_the_plain_queue():
    assert partition_names("orders", 1) == ["orders"]
    assert partition_names("orders", 2) == ["orders~0of2", "orders~1of2"]
    assert logical_name("orders~1of2") == "orders" and logical_name("orders") == "orders"
    assert collapse(["a", "orders~0of2", "orders~1of2", "orders"]) == ["a", "orders"]


def test_routing_is_crc32_and_the_same_in_every_process():
    ids = [f"id-{i}" for i in range(50)]
    assert [route(i, 7) for i in ids] == [zlib.crc32(i.encode()) % 7 for i in ids]
    code = f"from django_jobq.queue.sharding import route;print([route(i, 7) for i in {ids!r}])"
    for seed in ("1", "2"):  # str hash() differs per seed; the route must not
        out = subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert out.strip() == str([route(i, 7) for i in ids])


@pytest.mark.parametrize("bad", [0, MAX_SHARDS + 1, True, 2.0, "3", None])
def test_a_bad_shard_count_is_refused(bad, settings):
    from django_jobq.backend import check_settings

    if bad is not None:  # None as the argument means "the setting"
        with pytest.raises(InvalidOption, match="shards"):
            Queue("orders", storage=object(), shards=bad)
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {"orders": {"shards": bad}}}
    assert any("shards" in p for p in check_settings())
    with pytest.raises(ConfigurationError, match="shards"):
        Queue("orders", storage=object())


def test_a_name_too_long_for_its_partitions_is_refused():
    with pytest.raises(InvalidOption, match="cannot be sharded"):
        Queue("q" * 60, storage=object(), shards=2)
    assert Queue("q" * 57, storage=object(), shards=64).partition_names[-1] == "q" * 57 + "~63of64"


def test_a_partition_cannot_be_sharded_again():
    with pytest.raises(InvalidOption):
        Queue("orders~0of2", storage=object(), shards=2)


def test_the_setting_makes_every_queue_object_sharded(settings):
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {"orders": {"shards": 4}}}
    queue = Queue("orders", storage=object())
    assert isinstance(queue, ShardedQueue) and queue.shards == 4
    assert type(Queue("orders", storage=object(), shards=1)) is Queue  # the argument wins
    assert type(Queue("orders~1of4", storage=object())) is Queue  # one partition, asked for


@given(count=st.integers(1, MAX_SHARDS), prefix=st.text("abcxyz0189-", min_size=1, max_size=12))
@hsettings(max_examples=60, deadline=None)
def test_partition_tags_take_evenly_spaced_slot_ranges(count, prefix):
    for index in range(count):
        tag = QueueKeys.for_queue(prefix, partition_name("q", index, count)).tag
        slot = key_slot(tag.encode())
        assert index * 16384 // count <= slot < (index + 1) * 16384 // count
        assert "~" in tag and "#" in tag  # no user queue's tag can be equal


def test_served_queues_adds_old_partitions_only_while_they_hold_jobs(settings):
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {"orders": {"shards": 2}}}
    known = ["orders", "orders~0of2", "orders~1of3", "other~0of2"]
    assert served_queues(["orders"], known) == [
        "orders~0of2",
        "orders~1of2",
        "orders",
        "orders~1of3",
    ]
    assert served_queues(["orders"], known, {"orders": False, "orders~1of3": True}) == [
        "orders~0of2", "orders~1of2", "orders~1of3",
    ]  # fmt: skip


# -- every backend: routing, dedup, per-id operations ------------------------------------------


def test_jobs_spread_over_partitions_by_the_route_of_their_id(live_storage):
    queue = Queue(unique(), storage=live_storage, shards=3)
    ids = [f"job-{i}" for i in range(60)]
    results = queue.enqueue_many([(i, {"i": i}) for i in ids])
    assert [r.job_id for r in results] == ids  # answers in the callers' order
    for job_id in ids:
        home = queue.partitions[route(job_id, 3)]
        assert home.get_status(job_id) is not None
        assert all(p.get_status(job_id) is None for p in queue.partitions if p is not home)
    per = [p.counts()[JobState.QUEUED] for p in queue.partitions]
    assert sum(per) == 60 and min(per) > 0
    assert queue.counts()[JobState.QUEUED] == 60


def test_an_id_is_deduplicated_across_the_logical_queue(live_storage):
    queue = Queue(unique(), storage=live_storage, shards=3)
    assert queue.enqueue("same", 1).outcome is EnqueueOutcome.QUEUED
    assert queue.enqueue("same", 2).outcome is EnqueueOutcome.DUPLICATE
    again = queue.enqueue_many([("same", 3), ("other", 4)])
    assert [r.outcome for r in again] == [EnqueueOutcome.DUPLICATE, EnqueueOutcome.QUEUED]
    assert queue.counts()[JobState.QUEUED] == 2
    assert queue.get_payload("same") == 1


def test_a_dedup_key_routes_by_the_key_so_it_stays_atomic(live_storage):
    queue = Queue(unique(), storage=live_storage, shards=3)
    first, second = ids_in(0, 3, 1, "a")[0], ids_in(1, 3, 1, "b")[0]  # ids in two partitions
    assert queue.enqueue(first, 1, dedup_key="k").outcome is EnqueueOutcome.QUEUED
    assert queue.enqueue(second, 2, dedup_key="k").outcome is EnqueueOutcome.DUPLICATE
    assert queue.counts()[JobState.QUEUED] == 1


def test_per_id_operations_find_a_job_routed_by_another_key(live_storage):
    """A job placed by its group lives outside its id's partition: lookups fall back."""
    queue = Queue(unique(), storage=live_storage, shards=3)
    group = ids_in(2, 3, 1, "g")[0]
    job_id = ids_in(0, 3, 1, "x")[0]
    queue.enqueue(job_id, {"v": 1}, group=group, delay=60_000)
    assert queue.partitions[2].get_status(job_id) is not None
    status = queue.get_status(job_id)
    assert status is not None and status.queue == queue.name  # never the partition's name
    assert queue.get_payload(job_id) == {"v": 1}
    assert queue.change_priority(job_id, 5) is ChangeOutcome.CHANGED
    assert queue.promote(job_id) is ChangeOutcome.CHANGED
    assert queue.cancel(job_id) is CancelOutcome.CANCELLED
    assert queue.retry(job_id) is RetryOutcome.RETRIED
    assert queue.get_result(job_id).state is JobState.QUEUED
    assert queue.cancel("never-enqueued") is CancelOutcome.NOT_FOUND
    assert queue.get_status("never-enqueued") is None


def test_counts_pause_dead_letters_and_drain_cover_every_partition(live_storage):
    queue = Queue(unique(), storage=live_storage, shards=3)
    for p in range(3):
        for job_id in ids_in(p, 3, 2, f"p{p}-"):
            queue.enqueue(job_id, job_id, max_attempts=1)
    queue.pause()
    assert queue.is_paused() and all(p.is_paused() for p in queue.partitions)
    assert all(live_storage.claim(p.name, "w", 5, 30_000).jobs == [] for p in queue.partitions)
    queue.resume()
    assert not queue.is_paused()
    failed = []
    for part in queue.partitions:  # one job of each partition fails for good
        [claimed] = live_storage.claim(part.name, "w", 1, 30_000).jobs
        live_storage.fail(part.name, claimed.job_id, claimed.token, b'{"type": "E"}',
                          permanent=True)  # fmt: skip
        failed.append(claimed.job_id)
    assert queue.count_dead() == 3
    dead = queue.dead_letters(limit=10)
    assert sorted(d.status.job_id for d in dead) == sorted(failed)
    assert {d.status.queue for d in dead} == {queue.name}
    assert [d.status.job_id for d in queue.dead_letters(offset=1, limit=1)] == [
        dead[1].status.job_id
    ]
    assert queue.retry_dead() == 3
    assert queue.counts()[JobState.QUEUED] == 6
    assert queue.drain() == 6 and waiting(queue) == 0


def test_queue_wide_limits_are_split_over_the_partitions(live_storage):
    queue = Queue(unique(), storage=live_storage, shards=3)
    queue.set_limits(concurrency=7, rate_max=9, rate_window=1000)
    assert [p.get_limits().concurrency for p in queue.partitions] == [2, 2, 2]
    assert [p.get_limits().rate_max for p in queue.partitions] == [3, 3, 3]
    limits = queue.get_limits()
    assert (limits.concurrency, limits.rate_max) == (6, 9)  # what is enforced, never above
    with pytest.raises(InvalidOption, match="shards"):
        queue.set_limits(concurrency=2)


def test_events_are_merged_and_still_readable_per_partition(live_storage):
    """The merged feed is tests/test_sharded_events.py; a partition's own feed stays."""
    queue = Queue(unique(), storage=live_storage, shards=2)
    queue.enqueue(ids_in(1, 2, 1)[0], 1)
    assert [e.kind for e in queue.partition(1).events()] == ["queued"]
    assert [(e.queue, e.kind) for e in queue.events()] == [(queue.name, "queued")]


# -- workers -----------------------------------------------------------------------------------


def registry_for(name: str, seen: list | None = None) -> HandlerRegistry:
    handlers = HandlerRegistry()

    def handle(job):
        if seen is not None:
            seen.append((job.queue, job.id))
        return job.payload

    handlers.register(name, handle)
    return handlers


def test_enqueue_and_wait_gets_the_result_from_its_partition(live_storage, settings):
    name = unique()
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {name: {"shards": 3}}}
    queue = Queue(name, storage=live_storage)
    seen: list = []
    with running_workers(live_storage, handlers=registry_for(name, seen), reap_interval=0) as start:
        start([name])
        for job_id in ("w1", "w2", "w3", "w4"):
            assert queue.enqueue_and_wait(job_id, {"id": job_id}, timeout=30) == {"id": job_id}
    assert {q for q, _ in seen} == {name}  # handlers see the logical name


class RecordingWorker(Worker):
    """The real claim round; claimed jobs are recorded instead of run (slots stay as set)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.claimed: list[tuple[str, str]] = []

    def _dispatch(self, jobs):
        self.claimed.extend((c.queue, c.job_id) for c in jobs)


@pytest.mark.parametrize("shards", [3])
def test_claims_take_the_partitions_in_turn_so_none_starves(live_storage, backend, settings,
                                                             shards):  # fmt: skip
    """Property: whatever the backlog of each partition, the free slots and the batch size,
    a partition that holds jobs is served at least once every ``shards`` claim rounds, and
    every job is claimed exactly once."""

    @given(
        backlog=st.lists(st.integers(0, 6), min_size=shards, max_size=shards),
        free=st.integers(1, 3),
        batch=st.integers(1, 3),
    )
    @settings_for(backend)
    def check(backlog, free, batch):
        name = unique()
        settings.JOBQ = {**settings.JOBQ, "QUEUES": {name: {"shards": shards}}}
        queue = Queue(name, storage=live_storage)
        jobs = [j for p, n in enumerate(backlog) for j in ids_in(p, shards, n, f"b{p}-")]
        queue.enqueue_many([(j, None) for j in jobs])
        worker = RecordingWorker([name], storage=live_storage, handlers=registry_for(name),
                                 concurrency=free, batch=batch, lease=60_000)  # fmt: skip
        left = dict(zip(queue.partition_names, backlog, strict=True))
        last = dict.fromkeys(left, -1)
        for rnd in range(sum(backlog) * shards + shards):
            before = len(worker.claimed)
            worker._claim_round(rnd)
            for part, _ in worker.claimed[before:]:
                left[part] -= 1
                last[part] = rnd
            for part, n in left.items():  # holding jobs, yet skipped for a whole turn?
                assert n == 0 or rnd - last[part] < shards, (part, rnd, last, left)
            if not any(left.values()):
                break
        assert sorted(j for _, j in worker.claimed) == sorted(jobs)
        queue.obliterate(force=True)

    check()


def settings_for(backend: str):
    return hsettings(max_examples=25 if backend == "memory" else 6, deadline=None,
                    database=None)  # fmt: skip


def test_resharding_one_to_three_with_jobs_in_flight_loses_nothing(live_storage, settings):
    """The procedure of docs/scaling.md: old workers keep running while the new setting is
    deployed; new workers serve the new partitions and the old plain queue until it is empty."""
    name = unique()
    done: set[str] = set()
    lock, gate = threading.Lock(), threading.Event()
    handlers = HandlerRegistry()

    def handle(job):
        if job.id.startswith("old-"):  # in flight until the new worker has started
            gate.wait(30)
        with lock:
            done.add(job.id)

    handlers.register(name, handle)
    before = [f"old-{i}" for i in range(120)]
    after = [f"new-{i}" for i in range(120)]
    Queue(name, storage=live_storage).enqueue_many([(j, None) for j in before])  # 1 shard
    with running_workers(live_storage, handlers=handlers, reap_interval=0.2,
                         concurrency=2) as start:  # fmt: skip
        start([name])  # an old worker: one shard, busy with the backlog
        settings.JOBQ = {**settings.JOBQ, "QUEUES": {name: {"shards": 3}}}
        sharded = Queue(name, storage=live_storage)
        assert isinstance(sharded, ShardedQueue)
        sharded.enqueue_many([(j, None) for j in after[:60]])
        new = start([name])  # a new worker: three partitions, and the old queue while it holds jobs
        assert name in new.queues and len(new.queues) == 4
        gate.set()
        sharded.enqueue_many([(j, None) for j in after[60:]])
        assert wait_until(lambda: len(done) == 240, timeout=120), len(done)
        # A handler returns before its verdict is stored: wait for the verdicts too.
        assert wait_until(lambda: sharded.counts().get(JobState.COMPLETED) == 240, timeout=60)
        assert waiting(sharded) == 0
        assert all(sharded.get_status(j).state is JobState.COMPLETED for j in before + after)
        # Once the old queue is empty the new worker's sweep drops it from its round.
        assert wait_until(lambda: name not in new.queues, timeout=30)
    assert done == set(before) | set(after)


def test_a_worker_given_the_logical_name_serves_every_partition(live_storage, settings):
    name = unique()
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {name: {"shards": 3}}}
    queue = Queue(name, storage=live_storage)
    seen: list = []
    ids = [f"r{i}" for i in range(30)]
    queue.enqueue_many([(j, None) for j in ids])
    with running_workers(live_storage, handlers=registry_for(name, seen), reap_interval=0) as start:
        worker = start([name])
        assert worker.queues == queue.partition_names
        assert wait_until(lambda: len(seen) == 30)
    assert sorted(j for _, j in seen) == sorted(ids)


def test_a_reaper_given_the_logical_name_sweeps_every_partition(live_storage, settings):
    """``runreaper orders`` of a sharded queue recovers the stalled jobs of its partitions
    (it swept an empty plain queue named ``orders`` before), and the journal's reconcile of
    ``orders`` reads its partitions' entries."""
    from django_jobq.worker.reaper import Reaper

    name = unique()
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {name: {"shards": 3}}}
    queue = Queue(name, storage=live_storage)
    ids = [f"st{i}" for i in range(12)]
    queue.enqueue_many([(j, None) for j in ids])
    for partition in queue.partition_names:  # every job claimed under a lease of 1 ms
        live_storage.claim(partition, "dead-worker", 100, 1)
    assert sum(p.counts()[JobState.ACTIVE] for p in queue.partitions) == len(ids)
    reaper = Reaper([name], storage=live_storage, mirror=False, schedules=False)
    assert set(queue.partition_names) <= set(reaper.queues())

    def swept() -> bool:
        reaper.run_once()
        return queue.counts().get(JobState.QUEUED, 0) == len(ids)

    assert wait_until(swept, timeout=30)  # the leases end by the storage's clock


def test_a_flow_across_sharded_queues_releases_its_parent(live_storage, settings):
    """Parents and children are named by their partition in the flow's envelopes, so the
    storage steps that find and release them reach the right one."""
    from django_jobq.queue.flows import enqueue_flow, node

    parent_q, child_q = unique("fp"), unique("fc")
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {parent_q: {"shards": 3}, child_q: {"shards": 2}}}
    seen: list = []
    handlers = registry_for(child_q)
    handlers.register(
        parent_q, lambda job: seen.append([(c.queue, c.job_id) for c in job.children])
    )
    kids = [node(child_q, f"kid{i}", {"n": i}) for i in range(4)]
    enqueue_flow(node(parent_q, "top", None, children=kids), storage=live_storage)
    with running_workers(live_storage, handlers=handlers, reap_interval=0.2) as start:
        start([child_q, parent_q])
        parent = Queue(parent_q, storage=live_storage)
        assert wait_until(lambda: parent.get_status("top").state is JobState.COMPLETED)
    assert sorted(seen[0]) == [(child_q, f"kid{i}") for i in range(4)]  # named as the user did


def test_the_async_api_routes_like_the_sync_one(live_storage):
    from asgiref.sync import async_to_sync

    queue = Queue(unique(), storage=live_storage, shards=3)

    async def produce():
        first = await queue.aenqueue("async-1", {"a": 1})
        again = await queue.aenqueue("async-1", {"a": 2})
        return first.outcome, again.outcome, await queue.aget_status("async-1")

    # As an ASGI server runs it: thread-sensitive calls on this (the main) thread, whose
    # database connections the test run closes.
    first, again, status = async_to_sync(produce)()
    assert (first, again) == (EnqueueOutcome.QUEUED, EnqueueOutcome.DUPLICATE)
    assert status.queue == queue.name and status.state is JobState.QUEUED
    assert queue.partitions[route("async-1", 3)].get_status("async-1") is not None


CANVAS = HandlerRegistry()


@task(queue="shard-canvas", name="shard.inc", registry=CANVAS, max_attempts=1)
def shard_inc(x: int) -> int:
    return x + 1


@task(queue="shard-canvas-sum", name="shard.total", registry=CANVAS, max_attempts=1)
def shard_total(values: list) -> int:
    return sum(values)


def test_task_canvases_on_sharded_queues_are_waited_on_in_their_partitions(live_storage,
                                                                           settings):  # fmt: skip
    """Groups, chords and chains (flows of task jobs) across two sharded queues: their result
    handles find each member in its partition."""
    from django_jobq.tasks import chain, chord, group

    settings.JOBQ = {**settings.JOBQ, "QUEUES": {"shard-canvas": {"shards": 3},
                                                 "shard-canvas-sum": {"shards": 2}}}  # fmt: skip
    inc = shard_inc.using(queue=Queue("shard-canvas", storage=live_storage))
    total = shard_total.using(queue=Queue("shard-canvas-sum", storage=live_storage))
    with running_workers(live_storage, handlers=CANVAS, reap_interval=0.2) as start:
        start(["shard-canvas", "shard-canvas-sum"])
        assert group(*(inc.s(i) for i in range(6))).enqueue().get(60) == [1, 2, 3, 4, 5, 6]
        assert chord(group(inc.s(1), inc.s(2), inc.s(3)), total.s()).enqueue().get(60) == 9
        assert chain(inc.s(5), inc.s(), inc.s()).enqueue_and_wait(timeout=60) == 8
