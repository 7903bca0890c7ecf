"""job.set_progress / job.log from a handler run by a real worker, read through the Queue API
and the model mirror."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from django_jobq import InvalidOption, InvalidPayload, JobState
from django_jobq.job import LOG_LINE_MAX, Job
from django_jobq.queue import Queue
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker

from .helpers import wait_until

Q = "progress-api"


@pytest.fixture
def run(live_storage):
    """Starts a worker whose handler is ``fn``; returns the queue."""
    workers = []

    def start(fn) -> Queue:
        registry = HandlerRegistry()
        registry.register(Q, fn)
        worker = Worker([Q], storage=live_storage, handlers=registry, lease=5000, grace=1)
        worker.start()
        workers.append(worker)
        return Queue(Q, storage=live_storage)

    yield start
    for worker in workers:
        worker.stop(hurry=True)
        assert worker.stopped.wait(30)


def test_progress_and_logs_are_visible_while_the_job_runs_and_after(run):
    halfway, release = threading.Event(), threading.Event()

    def handler(job):
        job.log("starting")
        job.set_progress({"done": 1, "of": 2})
        halfway.set()
        release.wait(10)
        job.set_progress(100)
        job.log("finished")
        return "ok"

    queue = run(handler)
    queue.enqueue("p1", {})
    assert halfway.wait(30)
    status = queue.get_status("p1")
    assert (status.state, status.progress) == (JobState.ACTIVE, {"done": 1, "of": 2})
    assert [line for _, line in status.logs] == ["starting"]
    assert isinstance(status.logs[0][0], dt.datetime)
    release.set()
    assert wait_until(lambda: queue.get_status("p1").state is JobState.COMPLETED)
    status = queue.get_status("p1")
    assert status.progress == 100
    assert [line for _, line in status.logs] == ["starting", "finished"]


def test_a_report_after_the_lease_was_lost_tells_the_handler_to_stop(run):
    seen: dict = {}
    started, go = threading.Event(), threading.Event()

    def handler(job):
        seen["token"] = job.token
        started.set()
        go.wait(10)
        seen["ok"] = job.set_progress(50)
        seen["cancelled"] = job.is_cancelled()

    queue = run(handler)
    queue.enqueue("lost", {}, max_attempts=1)
    assert started.wait(30)
    # The attempt is finished behind the handler's back (as when a reclaimed lease's newer
    # attempt completes first): its token no longer fits.
    queue.storage.complete(Q, "lost", seen["token"], b'"by someone else"')
    go.set()
    assert wait_until(lambda: "cancelled" in seen)
    assert (seen["ok"], seen["cancelled"]) == (False, True)
    assert queue.get_status("lost").progress is None


def test_set_progress_refuses_what_is_not_json_or_too_big():
    job = Job(id="x", queue=Q, payload=None, attempt=1, max_attempts=1)
    with pytest.raises(InvalidPayload):
        job.set_progress({"when": object()})
    with pytest.raises(InvalidOption):
        job.set_progress("x" * 20_000)
    assert job.set_progress(3) is True and job.progress == 3  # no worker: kept locally


def test_long_log_lines_are_cut_not_refused():
    job = Job(id="x", queue=Q, payload=None, attempt=1, max_attempts=1)
    job.log("y" * (LOG_LINE_MAX + 500))
    assert len(job.logs[0]) == LOG_LINE_MAX
