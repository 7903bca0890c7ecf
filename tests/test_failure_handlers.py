"""Failure handlers with a real worker on every backend (real Redis, SQLite, PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from django_jobq import FailedJob, JobState, PermanentError
from django_jobq.errors import ConfigurationError
from django_jobq.job import JobOptions, NewJob
from django_jobq.queue import Queue
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker

from .helpers import wait_until

Q = "onfail-worker"
QUIET = 1.0  # seconds we watch for a call that must not come (the worker polls every 0.05 s)


class Recorder:
    """A failure handler that records its calls and raises for the first ``failures`` ones."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls: list[tuple[object, FailedJob, dict, float]] = []
        self.lock = threading.Lock()

    def __call__(self, payload, job, error) -> None:
        with self.lock:
            self.calls.append((payload, job, error, time.monotonic()))
            n = len(self.calls)
        if n <= self.failures:
            raise OSError(f"pager down ({n})")

    def ids(self) -> list[str]:
        with self.lock:
            return [job.id for _, job, _, _ in self.calls]


def handle(job):
    if job.payload.get("permanent"):
        raise PermanentError(f"bad input {job.payload['n']}")
    if job.payload.get("fail"):
        raise ValueError(f"boom {job.payload['n']}")
    return job.payload["n"]


@pytest.fixture
def run_worker(live_storage):
    """Starts workers on ``live_storage`` (stopped at the end); failure calls polled often."""
    workers: list[Worker] = []

    def start(registry: HandlerRegistry, **options) -> Worker:
        options = {"lease": 3000, "grace": 1, "failure_poll": 0.05, **options}
        worker = Worker([Q], storage=live_storage, handlers=registry, **options)
        workers.append(worker)
        worker.start()
        return worker

    yield start
    for worker in workers:
        worker.stop(hurry=True)
        if worker.started.is_set():
            assert worker.stopped.wait(30)


@pytest.fixture
def queue(live_storage) -> Queue:
    return Queue(Q, storage=live_storage)


def registry_with(on_failure=None) -> HandlerRegistry:
    registry = HandlerRegistry()
    registry.register(Q, handle, on_failure=on_failure)
    return registry


def test_a_permanent_error_calls_the_failure_handler_once_with_payload_job_and_error(
    run_worker, queue
):
    recorder = Recorder()
    run_worker(registry_with(recorder))
    queue.enqueue("perm-7", {"n": 7, "permanent": True}, max_attempts=5)
    assert wait_until(lambda: len(recorder.calls) == 1)
    time.sleep(QUIET)
    [(payload, job, error, _)] = recorder.calls
    assert payload == {"n": 7, "permanent": True}
    assert (job.id, job.queue, job.attempts, job.tries) == ("perm-7", Q, 1, 1)
    assert job.content_type == "json" and job.raw_payload == b'{"n":7,"permanent":true}'
    assert error["type"] == "django_jobq.errors.PermanentError"
    assert error["message"] == "bad input 7" and "Traceback" in error["traceback"]
    assert job.failed_at == queue.get_status("perm-7").finished_at
    assert wait_until(lambda: queue.count_failure_calls() == 0)


def test_used_up_attempts_call_the_failure_handler_once(run_worker, queue):
    recorder = Recorder()
    run_worker(registry_with(recorder))
    options = {"max_attempts": 3, "min_backoff": 1, "max_backoff": 1}
    queue.enqueue("tries-1", {"n": 1, "fail": True}, **options)
    assert wait_until(lambda: len(recorder.calls) == 1)
    time.sleep(QUIET)
    [(_, job, error, _)] = recorder.calls
    assert (job.id, job.attempts) == ("tries-1", 3)
    assert (error["type"], error["message"]) == ("builtins.ValueError", "boom 1")


def test_a_job_stalled_past_max_stalls_by_the_sweep_calls_the_failure_handler_once(
    run_worker, queue, live_storage
):
    live_storage.set_failure_hook(Q, True)
    queue.enqueue("stall-2", {"n": 2}, max_stalls=0)
    # A worker that died holding the job: its short lease lapses and is never renewed.
    [ghost] = live_storage.claim(Q, "ghost", 1, 200).jobs
    assert ghost.job_id == "stall-2"
    recorder = Recorder()
    run_worker(registry_with(recorder), lease=600, reap_interval=0.2)
    assert wait_until(lambda: len(recorder.calls) == 1)
    time.sleep(QUIET)
    [(payload, job, error, _)] = recorder.calls
    assert (payload, job.id, error["type"]) == ({"n": 2}, "stall-2", "Stalled")
    assert queue.get_status("stall-2").state is JobState.FAILED


def test_a_failing_failure_handler_is_retried_with_backoff_until_it_succeeds(run_worker, queue):
    recorder = Recorder(failures=2)
    run_worker(registry_with(recorder), failure_backoff=(300, 600))
    queue.enqueue("flaky-3", {"n": 3, "permanent": True})
    assert wait_until(lambda: len(recorder.calls) == 3)
    time.sleep(QUIET)
    assert recorder.ids() == ["flaky-3"] * 3  # never again once it succeeded
    assert [job.tries for _, job, _, _ in recorder.calls] == [1, 2, 3]
    times = [at for _, _, _, at in recorder.calls]
    # The backoff doubles from 300 ms (plus up to 25 % jitter); margins for a busy machine.
    assert times[1] - times[0] >= 0.25 and times[2] - times[1] >= 0.5
    assert queue.count_failure_calls() == 0
    # The failure handler's errors did not harm the worker.
    queue.enqueue("after", {"n": 4})
    assert wait_until(lambda: queue.get_status("after").state is JobState.COMPLETED)


def test_a_failure_handler_error_is_kept_for_operators_while_the_call_backs_off(run_worker, queue):
    recorder = Recorder(failures=100)
    run_worker(registry_with(recorder), failure_backoff=(60_000, 120_000))
    queue.enqueue("down-5", {"n": 5, "permanent": True})
    assert wait_until(lambda: len(recorder.calls) == 1)
    assert wait_until(lambda: queue.failure_calls()[0].last_error is not None)
    [pending] = queue.failure_calls()
    assert (pending.job_id, pending.payload, pending.tries) == (
        "down-5",
        {"n": 5, "permanent": True},
        1,
    )
    assert pending.last_error["message"] == "pager down (1)"
    assert pending.error["message"] == "bad input 5"
    assert pending.due_at.timestamp() - time.time() > 50  # a minute from the failed call
    assert queue.count_failure_calls() == 1


def test_no_call_is_recorded_when_the_worker_has_no_failure_handler(
    run_worker, queue, live_storage
):
    live_storage.set_failure_hook(Q, True)  # left on by an earlier deploy
    run_worker(registry_with(None))
    assert live_storage.failure_hook(Q) is False  # a worker without one clears it
    queue.enqueue("plain-6", {"n": 6, "permanent": True})
    assert wait_until(lambda: queue.get_status("plain-6").state is JobState.FAILED)
    assert queue.count_failure_calls() == 0


def test_a_cancelled_running_job_is_not_a_failure(run_worker, queue):
    recorder = Recorder()
    started = threading.Event()

    def slow(job):
        started.set()
        job.cancel_event.wait(10)

    registry = HandlerRegistry()
    registry.register(Q, slow, on_failure=recorder)
    run_worker(registry)
    queue.enqueue("cx-8", {"n": 8})
    assert started.wait(30)
    queue.cancel("cx-8")
    assert wait_until(lambda: queue.get_status("cx-8").state is JobState.CANCELLED)
    time.sleep(QUIET)
    assert recorder.calls == [] and queue.count_failure_calls() == 0


def test_an_operator_retry_then_a_second_failure_is_a_second_call(run_worker, queue):
    recorder = Recorder()
    run_worker(registry_with(recorder))
    queue.enqueue("twice-9", {"n": 9, "permanent": True})
    assert wait_until(lambda: len(recorder.calls) == 1)
    assert queue.retry("twice-9").value == "retried"
    assert wait_until(lambda: len(recorder.calls) == 2)
    time.sleep(QUIET)
    assert recorder.ids() == ["twice-9", "twice-9"]


def test_a_payload_that_does_not_decode_reaches_the_failure_handler_as_raw_bytes(
    run_worker, live_storage
):
    recorder = Recorder()
    run_worker(registry_with(recorder))
    live_storage.enqueue(Q, NewJob("garbled", b"{not json", JobOptions(max_attempts=3)))
    assert wait_until(lambda: len(recorder.calls) == 1)
    [(payload, job, error, _)] = recorder.calls
    assert payload == b"{not json" and job.raw_payload == b"{not json"
    assert error["type"] == "MalformedPayload"


def test_an_async_failure_handler_is_awaited(run_worker, queue):
    seen: list[str] = []

    async def notify(payload, job, error):
        await asyncio.sleep(0)
        seen.append(job.id)

    run_worker(registry_with(notify))
    queue.enqueue("async-1", {"n": 1, "permanent": True})
    assert wait_until(lambda: seen == ["async-1"])
    assert wait_until(lambda: queue.count_failure_calls() == 0)


def test_the_on_failure_decorator_and_handler_option_register_one_function():
    registry = HandlerRegistry()

    def notify(payload, job, error):
        return None

    registry.register(Q, handle, on_failure=notify)
    assert registry.failure_handler(Q) is notify
    registry.register_failure_handler(Q, notify)  # the same function again: fine

    def other(payload, job, error):
        return None

    with pytest.raises(ConfigurationError, match="already has failure handler"):
        registry.register_failure_handler(Q, other)
    with pytest.raises(ConfigurationError, match="callable"):
        registry.register_failure_handler("q2", "not a function")  # type: ignore[arg-type]


def test_bad_failure_settings_are_refused_at_worker_construction(live_storage):
    with pytest.raises(ConfigurationError, match="failure_max_backoff"):
        Worker([Q], storage=live_storage, handlers=registry_with(), failure_backoff=(10, 5))
    with pytest.raises(ConfigurationError, match="failure_lease"):
        Worker([Q], storage=live_storage, handlers=registry_with(), failure_lease=0)


@pytest.mark.redis
def test_jobq_dead_calls_lists_pending_calls_with_their_last_error(settings, redis_prefix, capsys):
    from django.core.management import call_command

    from django_jobq.worker.execution import error_body

    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "PREFIX": redis_prefix}
    queue = Queue(Q)
    queue.storage.set_failure_hook(Q, True)
    for job_id in ("k1", "k2"):
        queue.enqueue(job_id, {"n": job_id}, max_attempts=1)
        [claimed] = queue.storage.claim(Q, "w", 1, 5000).jobs
        queue.storage.fail(Q, job_id, claimed.token, b'{"type": "KeyError", "message": "k"}')
    [call] = queue.storage.claim_failure_calls(Q, "w", 1, 60_000)
    body = error_body(OSError("pager down"))
    assert queue.storage.settle_failure_call(Q, call, ok=False, retry_in_ms=60_000, error=body)
    call_command("jobq_dead", "calls", Q)
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [(x["id"], x["tries"], x["worker"], x["last_error"]) for x in lines] == [
        ("k2", 0, None, None), ("k1", 1, "w", "builtins.OSError: pager down"),
    ]  # fmt: skip
    assert lines[0]["error"] == "KeyError: k"
    assert "2 failure-handler call(s) pending" in captured.err
    call_command("jobq_dead", "list", Q)
    assert "2 dead letter(s), 2 failure-handler call(s) pending" in capsys.readouterr().err


def test_a_failure_handler_backoff_of_its_own_calls_it_again_after_that(run_worker, queue):
    """The worker's failure_backoff is a minute: only the handler's own fixed backoff of a
    twentieth of a second brings the second and third calls within the test's patience."""
    from django_jobq.tasks import Backoff

    recorder = Recorder(failures=2)
    registry = HandlerRegistry()
    registry.register(Q, handle, on_failure=recorder, failure_backoff=Backoff.fixed(0.05))
    run_worker(registry)
    queue.enqueue("own-backoff", {"n": 3, "permanent": True})
    assert wait_until(lambda: len(recorder.calls) == 3)
    assert [job.tries for _, job, _, _ in recorder.calls] == [1, 2, 3]
    assert wait_until(lambda: queue.count_failure_calls() == 0)
