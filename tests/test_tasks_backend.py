"""Django's Tasks framework running on django_jobq, end to end, on every storage backend:
``@task`` functions enqueued through ``TASKS`` run on a real Worker, with our retries, and their
``TaskResult`` reflects our state."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.test import override_settings
from django.utils import timezone

from django_jobq.contrib.tasks_backend import JobQBackend
from django_jobq.job import JobOptions, NewJob
from django_jobq.states import JobState
from django_jobq.tasks.registry import registry
from django_jobq.worker import Worker

from . import task_funcs
from .helpers import wait_until


@pytest.fixture
def tasks_on(live_storage, settings):
    """TASKS as in tests/settings.py, with this test's storage injected."""
    conf = {**settings.TASKS["default"]}
    conf["OPTIONS"] = {**conf["OPTIONS"], "STORAGE": live_storage}
    with override_settings(TASKS={"default": conf}):
        backend = task_backends["default"]
        assert isinstance(backend, JobQBackend)
        yield backend
    task_funcs.CALLS.clear()


@pytest.fixture
def worker(live_storage, tasks_on):
    running = []

    def start(*queues: str, concurrency: int = 4) -> Worker:
        w = Worker(list(queues or ["default"]), storage=live_storage, handlers=registry,
                   concurrency=concurrency, lease=5000, grace=5)  # fmt: skip
        w.start()
        running.append(w)
        return w

    yield start
    for w in running:
        w.stop(hurry=True)
        w.stopped.wait(10)


def finished(result):
    def check():
        result.refresh()
        return result.is_finished

    return check


def test_capabilities_are_declared():
    flags = ("supports_defer", "supports_async_task", "supports_get_result", "supports_priority")
    assert [getattr(JobQBackend, f) for f in flags] == [True] * 4


def test_a_task_runs_on_the_worker_and_its_result_comes_back(tasks_on, worker):
    result = task_funcs.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY and result.backend == "default"
    worker()
    assert wait_until(finished(result))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.attempts == 1 and result.finished_at >= result.started_at
    fetched = task_funcs.add.get_result(result.id)
    assert (fetched.args, fetched.return_value) == ([2, 3], 5)


def test_higher_django_priority_runs_first(tasks_on, worker):
    task_funcs.lazy.enqueue("low")
    task_funcs.add.enqueue(1, 1)
    last = task_funcs.urgent.enqueue("high")
    worker(concurrency=1)
    assert wait_until(finished(last))
    assert wait_until(lambda: len(task_funcs.CALLS) == 3)
    assert [c[0] if c[0] == "add" else c[1] for c in task_funcs.CALLS] == ["high", "add", "low"]


def test_run_after_defers_the_task(tasks_on, worker, live_storage):
    result = task_funcs.add.using(run_after=timezone.now() + dt.timedelta(seconds=60)).enqueue(1, 2)
    worker()
    queue, job_id = result.id.split("/")
    assert live_storage.get_record(queue, job_id).state is JobState.SCHEDULED
    result.refresh()
    assert result.status == TaskResultStatus.READY and task_funcs.CALLS == []


def test_a_failing_task_is_retried_then_failed_with_its_error(tasks_on, worker):
    result = task_funcs.explode.enqueue()
    worker()
    assert wait_until(finished(result))
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 2  # JOB_OPTIONS max_attempts=2: our retries applied
    assert result.errors[0].exception_class is ValueError
    assert "task exploded" in result.errors[0].traceback
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018


def test_takes_context_gets_the_attempt(tasks_on, worker):
    result = task_funcs.with_context.enqueue(7)
    worker()
    assert wait_until(finished(result))
    assert result.return_value == {"attempt": 1, "id": result.id, "x": 7}


def test_async_task_and_async_api(tasks_on, worker):
    worker()

    async def go():
        result = await task_funcs.async_double.aenqueue(21)
        for _ in range(200):
            await result.arefresh()
            if result.is_finished:
                break
            await asyncio.sleep(0.05)
        fetched = await task_funcs.async_double.aget_result(result.id)
        # The ORM ran in asgiref's executor thread: close its connections there.
        await sync_to_async(connections.close_all, thread_sensitive=True)()
        return fetched

    fetched = asyncio.run(go())
    assert (fetched.status, fetched.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


def test_queue_name_maps_to_our_queue(tasks_on, worker):
    result = task_funcs.on_other_queue.enqueue()
    assert result.id.startswith("tasks-other/")
    worker("tasks-other")
    assert wait_until(finished(result))
    assert result.return_value == "other"


def test_signals_are_sent(tasks_on, worker):
    seen = []

    def record(name):
        return lambda sender, task_result, **kw: seen.append((name, task_result.status))

    receivers = [(task_enqueued, record("enqueued")), (task_started, record("started")),
                 (task_finished, record("finished"))]  # fmt: skip
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)
    try:
        result = task_funcs.add.enqueue(1, 2)
        worker()
        assert wait_until(finished(result))
        assert wait_until(lambda: len(seen) == 3)
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    assert seen == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.SUCCESSFUL),
    ]


def test_unknown_result_id_does_not_exist(tasks_on):
    for bad in ("default/nope", "nope", "other-queue/x", "default/../../x"):
        with pytest.raises(TaskResultDoesNotExist):
            tasks_on.get_result(bad)


def test_a_payload_naming_a_plain_callable_is_refused_without_calling_it(
    tasks_on, worker, live_storage
):
    body = (b'{"task": "tests.task_funcs.not_a_task", "backend": "default", "args": [], '
            b'"kwargs": {}}')  # fmt: skip
    live_storage.enqueue("default", NewJob("evil", body, JobOptions(max_attempts=3)))
    worker()
    assert wait_until(lambda: live_storage.get_record("default", "evil").state
                      is JobState.FAILED)  # fmt: skip
    rec = live_storage.get_record("default", "evil")
    assert rec.attempts == 1  # permanent: no retries
    assert task_funcs.CALLS == []


def test_a_payload_naming_a_module_is_refused_without_importing_it(tasks_on, worker, live_storage):
    """Importing is executing: the path in a message (anyone allowed to enqueue chooses it) is
    looked up among the tasks the project declared, never imported."""
    import os
    import sys

    body = (b'{"task": "tests.side_effect_module.s", "backend": "default", "args": [], '
            b'"kwargs": {}}')  # fmt: skip
    live_storage.enqueue("default", NewJob("evil", body, JobOptions(max_attempts=3)))
    worker()
    assert wait_until(lambda: live_storage.get_record("default", "evil").state
                      is JobState.FAILED)  # fmt: skip
    assert "not a django.tasks Task this project declared" in str(
        live_storage.get_record("default", "evil").error
    )
    assert "tests.side_effect_module" not in sys.modules
    assert "JOBQ_TEST_SIDE_EFFECT_IMPORTED" not in os.environ


def test_non_json_arguments_are_rejected_at_enqueue(tasks_on):
    with pytest.raises(InvalidTask):
        task_funcs.add.enqueue(object(), 1)


def test_a_project_handler_on_a_task_queue_is_refused(settings):
    from django_jobq.errors import ConfigurationError

    registry.register("tasks-clash", lambda job: None)
    try:
        conf = {
            "BACKEND": "django_jobq.contrib.tasks_backend.JobQBackend",
            "QUEUES": ["tasks-clash"],
        }
        with override_settings(TASKS={"clash": conf}), pytest.raises(ConfigurationError):
            task_backends["clash"]
    finally:
        registry.unregister("tasks-clash")
