"""The Queue API on every backend: outcomes, validation at the edge, request/response."""

from __future__ import annotations

import threading

import pytest

from django_jobq import (
    CancelOutcome,
    EnqueueOutcome,
    InvalidJobId,
    InvalidOption,
    InvalidQueueName,
    JobFailed,
    JobState,
    PayloadTooLarge,
    Timeout,
)
from django_jobq.errors import SerializationError
from django_jobq.queue import Queue
from django_jobq.worker import Worker

from .helpers import wait_until


@pytest.fixture
def worker(live_storage):
    running = []

    def start(queue_name: str = "tests-echo", **kwargs) -> Worker:
        w = Worker([queue_name], storage=live_storage, lease=5000, grace=5, **kwargs)
        w.start()
        running.append(w)
        return w

    yield start
    for w in running:
        w.stop(hurry=True)
        w.stopped.wait(10)


# -- enqueue outcomes ---------------------------------------------------------------------------


def test_enqueue_new_id_is_queued(queue):
    result = queue.enqueue("job-1", {"n": 1})
    assert (result.outcome, result.state, result.created) == (
        EnqueueOutcome.QUEUED,
        JobState.QUEUED,
        True,
    )


def test_enqueue_without_id_generates_a_unique_one(queue):
    first, second = queue.enqueue(payload=1), queue.enqueue(payload=1)
    assert first.job_id != second.job_id
    assert len(first.job_id) == 32


def test_enqueue_existing_id_is_duplicate_and_keeps_the_first_payload(queue):
    queue.enqueue("job-1", {"n": 1})
    again = queue.enqueue("job-1", {"n": 2})
    assert (again.outcome, again.state) == (EnqueueOutcome.DUPLICATE, JobState.QUEUED)
    assert queue.storage.get_record("tests-echo", "job-1").payload == b'{"n":1}'


def test_enqueue_of_completed_id_returns_cached_result(queue, worker):
    worker()
    assert queue.enqueue_and_wait("job-1", "hi", timeout=30) == {"echo": "hi", "attempt": 1}
    again = queue.enqueue("job-1", "other")
    assert again.outcome is EnqueueOutcome.COMPLETED
    assert again.result == {"echo": "hi", "attempt": 1}


def test_enqueue_many_gives_per_item_outcomes(queue):
    results = queue.enqueue_many([("a", 1), {"id": "b", "payload": 2, "priority": 5}, ("a", 3)])
    assert [r.outcome for r in results] == [
        EnqueueOutcome.QUEUED,
        EnqueueOutcome.QUEUED,
        EnqueueOutcome.DUPLICATE,
    ]


def test_enqueue_many_with_one_invalid_item_writes_nothing(queue):
    with pytest.raises(InvalidJobId):
        queue.enqueue_many([("good", 1), ("bad id", 2)])
    assert queue.get_status("good") is None


def test_result_ttl_of_first_enqueue_wins(queue):
    queue.enqueue("job-1", 1, result_ttl=1000)
    queue.enqueue("job-1", 1, result_ttl=99_000)
    assert queue.storage.get_record("tests-echo", "job-1").result_ttl == 1000


def test_same_id_from_8_threads_makes_exactly_one_job(queue):
    barrier = threading.Barrier(8)
    outcomes = []

    def enqueue():
        barrier.wait()
        outcomes.append(queue.enqueue("race", {"n": 1}).outcome)

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == sorted([EnqueueOutcome.QUEUED] + [EnqueueOutcome.DUPLICATE] * 7)
    assert queue.counts()[JobState.QUEUED] == 1


# -- validation at the edge ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad_id",
    ["", "a b", "a:b", "{tag}", "a*", "a?", "x\n", "x\x00", "é", "a\u200fb", ".hidden", "x" * 129],
)
def test_invalid_job_ids_are_refused(queue, bad_id):
    with pytest.raises(InvalidJobId):
        queue.enqueue(bad_id, 1)


@pytest.mark.parametrize("bad_name", ["", "a b", "a:b", "{q}", "q" * 65, "-q", 42])
def test_invalid_queue_names_are_refused(live_storage, bad_name):
    with pytest.raises(InvalidQueueName):
        Queue(bad_name, storage=live_storage)


@pytest.mark.parametrize(
    "options",
    [
        {"result_ttl": 0},
        {"result_ttl": -5},
        {"result_ttl": 1.5},
        {"result_ttl": "60"},
        {"result_ttl": True},
        {"max_attempts": 0},
        {"priority": 10**6},
        {"delay": -1},
        {"no_such_option": 1},
    ],
)
def test_invalid_options_are_refused(queue, options):
    with pytest.raises(InvalidOption):
        queue.enqueue("job-1", 1, **options)
    assert queue.get_status("job-1") is None


def test_payload_over_the_limit_is_refused_with_sizes(live_storage):
    queue = Queue("tests-echo", storage=live_storage, max_payload_bytes=100)
    with pytest.raises(PayloadTooLarge) as info:
        queue.enqueue("big", "x" * 200)
    assert (info.value.size, info.value.limit) == (202, 100)
    assert queue.get_status("big") is None


def test_default_payload_limit_is_one_mebibyte(queue):
    with pytest.raises(PayloadTooLarge):
        queue.enqueue("big", "x" * (1024 * 1024))


def test_unserialisable_payload_is_refused_not_pickled(queue):
    with pytest.raises(SerializationError):
        queue.enqueue("obj", object())


def test_naive_run_at_is_refused(queue):
    import datetime as dt

    with pytest.raises(InvalidOption):
        queue.enqueue("job-1", 1, run_at=dt.datetime(2030, 1, 1))  # noqa: DTZ001


# -- request / response -------------------------------------------------------------------------


def test_enqueue_and_wait_returns_the_result(queue, worker):
    worker()
    assert queue.enqueue_and_wait("rr-1", [1, 2], timeout=30) == {"echo": [1, 2], "attempt": 1}


def test_enqueue_and_wait_raises_job_failed_with_the_remote_error(live_storage, worker):
    worker("tests-fail")
    queue = Queue("tests-fail", storage=live_storage)
    with pytest.raises(JobFailed) as info:
        queue.enqueue_and_wait("f-1", {"permanent": True}, timeout=30)
    assert info.value.error["type"] == "django_jobq.errors.PermanentError"
    assert info.value.error["message"] == "no point retrying"
    assert "Traceback" in info.value.error["traceback"]


def test_enqueue_and_wait_times_out_and_the_job_keeps_running(live_storage, worker):
    worker("tests-slow")
    queue = Queue("tests-slow", storage=live_storage)
    with pytest.raises(Timeout):
        queue.enqueue_and_wait("slow-1", {"seconds": 0.6}, timeout=0.2)
    assert queue.enqueue_and_wait("slow-1", {"seconds": 0.6}, timeout=30) == "slow-1"


def test_duplicate_waiter_of_a_running_job_gets_its_result(live_storage, worker):
    worker("tests-slow")
    queue = Queue("tests-slow", storage=live_storage)
    queue.enqueue("shared", {"seconds": 0.3})
    results = []
    threads = [
        threading.Thread(
            target=lambda: results.append(queue.enqueue_and_wait("shared", {}, timeout=30))
        )
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["shared"] * 3


def test_waiting_on_a_cancelled_job_raises_job_failed(queue):
    queue.enqueue("c-1", 1)
    queue.cancel("c-1")
    with pytest.raises(JobFailed) as info:
        queue.enqueue_and_wait("c-1", 1, timeout=1)
    assert info.value.state == "cancelled"


def test_waiter_is_told_when_the_job_is_cancelled_while_waiting(queue):
    errors = []

    def wait():
        try:
            queue.enqueue_and_wait("c-2", 1, timeout=30)
        except JobFailed as exc:
            errors.append(exc.state)

    thread = threading.Thread(target=wait)
    thread.start()
    for _ in range(200):  # until the waiter has enqueued
        if queue.get_status("c-2"):
            break
        threading.Event().wait(0.01)
    assert queue.cancel("c-2") is CancelOutcome.CANCELLED
    thread.join(5)
    assert errors == ["cancelled"]


@pytest.mark.parametrize("timeout", [0, -1, "5", True])
def test_enqueue_and_wait_needs_a_positive_timeout(queue, timeout):
    with pytest.raises(InvalidOption):
        queue.enqueue_and_wait("x", 1, timeout=timeout)


# -- cancel, status, result ---------------------------------------------------------------------


def test_cancel_outcomes_for_each_state(live_storage, worker):
    queue = Queue("tests-slow", storage=live_storage)
    queue.enqueue("waiting", {})
    assert queue.cancel("waiting") is CancelOutcome.CANCELLED
    assert queue.cancel("waiting") is CancelOutcome.CANCELLED
    assert queue.cancel("never-was") is CancelOutcome.NOT_FOUND
    assert queue.enqueue("waiting", {}).outcome is EnqueueOutcome.DUPLICATE  # stays deduplicated
    queue.enqueue("later", {}, delay=60_000)
    assert queue.get_status("later").state is JobState.SCHEDULED
    assert queue.cancel("later") is CancelOutcome.CANCELLED
    # A running job: its handler polls the cancel flag and runs until it sees it (30 s at most),
    # so the outcome does not depend on how fast this machine is.
    running = Queue("tests-soft-forever", storage=live_storage)
    worker("tests-slow")
    worker("tests-soft-forever")
    running.enqueue("running", {})
    assert wait_until(lambda: running.get_status("running").state is JobState.ACTIVE, 30)
    assert running.cancel("running") is CancelOutcome.REQUESTED  # its worker is asked to stop it
    with pytest.raises(JobFailed) as failed:
        running.enqueue_and_wait("running", {}, timeout=30)
    assert failed.value.state == "cancelled"
    assert running.cancel("running") is CancelOutcome.CANCELLED
    queue.enqueue("done", {"seconds": 0})
    assert queue.enqueue_and_wait("done", {}, timeout=30) == "done"
    assert queue.cancel("done") is CancelOutcome.COMPLETED


def test_cancelled_job_never_runs(live_storage, worker):
    queue = Queue("tests-echo", storage=live_storage)
    queue.enqueue("doomed", 1)
    queue.cancel("doomed")
    worker()
    assert queue.enqueue_and_wait("after", 2, timeout=30)["echo"] == 2
    assert queue.get_status("doomed").state is JobState.CANCELLED
    assert queue.get_status("doomed").started_at is None


def test_get_status_reports_state_attempts_times_and_worker(queue, worker):
    w = worker()
    queue.enqueue_and_wait("s-1", 1, timeout=30)
    status = queue.get_status("s-1")
    assert status.state is JobState.COMPLETED
    assert status.attempts == 1
    assert status.worker == w.worker_id
    assert status.created_at <= status.started_at <= status.finished_at


def test_get_result_of_unknown_job_is_none(queue):
    assert queue.get_result("nope") is None


def test_get_result_of_failed_job_has_the_error(live_storage, worker):
    worker("tests-fail")
    queue = Queue("tests-fail", storage=live_storage)
    with pytest.raises(JobFailed):
        queue.enqueue_and_wait("f-2", {"permanent": True}, timeout=30)
    result = queue.get_result("f-2")
    assert (result.state, result.ok, result.value) == (JobState.FAILED, False, None)
    assert result.error["message"] == "no point retrying"


def test_msgpack_serde_round_trips(live_storage, worker):
    worker()
    queue = Queue("tests-echo", storage=live_storage, serde="msgpack")
    assert queue.enqueue_and_wait("mp-1", {"b": b"\x00\x01"}, timeout=30) == {
        "echo": {"b": b"\x00\x01"},
        "attempt": 1,
    }
