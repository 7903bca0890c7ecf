"""Waiting on a canvas with a real worker on every backend (memory, Redis, Redis Cluster with
members in different slots, SQLite, PostgreSQL): ``get`` / ``aget`` return the canvas' result,
raise ``CanvasFailed`` naming the member that failed first, ``CanvasTimeout`` naming the
unfinished ones, and ``status`` says where the canvas stands; a property test checks random
canvases with random failures against a reference model."""

from __future__ import annotations

import threading

import pytest
from asgiref.sync import async_to_sync
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_jobq import JobState, PermanentError
from django_jobq.errors import InvalidOption, JobFailed, JobNotFound
from django_jobq.queue import Queue
from django_jobq.tasks import CanvasFailed, CanvasTimeout, chain, chord, group, task
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker

Q = "canvas-wait"
Q2 = "canvas-wait-other"  # another queue: another cluster slot
REG = HandlerRegistry()
PATIENCE = 60.0  # seconds a get() may wait; a passing test returns as soon as the result is in


@task(queue=Q, name="canvas.inc", registry=REG, max_attempts=1)
def inc(x: int, fail: bool = False) -> int:
    if fail:
        raise PermanentError(f"inc({x}) told to fail")
    return x + 1


@task(queue=Q2, name="canvas.total", registry=REG, max_attempts=1)
def total(values: list, fail: bool = False) -> int:
    if fail:
        raise PermanentError("total told to fail")
    return sum(values)


@pytest.fixture
def storage(live_storage):
    return live_storage


@pytest.fixture
def served(storage):
    """A worker on both queues; yields (inc, total) bound to this test's storage."""
    worker = Worker([Q, Q2], storage=storage, handlers=REG, concurrency=2, reap_interval=0.2,
                    grace=1)  # fmt: skip
    worker.start()
    yield bound(storage)
    worker.stop(hurry=True)
    assert worker.stopped.wait(30)


def bound(storage):
    return inc.using(queue=Queue(Q, storage=storage)), total.using(queue=Queue(Q2, storage=storage))


def test_get_returns_a_chains_last_result_a_groups_list_and_a_chords_callback_result(served):
    i, t = served
    assert (i.s(1) | i.s() | i.s()).enqueue().get(PATIENCE) == 4
    assert group(i.s(1), i.s(10), i.s(100)).enqueue().get(PATIENCE) == [2, 11, 101]
    assert chord(group(i.s(1), i.s(2)), t.s()).enqueue().get(PATIENCE) == 5
    assert chain(i.s(5)).enqueue_and_wait(timeout=PATIENCE) == 6
    assert group(i.s(0)).enqueue_and_wait(timeout=PATIENCE) == [1]
    assert (group(i.s(3), i.s(4)) | t.s()).enqueue_and_wait(timeout=PATIENCE) == 9


def test_the_handle_still_reads_as_the_enqueue_result_it_replaced(served):
    i, _ = served
    handle = chain(i.s(1).set(job_id="h1"), i.s().set(job_id="h2")).enqueue()
    assert handle.job_id == "h2" and handle.outcome.value == "queued"
    members = group(i.s(1).set(job_id="g1"), i.s(2).set(job_id="g2")).enqueue()
    assert [m.job_id for m in members] == ["g1", "g2"] and len(members) == 2
    assert members.get(PATIENCE) == [2, 3] and handle.get(PATIENCE) == 3
    # A second get, and a handle of the same canvas enqueued again, read the finished records.
    assert handle.get(PATIENCE) == 3
    assert chain(i.s(1).set(job_id="h1"), i.s().set(job_id="h2")).enqueue().get(PATIENCE) == 3


def test_a_failed_chain_step_is_named_not_the_steps_that_followed_it(served):
    i, _ = served
    handle = (i.s(1) | i.s(fail=True) | i.s() | i.s()).enqueue()
    with pytest.raises(CanvasFailed) as caught:
        handle.get(PATIENCE)
    failed = caught.value
    assert failed.member.role == "step 2 of 4" and failed.task == "canvas.inc"
    assert failed.job_id == handle.members[1].job_id and failed.queue == Q
    assert failed.error["type"] == "django_jobq.errors.PermanentError"
    assert "inc(2) told to fail" in str(failed) and "step 2 of 4" in str(failed)
    assert isinstance(failed, JobFailed)  # as enqueue_and_wait raises
    status = handle.status()
    assert status.state == "failed" and [m.member.role for m in status.failed][0] == "step 2 of 4"


def test_a_failed_chord_member_is_named_and_a_failed_callback_is_itself(served):
    i, t = served
    handle = chord(group(i.s(1), i.s(2, fail=True), i.s(3, fail=True)), t.s()).enqueue()
    with pytest.raises(CanvasFailed, match="member 2 of 3") as caught:
        handle.get(PATIENCE)
    assert caught.value.job_id == handle.members[1].job_id
    with pytest.raises(CanvasFailed, match="callback") as caught:
        chord(group(i.s(1)), t.s(fail=True)).enqueue_and_wait(timeout=PATIENCE)
    assert caught.value.task == "canvas.total" and caught.value.queue == Q2


def test_a_failed_group_member_is_named(served):
    i, _ = served
    with pytest.raises(CanvasFailed, match="member 3 of 3") as caught:
        group(i.s(1), i.s(2), i.s(3, fail=True)).enqueue().get(PATIENCE)
    assert "inc(3) told to fail" in caught.value.error["message"]


def test_a_cancelled_member_fails_the_wait_with_its_state(storage):
    i, t = bound(storage)
    handle = chord(group(i.s(1), i.s(2)), t.s()).enqueue()  # no worker: nothing runs
    Queue(Q, storage=storage).cancel(handle.members[0].job_id)
    status = handle.status()
    assert status.state == "failed" and status.failed[0].state is JobState.CANCELLED
    # The callback stays parked until a worker resolves it; the group's member is enough.
    with pytest.raises(CanvasFailed, match="member 1 of 1.*cancelled"):
        group(i.s(5).set(job_id=handle.members[0].job_id)).enqueue().get(PATIENCE)


def test_no_result_in_time_raises_a_timeout_naming_the_unfinished_members(storage):
    i, t = bound(storage)
    handle = chord(group(i.s(1), i.s(2)), t.s()).enqueue()  # no worker
    assert handle.status().state == "waiting"
    with pytest.raises(CanvasTimeout) as caught:
        handle.get(0.2)
    assert [m.role for m in caught.value.pending] == ["member 1 of 2", "member 2 of 2",
                                                        "callback"]  # fmt: skip
    assert "chord" in str(caught.value) and caught.value.job_id == handle.job_id
    with pytest.raises(CanvasTimeout, match="member 1 of 1"):
        group(i.s(1)).enqueue().get(0.05)
    with pytest.raises(InvalidOption, match="timeout"):  # as enqueue_and_wait's
        handle.get(0)


def test_status_follows_the_canvas_to_completion(served, storage):
    i, t = served
    handle = chord(group(i.s(1), i.s(2)), t.s()).enqueue()
    assert handle.get(PATIENCE) == 5
    status = handle.status()
    assert (status.kind, status.state, status.completed, status.total) == ("chord", "completed",
                                                                            3, 3)  # fmt: skip
    assert [m.status.task for m in status.members] == ["canvas.inc", "canvas.inc",
                                                       "canvas.total"]  # fmt: skip


def test_get_blocks_in_the_storage_instead_of_polling(served, storage, monkeypatch):
    """One read of the result job's record, then one blocking wait in the storage (which
    returns when the outcome comes): no loop of reads however long the canvas takes."""
    i, t = served
    reads, waits = [], []
    real_read, real_wait = storage.get_record, storage.wait_for_outcome
    me = threading.get_ident()  # the worker's threads share the storage object

    def read(q, j):
        if threading.get_ident() == me:
            reads.append(j)
        return real_read(q, j)

    def wait(q, j, s):
        waits.append(j)
        return real_wait(q, j, s)

    monkeypatch.setattr(storage, "get_record", read)
    monkeypatch.setattr(storage, "wait_for_outcome", wait)
    handle = chord(group(i.s(1), i.s(2)), t.s()).enqueue()
    reads.clear()
    assert handle.get(PATIENCE) == 5
    assert reads == [handle.job_id] and waits in ([handle.job_id], [])


def test_aget_and_astatus_from_async_code(served):
    i, t = served

    async def run():
        handle = await chord(group(i.s(1), i.s(2)), t.s()).aenqueue()
        value = await handle.aget(PATIENCE)
        status = await handle.astatus()
        listed = await group(i.s(7), i.s(8)).aenqueue_and_wait(timeout=PATIENCE)
        with pytest.raises(CanvasFailed, match="step 1 of 2"):
            await chain(i.s(1, fail=True), i.s()).aenqueue_and_wait(timeout=PATIENCE)
        return value, status.state, listed

    # As an ASGI server runs it: thread-sensitive calls on this (the main) thread, whose
    # database connections the test run closes.
    assert async_to_sync(run)() == (5, "completed", [8, 9])


# -- the property: random canvases with random failures against a reference model ------------


@st.composite
def canvases(draw):
    kind = draw(st.sampled_from(["chain", "group", "chord"]))
    members = draw(st.lists(st.tuples(st.integers(-50, 50), st.booleans()), min_size=1,
                            max_size=4))  # fmt: skip
    callback_fails = draw(st.booleans()) if kind == "chord" else False
    return kind, members, callback_fails


def model(kind, members, callback_fails):
    """("ok", value) or ("failed", role of the member the error must name)."""
    n = len(members)
    if kind == "chain":
        value = members[0][0]
        for k, (_, fail) in enumerate(members):
            if fail:
                return "failed", f"step {k + 1} of {n}"
            value += 1
        return "ok", value
    failed = [k for k, (_, fail) in enumerate(members) if fail]
    if failed:
        return "failed", f"member {failed[0] + 1} of {n}"
    values = [v + 1 for v, _ in members]
    if kind == "group":
        return "ok", values
    return ("failed", "callback") if callback_fails else ("ok", sum(values))


def build(i, t, kind, members, callback_fails):
    if kind == "chain":
        first, *rest = members
        return chain(i.s(first[0], fail=first[1]), *[i.s(fail=f) for _, f in rest])
    calls = group(*[i.s(v, fail=f) for v, f in members])
    return calls if kind == "group" else chord(calls, t.s(fail=callback_fails))


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(shape=canvases())
def test_the_wait_returns_or_raises_exactly_as_the_model_says(served, shape):
    i, t = served
    expected = model(*shape)
    handle = build(i, t, *shape).enqueue()
    try:
        got = ("ok", handle.get(PATIENCE))
    except CanvasFailed as exc:
        got = ("failed", exc.member.role)
    assert got == expected
    assert handle.status().state == ("completed" if expected[0] == "ok" else "failed")


@pytest.mark.parametrize("backend", [pytest.param("redis", marks=pytest.mark.redis)])
def test_redis_pushes_the_outcome_to_the_handle_because_its_jobs_carry_a_waiter(storage):
    """Redis tells only waiters counted on the record: the jobs a handle waits on (a chain's
    last step, parked; a chord's callback; each group member) are stored with one, and the
    others with none."""
    i, t = bound(storage)
    waiters = lambda q, j: storage.client.hget(storage.keys(q).job(j), "waiters")  # noqa: E731
    steps = (i.s(1) | i.s() | i.s()).enqueue()
    assert [waiters(m.queue, m.job_id) for m in steps.members] == [None, None, b"1"]
    chorded = chord(group(i.s(1), i.s(2)), t.s()).enqueue()
    assert [waiters(m.queue, m.job_id) for m in chorded.members] == [None, None, b"1"]
    grouped = group(i.s(1), i.s(2)).enqueue()
    assert [waiters(m.queue, m.job_id) for m in grouped.members] == [b"1", b"1"]


def test_a_member_whose_record_is_gone_raises_instead_of_waiting_out_the_timeout(served, storage):
    i, _ = served
    handle = chain(i.s(1).set(job_id="gone1"), i.s().set(job_id="gone2")).enqueue()
    assert handle.get(PATIENCE) == 3
    # Its records go (result_ttl ran out, retention or an operator removed them).
    assert storage.clean(Q, 0) >= 2
    with pytest.raises(JobNotFound, match="gone2"):
        handle.get(3600)  # would hang for an hour if it waited
    with pytest.raises(JobNotFound, match="gone2"):
        async_to_sync(handle.aget)(3600)
