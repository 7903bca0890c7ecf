"""chain / group / chord over task functions, on flows, with a real worker on every backend:
results flow into the next call, a chord's callback gets its members' results in order, a
failed member fails the callback without running it, and a call that cannot bind is refused
before anything is stored."""

from __future__ import annotations

import pytest

from django_jobq import JobState
from django_jobq.errors import InvalidOption, InvalidPayload
from django_jobq.queue import Queue
from django_jobq.tasks import chain, chord, group, task
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker

from .helpers import wait_until

Q = "tasks-canvas"
REG = HandlerRegistry()


@task(queue=Q, name="canvas.add", registry=REG, max_attempts=1)
def add(a: int, b: int) -> int:
    if a < 0:
        raise ValueError("negative")
    return a + b


@task(queue=Q, name="canvas.total", registry=REG)
def total(values: list, bonus: int = 0) -> int:
    return sum(values) + bonus


@task(queue=Q, name="canvas.hello", registry=REG)
def hello(who: str) -> str:
    return f"hello {who}"


@pytest.fixture
def queue(live_storage):
    worker = Worker([Q], storage=live_storage, handlers=REG, concurrency=2, reap_interval=0.2,
                    grace=1)  # fmt: skip
    worker.start()
    yield Queue(Q, storage=live_storage)
    worker.stop(hurry=True)
    assert worker.stopped.wait(30)


def outcome(queue, job_id):
    def done():
        status = queue.get_status(job_id)
        return status is not None and status.state in (JobState.COMPLETED, JobState.FAILED)

    assert wait_until(done), queue.get_status(job_id)
    return queue.get_result(job_id)


def test_a_chain_passes_each_result_on(queue):
    a, t, h = (f.using(queue=queue) for f in (add, total, hello))
    last = (a.s(1, 2) | a.s(10) | a.s(100)).enqueue()  # ((1 + 2) + 10) + 100
    assert outcome(queue, last.job_id).value == 113
    immutable = chain(a.s(1, 1), h.si("ada")).enqueue()  # si: takes no result
    assert outcome(queue, immutable.job_id).value == "hello ada"


def test_a_chord_gets_its_members_results_in_order(queue):
    a, t = add.using(queue=queue), total.using(queue=queue)
    done = chord(group(a.s(1, 1), a.s(2, 2), a.s(3, 3)), t.s(bonus=100)).enqueue()
    assert outcome(queue, done.job_id).value == 112
    again = (group(a.s(5, 5), a.s(0, 1)) | t.s()).enqueue()  # group | task: a chord
    assert outcome(queue, again.job_id).value == 11
    members = group(a.s(7, 7), a.s(8, 8)).enqueue()
    assert [outcome(queue, m.job_id).value for m in members] == [14, 16]


def test_a_failed_member_fails_the_callback_without_running_it(queue):
    a, t = add.using(queue=queue), total.using(queue=queue)
    done = chord([a.s(1, 1), a.s(-1, 1)], t.s()).enqueue()
    result = outcome(queue, done.job_id)
    assert result.state is JobState.FAILED
    assert "children did not complete" in result.error["message"]
    assert "negative" in result.error["message"]


def test_the_same_canvas_with_ids_is_stored_once(queue):
    a = add.using(queue=queue)
    for _ in range(2):
        last = chain(a.s(1, 2).set(job_id="c1"), a.s(3).set(job_id="c2")).enqueue()
    assert last.job_id == "c2" and outcome(queue, "c2").value == 6
    assert sum(queue.counts().values()) == 2


def test_a_canvas_that_cannot_bind_stores_nothing(live_storage):
    queue = Queue(Q, storage=live_storage)
    a, t = add.using(queue=queue), total.using(queue=queue)
    with pytest.raises(InvalidPayload, match="taking the result"):
        (a.s(1, 2) | a.s(1, 2)).enqueue()  # the second step would get three arguments
    with pytest.raises(InvalidPayload):
        chord(group(a.s(1, 2), a.s(1)), t.s()).enqueue()
    with pytest.raises(InvalidPayload):
        group(a.s(1, 2), a.s("x", 1, 2)).enqueue()
    with pytest.raises(InvalidOption):
        group()
    assert sum(queue.counts().values()) == 0
