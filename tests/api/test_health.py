"""GET /health, and 503 (never 500) when the storage is unreachable."""

from __future__ import annotations

import time

import pytest
from rest_framework.test import APIClient

from django_jobq.backend import get_storage, reset_storage
from django_jobq.models import Job
from django_jobq.queue import get_queue

from ..helpers import wait_until
from .conftest import registered_workers


def test_health_needs_no_credentials_and_shows_no_job_data(api_backend, worker):
    get_queue("api-a").enqueue("secret-id", {"card": "4111"})
    w = worker("tests-echo")
    assert wait_until(lambda: w.worker_id in registered_workers(), 30)
    response = APIClient().get("/jobq/health")
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["storage_reachable"], body["workers"]) == ("ok", True, 1)
    assert "secret-id" not in response.content.decode()
    assert "4111" not in response.content.decode()
    queues = {q["name"]: q for q in body["queues"]}
    assert queues["api-a"]["waiting"] == 1


def test_health_reports_oldest_waiting_age(api_backend, mirror_now):
    get_queue("api-a").enqueue("old")
    mirror_now()
    if api_backend == "redis":  # read from Redis, like the counts beside it
        storage = get_storage()
        storage.client.hset(storage.keys("api-a").job("old"), "created", 1577836800000)
    else:
        Job.objects.filter(job_id="old").update(created_at="2020-01-01T00:00:00Z")
    queues = {q["name"]: q for q in APIClient().get("/jobq/health").json()["queues"]}
    assert queues["api-a"]["oldest_waiting_seconds"] > 3600 * 24 * 365


def test_health_oldest_waiting_agrees_with_the_waiting_count(api_backend, mirror_now):
    queue = get_queue("api-a")
    queue.enqueue("gone")
    mirror_now()
    job = queue.storage.claim("api-a", "w", 1, 30_000).jobs[0]
    queue.storage.complete("api-a", "gone", job.token, b"1")  # the rows still say queued
    queues = {q["name"]: q for q in APIClient().get("/jobq/health").json()["queues"]}
    assert (queues["api-a"]["waiting"], queues["api-a"]["oldest_waiting_seconds"]) == (0, None)


def test_health_reports_mirror_lag_and_memory_on_redis_only(api_backend, mirror_now):
    get_queue("api-a").enqueue("m1")
    body = APIClient().get("/jobq/health").json()
    if api_backend == "redis":
        assert body["mirror_lag_seconds"] >= 0
        assert body["memory"]["used_memory"] > 0
        time.sleep(0.2)
        lagging = APIClient().get("/jobq/health").json()["mirror_lag_seconds"]
        assert lagging >= 0.2  # the enqueue's event is not mirrored yet
        mirror_now()
        assert APIClient().get("/jobq/health").json()["mirror_lag_seconds"] == 0
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
