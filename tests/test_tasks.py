"""Task functions (``@task``): several named job types on one queue, dispatched by name in a
real worker, arguments checked and serialised before anything is stored; on every backend."""

from __future__ import annotations

import asyncio

import pytest
from django.test import override_settings
from pydantic import BaseModel

from django_jobq import JobFailed, JobState
from django_jobq.errors import ConfigurationError, InvalidPayload
from django_jobq.queue import Queue
from django_jobq.tasks import Backoff, task
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker

from .helpers import wait_until

Q = "tasks-mixed"
REG = HandlerRegistry()  # this module's tasks only; the worker below serves exactly these


@task(queue=Q, name="tests.add", registry=REG)
def add(a: int, b: int = 0) -> int:
    return a + b


@task(queue=Q, name="tests.greet", registry=REG)
def greet(name: str, *, punctuation: str = "!") -> str:
    return f"hello {name}{punctuation}"


@task(queue=Q, name="tests.async_mul", registry=REG)
async def async_mul(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a * b


class Flaky(Exception):
    pass


class Broken(Exception):
    pass


ATTEMPTS: dict[str, list[int]] = {}


@task(queue=Q, name="tests.picky", registry=REG, max_attempts=3, retry_on=(Flaky,),
      backoff=Backoff.fixed(0.01))  # fmt: skip
def picky(key: str, kind: str) -> str:
    ATTEMPTS.setdefault(key, []).append(1)
    raise Flaky("try again") if kind == "flaky" else Broken("a bug")


class Order(BaseModel):
    sku: str
    qty: int


@task(queue=Q, name="tests.typed", registry=REG)
def typed(order: Order, note: str = "") -> dict:
    assert isinstance(order, Order)  # rebuilt as the model in the worker
    return {"sku": order.sku, "total": order.qty * 2, "note": note}


@pytest.fixture(params=["thread", "async"])
def env(request, backend, live_storage):
    queue = Queue(Q, storage=live_storage)
    worker = Worker([Q], storage=live_storage, handlers=REG, concurrency=2, reap_interval=0,
                    grace=1, pool=request.param)  # fmt: skip
    worker.start()
    yield queue, worker
    worker.stop(hurry=True)
    if worker.started.is_set():
        assert worker.stopped.wait(30)


def finished(queue: Queue, job_id: str):
    def check():
        status = queue.get_status(job_id)
        return status is not None and status.state in (JobState.COMPLETED, JobState.FAILED)

    assert wait_until(check), queue.get_status(job_id)
    return queue.get_status(job_id)


def test_several_named_tasks_share_one_queue_and_run_by_name(env):
    queue, _ = env
    jobs = {
        add.using(queue=queue).enqueue(2, b=3).job_id: 5,
        greet.using(queue=queue).enqueue("ada", punctuation="?").job_id: "hello ada?",
        async_mul.using(queue=queue).enqueue(6, 7).job_id: 42,
        typed.using(queue=queue).enqueue({"sku": "x1", "qty": 4}, note="n").job_id: {
            "sku": "x1", "total": 8, "note": "n"},
    }  # fmt: skip
    for job_id, expected in jobs.items():
        assert finished(queue, job_id).state is JobState.COMPLETED, job_id
        assert queue.get_result(job_id).value == expected


def test_enqueue_and_wait_returns_the_functions_value(env):
    queue, _ = env
    assert add.using(queue=queue).enqueue_and_wait(40, 2, wait_timeout=30) == 42
    assert typed.using(queue=queue).enqueue_and_wait(Order(sku="a", qty=1), wait_timeout=30) == {
        "sku": "a", "total": 2, "note": ""}  # fmt: skip


def test_a_job_id_makes_the_call_idempotent(env):
    queue, _ = env
    first = add.using(queue=queue).enqueue(1, 1, job_id="same-call")
    assert finished(queue, "same-call").state is JobState.COMPLETED
    again = add.using(queue=queue).enqueue(1, 1, job_id="same-call")
    assert first.outcome.value == "queued" and again.outcome.value == "completed"
    assert again.result == 2


def test_unknown_task_name_fails_the_job_and_the_worker_keeps_going(env):
    queue, _ = env
    ghost = queue.enqueue("ghost", {"args": [], "kwargs": {}}, meta={"task": "tests.nobody"})
    status = finished(queue, ghost.job_id)
    assert status.state is JobState.FAILED and status.attempts == 1
    assert status.error["type"] == "UnknownTask" and "tests.nobody" in status.error["message"]
    assert [d.job_id for d in queue.dead_letters()] == ["ghost"]
    assert add.using(queue=queue).enqueue_and_wait(1, 2, wait_timeout=30) == 3


def test_a_plain_job_on_a_tasks_only_queue_is_a_dead_letter(env):
    queue, _ = env
    queue.enqueue("plain", {"a": 1})
    status = finished(queue, "plain")
    assert status.state is JobState.FAILED and "names no task" in status.error["message"]


def test_arguments_the_code_no_longer_takes_fail_for_good_not_in_the_task(env):
    queue, _ = env
    queue.enqueue("old", {"args": [1, 2, 3], "kwargs": {}}, meta={"task": "tests.add"})
    queue.enqueue("shapeless", [1, 2], meta={"task": "tests.add"})
    queue.enqueue("badmodel", {"args": [{"sku": 1}], "kwargs": {}}, meta={"task": "tests.typed"})
    for job_id, words in (("old", "cannot take"), ("shapeless", "not a task call"),
                          ("badmodel", "not a valid Order")):  # fmt: skip
        status = finished(queue, job_id)
        assert status.state is JobState.FAILED and status.attempts == 1, job_id
        assert words in status.error["message"], status.error


def test_retry_on_retries_listed_errors_and_fails_others_at_once(env):
    queue, _ = env
    flaky = picky.using(queue=queue).enqueue("f", "flaky").job_id
    broken = picky.using(queue=queue).enqueue("b", "broken").job_id
    status = finished(queue, broken)
    assert status.state is JobState.FAILED and status.attempts == 1
    assert status.error["type"] == f"{__name__}.Broken"  # the task's own error, not a wrapper
    status = finished(queue, flaky)
    assert status.state is JobState.FAILED and status.attempts == 3
    assert status.error["type"] == f"{__name__}.Flaky"
    with pytest.raises(JobFailed) as failed:
        picky.using(queue=queue).enqueue_and_wait("w", "broken", wait_timeout=30)
    assert failed.value.error["message"] == "a bug"


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda t: t.enqueue(), "missing a required argument: 'a'"),
        (lambda t: t.enqueue(1, 2, 3), "too many positional arguments"),
        (lambda t: t.enqueue(1, c=2), "unexpected keyword argument 'c'"),
        (lambda t: t.enqueue({1, 2}), "not JSON"),
        (lambda t: t.enqueue(float("nan")), "NaN"),
    ],
)
def test_a_bad_call_raises_at_the_caller_and_stores_nothing(live_storage, call, words):
    queue = Queue(Q, storage=live_storage)
    with pytest.raises(InvalidPayload) as refused:
        call(add.using(queue=queue))
    assert words.lower() in str(refused.value).lower()
    assert sum(queue.counts().values()) == 0


def test_a_typed_argument_is_validated_at_the_caller(live_storage):
    queue = Queue(Q, storage=live_storage)
    with pytest.raises(InvalidPayload, match="'order' is not a valid Order"):
        typed.using(queue=queue).enqueue({"sku": "x"})
    assert sum(queue.counts().values()) == 0
    job = typed.using(queue=queue).enqueue(Order(sku="x", qty=2))
    assert queue.get_payload(job.job_id) == {"args": [{"sku": "x", "qty": 2}], "kwargs": {}}


def test_a_plain_handler_queue_can_also_run_routed_tasks(live_storage):
    registry = HandlerRegistry()
    registry.register("tasks-plain", lambda job: {"plain": job.payload})
    registry.register_task(add)
    queue = Queue("tasks-plain", storage=live_storage)
    worker = Worker(["tasks-plain"], storage=live_storage, handlers=registry, reap_interval=0,
                    grace=1)  # fmt: skip
    worker.start()
    try:
        queue.enqueue("p", 7)
        assert add.using(queue=queue).enqueue_and_wait(1, 1, wait_timeout=30) == 2
        assert finished(queue, "p").state is JobState.COMPLETED
        assert queue.get_result("p").value == {"plain": 7}
    finally:
        worker.stop(hurry=True)
        assert worker.stopped.wait(30)


def test_routes_send_a_task_to_another_queue_and_workers_serve_it():
    assert add.target_queue().name == Q
    with override_settings(JOBQ={"BACKEND": "memory", "ROUTES": {"tests.add": "tasks-fast"}}):
        assert add.target_queue().name == "tasks-fast"
        assert greet.target_queue().name == Q
        assert "tasks-fast" in REG.queues() and REG.get("tasks-fast") is not None
        assert add.using(queue="elsewhere").target_queue().name == "elsewhere"


def test_a_task_name_is_taken_once_and_reserved_parameters_are_refused():
    registry = HandlerRegistry()

    def one(x):
        return x

    def two(x):
        return x

    task(name="tests.dup", registry=registry)(one)
    task(name="tests.dup", registry=registry)(one)  # the same function imported again: fine
    with pytest.raises(ConfigurationError, match="already taken"):
        task(name="tests.dup", registry=registry)(two)
    with pytest.raises(ConfigurationError, match="reserved"):
        task(registry=registry)(lambda job_id: job_id)
    with pytest.raises(ConfigurationError, match="task name"):
        task(name="has space", registry=registry)(two)
    with pytest.raises(ConfigurationError, match="max_attempts"):
        task(name="tests.bad", max_attempts=0, registry=registry)(two)
    with pytest.raises(ConfigurationError, match="retry_on"):
        task(name="tests.bad2", retry_on=("ValueError",), registry=registry)(two)


def test_calling_the_task_runs_the_function_here():
    assert add(1, 2) == 3
    assert asyncio.run(async_mul(2, 3)) == 6
