"""The Spark export and the JDBC history query name a sharded queue's partitions by their
logical queue, so the analytics see one queue."""

from __future__ import annotations

import pyarrow.dataset as ds
import pytest
from django.db import connections

from django_jobq.contrib.spark import export_history
from django_jobq.contrib.spark.history import _history_query
from django_jobq.queue import Queue
from django_jobq.storage.database import DatabaseStorage

pytestmark = [pytest.mark.spark]
Q = "spark-sharded"


def run_sharded_jobs(alias: str, n: int = 12) -> Queue:
    storage = DatabaseStorage(alias)
    queue = Queue(Q, storage=storage, shards=3)
    queue.enqueue_many([(f"s{i}", i) for i in range(n)])
    for part in queue.partition_names:
        while batch := storage.claim(part, "w-1", 10, 30_000).jobs:
            for claimed in batch:
                storage.complete(part, claimed.job_id, claimed.token, b"1")
    storage.close()
    return queue


@pytest.mark.django_db(databases=["default"], transaction=True)
def test_the_export_writes_a_sharded_queue_under_its_logical_name(tmp_path):
    run_sharded_jobs("default")
    result = export_history(tmp_path, using="default", settle=0)
    assert result.jobs == 12
    folders = sorted(p.name for p in (tmp_path / "jobs").iterdir())
    assert folders == [f"queue={Q}"]
    events = ds.dataset(tmp_path / "events", format="parquet", partitioning="hive").to_table()
    assert set(events.column("queue").to_pylist()) == {Q}


@pytest.mark.postgres
@pytest.mark.django_db(databases=["pg"], transaction=True)
def test_the_jdbc_history_query_reads_partitions_as_their_queue():
    run_sharded_jobs("pg")
    with connections["pg"].cursor() as cursor:
        cursor.execute(f"SELECT DISTINCT queue FROM ({_history_query(None)}) AS h")  # noqa: S608
        assert [row[0] for row in cursor.fetchall()] == [Q]
