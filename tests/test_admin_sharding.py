"""A sharded queue in the admin: one row on the overview with the partitions' figures summed,
one queue page, the job list filtered by the logical name, and job actions on a partition's
row going to that partition. On the database backend and on Redis with the mirror."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_jobq.backend import get_storage
from django_jobq.mirror import Mirror
from django_jobq.models import Job
from django_jobq.queue import Queue
from django_jobq.queue.sharded import ShardedQueue
from django_jobq.states import JobState

Q = "admin-sharded"
pytestmark = pytest.mark.django_db(databases=["default"], transaction=True)


@pytest.fixture(params=["database", pytest.param("redis", marks=pytest.mark.redis)])
def sharded(request, settings) -> ShardedQueue:
    backend = {"BACKEND": "database", "DATABASE_ALIAS": "default"}
    if request.param == "redis":
        backend = {"BACKEND": "redis", "PREFIX": request.getfixturevalue("redis_prefix"),
                   "MIRROR": {"ENABLED": True, "DATABASE_ALIAS": "default"}}  # fmt: skip
    settings.JOBQ = {**settings.JOBQ, **backend, "QUEUES": {Q: {"shards": 3}}}
    queue = Queue(Q)
    assert isinstance(queue, ShardedQueue)
    return queue


def sync() -> None:
    storage = get_storage()
    if hasattr(storage, "read_group"):  # Redis: bring the rows up to date
        Mirror(storage, queues=[Q], using="default", consumer="admin-sharded").drain()


def complete_one_per_partition(queue: ShardedQueue) -> None:
    storage = get_storage()
    for part in queue.partition_names:
        [claimed] = storage.claim(part, "w-1", 1, 30_000).jobs
        storage.complete(part, claimed.job_id, claimed.token, b"1")


def test_the_overview_shows_one_row_with_the_partitions_summed(admin_client, sharded):
    sharded.enqueue_many([(f"j{i}", i) for i in range(30)])
    complete_one_per_partition(sharded)
    sync()
    page = admin_client.get(reverse("admin:django_jobq_queueconfig_changelist"))
    names = [r["name"] for r in page.context["rows"]]
    assert Q in names and not any("~" in n for n in names)
    row = next(r for r in page.context["rows"] if r["name"] == Q)
    assert row["counts"]["queued"] == 27 and row["completed_hour"] == 3
    assert row["oldest_age"] is not None
    detail = admin_client.get(reverse("admin:django_jobq_queue_detail", args=[Q]))
    assert detail.status_code == 200 and detail.context["row"]["counts"]["queued"] == 27


def test_the_job_list_filters_by_the_logical_name(admin_client, sharded):
    sharded.enqueue_many([(f"k{i}", i) for i in range(12)])
    sync()
    page = admin_client.get(reverse("admin:django_jobq_job_changelist"), {"queue": Q})
    assert {job.job_id for job in page.context["cl"].result_list} == {f"k{i}" for i in range(12)}
    lookups = [value for value, _ in page.context["cl"].filter_specs[0].lookup_choices]
    assert Q in lookups and not any("~" in v for v in lookups)


def test_a_job_action_on_a_partition_row_acts_on_that_partition(admin_client, sharded):
    sharded.enqueue("waiting", 1)
    sync()
    row = Job.objects.get(job_id="waiting")
    assert row.queue == sharded.locate("waiting").name  # the row names its partition
    url = reverse("admin:django_jobq_job_act", args=[row.pk, "cancel"])
    assert admin_client.post(url, {"confirm": "yes"}).status_code == 302
    assert sharded.get_status("waiting").state is JobState.CANCELLED
