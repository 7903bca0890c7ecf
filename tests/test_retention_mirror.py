"""The model mirror follows retention (Redis → SQLite and PostgreSQL): the row of a job the
queue's retention removed is deleted with its events, so the admin never lists a job Redis
no longer has, and the reconciliation check does not call that a difference."""

from __future__ import annotations

import pytest

from django_jobq.job import JobOptions, Keep, NewJob, Retention
from django_jobq.mirror import Mirror
from django_jobq.mirror.check import check_queue
from django_jobq.models import Job, JobEvent
from django_jobq.storage.redis.storage import RedisStorage

pytestmark = pytest.mark.redis
Q = "keep-mirror-q"


@pytest.fixture(params=["default", "pg"])
def db_alias(request):
    """The database the mirror writes to (conftest gives the test that database)."""
    return request.param


@pytest.fixture
def storage(redis_client, redis_prefix) -> RedisStorage:
    return RedisStorage(redis_client, prefix=redis_prefix)


@pytest.fixture
def mirror(storage, db_alias) -> Mirror:
    m = Mirror(storage, queues=[Q], using=db_alias, consumer="m1")
    m.queues()  # the group exists before any event: everything from here on is mirrored
    return m


def complete(storage, job_id: str) -> None:
    storage.enqueue(Q, NewJob(job_id, b'{"n": 1}', JobOptions()))
    job = storage.claim(Q, "w1", 1, 30_000).jobs[0]
    assert job.job_id == job_id
    storage.complete(Q, job_id, job.token, b'"ok"')


def rows(alias) -> dict[str, str]:
    return dict(Job.objects.using(alias).filter(queue=Q).values_list("job_id", "state"))


def test_rows_of_removed_jobs_are_deleted_with_their_events(storage, mirror, db_alias):
    storage.set_retention(Q, Retention(completed=Keep(count=2)))
    complete(storage, "a")
    complete(storage, "b")
    mirror.drain()
    assert rows(db_alias) == {"a": "completed", "b": "completed"}
    complete(storage, "c")  # "a" falls out of the count
    mirror.drain()
    assert rows(db_alias) == {"b": "completed", "c": "completed"}
    assert not JobEvent.objects.using(db_alias).filter(queue=Q, job__job_id="a").exists()


def test_a_job_finished_and_removed_between_two_reads_leaves_no_row(storage, mirror, db_alias):
    storage.set_retention(Q, Retention(completed=Keep(count=1)))
    for job_id in ("a", "b", "c"):
        complete(storage, job_id)
    mirror.drain()
    assert rows(db_alias) == {"c": "completed"}


def test_an_id_enqueued_again_after_removal_is_mirrored_as_the_new_job(storage, mirror, db_alias):
    storage.set_retention(Q, Retention(completed=Keep(count=1)))
    complete(storage, "a")
    complete(storage, "b")
    storage.enqueue(Q, NewJob("a", b'{"n": 2}', JobOptions()))
    mirror.drain()
    assert rows(db_alias) == {"a": "queued", "b": "completed"}


def test_the_reconciliation_check_finds_no_difference_after_removals(storage, mirror, db_alias):
    storage.set_retention(Q, Retention(completed=Keep(count=1), failed=Keep(count=1)))
    for job_id in ("a", "b", "c"):
        complete(storage, job_id)
    storage.enqueue(Q, NewJob("waiting", b"{}", JobOptions()))
    mirror.drain()
    assert rows(db_alias) == {"c": "completed", "waiting": "queued"}
    report = check_queue(mirror, Q, repair=False)
    assert report.consistent, str(report)
    assert report.repaired == 0


def test_a_journal_queue_does_not_bring_removed_jobs_back(
    redis_client, redis_prefix, db_alias, settings
):
    """Journal mode: reconcile re-sends what Redis does not know unless a finished row says
    it ran. Retention deletes both the record and the row, so the mirror drops the journal
    entries of removed jobs too; otherwise the next reconcile would run them again."""
    from django_jobq.models import JournalEntry
    from django_jobq.queue import Queue
    from django_jobq.queue.journal import reconcile

    settings.JOBQ = {
        **settings.JOBQ,
        "BACKEND": "redis",
        "PREFIX": redis_prefix,
        "QUEUES": {Q: {"durability": "journal"}},
        "JOURNAL": {"DATABASE_ALIAS": db_alias, "MIN_AGE": 0},
        "MIRROR": {"ENABLED": False, "DATABASE_ALIAS": db_alias},
    }
    storage = RedisStorage(redis_client, prefix=redis_prefix)
    mirror = Mirror(storage, queues=[Q], using=db_alias, consumer="m1")
    mirror.queues()
    q = Queue(Q, storage=storage)
    storage.set_retention(Q, Retention(completed=Keep(count=1)))
    for job_id in ("a", "b"):
        q.enqueue(job_id, {"n": 1})
        job = storage.claim(Q, "w1", 1, 30_000).jobs[0]
        storage.complete(Q, job.job_id, job.token, b"1")
    assert storage.get_record(Q, "a") is None  # removed when "b" finished
    mirror.drain()
    assert not JournalEntry.objects.using(db_alias).filter(queue=Q, job_id="a").exists()
    report = reconcile(storage, [Q], min_age=0)[Q]
    assert report.recreated == 0
    assert q.get_status("a") is None
