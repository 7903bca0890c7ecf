"""The mirror's commits wait for the disk once per read (``mirror_sql.write_transaction``,
``make_durable``): every earlier transaction of the read commits lazily, and nothing is
acknowledged before a durable commit or flush followed it."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connections, transaction

from django_jobq.job import JobOptions, NewJob
from django_jobq.mirror import Mirror
from django_jobq.mirror.sql import make_durable, write_transaction
from django_jobq.models import Job, JobEvent
from django_jobq.storage.redis.storage import RedisStorage

pytestmark = pytest.mark.redis
Q = "mirror-commits"


@pytest.fixture(params=["default", "pg"])
def db_alias(request):
    """The database the mirror writes to (conftest gives the test that database)."""
    return request.param


def commit_setting(alias: str) -> str:
    with connections[alias].cursor() as cursor:
        if connections[alias].vendor == "postgresql":
            cursor.execute("SHOW synchronous_commit")
        else:
            cursor.execute("PRAGMA synchronous")
        return str(cursor.fetchone()[0])


def file_in_wal_mode(alias: str) -> bool:
    with connections[alias].cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        return cursor.fetchone()[0] == "wal"


def test_a_lazy_transaction_relaxes_only_its_own_commit(db_alias):
    before = commit_setting(db_alias)
    with write_transaction(Job, db_alias, durable=False):
        inside = commit_setting(db_alias)
    assert commit_setting(db_alias) == before
    if connections[db_alias].vendor == "postgresql":
        assert inside == "off"
    else:  # NORMAL (1) only in WAL mode, which the mirror set on the file
        assert file_in_wal_mode(db_alias) and inside == "1"


def test_a_durable_transaction_keeps_the_commit_setting(db_alias):
    before = commit_setting(db_alias)
    with write_transaction(Job, db_alias, durable=True):
        assert commit_setting(db_alias) == before


def test_inside_a_callers_transaction_nothing_is_relaxed(db_alias):
    before = commit_setting(db_alias)
    with transaction.atomic(using=db_alias), write_transaction(Job, db_alias, durable=False):
        assert commit_setting(db_alias) == before


def test_make_durable_flushes_without_writing_rows(db_alias):
    with write_transaction(Job, db_alias, durable=False):
        pass
    make_durable(db_alias)
    assert Job.objects.using(db_alias).count() == 0


def test_a_read_of_several_transactions_is_written_whole_before_it_is_acknowledged(
    redis_client, redis_prefix, db_alias
):
    storage = RedisStorage(redis_client, prefix=redis_prefix)
    mirror = Mirror(storage, queues=[Q], using=db_alias, consumer="m1", batch=2)
    mirror.queues()
    storage.enqueue_many(Q, [NewJob(f"j{i}", b"1", JobOptions()) for i in range(7)])
    assert mirror.drain() == 7  # reads of up to 16 events: several transactions on SQLite
    assert storage.group_backlog(Q, "jobq-mirror")[0] == 0
    assert Job.objects.using(db_alias).filter(queue=Q).count() == 7
    assert JobEvent.objects.using(db_alias).filter(queue=Q).count() == 7
    assert not mirror._unsynced  # the read's last commit was durable


@pytest.mark.parametrize("ms", [
    0, 1, 999, 946_684_799_999, 946_684_800_000, 946_684_800_001,  # around PostgreSQL's epoch
    1_732_590_000_123, 1_732_590_000_999, 4_102_444_800_000,
    253_402_300_799_999,  # 9999-12-31 23:59:59.999, the last time Python has
])  # fmt: skip
def test_times_are_stored_as_the_orm_would_store_them(db_alias, ms):
    """The mirror writes times from their epoch milliseconds (PostgreSQL: the integer of the
    binary wire format, ``pg_micros``; SQLite: the adapter's text): every value must be that
    millisecond exactly, on both sides of 2000; it is the aware datetime ``ms_dt`` makes of
    it wherever a float holds the microseconds (until 2255: past that ``ms_dt``'s division
    is a few microseconds off, and both databases keep the exact time)."""
    from django_jobq.mirror.sql import JOB_COLUMNS, insert_events, ms_dt, upsert_jobs

    values = dict.fromkeys(JOB_COLUMNS)
    values.update(
        queue="times", job_id=str(ms), state="completed", handler="h", payload=b"{}",
        content_type="json", attempts=1, max_attempts=1, stalls=0, max_stalls=1, priority=0,
        result_ttl=0, run_at=ms, created_at=ms, started_at=ms, finished_at=ms, expires_at=ms,
        worker="", min_backoff=0, max_backoff=0, token=0, waiters=0, mirror_seq=0,
    )  # fmt: skip
    with transaction.atomic(using=db_alias):
        upsert_jobs(Job, db_alias, [tuple(values[c] for c in JOB_COLUMNS)])
        insert_events(
            JobEvent, Job, db_alias, [(str(ms), "times", "completed", ms, "", None, "1-0")]
        )
    row = Job.objects.using(db_alias).get(queue="times", job_id=str(ms))
    expected = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)
    if ms * 1000 < 2**53:
        assert expected == ms_dt(ms)
    assert row.created_at == row.run_at == row.started_at == expected
    assert row.finished_at == row.expires_at == expected
    assert JobEvent.objects.using(db_alias).get(job=row).at == expected
