"""``atomic=True`` handlers and tasks (issue 38): the handler's database writes and its job's
completion commit in one transaction, on SQLite and PostgreSQL (database backend).

In-process workers here; ``test_atomic_processes.py`` kills worker processes."""

from __future__ import annotations

import datetime as dt
import hashlib
import threading

import pytest
from django.core import checks
from django.db import connections
from django.utils import timezone

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

    with pytest.raises(ConfigurationError, match="database or the Redis backend"):
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


# -- Redis: the outcome ledger --------------------------------------------------------------


@pytest.fixture
def on_redis(alias, settings, request):
    """A Redis storage of this test's own prefix, its ledger (JOBQ["DATABASE_ALIAS"]) on
    ``alias``."""
    from django_jobq.storage.redis import RedisStorage

    settings.JOBQ = {**settings.JOBQ, "DATABASE_ALIAS": alias}
    client, prefix = (request.getfixturevalue(f) for f in ("redis_client", "redis_prefix"))
    return RedisStorage(client, prefix=prefix)


def outcomes(alias: str, job_id: str) -> int:
    from django_jobq.models import JobOutcome

    return JobOutcome.objects.using(alias).filter(queue=Q, job_id=job_id).count()


@pytest.mark.redis
def test_on_redis_a_redelivered_job_with_an_outcome_is_acknowledged_without_running(
    alias, on_redis
):
    """The worker died after the commit, before Redis heard of it: the lease expires, the
    reaper requeues the job, and the next run acknowledges the stored result."""
    from django_jobq.worker import execution

    calls: list[int] = []
    registry = HandlerRegistry()

    def handle(job):
        calls.append(job.attempt)
        write_effect(alias, job.id)
        return {"run": len(calls)}

    registry.register(Q, handle, atomic=True)
    queue = Queue(Q, storage=on_redis)
    queue.enqueue("r1", 1, max_stalls=5)
    first = on_redis.claim(Q, "w1", 1, 50).jobs[0]
    ack = execution.execute(first, registry, storage=on_redis)
    assert ack.kind == "complete" and ack.settled is None  # for Redis; never sent: "killed"
    assert (effects(alias, "r1"), outcomes(alias, "r1")) == (1, 1)
    assert wait_until(lambda: "r1" in on_redis.reap(Q).requeued, 30)
    second = on_redis.claim(Q, "w2", 1, 60_000).jobs[0]
    again = execution.execute(second, registry, storage=on_redis)
    assert calls == [1] and again.body == ack.body  # not run again: the stored result
    assert on_redis.ack_many(Q, [again]) == [AckOutcome.COMPLETED]
    assert queue.get_result("r1").value == {"run": 1} and effects(alias, "r1") == 1


@pytest.mark.redis
def test_on_redis_a_second_run_committing_beside_the_first_rolls_back(alias, on_redis):
    """Another run's outcome appears while this run's transaction is open (a lease taken
    over): this run's ledger insert fails, its writes roll back, and it acknowledges the other
    run's result."""
    from django_jobq.models import JobOutcome
    from django_jobq.worker import execution

    registry = HandlerRegistry()
    queue = Queue(Q, storage=on_redis)

    def other_run_commits():
        record = on_redis.get_record(Q, "c1")
        digest = hashlib.blake2b(bytes(record.payload), digest_size=16).hexdigest()
        try:
            JobOutcome.objects.using(alias).create(
                queue=Q, job_id="c1", created_ms=record.created_at, digest=digest,
                result=b'{"by": "other"}',
                expires_at=timezone.now() + dt.timedelta(hours=1),
            )  # fmt: skip
        finally:
            connections[alias].close()

    def handle(job):
        thread = threading.Thread(target=other_run_commits)
        thread.start()
        thread.join(30)
        write_effect(alias, job.id)
        return {"by": "this"}

    registry.register(Q, handle, atomic=True)
    queue.enqueue("c1", 1)
    claimed = on_redis.claim(Q, "w1", 1, 60_000).jobs[0]
    ack = execution.execute(claimed, registry, storage=on_redis)
    assert ack.body == b'{"by": "other"}' and ack.settled is None
    assert effects(alias, "c1") == 0 and outcomes(alias, "c1") == 1


@pytest.mark.redis
def test_on_redis_an_id_enqueued_again_after_its_record_went_runs_again(alias, on_redis):
    """The ledger keys an outcome by the job's record (its creation time), not by the id."""
    registry = HandlerRegistry()
    registry.register(Q, lambda job: write_effect(alias, job.id), atomic=True)
    queue = Queue(Q, storage=on_redis)
    queue.enqueue("again", 1)
    served(on_redis, registry, "again")
    assert on_redis.delete_finished(Q, ["again"]) == 1
    queue.enqueue("again", 2)
    served(on_redis, registry, "again")
    assert (effects(alias, "again"), outcomes(alias, "again")) == (2, 2)


@pytest.mark.redis
def test_the_reaper_prunes_outcomes_past_their_result_ttl(alias, on_redis):
    from django_jobq.tasks.registry import registry as global_registry
    from django_jobq.worker.reaper import Reaper

    global_registry.register(Q, lambda job: write_effect(alias, job.id), atomic=True)
    try:
        queue = Queue(Q, storage=on_redis)
        queue.enqueue("short", 1, result_ttl=1)
        queue.enqueue("long", 1)
        with running_workers(on_redis, handlers=global_registry, reap_interval=0) as start:
            start([Q])
            assert wait_until(  # "short" ran, then its record expired
                lambda: (
                    queue.get_status("short") is None
                    and getattr(queue.get_status("long"), "state", None) is JobState.COMPLETED
                ),
                60,
            )
        assert outcomes(alias, "short") == 1
        Reaper([Q], storage=on_redis, mirror=False, schedules=False).run_once()
        assert (outcomes(alias, "short"), outcomes(alias, "long")) == (0, 1)
    finally:
        global_registry.unregister(Q)


@pytest.mark.redis
def test_on_redis_follow_ups_exist_exactly_when_the_job_completed(alias, on_redis, monkeypatch):
    """``enqueue_on_commit`` inside an atomic run is recorded with the outcome: none for a
    failed attempt, and sent by the run that finds the outcome when the committing worker died
    before sending them."""
    from django_jobq.worker import execution

    registry = HandlerRegistry()

    def handle(job):
        Queue("atomic-next", storage=on_redis).enqueue_on_commit(f"next-{job.attempt}", 1)
        write_effect(alias, job.id)
        if job.attempt == 1:
            raise RuntimeError("first attempt fails after its follow-up")
        return 1

    registry.register(Q, handle, atomic=True)
    queue, follow = Queue(Q, storage=on_redis), Queue("atomic-next", storage=on_redis)
    queue.enqueue("f", 1, max_attempts=3, min_backoff=1, max_backoff=1, max_stalls=5)
    first = on_redis.claim(Q, "w1", 1, 60_000).jobs[0]
    assert on_redis.ack_many(Q, [execution.execute(first, registry, storage=on_redis)]) == [
        AckOutcome.RETRYING
    ]
    assert follow.get_status("next-1") is None  # rolled back with the attempt
    real_send = execution.send_follow_ups
    monkeypatch.setattr(execution, "send_follow_ups", lambda storage, follow_ups: None)
    # the retry is due after its 1 ms backoff: a reaper pass promotes it
    assert wait_until(lambda: on_redis.reap(Q) is not None and queue.counts()[JobState.QUEUED], 30)
    second = on_redis.claim(Q, "w2", 1, 50).jobs[0]
    assert execution.execute(second, registry, storage=on_redis).kind == "complete"  # "killed"
    assert follow.get_status("next-2") is None  # committed, never sent
    monkeypatch.setattr(execution, "send_follow_ups", real_send)
    assert wait_until(lambda: "f" in on_redis.reap(Q).requeued, 30)
    third = on_redis.claim(Q, "w3", 1, 60_000).jobs[0]
    ack = execution.execute(third, registry, storage=on_redis)  # finds the outcome
    assert on_redis.ack_many(Q, [ack]) == [AckOutcome.COMPLETED]
    assert follow.get_status("next-2").state is JobState.QUEUED
    assert follow.get_status("next-3") is None and effects(alias, "f") == 1
