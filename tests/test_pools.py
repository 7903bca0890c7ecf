"""Worker pools against the real Redis: the process pool (CPU-bound work, hard timeouts, dead
children), the async pool, and soft timeouts. Handlers live in tests/jobsapp/jobs.py, because
process-pool children run the handlers of their own registry."""

from __future__ import annotations

import os
import signal

import pytest

from django_jobq import JobState
from django_jobq.errors import ConfigurationError
from django_jobq.queue import Queue
from django_jobq.storage.redis.storage import RedisStorage
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker
from tests.jobsapp import jobs

from .helpers import Spawner, running_workers, wait_until

pytestmark = pytest.mark.redis


@pytest.fixture
def storage(redis_client, redis_prefix) -> RedisStorage:
    return RedisStorage(redis_client, prefix=redis_prefix)


@pytest.fixture
def run(storage):
    with running_workers(storage) as start:
        yield start


def done(queue: Queue, job_id: str, timeout: float = 20) -> bool:
    def finished() -> bool:
        status = queue.get_status(job_id)
        return status is not None and status.state in (JobState.COMPLETED, JobState.FAILED)

    return wait_until(finished, timeout)


def test_cpu_bound_jobs_run_in_reused_children_and_keep_their_leases(run, storage):
    # A lease of 1 s: a job holding the CPU for 2.5 s survives only if heartbeats go on.
    worker = run(["tests-cpu"], pool="process", concurrency=2, lease=1000, reap_interval=0.2)
    queue = Queue("tests-cpu", storage=storage)
    queue.enqueue("long", {"seconds": 2.5})
    for i in range(6):
        queue.enqueue(f"short-{i}", {"seconds": 0.01})
    ids = ["long"] + [f"short-{i}" for i in range(6)]
    assert all(done(queue, job_id) for job_id in ids)
    results = {job_id: queue.get_result(job_id).value for job_id in ids}
    assert all(r["attempt"] == 1 for r in results.values())  # no lease was lost
    assert queue.get_status("long").stalls == 0
    pids = {r["pid"] for r in results.values()}
    assert pids <= set(worker._runner.pids()) and os.getpid() not in pids
    assert len(pids) <= 2  # two children, reused: not a process per job


def test_hard_timeout_kills_the_child_and_the_worker_goes_on(run, storage):
    worker = run(["tests-hang"], pool="process", concurrency=1)
    queue = Queue("tests-hang", storage=storage)
    queue.enqueue("first", {})
    assert done(queue, "first")
    before = queue.get_result("first").value["pid"]
    queue.enqueue("stuck", {"hang": True}, max_attempts=1)
    assert done(queue, "stuck")
    status = queue.get_status("stuck")
    assert (status.state, status.error["type"]) == (
        JobState.FAILED,
        "django_jobq.errors.HardTimeout",
    )
    queue.enqueue("after", {})
    assert done(queue, "after")
    after = queue.get_result("after").value["pid"]
    assert after != before and after in worker._runner.pids()  # a new child took the slot


def test_a_hard_timeout_retries_per_policy(run, storage):
    run(["tests-hang"], pool="process", concurrency=1)
    queue = Queue("tests-hang", storage=storage)
    queue.enqueue("twice", {"hang": True}, max_attempts=2, min_backoff=1, max_backoff=1)
    assert done(queue, "twice", 30)
    assert queue.get_status("twice").attempts == 2


def test_a_child_that_dies_fails_the_attempt_which_then_retries(run, storage):
    run(["tests-crash"], pool="process", concurrency=1)
    queue = Queue("tests-crash", storage=storage)
    queue.enqueue("boom", {"crash": True}, max_attempts=2, min_backoff=1, max_backoff=1)
    assert done(queue, "boom")
    assert queue.get_status("boom").state is JobState.COMPLETED
    assert queue.get_result("boom").value["attempt"] == 2


@pytest.mark.parametrize("pool", ["thread", "process", "async"])
def test_soft_timeout_sets_the_flag_and_a_cooperative_handler_stops(run, storage, pool):
    run(["tests-soft"], pool=pool, concurrency=1)
    queue = Queue("tests-soft", storage=storage)
    queue.enqueue("polite", {})
    assert done(queue, "polite")
    assert queue.get_result("polite").value == {"stopped": True}


def test_progress_from_a_child_is_stored_through_the_parent(run, storage):
    run(["tests-report"], pool="process", concurrency=1)
    queue = Queue("tests-report", storage=storage)
    queue.enqueue("r", {})
    assert done(queue, "r")
    status = queue.get_status("r")
    child = queue.get_result("r").value
    assert status.progress == {"pid": child} and child != os.getpid()
    assert [line for _, line in status.logs] == [f"child {child} at work"]


def test_async_pool_runs_many_coroutines_at_once(run, storage):
    jobs.ASYNC_STATE.update(running=0, peak=0)
    run(["tests-async"], pool="async", concurrency=50)
    queue = Queue("tests-async", storage=storage)
    queue.enqueue_many([(f"a{i}", {"n": i, "sleep": 0.5}) for i in range(40)])
    assert wait_until(lambda: queue.counts()[JobState.COMPLETED] == 40), queue.counts()
    assert queue.get_result("a7").value == 7
    assert jobs.ASYNC_STATE["peak"] >= 10  # one thread, many jobs in flight


def test_async_pool_cancels_a_task_at_its_hard_timeout(run, storage):
    run(["tests-async-hang", "tests-async"], pool="async", concurrency=4)
    queue = Queue("tests-async-hang", storage=storage)
    queue.enqueue("slow", {}, max_attempts=1)
    assert done(queue, "slow")
    assert queue.get_status("slow").error["type"] == "django_jobq.errors.HardTimeout"
    other = Queue("tests-async", storage=storage)
    other.enqueue("next", {"n": 1, "sleep": 0})
    assert done(other, "next")


def test_the_thread_pool_refuses_a_hard_timeout_it_cannot_enforce(storage):
    worker = Worker(["tests-hang"], storage=storage, pool="thread")
    with pytest.raises(ConfigurationError, match="hard_timeout"):
        worker.check()


def test_an_unknown_pool_is_refused(storage):
    with pytest.raises(ConfigurationError, match="pool"):
        Worker(["tests-echo"], storage=storage, pool="fork")


def test_handler_timeouts_are_validated():
    registry = HandlerRegistry()
    with pytest.raises(ConfigurationError):
        registry.register("q", lambda job: None, timeout=0)
    with pytest.raises(ConfigurationError):
        registry.register("q", lambda job: None, hard_timeout="5")


@pytest.mark.slow
def test_runworker_process_pool_stops_its_children_on_sigterm(storage, redis_prefix, tmp_path):
    spawner = Spawner(tmp_path, {"JOBQ_TEST_PREFIX": redis_prefix,
                                 "JOBQ_TEST_SQLITE": str(tmp_path / "sub.sqlite3")})  # fmt: skip
    try:
        worker = spawner("runworker", "tests-cpu", "--pool", "process", "-c", "2")
        queue = Queue("tests-cpu", storage=storage)
        queue.enqueue_many([(f"j{i}", {"seconds": 0.01}) for i in range(10)])
        assert wait_until(lambda: queue.counts()[JobState.COMPLETED] == 10, 60), queue.counts()
        children = {queue.get_result(f"j{i}").value["pid"] for i in range(10)}
        assert worker.pid not in children and 1 <= len(children) <= 2
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        for pid in children:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        spawner.stop_all()


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_batch_handler_gets_many_jobs_and_each_ends_on_its_own(run, storage, pool):
    queue = Queue("tests-batch", storage=storage)
    queue.pause()
    queue.enqueue_many([(f"b{i}", {"n": i}) for i in range(25)] + [("bad", {"n": 0, "bad": True})])
    worker = run(["tests-batch"], pool=pool, concurrency=10)
    # Every slot free (the process pool's children all started) before the jobs are claimable:
    # the first claim then takes ten jobs, one handler call's worth. A worker whose children
    # start one by one meanwhile claims one job per child that is up.
    assert wait_until(lambda: worker._free == worker.concurrency, 60)
    # An idle worker sizes its claim-on-wake-up when it starts to wait: one that began while a
    # child was still starting asks for nine, until its next idle round (idle_timeout, 1 s).
    assert wait_until(lambda: worker.idle_claim == worker.concurrency, 60)
    queue.resume()
    assert wait_until(lambda: queue.counts()[JobState.COMPLETED] == 25, 60), queue.counts()
    results = [queue.get_result(f"b{i}").value for i in range(25)]
    assert [r["n"] for r in results] == [2 * i for i in range(25)]
    assert max(r["size"] for r in results) == 10  # jobs really arrived together, ten per call
    assert all(r["size"] <= 10 for r in results)
    assert wait_until(lambda: queue.get_status("bad").state is JobState.FAILED, 30)
    assert queue.get_status("bad").error["message"] == "bad item bad"


def test_a_batch_handler_that_raises_retries_every_job_of_the_call(storage):
    from django_jobq.job import ClaimedJob
    from django_jobq.worker.execution import execute_batch

    registry = HandlerRegistry()

    def explode(jobs):
        raise ValueError("database down")

    registry.register("q", explode, batch=5)
    claimed = [ClaimedJob("q", f"j{i}", b"{}", i + 1, 1, 3, 100, 100) for i in range(3)]
    claimed.append(ClaimedJob("q", "junk", b"{not json", 9, 1, 3, 100, 100))
    acks = execute_batch(claimed, registry)
    assert [a.job_id for a in acks] == ["j0", "j1", "j2", "junk"]
    assert all(a.kind == "fail" and not a.permanent and a.retry_in == 100 for a in acks[:3])
    assert acks[3].permanent  # malformed: never reached the handler


def test_a_batch_result_of_the_wrong_length_fails_the_call(storage):
    from django_jobq.job import ClaimedJob
    from django_jobq.worker.execution import execute_batch

    registry = HandlerRegistry()
    registry.register("q", lambda jobs: [1], batch=5)
    claimed = [ClaimedJob("q", f"j{i}", b"{}", i + 1, 1, 3, 100, 100) for i in range(2)]
    acks = execute_batch(claimed, registry)
    assert all(a.kind == "fail" for a in acks)
    assert b"must return a list of 2 results" in acks[0].body


def test_the_async_pool_refuses_batch_handlers(storage):
    with pytest.raises(ConfigurationError, match="batch"):
        Worker(["tests-batch"], storage=storage, pool="async").check()


def wait_active(queue: Queue, job_id: str) -> bool:
    return wait_until(
        lambda: (s := queue.get_status(job_id)) is not None and s.state is JobState.ACTIVE
    )


@pytest.mark.parametrize("pool", ["thread", "process", "async"])
def test_cancelling_a_running_job_stops_a_cooperative_handler(run, storage, pool):
    from django_jobq import CancelOutcome

    run(["tests-soft-forever"], pool=pool, concurrency=1)
    queue = Queue("tests-soft-forever", storage=storage)
    queue.enqueue("coop", {}, max_attempts=3)
    assert wait_active(queue, "coop")
    assert queue.cancel("coop") is CancelOutcome.REQUESTED
    assert wait_until(lambda: queue.get_status("coop").state is JobState.CANCELLED)
    status = queue.get_status("coop")
    assert (status.attempts, status.error["type"]) == (1, "JobCancelled")


@pytest.mark.parametrize(
    ("pool", "queue_name"), [("process", "tests-stubborn"), ("async", "tests-async-sleep")]
)
def test_a_forced_cancel_kills_a_handler_that_ignores_its_flag(run, storage, pool, queue_name):
    from django_jobq import CancelOutcome

    worker = run([queue_name], pool=pool, concurrency=1)
    queue = Queue(queue_name, storage=storage)
    queue.enqueue("stuck", {"seconds": 60}, max_attempts=3)
    assert wait_active(queue, "stuck")
    assert queue.cancel("stuck", force=True) is CancelOutcome.REQUESTED
    assert wait_until(lambda: queue.get_status("stuck").state is JobState.CANCELLED)
    assert queue.get_status("stuck").attempts == 1  # not retried
    queue.enqueue("next", {"seconds": 0})  # the worker goes on (a new child, on process)
    assert wait_until(lambda: queue.get_status("next").state is JobState.COMPLETED, 30)
    assert worker.stats["cancelled"] == 1
