"""Job signals in-process, on every backend: who sends what, with which arguments."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from django_jobq import JobFailed, JobState, signals
from django_jobq.errors import PermanentError
from django_jobq.queue import Queue
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker
from django_jobq.worker.reaper import Reaper

from .helpers import wait_until

NAMES = {getattr(signals, n): n for n in dir(signals) if n.startswith("job_")}


class Recorder:
    """Every signal sent, as (name, sender, kwargs), in order; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, Any, dict[str, Any]]] = []

    def __call__(self, signal, sender, **kwargs):
        with self.lock:
            self.seen.append((NAMES[signal], sender, kwargs))

    def of(self, name: str, job_id: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [k for n, _, k in self.seen if n == name
                    and (job_id is None or k["job_id"] == job_id)]  # fmt: skip

    def names(self, job_id: str) -> list[str]:
        with self.lock:
            return [n for n, _, k in self.seen if k.get("job_id") == job_id]


@pytest.fixture
def recorder():
    rec = Recorder()
    for signal in signals.ALL:
        signal.connect(rec, weak=False, dispatch_uid="test-recorder")
    yield rec
    for signal in signals.ALL:
        signal.disconnect(dispatch_uid="test-recorder")


@pytest.fixture
def handlers() -> HandlerRegistry:
    registry = HandlerRegistry()

    def run(job):
        if job.payload.get("fail") == "permanent":
            raise PermanentError("bad input")
        if job.payload.get("fail"):
            raise ValueError(f"boom {job.attempt}")
        return job.payload

    registry.register("sig", run)
    return registry


@pytest.fixture
def worker(live_storage, handlers):
    w = Worker(["sig"], storage=live_storage, handlers=handlers, lease=5000, grace=1,
               worker_id="sig-worker")  # fmt: skip
    w.start()
    yield w
    w.stop(hurry=True)
    assert w.stopped.wait(20)


@pytest.fixture
def q(live_storage) -> Queue:
    return Queue("sig", storage=live_storage)


def test_enqueue_sends_job_enqueued_with_each_outcome(q, recorder):
    q.enqueue("a", {})
    q.enqueue("a", {})
    q.enqueue_many([("b", {}), ("c", {})])
    sent = [(k["queue"], k["job_id"], k["outcome"]) for k in recorder.of("job_enqueued")]
    assert sent == [("sig", "a", "queued"), ("sig", "a", "duplicate"),
                    ("sig", "b", "queued"), ("sig", "c", "queued")]  # fmt: skip
    assert all(sender is Queue for _, sender, _ in recorder.seen)


def test_a_completed_job_sends_started_then_finished(q, recorder, worker):
    assert q.enqueue_and_wait("ok", {"x": 1}, timeout=20) == {"x": 1}
    assert wait_until(lambda: recorder.of("job_finished", "ok"), 10)
    names = recorder.names("ok")  # the producer's job_enqueued may come after the worker's
    assert names.count("job_enqueued") == 1
    assert [n for n in names if n != "job_enqueued"] == ["job_started", "job_finished"]
    (started,) = recorder.of("job_started", "ok")
    assert started == {"queue": "sig", "job_id": "ok", "attempt": 1, "worker_id": "sig-worker"}
    (finished,) = recorder.of("job_finished", "ok")
    assert finished["outcome"] == "completed"
    assert finished["error"] is None
    assert finished["duration"] >= 0


def test_a_failing_job_sends_retrying_then_failed_with_the_error(q, recorder, worker):
    with pytest.raises(JobFailed):
        q.enqueue_and_wait("bad", {"fail": True}, max_attempts=2, min_backoff=10,
                           max_backoff=10, timeout=20)  # fmt: skip
    assert wait_until(lambda: recorder.of("job_failed", "bad"), 10)
    (retrying,) = recorder.of("job_retrying", "bad")
    assert (retrying["attempt"], retrying["error"]["message"]) == (1, "boom 1")
    assert retrying["delay"] > 0
    (failed,) = recorder.of("job_failed", "bad")
    assert (failed["attempt"], failed["error"]["message"]) == (2, "boom 2")
    assert failed["error"]["type"] == "builtins.ValueError"
    outcomes = [k["outcome"] for k in recorder.of("job_finished", "bad")]
    assert outcomes == ["retrying", "failed"]


def test_a_permanent_error_sends_job_failed_on_the_first_attempt(q, recorder, worker):
    with pytest.raises(JobFailed):
        q.enqueue_and_wait("perm", {"fail": "permanent"}, timeout=20)
    assert wait_until(lambda: recorder.of("job_failed", "perm"), 10)
    assert recorder.of("job_retrying", "perm") == []
    assert recorder.of("job_failed", "perm")[0]["error"]["message"] == "bad input"


def test_cancelling_a_waiting_job_sends_job_cancelled(q, recorder):
    q.enqueue("later", {}, delay=60_000)
    q.cancel("later")
    (cancelled,) = recorder.of("job_cancelled", "later")
    assert cancelled == {"queue": "sig", "job_id": "later", "worker_id": None}
    q.cancel("never-was")
    assert recorder.of("job_cancelled", "never-was") == []


def test_a_stalled_job_sends_job_stalled_from_the_reaper(q, recorder, live_storage):
    q.enqueue("lost", {}, max_stalls=1)
    batch = live_storage.claim("sig", "gone-worker", 1, 1)  # a 1 ms lease nobody extends
    assert [j.job_id for j in batch.jobs] == ["lost"]
    reaper = Reaper(["sig"], storage=live_storage, schedules=False, mirror=False)
    assert wait_until(lambda: reaper.run_once()["sig"].requeued, 10)
    (stalled,) = recorder.of("job_stalled", "lost")
    assert stalled == {"queue": "sig", "job_id": "lost", "failed": False, "worker_id": None}
    assert q.get_status("lost").state is JobState.QUEUED


def test_a_receiver_that_raises_changes_nothing(q, worker, recorder):
    def broken(sender, **kwargs):
        raise RuntimeError("observer bug")

    signals.job_finished.connect(broken, weak=False, dispatch_uid="broken")
    signals.job_enqueued.connect(broken, weak=False, dispatch_uid="broken")
    try:
        assert q.enqueue_and_wait("robust", {"y": 2}, timeout=20) == {"y": 2}
        assert wait_until(lambda: recorder.of("job_finished", "robust"), 10)
    finally:
        signals.job_finished.disconnect(dispatch_uid="broken")
        signals.job_enqueued.disconnect(dispatch_uid="broken")


def test_a_job_handed_back_at_shutdown_finishes_released(live_storage, recorder):
    registry = HandlerRegistry()
    running = threading.Event()

    def cooperative(job):
        running.set()
        job.cancel_event.wait(20)  # until shutdown asks it to stop

    registry.register("sig", cooperative)
    w = Worker(["sig"], storage=live_storage, handlers=registry, lease=5000, grace=0,
               worker_id="sig-stopper")  # fmt: skip
    w.start()
    Queue("sig", storage=live_storage).enqueue("held", {})
    assert running.wait(20)
    w.stop(hurry=True)
    assert w.stopped.wait(20)
    finished = recorder.of("job_finished", "held")
    assert [(k["outcome"], k["worker_id"]) for k in finished] == [("released", "sig-stopper")]


def test_verdicts_without_a_listener_are_not_signalled(q, worker, monkeypatch):
    """With receivers on job_failed only (the metrics listen to job_cancelled only, the same
    way), a completion is not put through the signal path at all, a failure is signalled to
    its receiver, and job_finished, which nobody listens to, is never sent."""
    sent, failed = [], []
    real_send = signals.send
    monkeypatch.setattr(signals, "send", lambda s, *a, **k: (sent.append(NAMES[s]),
                                                             real_send(s, *a, **k)))  # fmt: skip

    def on_failed(sender, **kwargs):
        failed.append(kwargs["job_id"])

    signals.job_failed.connect(on_failed, weak=False, dispatch_uid="test-failed-only")
    try:
        assert q.enqueue_and_wait("quiet", {"x": 1}, timeout=20) == {"x": 1}
        with pytest.raises(JobFailed):
            q.enqueue_and_wait("loud", {"fail": "permanent"}, timeout=20)
        assert wait_until(lambda: failed == ["loud"], 10)
    finally:
        signals.job_failed.disconnect(dispatch_uid="test-failed-only")
    assert [n for n in sent if n not in ("job_enqueued", "job_started")] == ["job_failed"]
