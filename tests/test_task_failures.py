"""A failure handler per task function, on every backend (memory, Redis, Redis Cluster, SQLite,
PostgreSQL): each task of a queue tells its own handler, tasks without one fall back to the
queue's, a task routed elsewhere by ``JOBQ["ROUTES"]`` is still told, and each failure handler
follows its own retry policy (backoff, ``retry_on`` / ``dont_retry_on``)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_jobq import JobState, PermanentError
from django_jobq.errors import ConfigurationError
from django_jobq.queue import Queue
from django_jobq.tasks import Backoff, task
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker
from django_jobq.worker.execution import envelope_meta, execute, make_job
from django_jobq.worker.failures import FailureCaller

from .helpers import wait_until

Q = "task-onfail"
QUIET = 0.5  # seconds we watch for a call that must not come (the worker polls every 0.05 s)


class Told:
    """A failure handler that records (task, job id, payload, error type) of each call and
    raises ``raises[i]`` on its i-th call while there are any."""

    def __init__(self, *raises: BaseException) -> None:
        self.raises = list(raises)
        self.calls: list[tuple[str | None, str, object, str]] = []
        self.lock = threading.Lock()

    def __call__(self, payload, job, error) -> None:
        with self.lock:
            self.calls.append((job.task, job.id, payload, error["type"]))
            n = len(self.calls)
        if n <= len(self.raises):
            raise self.raises[n - 1]

    def ids(self) -> list[str]:
        with self.lock:
            return sorted(c[1] for c in self.calls)


def tasks_on(registry: HandlerRegistry, queue: str = Q):
    """Three task functions of one queue that fail for good when told to."""

    def make(name: str):
        def run(n: int, fail: bool = False) -> int:
            if fail:
                raise PermanentError(f"{name} {n} failed")
            return n

        run.__qualname__ = f"run_{name}"
        return task(run, queue=queue, name=f"onfail.{name}", registry=registry)

    return make("a"), make("b"), make("c")


@pytest.fixture
def run_worker(live_storage):
    workers: list[Worker] = []

    def start(registry: HandlerRegistry, queues=(Q,), **options) -> Worker:
        options = {"lease": 3000, "grace": 1, "failure_poll": 0.05, **options}
        worker = Worker(list(queues), storage=live_storage, handlers=registry, **options)
        workers.append(worker)
        worker.start()
        return worker

    yield start
    for worker in workers:
        worker.stop(hurry=True)
        if worker.started.is_set():
            assert worker.stopped.wait(30)


def test_each_task_of_a_queue_tells_its_own_failure_handler_and_the_rest_the_queues(
    run_worker, live_storage
):
    registry = HandlerRegistry()
    a, b, c = tasks_on(registry)
    told_a, told_b, told_queue = Told(), Told(), Told()
    a.on_failure(told_a)
    b.on_failure(told_b)
    registry.register_failure_handler(Q, told_queue)  # for c, which has none of its own
    queue = Queue(Q, storage=live_storage)
    run_worker(registry)
    for fn, n in ((a, 1), (b, 2), (c, 3), (a, 4)):
        fn.using(queue=queue).enqueue(n, job_id=f"{fn.name}-{n}", fail=True)
    b.using(queue=queue).enqueue(5, job_id="fine")  # completes: nobody is told
    assert wait_until(lambda: len(told_a.calls) + len(told_b.calls) + len(told_queue.calls) == 4)
    time.sleep(QUIET)
    assert told_a.ids() == ["onfail.a-1", "onfail.a-4"]
    # The payload as the task's call was bound: {"args", "kwargs"}.
    assert told_b.calls == [("onfail.b", "onfail.b-2", {"args": [2, True], "kwargs": {}},
                             "django_jobq.errors.PermanentError")]  # fmt: skip
    assert told_queue.calls == [("onfail.c", "onfail.c-3", {"args": [3, True], "kwargs": {}},
                                 "django_jobq.errors.PermanentError")]  # fmt: skip
    assert wait_until(lambda: queue.count_failure_calls() == 0)
    assert queue.count_dead() == 4  # the dead letters stay, told or not


def test_a_task_without_a_handler_on_a_queue_without_one_is_not_told(run_worker, live_storage):
    registry = HandlerRegistry()
    a, b, _ = tasks_on(registry)
    told_a = Told()
    a.on_failure(told_a)  # turns the queue's hook on
    queue = Queue(Q, storage=live_storage)
    run_worker(registry)
    b.using(queue=queue).enqueue(1, job_id="untold", fail=True)
    a.using(queue=queue).enqueue(2, job_id="told", fail=True)
    assert wait_until(lambda: told_a.ids() == ["told"])
    # b's call was recorded (the hook is per queue) and dropped: no one to tell, nothing left.
    assert wait_until(lambda: queue.count_failure_calls() == 0)
    time.sleep(QUIET)
    assert told_a.ids() == ["told"]
    assert queue.get_status("untold").state is JobState.FAILED


def test_a_task_routed_to_another_queue_tells_its_failure_handler_there(
    run_worker, live_storage, settings
):
    registry = HandlerRegistry()
    a, _, _ = tasks_on(registry, queue="task-onfail-home")
    told = Told()
    a.on_failure(told)
    routed = f"{Q}-routed"
    settings.JOBQ = {**settings.JOBQ, "ROUTES": {a.name: routed}}
    assert registry.has_failure_handler(routed) and not registry.has_failure_handler(
        "task-onfail-home"
    )
    run_worker(registry, queues=(routed,))
    queue = Queue(routed, storage=live_storage)
    # The task's storage, its queue from the route: an explicit Queue would bypass ROUTES.
    assert a.target_queue().name == routed
    queue.enqueue("routed-1", a.payload((7,), {"fail": True}), meta={"task": a.name})
    assert wait_until(lambda: told.ids() == ["routed-1"])
    assert told.calls[0][0] == a.name
    assert wait_until(lambda: queue.count_failure_calls() == 0)


def test_a_task_failure_handler_backs_off_by_its_own_policy(run_worker, live_storage):
    registry = HandlerRegistry()
    a, _, _ = tasks_on(registry)
    told = Told(OSError("pager down"), OSError("pager still down"))
    # The worker's own failure backoff is a minute: only the task's fixed 0.05 s brings the
    # second and third calls within the test's patience.
    a.on_failure(backoff=Backoff.fixed(0.05), retry_on=(OSError,))(told)
    queue = Queue(Q, storage=live_storage)
    run_worker(registry, failure_backoff=(60_000, 120_000))
    a.using(queue=queue).enqueue(1, job_id="flaky-pager", fail=True)
    assert wait_until(lambda: len(told.calls) == 3)
    assert wait_until(lambda: queue.count_failure_calls() == 0)


@pytest.mark.parametrize(
    ("policy", "raised"),
    [
        ({"dont_retry_on": (LookupError,)}, KeyError("no such customer")),
        ({"retry_on": (OSError,)}, ValueError("not a network error")),
        ({}, PermanentError("give up")),
    ],
)
def test_a_failure_handler_error_its_policy_does_not_retry_gives_up_on_the_call(
    run_worker, live_storage, policy, raised
):
    registry = HandlerRegistry()
    a, _, _ = tasks_on(registry)
    told = Told(raised)
    a.on_failure(backoff=0.05, **policy)(told)
    queue = Queue(Q, storage=live_storage)
    worker = run_worker(registry)
    a.using(queue=queue).enqueue(1, job_id="given-up", fail=True)
    assert wait_until(lambda: len(told.calls) == 1)
    assert wait_until(lambda: queue.count_failure_calls() == 0)
    time.sleep(QUIET)
    assert len(told.calls) == 1  # not called again
    assert worker._failures.stats["gave_up"] == 1
    assert queue.dead_letters()[0].job_id == "given-up"  # the failure itself is kept


def test_a_queue_failure_handler_policy_applies_to_plain_jobs_too(run_worker, live_storage):
    def handle(job):
        raise PermanentError("plain")

    told = Told(KeyError("x"))
    registry = HandlerRegistry()
    registry.register(Q, handle, on_failure=told, failure_dont_retry_on=(KeyError,))
    queue = Queue(Q, storage=live_storage)
    run_worker(registry)
    queue.enqueue("plain-1", {"n": 1}, timeout=30)  # an enveloped job: its payload unwrapped
    assert wait_until(lambda: len(told.calls) == 1)
    assert told.calls[0][:3] == (None, "plain-1", {"n": 1})
    assert wait_until(lambda: queue.count_failure_calls() == 0)


def test_a_task_failure_handler_is_set_once_and_checked_at_registration():
    registry = HandlerRegistry()
    a, _, _ = tasks_on(registry)

    def first(payload, job, error):
        return None

    def second(payload, job, error):
        return None

    a.on_failure(first)
    a.using(priority=1).on_failure(first)  # the same function again (a re-import): fine
    assert registry.task(a.name).failure_handler is first
    with pytest.raises(ConfigurationError, match="already has failure handler"):
        a.on_failure(second)
    with pytest.raises(ConfigurationError, match="callable"):
        a.on_failure("not a function")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="retry_on"):
        a.on_failure(retry_on="OSError")
    with pytest.raises(ConfigurationError, match="backoff"):
        a.on_failure(backoff="soon")

    @task(queue=Q, name="onfail.decorated", registry=registry, on_failure=first)
    def decorated() -> None:
        return None

    assert decorated.failure_handler is first and registry.has_failure_handler(Q)


# -- the property: who is told, for any mix of tasks, handlers and failures ------------------


@st.composite
def scenarios(draw):
    """Tasks with or without a failure handler, a queue handler or not, and jobs of those
    tasks that fail or complete."""
    handlers = draw(st.lists(st.booleans(), min_size=1, max_size=3))
    queue_handler = draw(st.booleans())
    jobs = draw(st.lists(st.tuples(st.integers(0, len(handlers) - 1), st.booleans()),
                         min_size=1, max_size=6))  # fmt: skip
    return handlers, queue_handler, jobs


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(scenario=scenarios())
def test_every_failure_is_told_to_exactly_the_handler_the_model_names(live_storage, scenario):
    """Jobs run through the worker's own steps (claim, execute, verdict) and the failure
    caller runs every call: each failed job is told once, to its task's handler if it has
    one, else to the queue's, else to no one; no call is left pending."""
    has_handler, queue_handler, jobs = scenario
    name = f"task-onfail-{uuid.uuid4().hex[:8]}"
    registry = HandlerRegistry()
    told = {i: Told() for i in range(len(has_handler))}
    told_queue = Told()
    fns = []

    def run(n: int, fail: bool) -> int:
        if fail:
            raise PermanentError(f"job {n} failed")
        return n

    for i, has in enumerate(has_handler):
        fn = task(run, queue=name, name=f"{name}.t{i}", registry=registry)
        if has:
            fn.on_failure(told[i])
        fns.append(fn)
    if queue_handler:
        registry.register_failure_handler(name, told_queue)
    caller = FailureCaller(live_storage, registry, [name], "prop", lease_ms=60_000,
                           backoff=(10, 10), poll=0.01)  # fmt: skip
    caller.apply_hooks()
    queue = Queue(name, storage=live_storage)
    expected: dict[str, list[str]] = {"queue": []}
    for j, (i, fail) in enumerate(jobs):
        fns[i].using(queue=queue).enqueue(j, job_id=f"j{j}", fail=fail)
        if fail:
            who = str(i) if has_handler[i] else "queue" if queue_handler else None
            if who is not None:
                expected.setdefault(who, []).append(f"j{j}")
    for _ in jobs:
        [claimed] = live_storage.claim(name, "prop", 1, 60_000).jobs
        job = make_job(claimed, None)
        job.meta = envelope_meta(claimed)
        live_storage.ack_many(name, [execute(claimed, registry, job)])
    while caller.run_due(name):
        pass
    assert queue.count_failure_calls() == 0
    got = {str(i): t.ids() for i, t in told.items() if t.calls}
    if told_queue.calls:
        got["queue"] = told_queue.ids()
    assert got == {k: sorted(v) for k, v in expected.items() if v}


def test_the_test_mode_runs_a_tasks_own_failure_handler_and_a_canvas_handle_answers(db):
    """Users' test mode (memory, in the test's thread): the task's handler is told after
    run_all(), and a canvas handle's get() answers at once from the records."""
    from django_jobq.tasks import CanvasFailed, chain, group
    from django_jobq.testing import jobq_test_mode

    registry = HandlerRegistry()
    a, b, _ = tasks_on(registry, queue="tm-task-onfail")
    told = Told()
    a.on_failure(told)
    with jobq_test_mode(handlers=registry, schedules=False) as jobq:
        a.enqueue(1, job_id="tm-1", fail=True)
        handle = chain(b.s(1), b.s(fail=True)).enqueue()
        ok = group(b.s(3), b.s(4)).enqueue()
        runs = jobq.run_all()
        assert told.ids() == ["tm-1"]
        assert [r.kind for r in runs].count("on_failure") == 1
        assert ok.get(1) == [3, 4]
        with pytest.raises(CanvasFailed, match="step 2 of 2"):
            handle.get(1)
