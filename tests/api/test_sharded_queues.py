"""A sharded queue through the REST API: one queue, its partitions' figures summed, its rows
listed under its name; per-id endpoints reach the partition that holds the job."""

from __future__ import annotations

import pytest

from django_jobq.queue import get_queue
from django_jobq.queue.sharded import ShardedQueue
from django_jobq.states import JobState

from ..helpers import wait_until

Q = "tests-echo"


@pytest.fixture
def sharded(api_backend, settings):
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {Q: {"shards": 3}}}
    queue = get_queue(Q)
    assert isinstance(queue, ShardedQueue)
    return queue


def test_a_sharded_queue_is_one_queue_with_summed_counts(api, sharded, worker, mirror_now):
    sharded.enqueue_many([(f"a{i}", i) for i in range(9)])
    sharded.enqueue("later", 1, delay=60_000)
    worker(Q)
    assert wait_until(lambda: sharded.counts()[JobState.COMPLETED] == 9)
    mirror_now()
    listed = [q["name"] for q in api.get("/jobq/queues/").json()]
    assert Q in listed and not any("~" in name for name in listed)
    body = api.get(f"/jobq/queues/{Q}/").json()
    assert (body["counts"]["completed"], body["counts"]["scheduled"]) == (9, 1)
    assert body["stats"]["completed_last_hour"] == 9
    rows = api.get("/jobq/jobs/", {"queue": Q, "limit": 50}).json()["results"]
    assert len(rows) == 10 and {r["queue"] for r in rows} == {Q}


def test_job_endpoints_reach_the_partition_of_the_job(api, sharded, worker):
    created = api.post(f"/jobq/queues/{Q}/jobs/", {"id": "p1", "payload": {"x": 1}}, format="json")
    assert created.status_code == 201, created.content
    status = api.get(f"/jobq/queues/{Q}/jobs/p1/").json()
    assert (status["state"], status["queue"]) == ("queued", Q)
    assert api.post(f"/jobq/queues/{Q}/jobs/p1/cancel/").json()["outcome"] == "cancelled"
    assert api.post(f"/jobq/queues/{Q}/jobs/p1/retry/").json()["outcome"] == "retried"
    worker(Q)
    result = api.get(f"/jobq/queues/{Q}/jobs/p1/result/", {"wait": 20}).json()
    assert result["state"] == "completed"


def test_pause_covers_every_partition_and_events_are_merged(api, sharded):
    sharded.enqueue("e1", 1)
    assert api.post(f"/jobq/queues/{Q}/pause/").json()["paused"] is True
    assert all(p.is_paused() for p in sharded.partitions)
    streamed = api.get(f"/jobq/queues/{Q}/events/", {"timeout": 0.1})
    assert streamed.status_code == 200
    body = b"".join(streamed.streaming_content).decode()
    assert '"job_id": "e1"' in body and f'"queue": "{Q}"' in body and "id: s3:" in body
    refused = api.get(f"/jobq/queues/{Q}/events/", {"timeout": 0.1, "since": "s2:0,0"})
    assert refused.status_code == 400 and "3" in refused.content.decode()
