"""PostgreSQL ``enqueue_many`` binds a column once when the whole chunk shares its value and as
an array otherwise (``Enqueue._insert_chunk``). Either way each job must be stored with its own
values: these tests vary one column at a time inside a chunk and read every row back."""

from __future__ import annotations

import pytest

from django_jobq.job import JobOptions, NewJob
from django_jobq.models import Job
from django_jobq.storage.database import DatabaseStorage

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(databases=["pg"], transaction=True)]

Q = "bulk-columns"


@pytest.fixture
def storage():
    s = DatabaseStorage("pg")
    yield s
    s.close()


def rows() -> dict[str, Job]:
    return {r.job_id: r for r in Job.objects.using("pg").filter(queue=Q)}


def test_a_chunk_with_one_value_per_column_stores_it_on_every_row(storage):
    jobs = [NewJob(f"same-{i}", b'"x"', JobOptions(priority=2, max_attempts=4)) for i in range(5)]

    storage.enqueue_many(Q, jobs)

    stored = rows()
    assert sorted(stored) == [f"same-{i}" for i in range(5)]
    assert {(r.priority, r.max_attempts, bytes(r.payload), r.state) for r in stored.values()} == {
        (2, 4, b'"x"', "queued")
    }


def test_a_column_that_differs_in_one_job_keeps_each_jobs_value(storage):
    jobs = [
        NewJob("a", b'"1"', JobOptions(priority=0)),
        NewJob("b", b'"1"', JobOptions(priority=0), group="g1"),
        NewJob("c", b'"1"', JobOptions(priority=3), lifo=True, delay=60_000),
    ]

    storage.enqueue_many(Q, jobs)

    stored = rows()
    assert [stored[k].priority for k in "abc"] == [0, 0, 3]
    assert [stored[k].group for k in "abc"] == ["", "g1", ""]
    assert [stored[k].lifo for k in "abc"] == [False, False, True]
    assert [stored[k].state for k in "abc"] == ["queued", "queued", "scheduled"]
    assert stored["a"].run_at is None and stored["c"].run_at is not None
