"""``atomic=True`` handlers and tasks (issue 38): the handler's database writes and its job's
completion commit in one transaction, on SQLite and PostgreSQL (database backend).

In-process workers here; ``test_atomic_processes.py`` kills worker processes."""

from __future__ import annotations

import threading

import pytest
from django.core import checks
from django.db import connections

from django_jobq import JobState
from django_jobq.errors import ConfigurationError
from django_jobq.job import AckOutcome
from django_jobq.queue import Queue
from django_jobq.storage.database import DatabaseStorage
from django_jobq.storage.memory import MemoryStorage
from django_jobq.tasks.core import task
from django_jobq.tasks.registry import HandlerRegistry

from .helpers import running_workers, wait_until

ALIASES = ["default", pytest.param("pg", marks=pytest.mark.postgres)]
pytestmark = pytest.mark.django_db(databases=["default", "pg"], transaction=True)
Q = "atomic-q"


@pytest.fixture(params=ALIASES)
def alias(request):
    with connections[request.param].cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS jobq_test_effects")
        cursor.execute("CREATE TABLE jobq_test_effects (job_id varchar(160) NOT NULL)")
    yield request.param
    with connections[request.param].cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS jobq_test_effects")


def effects(alias: str, job_id: str | None = None) -> int:
    with connections[alias].cursor() as cursor:
        if job_id is None:
            cursor.execute("SELECT COUNT(*) FROM jobq_test_effects")
        else:
            cursor.execute("SELECT COUNT(*) FROM jobq_test_effects WHERE job_id = %s", [job_id])
        return int(cursor.fetchone()[0])


def write_effect(alias: str, job_id: str) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute("INSERT INTO jobq_test_effects (job_id) VALUES (%s)", [job_id])


def served(storage, registry, *job_ids: str, states=(JobState.COMPLETED,)):
    queue = Queue(Q, storage=storage)
    with running_workers(storage, handlers=registry, reap_interval=0) as start:
        start([Q])
        assert wait_until(
            lambda: all(getattr(queue.get_status(j), "state", None) in states for j in job_ids), 60
        ), [queue.get_status(j) for j in job_ids]
    return queue


def test_the_writes_and_the_completion_commit_together_and_a_failure_rolls_back(alias):
    storage = DatabaseStorage(alias)
    registry = HandlerRegistry()

    def handle(job):
        write_effect(alias, job.id)
        if job.payload == "boom" and job.attempt == 1:
            raise RuntimeError("after the write")
        return {"done": job.id}

    registry.register(Q, handle, atomic=True)
    queue = Queue(Q, storage=storage)
    queue.enqueue("ok", "fine")
    queue.enqueue("boom", "boom", max_attempts=2, min_backoff=1, max_backoff=1)
    served(storage, registry, "ok", "boom")
    assert queue.get_result("ok").value == {"done": "ok"}
    assert effects(alias, "ok") == 1
    # The first attempt wrote, then raised: its write went with the rollback; the second ran
    # on clean state.
    assert effects(alias, "boom") == 1 and queue.get_status("boom").attempts == 2


def test_a_stale_run_rolls_its_writes_back_instead_of_completing_over_the_newer(alias):
    """The lease is taken over (another connection requeues the job and claims it anew, as
    the reaper and a second worker would), on PostgreSQL while the handler runs: the stale
    run's completion is refused and its writes roll back."""
    storage = DatabaseStorage(alias)
    registry = HandlerRegistry()
    taken = threading.Event()
    verdicts = []

    def take_over():
        other = DatabaseStorage(alias)
        try:
            other._jobs().filter(queue=Q, job_id="j").update(state=JobState.QUEUED)
            batch = other.claim(Q, "newer-worker", 1, 60_000)
            assert [c.job_id for c in batch.jobs] == ["j"]
        finally:
            connections[alias].close()
            taken.set()

    def handle(job):
        if alias == "pg":  # while this run's transaction is open
            threading.Thread(target=take_over).start()
            assert taken.wait(30)
        write_effect(alias, job.id)
        return "stale"

    registry.register(Q, handle, atomic=True)
    queue = Queue(Q, storage=storage)
    queue.enqueue("j", 1)
    from django_jobq.worker import execution

    claimed = storage.claim(Q, "old-worker", 1, 60_000).jobs[0]
    if alias != "pg":
        # SQLite: an atomic run holds the write lock from its start, so a takeover cannot
        # happen during it; the stale run is one whose lease was taken before it began.
        take_over()
    ack = execution.execute(claimed, registry, storage=storage)
    verdicts.append(ack)
    assert ack.settled is AckOutcome.LEASE_LOST
    assert effects(alias, "j") == 0  # rolled back with the refused completion
    record = storage.get_record(Q, "j")
    assert record.state is JobState.ACTIVE and record.worker == "newer-worker"


def test_enqueue_on_commit_inside_an_atomic_handler_joins_its_transaction(alias):
    """Follow-up jobs exist exactly when the job completed: a failed attempt's are rolled back
    with its writes (not sent at a commit that never comes, nor lost after one that did)."""
    storage = DatabaseStorage(alias)
    registry = HandlerRegistry()

    def handle(job):
        Queue("atomic-next", storage=storage).enqueue_on_commit(
            f"next-{job.id}-{job.attempt}", 1, using=alias
        )
        write_effect(alias, job.id)
        if job.attempt == 1:
            raise RuntimeError("first attempt fails after its follow-up")
        return 1

    registry.register(Q, handle, atomic=True)
    Queue(Q, storage=storage).enqueue("p", 1, max_attempts=2, min_backoff=1, max_backoff=1)
    served(storage, registry, "p")
    follow = Queue("atomic-next", storage=storage)
    assert follow.get_status("next-p-1") is None
    assert follow.get_status("next-p-2").state is JobState.QUEUED
    assert effects(alias, "p") == 1


def test_an_atomic_task_runs_in_the_transaction_too(alias):
    storage = DatabaseStorage(alias)
    registry = HandlerRegistry()

    @task(queue=Q, name="tests.atomic_task", atomic=True, registry=registry)
    def add(key: str, fail: bool = False) -> str:
        write_effect(alias, key)
        if fail:
            raise RuntimeError("no")
        return key

    add.using(queue=Queue(Q, storage=storage)).enqueue("t1", job_id="t1")
    add.using(queue=Queue(Q, storage=storage), max_attempts=1).enqueue("t2", fail=True, job_id="t2")
    served(storage, registry, "t1", "t2", states=(JobState.COMPLETED, JobState.FAILED))
    assert (effects(alias, "t1"), effects(alias, "t2")) == (1, 0)


def test_an_unserialisable_result_fails_the_job_and_rolls_its_writes_back(alias):
    storage = DatabaseStorage(alias)
    registry = HandlerRegistry()

    def handle(job):
        write_effect(alias, job.id)
        return {1, 2}  # a set: not JSON

    registry.register(Q, handle, atomic=True)
    Queue(Q, storage=storage).enqueue("bad", 1)
    served(storage, registry, "bad", states=(JobState.FAILED,))
    assert effects(alias, "bad") == 0


def test_a_worker_refuses_atomic_queues_where_it_cannot_keep_the_promise():
    registry = HandlerRegistry()
    registry.register(Q, lambda job: 1, atomic=True)
    from django_jobq.worker import Worker

    with pytest.raises(ConfigurationError, match="database backend"):
        Worker([Q], storage=MemoryStorage(), handlers=registry).check()
    for pool in ("process", "async"):
        with pytest.raises(ConfigurationError, match="thread pool only"):
            Worker([Q], storage=DatabaseStorage("default"), handlers=registry, pool=pool).check()
    Worker([Q], storage=DatabaseStorage("default"), handlers=registry).check()  # fine


def test_atomic_is_refused_for_async_and_batch_handlers_and_odd_values():
    registry = HandlerRegistry()

    async def coro(job):
        return 1

    with pytest.raises(ConfigurationError, match="plain function"):
        registry.register(Q, coro, atomic=True)
    with pytest.raises(ConfigurationError, match="batch"):
        registry.register(Q, lambda jobs: [1], atomic=True, batch=10)
    with pytest.raises(ConfigurationError, match="atomic must be"):
        registry.register(Q, lambda job: 1, atomic=1)


def test_manage_py_check_refuses_atomic_handlers_off_the_database_backend(settings):
    from django_jobq.checks import atomic_handlers_check
    from django_jobq.tasks.registry import registry

    registry.register("atomic-check", lambda job: 1, atomic=True)
    registry.register("atomic-elsewhere", lambda job: 1, atomic="pg")
    try:
        settings.JOBQ = {**settings.JOBQ, "BACKEND": "memory"}
        found = [e for e in atomic_handlers_check(None) if "atomic-check" in e.msg]
        assert [e.id for e in found] == ["django_jobq.E003"] and found[0].level == checks.ERROR
        settings.JOBQ = {**settings.JOBQ, "BACKEND": "database", "DATABASE_ALIAS": "default"}
        messages = [e.msg for e in atomic_handlers_check(None)]
        assert not any("atomic-check" in m for m in messages)
        assert any("'pg'" in m and "atomic-elsewhere" in m for m in messages)
    finally:
        registry.unregister("atomic-check")
        registry.unregister("atomic-elsewhere")


def test_the_tasks_backend_runs_its_tasks_atomically_when_asked(alias, settings):
    """``TASKS[...]["OPTIONS"]["ATOMIC"]``: the failed first attempt's write is rolled back,
    so one row, where the plain backend leaves two."""
    from django.tasks import TaskResultStatus, task_backends
    from django.test import override_settings

    from django_jobq.contrib.tasks_backend import run_task
    from django_jobq.tasks.registry import registry

    from . import task_funcs

    storage = DatabaseStorage(alias)
    conf = {**settings.TASKS["default"]}
    conf["OPTIONS"] = {**conf["OPTIONS"], "STORAGE": storage, "ATOMIC": True}
    try:
        with override_settings(TASKS={"default": conf}):
            task_backends["default"]  # registers run_task on its queues, atomic
            assert registry.options("default").atomic is True
            result = task_funcs.effect_then_fail_once.enqueue(alias, "dt1")
            with running_workers(storage, handlers=registry, reap_interval=0) as start:
                start(["default"])

                def done() -> bool:
                    result.refresh()
                    return result.status == TaskResultStatus.SUCCESSFUL

                assert wait_until(done, 60), result.status
        assert effects(alias, "dt1") == 1
    finally:  # the queues' plain handler again, as the settings' backend registers it
        for name in settings.TASKS["default"]["QUEUES"]:
            registry.register(name, run_task)
