"""The worker in-process, on every backend: retries, shutdown, leases, registration."""

from __future__ import annotations

import threading
import time

import pytest

from django_jobq import JobFailed, JobState
from django_jobq.errors import PermanentError, Retry
from django_jobq.queue import Queue
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker

from .helpers import wait_until


@pytest.fixture
def handlers() -> HandlerRegistry:
    return HandlerRegistry()


@pytest.fixture
def run_worker(live_storage, handlers):
    workers = []

    def start(**kwargs) -> Worker:
        kwargs.setdefault("lease", 5000)
        kwargs.setdefault("grace", 5)
        w = Worker(["w"], storage=live_storage, handlers=handlers, **kwargs)
        w.start()
        workers.append(w)
        return w

    yield start
    for w in workers:
        w.stop(hurry=True)
        assert w.stopped.wait(30)


@pytest.fixture
def q(live_storage) -> Queue:
    return Queue("w", storage=live_storage)


def test_failing_job_retries_with_backoff_then_fails_with_the_error(q, handlers, run_worker):
    attempts = []

    def flaky(job):
        attempts.append((job.attempt, time.monotonic()))
        raise ValueError(f"attempt {job.attempt}")

    handlers.register("w", flaky)
    run_worker()
    with pytest.raises(JobFailed) as info:
        q.enqueue_and_wait("f", 1, max_attempts=3, min_backoff=100, max_backoff=1000, timeout=30)
    assert [a for a, _ in attempts] == [1, 2, 3]
    gaps = [b - a for (_, a), (_, b) in zip(attempts, attempts[1:], strict=False)]
    assert gaps[0] >= 0.09 and gaps[1] >= 0.19  # 100 ms then 200 ms (+ jitter)
    assert info.value.error["message"] == "attempt 3"
    status = q.get_status("f")
    assert (status.state, status.attempts) == (JobState.FAILED, 3)


def test_job_succeeding_on_a_retry_completes(q, handlers, run_worker):
    def second_time_lucky(job):
        if job.attempt == 1:
            raise ConnectionError("flaky upstream")
        return "ok"

    handlers.register("w", second_time_lucky)
    run_worker()
    assert q.enqueue_and_wait("r", 1, min_backoff=10, timeout=30) == "ok"
    assert q.get_status("r").attempts == 2


def test_permanent_error_uses_one_attempt(q, handlers, run_worker):
    calls = []

    def perm(job):
        calls.append(job.attempt)
        raise PermanentError("never")

    handlers.register("w", perm)
    run_worker()
    with pytest.raises(JobFailed):
        q.enqueue_and_wait("p", 1, max_attempts=5, timeout=30)
    assert calls == [1]


def test_retry_request_sets_the_next_run_time(q, handlers, run_worker):
    starts = []

    def later(job):
        starts.append(time.monotonic())
        if job.attempt == 1:
            raise Retry(retry_in=0.3)
        return job.attempt

    handlers.register("w", later)
    run_worker()
    assert q.enqueue_and_wait("rt", 1, min_backoff=1, max_backoff=1, timeout=30) == 2
    assert starts[1] - starts[0] >= 0.29


def test_many_jobs_all_complete_with_a_small_pool(q, handlers, run_worker):
    handlers.register("w", lambda job: job.payload * 2)
    w = run_worker(concurrency=3, batch=2)
    q.enqueue_many([(f"j{i}", i) for i in range(300)])
    assert wait_until(lambda: q.counts()[JobState.COMPLETED] == 300)
    assert q.get_result("j150").value == 300
    # The worker counts a verdict once storage has acknowledged it, a moment after it is visible.
    assert wait_until(lambda: w.stats["completed"] == 300), w.stats


def test_malformed_bytes_in_storage_fail_that_job_and_others_flow(
    q, handlers, run_worker, live_storage
):
    from django_jobq.job import NewJob

    handlers.register("w", lambda job: "fine")
    live_storage.enqueue("w", NewJob("poison", b"\xff{{not json", q.defaults))
    q.enqueue_many([(f"ok{i}", i) for i in range(20)])
    run_worker()
    assert wait_until(lambda: q.counts()[JobState.COMPLETED] == 20)
    assert wait_until(lambda: q.get_status("poison").state is JobState.FAILED)
    assert q.get_status("poison").error["type"] == "MalformedPayload"


def test_graceful_stop_lets_the_running_job_finish(q, handlers, run_worker):
    started = threading.Event()

    def slow(job):
        started.set()
        time.sleep(0.5)
        return "finished"

    handlers.register("w", slow)
    w = run_worker(grace=5)
    q.enqueue("g", 1)
    assert started.wait(30)
    w.stop()
    assert w.stopped.wait(30)
    assert q.get_result("g").value == "finished"


def one_by_one(q, handlers, run_worker, handler, jobs: int) -> None:
    """``jobs`` request/responses (payload = index), each sent after the last one's result,
    to a worker of four slots started with ``handler`` and idle (its wait claims for all)."""
    handlers.register("w", handler)
    w = run_worker(concurrency=4)
    assert wait_until(lambda: w.idle_claim == 4, 30)
    for i in range(jobs):
        assert q.enqueue_and_wait(f"t{i}", i, timeout=60) == i


def test_a_job_claimed_on_wake_up_runs_on_the_thread_that_waited(
    q, handlers, run_worker, live_storage, backend, monkeypatch
):
    # Arrange: note which thread each wait_and_claim returned a job on (the storage method
    # is wrapped on the instance; the worker's choice to delegate looks at the class).
    skip_unless_waits_on_handler_threads(live_storage, backend)
    waited_on: dict[str, str] = {}
    wait_and_claim = live_storage.wait_and_claim

    def noting(*args, **kwargs):
        batch = wait_and_claim(*args, **kwargs)
        for job in batch.jobs if batch is not None else ():
            waited_on[job.job_id] = threading.current_thread().name
        return batch

    monkeypatch.setattr(live_storage, "wait_and_claim", noting)  # undone: no cycle left
    ran_on: dict[str, str] = {}

    def note_thread(job):
        ran_on[job.id] = threading.current_thread().name
        return job.payload

    # Act: jobs sent one at a time to the idle worker.
    one_by_one(q, handlers, run_worker, note_thread, 5)
    # Assert: each ran on a handler thread, the very one whose wait claimed it (no hop).
    assert set(waited_on) == set(ran_on) == {f"t{i}" for i in range(5)}
    assert all(ran_on[i] == waited_on[i] for i in ran_on), (ran_on, waited_on)
    assert all(name.startswith("jobq-handler-") for name in ran_on.values())


def skip_unless_waits_on_handler_threads(live_storage, backend) -> None:
    """The worker hands its idle wait to a handler thread where the storage claims as its
    wait ends, unless each calling thread would hold a database connection of its own."""
    from django_jobq.storage.base import Storage

    if type(live_storage).wait_and_claim is Storage.wait_and_claim or backend == "redis-cluster":
        # A cluster client has no one connection to write the claim behind the wait.
        pytest.skip("this backend does not claim as its wait ends (wait_and_claim)")
    if live_storage.connection_per_thread:
        pytest.skip("a connection per calling thread: storage stays on the worker's threads")


def test_handler_threads_make_no_storage_calls_where_each_thread_holds_a_connection(
    q, handlers, run_worker, live_storage, monkeypatch
):
    """Issue 36, item 3: on the database backend, waits, claims and verdicts stay on the
    worker's own threads, so the handler threads open no connection of their own."""
    if not live_storage.connection_per_thread:
        pytest.skip("storage calls hold no per-thread connection here")
    callers: set[str] = set()
    for name in ("wait_and_claim", "claim", "ack_many", "wait_for_jobs"):
        original = getattr(live_storage, name)

        def noting(*args, _original=original, **kwargs):
            callers.add(threading.current_thread().name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(live_storage, name, noting)  # undone: no cycle left
    one_by_one(q, handlers, run_worker, lambda job: job.payload, 5)
    handlers.register("w", lambda job: time.sleep(0.01) or job.payload)
    q.enqueue_many([{"id": f"b{i}", "payload": i} for i in range(40)])
    assert wait_until(lambda: q.counts()[JobState.COMPLETED] == 45, 60)
    assert callers and not {c for c in callers if c.startswith("jobq-handler")}, callers


def _count_waits(live_storage, backend, monkeypatch) -> list[int]:
    """``[n]``: how many of the worker's ``wait_and_claim`` calls are in flight (skipped where
    the storage does not claim as its wait ends). Waits run one at a time, so the count needs
    no lock; a second one in flight is what the tests using it look for."""
    skip_unless_waits_on_handler_threads(live_storage, backend)
    in_flight = [0]
    wait_and_claim = live_storage.wait_and_claim

    def counting(*args, **kwargs):
        in_flight[0] += 1
        try:
            return wait_and_claim(*args, **kwargs)
        finally:
            in_flight[0] -= 1

    monkeypatch.setattr(live_storage, "wait_and_claim", counting)  # undone: no cycle left
    return in_flight


def _waits_around_lone_jobs(
    q, handlers, run_worker, live_storage, backend, monkeypatch, jobs: int
) -> list[tuple[str, str]]:
    """Run ``jobs`` request/responses one after another on an idle worker of four slots and
    return, for each wait that claimed one job, the thread that made it and the thread that
    made the next wait (skipped where the storage does not claim as its wait ends). Waits run
    one at a time, so their order is well defined; a wait that comes back empty (a timeout, or
    a wake-up that found nothing) may move the chain to another thread, which is why the
    pairs are taken around the waits that claimed, not from the threads the jobs ran on."""
    from django_jobq.storage.base import Storage

    if type(live_storage).wait_and_claim is Storage.wait_and_claim or backend == "redis-cluster":
        pytest.skip("this backend does not claim as its wait ends (wait_and_claim)")
    waits: list[list] = []  # [thread, jobs claimed], in the order the waits started
    wait_and_claim = live_storage.wait_and_claim

    def noting(*args, **kwargs):
        entry = [threading.current_thread().name, None]
        waits.append(entry)
        batch = wait_and_claim(*args, **kwargs)
        entry[1] = len(batch.jobs) if batch is not None else 0
        return batch

    monkeypatch.setattr(live_storage, "wait_and_claim", noting)  # undone: no cycle left
    one_by_one(q, handlers, run_worker, lambda job: job.payload, jobs)
    assert wait_until(lambda: len(waits) > 0 and waits[-1][1] is None, 30)  # re-armed
    return [(a[0], b[0]) for a, b in zip(waits, waits[1:], strict=False) if a[1] == 1]


def test_a_quiet_worker_runs_short_lone_jobs_and_waits_again_on_one_thread(
    q, handlers, run_worker, live_storage, backend, monkeypatch
):
    # Arrange: every job counts as short and none is long enough to have its wait passed on
    # (so the machine's speed decides nothing here).
    monkeypatch.setattr("django_jobq.worker.core.INLINE_UNDER", 3600.0)
    monkeypatch.setattr("django_jobq.worker.core.PASS_ON_AFTER", 3600.0)
    # Act
    pairs = _waits_around_lone_jobs(q, handlers, run_worker, live_storage, backend, monkeypatch, 6)
    # Assert: the thread that claimed a job alone ran it and made the next wait itself.
    assert len(pairs) == 6 and all(claimer == next_ for claimer, next_ in pairs), pairs


def test_a_quiet_worker_whose_lone_jobs_are_not_short_passes_each_wait_on_first(
    q, handlers, run_worker, live_storage, backend, monkeypatch
):
    # Arrange: no job counts as short (the first is run inline, as nothing is known yet), and
    # none has its wait passed on by the watchdog; each handler looks for another thread's
    # wait in flight while it runs.
    monkeypatch.setattr("django_jobq.worker.core.INLINE_UNDER", 0.0)
    monkeypatch.setattr("django_jobq.worker.core.PASS_ON_AFTER", 3600.0)
    in_flight = _count_waits(live_storage, backend, monkeypatch)
    seen: list[bool] = []

    def handler(job):
        if job.payload > 0:
            seen.append(wait_until(lambda: in_flight[0] > 0, 30))
        return job.payload

    # Act
    one_by_one(q, handlers, run_worker, handler, 6)
    # Assert: from the second job on, the next wait was on its way while the job ran (run
    # inline instead, no wait would be in flight until the job ended).
    assert seen == [True] * 5


def test_lone_jobs_of_a_quiet_worker_set_no_timer_per_job(
    q, handlers, run_worker, live_storage, backend, monkeypatch
):
    # Arrange: every job counts as short and the watchdog's look is an hour away; the
    # watchdog's schedule calls are counted (no handler here has a soft timeout).
    from django_jobq.worker.pools.watchdog import Watchdog

    monkeypatch.setattr("django_jobq.worker.core.INLINE_UNDER", 3600.0)
    monkeypatch.setattr("django_jobq.worker.core.PASS_ON_AFTER", 3600.0)
    _count_waits(live_storage, backend, monkeypatch)  # (skips where no wait claims)
    delays: list[float] = []
    schedule = Watchdog.schedule

    def counting(self, delay, callback):
        delays.append(delay)
        return schedule(self, delay, callback)

    monkeypatch.setattr(Watchdog, "schedule", counting)
    # Act: eight request/responses, each job run by the thread whose wait claimed it.
    one_by_one(q, handlers, run_worker, lambda job: job.payload, 8)
    # Assert: one look armed for the whole stream. A timer per job (scheduled, then
    # cancelled) kept waking the watchdog's thread (how often was read off the heap's
    # rules, not counted); removing those wake-ups saved ~25 µs of worker CPU per job.
    assert delays == [3600.0]


def test_the_watchdog_stops_looking_at_lone_jobs_once_the_worker_is_quiet(
    q, handlers, run_worker, live_storage, backend, monkeypatch
):
    # Arrange: looks every 20 ms; every job counts as short.
    from .test_watchdog import asleep

    monkeypatch.setattr("django_jobq.worker.core.INLINE_UNDER", 3600.0)
    monkeypatch.setattr("django_jobq.worker.core.PASS_ON_AFTER", 0.02)
    _count_waits(live_storage, backend, monkeypatch)
    handlers.register("w", lambda job: job.payload)
    w = run_worker(concurrency=4)
    assert wait_until(lambda: w.idle_claim == 4, 30)
    # Act: a few request/responses, then nothing.
    for i in range(4):
        assert q.enqueue_and_wait(f"t{i}", i, timeout=60) == i
    # Assert: the looks stop, leaving the watchdog's thread parked with nothing scheduled
    # (a quiet worker's watchdog never wakes), and the wait is still served afterwards.
    assert wait_until(lambda: not w._looking and not w._watchdog._heap and asleep(w._watchdog))
    assert q.enqueue_and_wait("after", "after", timeout=60) == "after"


def test_a_job_whose_wait_was_passed_on_never_takes_back_the_wait_of_a_later_run(
    q, handlers, run_worker, live_storage, backend, monkeypatch
):
    # Arrange: every job counts as short; a long one has its wait passed on after 50 ms.
    monkeypatch.setattr("django_jobq.worker.core.INLINE_UNDER", 3600.0)
    monkeypatch.setattr("django_jobq.worker.core.PASS_ON_AFTER", 0.05)
    in_flight = _count_waits(live_storage, backend, monkeypatch)
    started = {"long": threading.Event(), "short": threading.Event()}
    release = {"long": threading.Event(), "short": threading.Event()}

    def handler(job):
        if job.payload in started:
            started[job.payload].set()
            assert release[job.payload].wait(60)
        return job.payload

    handlers.register("w", handler)
    w = run_worker(concurrency=4)
    assert wait_until(lambda: w.idle_claim == 4, 30)
    try:
        # Act: the long job runs before its wait, which the watchdog passes on; then a short
        # job is claimed alone by that wait and run before it (its wait kept: no pass-on now).
        q.enqueue("long", "long")
        assert started["long"].wait(30)
        assert wait_until(lambda: in_flight[0] == 1, 30)
        monkeypatch.setattr("django_jobq.worker.core.PASS_ON_AFTER", 3600.0)
        q.enqueue("short", "short")
        assert started["short"].wait(30)
        assert in_flight[0] == 0  # the short job's thread holds the wait while it runs
        release["long"].set()  # the long job ends while the short one's run holds the wait
        assert wait_until(lambda: q.get_status("long").state == JobState.COMPLETED, 30)
        # Assert: the long job's thread left the wait to the run that holds it. Taking it
        # back, it would wait again at once, beside the short job's thread later.
        assert not wait_until(lambda: in_flight[0] > 0, 2)
    finally:
        for event in release.values():
            event.set()
    # ... and the short job's thread, which still owns the wait, goes on serving.
    assert q.enqueue_and_wait("next", "next", timeout=30) == "next"


def test_a_long_job_on_the_thread_that_waited_does_not_hold_up_claiming(q, handlers, run_worker):
    # Arrange: a job that runs until the test lets it go, on a worker of two slots.
    started, release = threading.Event(), threading.Event()

    def handler(job):
        if job.payload == "long":
            started.set()
            assert release.wait(30)
        return job.payload

    handlers.register("w", handler)
    run_worker(concurrency=2)
    q.enqueue("long", "long")
    assert started.wait(30)
    # Act + assert: the second slot serves a job while the first still runs.
    try:
        assert q.enqueue_and_wait("short", "short", timeout=30) == "short"
        assert q.get_status("long").state == JobState.ACTIVE
    finally:
        release.set()
    assert wait_until(lambda: q.get_status("long").state == JobState.COMPLETED, 30)


def test_stop_past_grace_releases_the_job_without_using_an_attempt(q, handlers, run_worker):
    started, release = threading.Event(), threading.Event()

    def stuck(job):
        started.set()
        release.wait(5)
        return "late"

    handlers.register("w", stuck)
    w = run_worker(grace=0.2)
    q.enqueue("stuck", 1)
    assert started.wait(30)
    w.stop()
    assert w.stopped.wait(30)
    status = q.get_status("stuck")
    assert (status.state, status.attempts) == (JobState.QUEUED, 0)
    release.set()


class _HoldingWorker(Worker):
    """A worker whose handler threads hold the job named ``held`` after it was handed to them
    and before it is marked running, until ``hold`` is set: the window a stop can land in
    between a claim and the start of its handler, made as wide as the test needs."""

    def __init__(self, *args, held: str, hold: threading.Event, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.held, self.hold, self.holding = held, hold, threading.Event()

    def _start(self, claimed):
        if claimed.job_id == self.held:
            self.holding.set()
            self.hold.wait(60)
        return super()._start(claimed)


def test_claimed_but_unstarted_jobs_are_released_at_once_on_stop(q, handlers, live_storage):
    gate, running = threading.Event(), threading.Event()
    handlers.register("w", lambda job: running.set() or gate.wait(60))
    # grace 60 s: a worker that kept the unstarted job until the grace ran out would release
    # it only long after the wait below gives up.
    w = _HoldingWorker(["w"], storage=live_storage, handlers=handlers, concurrency=2, batch=1,
                       lease=5000, grace=60, held="second", hold=gate)  # fmt: skip
    w.start()
    try:
        q.enqueue("first", 1)
        assert running.wait(30)
        q.enqueue("second", 2)
        assert w.holding.wait(30)  # claimed and handed to a handler thread, not started
        w.stop()
        # Released while "first" still runs (its handler waits for the gate): at once, not
        # at the end of the grace period.
        assert wait_until(lambda: q.get_status("second").state is JobState.QUEUED, 30)
        assert q.get_status("first").state is JobState.ACTIVE
        assert q.get_status("second").attempts == 0
    finally:
        gate.set()  # "first" finishes within the grace period
        assert w.stopped.wait(60)
    assert q.get_status("first").state is JobState.COMPLETED
    assert (w.stats["completed"], w.stats["released"]) == (1, 1)


def test_heartbeats_keep_a_job_longer_than_its_lease(q, handlers, run_worker, live_storage):
    # The job runs 2.5 leases: kept only by heartbeats (every third of a lease). A lease of a
    # few hundred ms was lost to scheduling alone on a loaded machine.
    handlers.register("w", lambda job: time.sleep(5.0) or job.attempt)
    run_worker(lease=2000, reap_interval=0.05)
    assert q.enqueue_and_wait("long", 1, timeout=30) == 1
    assert q.get_status("long").stalls == 0


def test_reclaimed_attempt_is_told_to_stop_and_its_late_verdict_is_refused(
    q, handlers, run_worker, live_storage, monkeypatch
):
    """Heartbeats fail for a while (network blip), the lease lapses, the reaper requeues the
    job and this same worker claims it again: the old attempt's cancel flag is set, its verdict
    is refused, the new attempt's result wins, and no concurrency slot leaks."""
    calls, seen = [], {}

    def handler(job):
        calls.append(job.token)
        if len(calls) == 1:
            deadline = time.monotonic() + 5
            while not job.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
            seen["old_cancelled"] = job.is_cancelled()
            return "stale attempt"
        return "new attempt"

    handlers.register("w", handler)
    blip = threading.Event()
    blip.set()
    real_heartbeat = live_storage.heartbeat

    def flaky_heartbeat(*args, **kwargs):
        if blip.is_set():
            raise ConnectionError("network blip")
        return real_heartbeat(*args, **kwargs)

    monkeypatch.setattr(live_storage, "heartbeat", flaky_heartbeat)
    w = run_worker(lease=300, reap_interval=0, concurrency=2)
    q.enqueue("lost", 1)
    assert wait_until(lambda: len(calls) == 1)
    assert wait_until(lambda: live_storage.reap("w").requeued == ["lost"])
    assert wait_until(lambda: len(calls) == 2)
    blip.clear()
    assert wait_until(lambda: "old_cancelled" in seen)
    assert seen["old_cancelled"] is True
    assert wait_until(lambda: w.stats["lost"] == 1)
    assert q.get_result("lost").value == "new attempt"
    assert q.get_status("lost").stalls == 1
    assert wait_until(lambda: w._free == w.concurrency)


def test_worker_registers_while_running_and_deregisters_on_stop(live_storage, handlers, run_worker):
    handlers.register("w", lambda job: None)
    w = run_worker()
    ids = [rec.worker_id for rec in live_storage.list_workers()]
    assert w.worker_id in ids
    info = next(r for r in live_storage.list_workers() if r.worker_id == w.worker_id).info
    assert (info["queues"], info["concurrency"]) == (["w"], w.concurrency)
    w.stop()
    assert w.stopped.wait(30)
    assert w.worker_id not in [rec.worker_id for rec in live_storage.list_workers()]


def test_worker_refuses_queues_without_handlers(live_storage, handlers):
    from django_jobq.errors import ConfigurationError

    with pytest.raises(ConfigurationError):
        Worker(["w"], storage=live_storage, handlers=handlers).check()


def test_idle_worker_wakes_for_a_delayed_job_when_it_is_due(storage, clock, handlers, monkeypatch):
    """A claim that finds only a job due in 300 ms makes the worker wait exactly that long,
    not its idle timeout. Every storage caps its waits (a safety net for lost signals), so a
    worker that ignored the due time would still run the job, seconds late: the wait it asks
    of the storage is the wake-up. The storage clock is the test's, so "due" is an event."""
    waits: list[float] = []
    real_wait, real_wait_and_claim = storage.wait_for_jobs, storage.wait_and_claim

    def recording_wait(queues, timeout, worker_id=None):
        waits.append(timeout)
        return real_wait(queues, timeout, worker_id)

    def recording_wait_and_claim(queue, worker_id, count, lease_ms, timeout):
        waits.append(timeout)  # (Redis: the wait that claims as it wakes)
        return real_wait_and_claim(queue, worker_id, count, lease_ms, timeout)

    monkeypatch.setattr(storage, "wait_for_jobs", recording_wait)
    monkeypatch.setattr(storage, "wait_and_claim", recording_wait_and_claim)
    handlers.register("w", lambda job: "ran")
    q = Queue("w", storage=storage)
    q.enqueue("d", 1, delay=300)
    w = Worker(["w"], storage=storage, handlers=handlers, idle_timeout=120, lease=5000, grace=5)
    w.start()
    try:
        assert wait_until(lambda: 0.3 in waits, 30), waits
        assert q.get_status("d").state is JobState.SCHEDULED
        clock.advance(300)
        assert wait_until(lambda: q.get_status("d").state is JobState.COMPLETED, 30)
    finally:
        w.stop(hurry=True)
        assert w.stopped.wait(30)
    assert q.get_result("d").value == "ran"
