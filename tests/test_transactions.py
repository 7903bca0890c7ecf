"""Enqueue and database transactions.

The database backend writes the job in the caller's transaction (rolled back → no job, and no
worker is woken before the commit); the Redis backend offers ``enqueue_on_commit``.
"""

from __future__ import annotations

import threading

import pytest
from django.db import transaction

from django_jobq.queue import Queue
from django_jobq.states import JobState
from django_jobq.storage.database import DatabaseStorage


class Rollback(Exception):
    pass


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request):
    return request.param


def test_database_enqueue_is_rolled_back_with_the_callers_transaction(live_storage):
    assert isinstance(live_storage, DatabaseStorage)
    q = Queue("tx", storage=live_storage)
    with pytest.raises(Rollback), transaction.atomic(using=live_storage.using):
        assert q.enqueue("lost", 1).state is JobState.QUEUED
        raise Rollback
    assert q.get_status("lost") is None
    assert q.counts()[JobState.QUEUED] == 0

    with transaction.atomic(using=live_storage.using):
        q.enqueue("kept", 1)
        # Not claimable by anyone else until the commit: a worker's own connection sees nothing.
        assert q.get_status("kept").state is JobState.QUEUED
    assert q.get_status("kept").state is JobState.QUEUED
    assert [j.job_id for j in live_storage.claim("tx", "w", 10, 1000).jobs] == ["kept"]


def test_database_bulk_enqueue_is_rolled_back_too(live_storage):
    q = Queue("tx", storage=live_storage)
    with pytest.raises(Rollback), transaction.atomic(using=live_storage.using):
        q.enqueue_many([(f"j{i}", i) for i in range(50)])
        raise Rollback
    assert q.counts()[JobState.QUEUED] == 0


def test_uncommitted_job_is_invisible_to_a_worker_thread(live_storage):
    """A claim made on another connection while the enqueueing transaction is open never gets
    the job. PostgreSQL: the claim returns at once, empty. SQLite (one writer at a time): the
    claim waits for the write lock and gets the job once it is committed."""
    q = Queue("tx", storage=live_storage)
    calling, committing = threading.Event(), threading.Event()
    answers: list[tuple[list[str], bool]] = []  # (ids claimed, the commit had begun)

    def claim() -> None:
        calling.set()
        jobs = live_storage.claim("tx", "w", 5, 1000).jobs
        answers.append(([j.job_id for j in jobs], committing.is_set()))

    with transaction.atomic(using=live_storage.using):
        q.enqueue("pending", 1)
        t = threading.Thread(target=claim)
        t.start()
        assert calling.wait(30)
        if live_storage.vendor == "postgresql":  # readers never wait for writers
            t.join(30)
            assert answers == [([], False)]
        committing.set()
    t.join(30)
    assert not t.is_alive()
    [(ids, after_commit)] = answers
    if ids:
        # The flag is read after the claim returned: had the commit not begun by then, the
        # claim would have handed out a job nobody had committed.
        assert (ids, after_commit) == (["pending"], True)
    else:
        # An empty answer, before the commit or while it ran (SQLite: a read snapshot taken
        # before it): the committed job is there for the next claim.
        ids = [j.job_id for j in live_storage.claim("tx", "w", 5, 1000).jobs]
        assert ids == ["pending"]


def test_rows_name_the_queue_handler(live_storage):
    """The admin and API show which code runs a job: the handler registered for its queue."""
    from django_jobq.models import Job

    q = Queue("tests-echo", storage=live_storage)
    q.enqueue("one", 1)
    q.enqueue_many([("two", 2)])
    handlers = set(Job.objects.using(live_storage.using).values_list("handler", flat=True))
    assert handlers == {"tests.jobsapp.jobs.echo"}
