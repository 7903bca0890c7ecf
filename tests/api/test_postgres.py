"""The main flows once more on the database backend on PostgreSQL (LISTEN/NOTIFY wake-ups for
the long-poll, keyset pages on its own ordering of timestamps)."""

from __future__ import annotations

import pytest

from django_jobq.queue import get_queue

pytestmark = pytest.mark.parametrize("api_backend", ["postgres"], indirect=True)
URL = "/jobq/queues/tests-echo/"


def test_enqueue_wait_for_result_and_list(api, worker):
    assert api.post(URL + "jobs/", {"id": "pg-1", "payload": 5}, format="json").status_code == 201
    worker("tests-echo")
    body = api.get(URL + "jobs/pg-1/result/?wait=10").json()
    assert (body["ready"], body["value"]) == (True, {"echo": 5, "attempt": 1})
    rows = api.get("/jobq/jobs/?queue=tests-echo").json()["results"]
    assert [(r["id"], r["state"]) for r in rows] == [("pg-1", "completed")]


def test_cancel_retry_and_pages(api):
    for n in range(5):
        get_queue("tests-echo").enqueue(f"pg-p{n}")
    assert api.post(URL + "jobs/pg-p0/cancel/").status_code == 200
    assert api.post(URL + "jobs/pg-p0/retry/").json()["state"] == "queued"
    assert api.post(URL + "jobs/pg-p1/retry/").status_code == 409
    first = api.get("/jobq/jobs/?limit=3").json()
    second = api.get(first["next"]).json()
    ids = [r["id"] for r in first["results"] + second["results"]]
    assert ids == [f"pg-p{n}" for n in range(4, -1, -1)]


def test_idempotent_enqueue(api):
    one = api.post(URL + "jobs/", {"payload": 1}, format="json", HTTP_IDEMPOTENCY_KEY="pg-k")
    two = api.post(URL + "jobs/", {"payload": 1}, format="json", HTTP_IDEMPOTENCY_KEY="pg-k")
    assert one.json() == two.json()
