"""The database backend's per-state counts (``StateCount``, migration 0031): triggers keep them
in the writing transaction, so they must equal a count of the rows whatever writes the rows.

The storage model test checks them after every step of one writer; here: writers at once on
PostgreSQL (each adding to its own slot, none waiting on another's, the reaper folding the
slots of the backends that left), ``TRUNCATE``, a rollback, and ``flush`` on both databases.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.core.management import call_command
from django.db import connections, transaction

from django_jobq.job import JobOptions, NewJob
from django_jobq.models import Job, StateCount
from django_jobq.states import JobState
from django_jobq.storage.base import Ack
from django_jobq.storage.database import DatabaseStorage

from .helpers import wait_until

Q = "counted"
ON_BOTH = pytest.mark.parametrize(
    "alias", ["default", pytest.param("pg", marks=pytest.mark.postgres)]
)


def held(alias: str, queue: str = Q) -> dict[JobState, int]:
    """The truth: the rows, counted one by one."""
    states = Job.objects.using(alias).filter(queue=queue).values_list("state", flat=True)
    return {JobState(state): n for state, n in Counter(states).items()}


def counted(storage: DatabaseStorage, queue: str = Q) -> dict[JobState, int]:
    return {state: n for state, n in storage.counts(queue).items() if n}


def jobs(prefix: str, n: int) -> list[NewJob]:
    return [NewJob(f"{prefix}-{i}", b"1", JobOptions(max_attempts=2)) for i in range(n)]


def churn(alias: str, name: str, rounds: int, errors: list[BaseException]) -> None:
    """One writer on its own connection: enqueues (bulk and single), claims, completes, fails
    (some for good, some to retry), cancels, retries a dead letter, reaps."""
    storage = DatabaseStorage(alias)
    try:
        for r in range(rounds):
            storage.enqueue_many(Q, jobs(f"{name}-{r}", 30))
            storage.enqueue(Q, NewJob(f"{name}-{r}-later", b"1", JobOptions(), delay=60_000))
            batch = storage.claim(Q, name, 12, 60_000)
            acks = []
            for i, job in enumerate(batch.jobs):
                kind = ("complete", "fail", "fail", "release")[i % 4]
                body = b"1" if kind == "complete" else b'{"type": "E", "message": "m"}'
                acks.append(Ack(kind, job.job_id, job.token, body, permanent=i % 8 == 1))
            storage.ack_many(Q, acks)
            storage.cancel(Q, f"{name}-{r}-29")
            for record in storage.dead_letters(Q, limit=1):
                storage.retry(Q, record.job_id)
            storage.reap(Q)
    except BaseException as exc:  # noqa: BLE001 - reported by the test thread
        errors.append(exc)
    finally:
        storage.close()
        connections[alias].close()


@pytest.mark.postgres
@pytest.mark.django_db(databases=["pg"], transaction=True)
def test_concurrent_writers_keep_exact_counts_and_the_reaper_folds_their_slots():
    errors: list[BaseException] = []
    writers = [threading.Thread(target=churn, args=("pg", f"w{i}", 8, errors)) for i in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert errors == []
    storage = DatabaseStorage("pg")
    truth = held("pg")
    assert sum(truth.values()) == 4 * 8 * 31 and counted(storage) == truth
    slots = StateCount.objects.using("pg").filter(queue=Q)
    assert slots.exclude(slot=0).exists()  # the writers' own slots, before folding

    def folded() -> bool:  # each writer's backend exits once its connection closed
        storage.fold_counts(Q)
        return not slots.exclude(slot=0).exists()

    assert wait_until(folded)
    assert counted(storage) == truth  # folding moved counts, it did not change them


@pytest.mark.postgres
@pytest.mark.django_db(databases=["pg"], transaction=True)
def test_a_slot_locked_by_a_running_transaction_is_left_for_the_next_fold():
    """Folding never waits on a writer (``SKIP LOCKED``): the row it skips is folded later."""
    storage = DatabaseStorage("pg")
    storage.enqueue_many(Q, jobs("a", 3))
    StateCount.objects.using("pg").filter(queue=Q).update(slot=1)  # as if a backend that left
    other = DatabaseStorage("pg")
    with transaction.atomic(using="pg"):
        StateCount.objects.using("pg").select_for_update().filter(queue=Q, slot=1).first()

        def fold_elsewhere() -> None:
            try:
                with connections["pg"].cursor():  # a connection of this thread
                    other.fold_counts(Q)
            finally:
                connections["pg"].close()

        folder = threading.Thread(target=fold_elsewhere)
        folder.start()
        folder.join(timeout=60)
        assert not folder.is_alive()  # it did not wait for this transaction
        assert StateCount.objects.using("pg").filter(queue=Q, slot=1).exists()
    storage.fold_counts(Q)
    assert list(StateCount.objects.using("pg").filter(queue=Q).values_list("slot", "n")) == [(0, 3)]
    assert counted(storage) == {JobState.QUEUED: 3}


@pytest.mark.postgres
@pytest.mark.django_db(databases=["pg"], transaction=True)
def test_truncating_the_job_table_empties_the_counts():
    storage = DatabaseStorage("pg")
    storage.enqueue_many(Q, jobs("t", 5))
    with connections["pg"].cursor() as cursor:
        cursor.execute(f"TRUNCATE {Job._meta.db_table} CASCADE")
    assert counted(storage) == {} == held("pg")
    storage.enqueue_many(Q, jobs("u", 2))
    assert counted(storage) == {JobState.QUEUED: 2}


@ON_BOTH
@pytest.mark.django_db(databases=["default", "pg"], transaction=True)
def test_a_rolled_back_write_leaves_the_counts_as_they_were(alias):
    storage = DatabaseStorage(alias)
    storage.enqueue_many(Q, jobs("kept", 2))
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        storage.enqueue_many(Q, jobs("gone", 3))
        assert counted(storage) == {JobState.QUEUED: 5}  # the transaction sees its own
        raise RuntimeError("roll back")
    assert counted(storage) == {JobState.QUEUED: 2} == held(alias)


@ON_BOTH
@pytest.mark.django_db(databases=["default", "pg"], transaction=True)
def test_flush_leaves_no_count_behind(alias):
    """SQLite's flush deletes table by table in no fixed order: the counts are taken anew
    after it (``post_migrate``); PostgreSQL's is one ``TRUNCATE``."""
    storage = DatabaseStorage(alias)
    storage.enqueue_many(Q, jobs("f", 4))
    storage.enqueue(Q, NewJob("d", b"1", JobOptions(), delay=60_000))
    call_command("flush", database=alias, interactive=False, verbosity=0)
    assert not StateCount.objects.using(alias).exclude(n=0).exists()
    storage.enqueue_many(Q, jobs("g", 1))
    assert counted(storage) == {JobState.QUEUED: 1} == held(alias)
