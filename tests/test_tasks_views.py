"""Where operators see a task function's job: its name in the mirror's ``handler`` column (so
the admin list, the API list and the Spark analytics group by it), on the admin job page and
in the API's job status, on Redis and the database backend."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_jobq.job import JobOptions, NewJob
from django_jobq.mirror import Mirror
from django_jobq.models import Job
from django_jobq.queue import Queue
from django_jobq.storage.redis.storage import RedisStorage

from .test_admin import jobq  # noqa: F401 - the admin's backend fixture, reused
from .test_tasks import add

Q = "tests-echo"  # a queue with a plain handler: its plain jobs keep showing that handler


@pytest.mark.redis
@pytest.mark.parametrize("db_alias", ["default", "pg"])
def test_the_mirror_names_a_task_job_by_its_task(redis_client, redis_prefix, db_alias):
    storage = RedisStorage(redis_client, prefix=redis_prefix)
    queue = Queue(Q, storage=storage)
    mirror = Mirror(storage, queues=[Q], using=db_alias, consumer="m1")
    mirror.queues()
    add.using(queue=queue).enqueue(1, 2, job_id="t1")
    storage.enqueue(Q, NewJob("plain", b"1", JobOptions()))
    storage.enqueue(Q, NewJob("broken-env", b"{not json", JobOptions(), content_type="json+env"))
    mirror.drain()
    rows = dict(Job.objects.using(db_alias).values_list("job_id", "handler"))
    assert rows == {"t1": "tests.add", "plain": "tests.jobsapp.jobs.echo",
                    "broken-env": "tests.jobsapp.jobs.echo"}  # fmt: skip


def test_status_and_admin_page_show_the_task(jobq, admin_client):  # noqa: F811
    queue = jobq.queue  # the admin tests' queue, on the configured backend
    add.using(queue=queue).enqueue(5, job_id="t-admin")
    queue.enqueue("plain-admin", {"n": 1})
    assert queue.get_status("t-admin").task == "tests.add"
    assert queue.get_status("plain-admin").task is None
    page = admin_client.get(reverse("admin:django_jobq_job_change",
                                    args=[jobq.row("t-admin").pk]))  # fmt: skip
    assert page.status_code == 200
    assert b"<th>task</th><td>tests.add</td>" in page.content


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_the_database_backend_names_a_task_job_by_its_task(live_storage):
    """On the database backend the rows are the state: each path that inserts one (single
    and bulk) writes the task's name, a plain job the queue's handler, and a payload that no
    longer decodes as an envelope the queue's handler too."""
    queue = Queue(Q, storage=live_storage)
    add.using(queue=queue).enqueue(1, 2, job_id="t1")
    payload, options = add._call((3, 4), {})
    live_storage.enqueue_many(Q, [
        queue.build("bulk-plain", {"n": 1}),
        NewJob("bulk-broken", b"{not json", JobOptions(), content_type="json+env"),
        *[queue.build(f"bulk-t{i}", payload, **options) for i in range(2)],
    ])  # fmt: skip
    live_storage.enqueue(Q, NewJob("plain", b"1", JobOptions()))
    rows = dict(Job.objects.using(live_storage.using).filter(queue=Q)
                .values_list("job_id", "handler"))  # fmt: skip
    echo = "tests.jobsapp.jobs.echo"
    assert rows == {"t1": "tests.add", "plain": echo, "bulk-plain": echo, "bulk-broken": echo,
                    "bulk-t0": "tests.add", "bulk-t1": "tests.add"}  # fmt: skip
