"""Job flows (parents waiting for children on any queue, chains) and per-job timeouts.

Storage-level tests run on every backend with the fake clock and no worker, so the sweep (the
path that does not depend on a worker's trigger) is checked on its own; worker tests run real
in-process workers on every backend, and the per-job timeout tests run the pools on Redis.
"""

from __future__ import annotations

import datetime as dt

import pytest

from django_jobq import JobState
from django_jobq.errors import FlowError, InvalidOption
from django_jobq.job import PARKED_MS, EnqueueOutcome
from django_jobq.queue import Queue
from django_jobq.queue.flows import chain, enqueue_flow, node, resolve_parked
from django_jobq.storage.base import Ack
from django_jobq.tasks.registry import registry
from django_jobq.worker.execution import Prepared, prepare
from tests.jobsapp import jobs

from .helpers import running_workers, wait_until

LEAF, SUM, STEP = "tests-flow-leaf", "tests-flow-sum", "tests-flow-step"


def _finish(storage, queue: str, result: bytes) -> None:
    """Claim and complete every job of ``queue`` by hand: no worker, so no fast path."""
    for claimed in storage.claim(queue, "hand", 10, 30_000).jobs:
        storage.complete(queue, claimed.job_id, claimed.token, result)


# --- building and refusing flows --------------------------------------------------------------


def test_a_cycle_is_refused_before_any_job_is_stored(storage):
    a = node(SUM, "cyc-a")
    b = node(SUM, "cyc-b", children=[a, node(LEAF, "cyc-leaf", {"value": 1})])
    a.children.append(b)
    with pytest.raises(FlowError, match="cycle: .*cyc-b -> .*cyc-a -> .*cyc-b"):
        enqueue_flow(b, storage=storage)
    for queue, job_id in [(SUM, "cyc-a"), (SUM, "cyc-b"), (LEAF, "cyc-leaf")]:
        assert storage.get_record(queue, job_id) is None


def test_a_job_that_waits_for_itself_is_a_cycle(storage):
    me = node(SUM, "self")
    me.children.append(me)
    with pytest.raises(FlowError, match="cycle"):
        enqueue_flow(me, storage=storage)
    assert storage.get_record(SUM, "self") is None


def test_one_id_defined_twice_differently_is_refused(storage):
    parent = node(SUM, "p", children=[node(LEAF, "x", {"value": 1}), node(LEAF, "x", {"value": 2})])
    with pytest.raises(FlowError, match="twice"):
        enqueue_flow(parent, storage=storage)
    assert storage.get_record(LEAF, "x") is None


def test_bad_flow_options_are_refused_at_the_edge():
    with pytest.raises(InvalidOption, match="on_child_failure"):
        node(SUM, "p", on_child_failure="shrug")
    with pytest.raises(InvalidOption, match="flow nodes"):
        node(SUM, "p", children=["not-a-node"])
    with pytest.raises(InvalidOption):
        chain()


# --- the sweep, with no worker --------------------------------------------------------------


def test_a_parent_stays_parked_until_every_child_finished_then_the_sweep_releases_it(storage):
    parent = node(SUM, "p1", {"report": 7},
                  children=[node("tests-flow-a", "c1", {"value": 2}),
                            node("tests-flow-b", "c2", {"value": 3})])  # fmt: skip
    results = enqueue_flow(parent, storage=storage)
    assert {k: r.outcome for k, r in results.items()} == {
        ("tests-flow-a", "c1"): EnqueueOutcome.QUEUED,
        ("tests-flow-b", "c2"): EnqueueOutcome.QUEUED,
        (SUM, "p1"): EnqueueOutcome.QUEUED,
    }
    record = storage.get_record(SUM, "p1")
    assert record.state is JobState.SCHEDULED and record.run_at == PARKED_MS
    assert storage.parked(SUM) == ["p1"]
    assert storage.claim(SUM, "w", 10, 30_000).jobs == []  # parked: nothing to claim

    _finish(storage, "tests-flow-a", b"2")
    assert resolve_parked(storage, SUM) == 0  # c2 still waits
    assert storage.get_record(SUM, "p1").state is JobState.SCHEDULED

    _finish(storage, "tests-flow-b", b"3")
    assert resolve_parked(storage, SUM) == 1
    assert resolve_parked(storage, SUM) == 0  # idempotent
    assert storage.parked(SUM) == []
    assert storage.get_record(SUM, "p1").state is JobState.QUEUED

    (claimed,) = storage.claim(SUM, "w", 10, 30_000).jobs
    prepared = prepare(claimed, registry)
    assert isinstance(prepared, Prepared)
    job = prepared.job
    assert job.payload == {"report": 7}
    assert [(c.queue, c.job_id, c.state, c.value) for c in job.children] == [
        ("tests-flow-a", "c1", JobState.COMPLETED, 2),
        ("tests-flow-b", "c2", JobState.COMPLETED, 3),
    ]
    assert job.child_results == {"c1": 2, "c2": 3}


def test_a_failed_child_fails_its_parent_without_running_it(storage):
    enqueue_flow(node(SUM, "p2", children=[node(LEAF, "ok", {"value": 1}),
                                           node(LEAF, "bad", {"value": 0})]),
                 storage=storage)  # fmt: skip
    for claimed in storage.claim(LEAF, "hand", 10, 30_000).jobs:
        if claimed.job_id == "ok":
            storage.complete(LEAF, "ok", claimed.token, b"1")
        else:
            storage.fail(LEAF, "bad", claimed.token, b'{"type":"X","message":"broken"}',
                         retry_in=0, permanent=True)  # fmt: skip
    assert resolve_parked(storage, SUM) == 1
    (claimed,) = storage.claim(SUM, "w", 1, 30_000).jobs
    verdict = prepare(claimed, registry)
    assert isinstance(verdict, Ack) and verdict.kind == "fail" and verdict.permanent
    assert b"ChildFailed" in verdict.body and b"tests-flow-leaf/bad failed: broken" in verdict.body


def test_release_policy_runs_the_parent_with_the_failed_childs_error(storage):
    enqueue_flow(node(SUM, "p3", on_child_failure="release",
                      children=[node(LEAF, "gone", {"value": 0})]), storage=storage)  # fmt: skip
    storage.cancel(LEAF, "gone")
    assert resolve_parked(storage, SUM) == 1
    (claimed,) = storage.claim(SUM, "w", 1, 30_000).jobs
    prepared = prepare(claimed, registry)
    assert isinstance(prepared, Prepared)
    (child,) = prepared.job.children
    assert child.state is JobState.CANCELLED and not child.ok


def test_a_parent_whose_child_already_completed_is_released_at_once(storage):
    Queue(LEAF, storage=storage).enqueue("old", {"value": 5})
    _finish(storage, LEAF, b"5")
    enqueue_flow(node(SUM, "late", children=[node(LEAF, "old", {"value": 5})]), storage=storage)
    assert storage.get_record(SUM, "late").state is JobState.QUEUED


def test_enqueueing_the_same_flow_again_stores_nothing_new(storage):
    def flow():
        return node(SUM, "again", children=[node(LEAF, "again-c", {"value": 1})])

    enqueue_flow(flow(), storage=storage)
    second = enqueue_flow(flow(), storage=storage)
    assert {r.outcome for r in second.values()} == {EnqueueOutcome.DUPLICATE}
    assert storage.parked(SUM) == ["again"]


def test_a_parent_started_by_hand_before_its_children_is_parked_again(storage):
    enqueue_flow(node(SUM, "eager", children=[node(LEAF, "slowpoke", {"value": 1})]),
                 storage=storage)  # fmt: skip
    Queue(SUM, storage=storage).promote("eager")  # an operator's "run now"
    (claimed,) = storage.claim(SUM, "w", 1, 30_000).jobs
    verdict = prepare(claimed, registry)
    assert isinstance(verdict, Ack) and verdict.kind == "postpone"
    storage.postpone(SUM, "eager", claimed.token, verdict.retry_in)
    assert storage.parked(SUM) == ["eager"]


def test_a_parents_own_delay_applies_after_its_children(storage, clock):
    due = dt.datetime.fromtimestamp(clock.now / 1000, tz=dt.UTC) + dt.timedelta(hours=1)
    enqueue_flow(node(SUM, "later", run_at=due, children=[node(LEAF, "k", {"value": 1})]),
                 storage=storage)  # fmt: skip
    _finish(storage, LEAF, b"1")
    assert resolve_parked(storage, SUM) == 1
    record = storage.get_record(SUM, "later")
    assert record.state is JobState.SCHEDULED and record.run_at == int(due.timestamp() * 1000)


# --- real workers -----------------------------------------------------------------------------


@pytest.fixture
def run(live_storage):
    with running_workers(live_storage) as start:
        yield start


def _finished(queue: Queue, job_id: str, timeout: float = 20) -> JobState | None:
    def done() -> bool:
        status = queue.get_status(job_id)
        return status is not None and status.state in (JobState.COMPLETED, JobState.FAILED)

    wait_until(done, timeout)
    status = queue.get_status(job_id)
    return status.state if status else None


def test_a_worker_runs_a_flow_across_queues_and_the_parent_gets_the_results(run, live_storage):
    # No reaper and a long sweep interval: only the workers' fast path can release parents.
    run([LEAF, SUM], concurrency=4, reap_interval=3600)
    run(["tests-flow-a"], concurrency=2, reap_interval=3600)
    parent = node(SUM, "total", {"who": "ops"}, children=[
        node(LEAF, "l1", {"value": 1, "seconds": 0.2}),
        node(LEAF, "l2", {"value": 2}),
        node("tests-flow-a", "l3", {"value": 4}),
    ])  # fmt: skip
    jobs.FLOW_CALLS.clear()
    enqueue_flow(parent, storage=live_storage)
    sums = Queue(SUM, storage=live_storage)
    assert _finished(sums, "total") is JobState.COMPLETED
    result = sums.get_result("total").value
    assert result["sum"] == 7 and result["payload"] == {"who": "ops"}
    assert [c[1] for c in result["children"]] == ["l1", "l2", "l3"]
    assert jobs.FLOW_CALLS == ["total"]


def test_a_chain_passes_each_result_to_the_next_step(run, live_storage):
    run([STEP], concurrency=2, reap_interval=3600)
    last = chain(
        node(STEP, "s1", {"add": 1}),
        node(STEP, "s2", {"add": 2, "times": 10}),
        node(STEP, "s3", {"add": 3, "times": 10}),
    )
    assert last.job_id == "s3"
    enqueue_flow(last, storage=live_storage)
    steps = Queue(STEP, storage=live_storage)
    assert _finished(steps, "s3") is JobState.COMPLETED
    assert steps.get_result("s3").value == (1 * 10 + 2) * 10 + 3


def test_a_failed_child_fails_the_parent_for_good_and_its_handler_never_runs(run, live_storage):
    run([LEAF, SUM], concurrency=2, reap_interval=3600)
    jobs.FLOW_CALLS.clear()
    enqueue_flow(node(SUM, "doomed", children=[node(LEAF, "nope", {"fail": True})]),
                 storage=live_storage)  # fmt: skip
    sums = Queue(SUM, storage=live_storage)
    assert _finished(sums, "doomed") is JobState.FAILED
    assert sums.get_status("doomed").error["type"] == "django_jobq.errors.ChildFailed"
    assert jobs.FLOW_CALLS == []
    assert [d.job_id for d in sums.dead_letters()] == ["doomed"]


@pytest.mark.parametrize("backend", ["redis"], indirect=True)
def test_the_reaper_sweep_releases_parents_when_no_worker_triggered_them(live_storage):
    from django_jobq.worker.reaper import Reaper

    enqueue_flow(node(SUM, "swept", children=[node(LEAF, "done-by-hand", {"value": 9})]),
                 storage=live_storage)  # fmt: skip
    _finish(live_storage, LEAF, b"9")
    assert live_storage.get_record(SUM, "swept").state is JobState.SCHEDULED
    Reaper([SUM], storage=live_storage, mirror=False, schedules=False).run_once()
    assert live_storage.get_record(SUM, "swept").state is JobState.QUEUED


# --- per-job timeouts ---------------------------------------------------------------------------


def test_per_job_timeouts_are_validated():
    queue = Queue("tests-echo")
    for bad in (0, -1, True, "5", 86401):
        with pytest.raises(InvalidOption, match="timeout"):
            queue.build("t", {}, timeout=bad)
        with pytest.raises(InvalidOption, match="hard_timeout"):
            queue.build("t", {}, hard_timeout=bad)


def test_a_job_with_its_own_timeout_keeps_its_plain_payload_for_everyone(queue):
    queue.enqueue("env", {"a": 1}, timeout=2.5)
    assert queue.get_payload("env") == {"a": 1}
    assert queue.storage.get_record(queue.name, "env").content_type == "json+env"
    queue.enqueue("plain", {"a": 1})
    assert queue.storage.get_record(queue.name, "plain").content_type == "json"


@pytest.mark.redis
@pytest.mark.parametrize("pool", ["thread", "process", "async"])
def test_a_jobs_own_soft_timeout_stops_a_cooperative_handler(pool, redis_client, redis_prefix):
    from django_jobq.storage.redis.storage import RedisStorage

    storage = RedisStorage(redis_client, prefix=redis_prefix)
    with running_workers(storage) as start:
        start(["tests-soft-forever"], pool=pool, concurrency=1)
        queue = Queue("tests-soft-forever", storage=storage)
        queue.enqueue("short-leash", {}, timeout=0.3)
        assert _finished(queue, "short-leash", 10) is JobState.COMPLETED
        assert queue.get_result("short-leash").value == "stopped"  # long before its 30 s


@pytest.mark.redis
def test_a_jobs_own_hard_timeout_kills_its_child_and_the_worker_goes_on(redis_client, redis_prefix):
    from django_jobq.storage.redis.storage import RedisStorage

    storage = RedisStorage(redis_client, prefix=redis_prefix)
    with running_workers(storage) as start:
        worker = start(["tests-job-hang"], pool="process", concurrency=1)
        queue = Queue("tests-job-hang", storage=storage)
        queue.enqueue("stuck", {"seconds": 60}, hard_timeout=0.5, max_attempts=1)
        assert _finished(queue, "stuck", 15) is JobState.FAILED
        assert queue.get_status("stuck").error["type"] == "django_jobq.errors.HardTimeout"
        queue.enqueue("next", {"seconds": 0})  # the handler itself has no timeout
        assert _finished(queue, "next", 15) is JobState.COMPLETED
        assert queue.get_result("next").value["pid"] in worker._runner.pids()
