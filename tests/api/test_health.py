"""GET /health, and 503 (never 500) when the storage is unreachable."""

from __future__ import annotations

import json
import time

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from django_jobq.backend import get_storage, reset_storage
from django_jobq.models import Job
from django_jobq.queue import get_queue

from ..helpers import wait_until
from .conftest import registered_workers


def test_health_needs_no_credentials_and_shows_no_job_data(api_backend, worker, api):
    get_queue("api-a").enqueue("secret-id", {"card": "4111"})
    w = worker("tests-echo")
    assert wait_until(lambda: w.worker_id in registered_workers(), 30)
    for client in (APIClient(), api):  # anonymous: the small answer; a reader: per queue
        response = client.get("/jobq/health")
        assert response.status_code == 200
        body = response.json()
        assert (body["status"], body["storage_reachable"], body["workers"]) == ("ok", True, 1)
        assert "secret-id" not in response.content.decode()
        assert "4111" not in response.content.decode()
    queues = {q["name"]: q for q in body["queues"]}
    assert queues["api-a"]["waiting"] == 1


def test_anonymous_health_names_no_queue_and_is_throttled(api_backend, settings, client_for):
    """Issue 36: anonymous /jobq/health listed every queue name (0.79 MB, 16 s at 10,000
    queues) and was never throttled."""
    for name in ("tenant-alpha", "tenant-beta"):
        get_queue(name).enqueue("x")
    body = APIClient().get("/jobq/health").json()
    assert body["queue_count"] >= 2 and body["queues"] is None
    assert "tenant-alpha" not in json.dumps(body)
    assert all(body[k] is None for k in ("mirror_lag_seconds", "mirror_gaps", "memory"))
    scoped = client_for(queues=("tenant-alpha",), actions=("read",))
    mine = scoped.get("/jobq/health").json()
    assert [q["name"] for q in mine["queues"]] == ["tenant-alpha"] and mine["queue_count"] == 1
    settings.JOBQ = {**settings.JOBQ, "API": {"HEALTH_RATE": "3/min"}}
    cache.clear()  # the calls above counted under the default rate
    answers = [APIClient().get("/jobq/health").status_code for _ in range(4)]
    assert answers == [200, 200, 200, 429], answers
    assert scoped.get("/jobq/health").status_code == 200  # a credential is not held back


def test_health_reports_oldest_waiting_age(api_backend, mirror_now, api):
    get_queue("api-a").enqueue("old")
    mirror_now()
    if api_backend == "redis":  # read from Redis, like the counts beside it
        storage = get_storage()
        storage.client.hset(storage.keys("api-a").job("old"), "created", 1577836800000)
    else:
        Job.objects.filter(job_id="old").update(created_at="2020-01-01T00:00:00Z")
    queues = {q["name"]: q for q in api.get("/jobq/health").json()["queues"]}
    assert queues["api-a"]["oldest_waiting_seconds"] > 3600 * 24 * 365


def test_health_oldest_waiting_agrees_with_the_waiting_count(api_backend, mirror_now, api):
    queue = get_queue("api-a")
    queue.enqueue("gone")
    mirror_now()
    job = queue.storage.claim("api-a", "w", 1, 30_000).jobs[0]
    queue.storage.complete("api-a", "gone", job.token, b"1")  # the rows still say queued
    queues = {q["name"]: q for q in api.get("/jobq/health").json()["queues"]}
    assert (queues["api-a"]["waiting"], queues["api-a"]["oldest_waiting_seconds"]) == (0, None)


def test_health_reports_mirror_lag_and_memory_on_redis_only(api_backend, mirror_now, api):
    get_queue("api-a").enqueue("m1")
    body = api.get("/jobq/health").json()
    if api_backend == "redis":
        assert body["mirror_lag_seconds"] >= 0
        assert body["memory"]["used_memory"] > 0
        time.sleep(0.2)
        lagging = api.get("/jobq/health").json()["mirror_lag_seconds"]
        assert lagging >= 0.2  # the enqueue's event is not mirrored yet
        mirror_now()
        assert api.get("/jobq/health").json()["mirror_lag_seconds"] == 0
    else:
        assert (body["mirror_lag_seconds"], body["memory"]) == (None, None)


@pytest.fixture
def redis_down(settings, db):
    """Redis on a loopback port nothing listens on."""
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "REDIS_URL": "redis://127.0.0.1:1/0"}
    yield
    reset_storage()


def test_health_is_503_when_storage_is_unreachable(redis_down):
    response = APIClient().get("/jobq/health")
    assert response.status_code == 503
    assert (response.json()["status"], response.json()["storage_reachable"]) == (
        "unavailable", False,
    )  # fmt: skip


def test_endpoints_are_503_not_500_when_storage_is_unreachable(redis_down, client_for):
    client = client_for()
    calls = [("post", "/jobq/queues/a/jobs/"), ("get", "/jobq/queues/a/jobs/x/"),
             ("get", "/jobq/queues/a/jobs/x/result/"), ("get", "/jobq/queues/"),
             ("post", "/jobq/queues/a/jobs/x/cancel/"), ("post", "/jobq/queues/a/pause/"),
             ("get", "/jobq/workers/")]  # fmt: skip
    for method, url in calls:
        response = getattr(client, method)(url, {"id": "x"} if method == "post" else None,
                                           format="json")  # fmt: skip
        assert response.status_code == 503, url
        assert response["Retry-After"] == "5"
