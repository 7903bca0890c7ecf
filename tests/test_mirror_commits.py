"""The mirror's commits wait for the disk once per read (``mirror_sql.write_transaction``,
``make_durable``): every earlier transaction of the read commits lazily, and nothing is
acknowledged before a durable commit or flush followed it."""

from __future__ import annotations

import pytest
from django.db import connections, transaction

from django_jobq.job import JobOptions, NewJob
from django_jobq.mirror import Mirror
from django_jobq.mirror_sql import make_durable, write_transaction
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
