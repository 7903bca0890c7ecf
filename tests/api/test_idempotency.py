"""Idempotency-Key on enqueue: replay for the same body, 422 for another, per credential."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from django_jobq.models import IdempotencyRecord
from django_jobq.queue import get_queue

URL = "/jobq/queues/tests-echo/jobs/"


def post(client, body, key):
    return client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_same_key_and_body_replays_the_first_response(api):
    first = post(api, {"payload": {"n": 1}}, "k-1")
    second = post(api, {"payload": {"n": 1}}, "k-1")
    assert (first.status_code, second.status_code) == (201, 201)
    assert second.json() == first.json()  # the same generated id: one job, not two
    assert second["Idempotent-Replayed"] == "true"
    assert get_queue("tests-echo").counts()["queued"] == 1


def test_same_key_with_another_body_is_422(api):
    post(api, {"payload": {"n": 1}}, "k-2")
    response = post(api, {"payload": {"n": 2}}, "k-2")
    assert response.status_code == 422
    assert get_queue("tests-echo").counts()["queued"] == 1


def test_refused_request_does_not_use_up_its_key(api):
    assert post(api, {"id": "bad id"}, "k-3").status_code == 400
    assert post(api, {"id": "good-id"}, "k-3").status_code == 201


def test_keys_of_two_credentials_do_not_mix(api_backend, client_for):
    one, two = client_for(), client_for()
    first = post(one, {"payload": 1}, "shared")
    second = post(two, {"payload": 1}, "shared")
    assert first.json()["id"] != second.json()["id"]


def test_expired_key_runs_the_request_again(api):
    first = post(api, {"payload": 1}, "k-4")
    IdempotencyRecord.objects.update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    second = post(api, {"payload": 1}, "k-4")
    assert second.status_code == 201
    assert second.json()["id"] != first.json()["id"]


def test_key_is_kept_for_24_hours(api):
    post(api, {"payload": 1}, "k-5")
    row = IdempotencyRecord.objects.get()
    assert row.expires_at - row.created_at == dt.timedelta(hours=24)


def test_key_in_flight_is_409(api):
    # A claim left by a request still running (status 0) holds the key.
    post(api, {"payload": 1}, "k-6")
    IdempotencyRecord.objects.update(status_code=0)
    assert post(api, {"payload": 1}, "k-6").status_code == 409


def test_bulk_enqueue_is_idempotent_too(api):
    body = {"jobs": [{"payload": 1}, {"payload": 2}]}
    first = api.post("/jobq/queues/tests-echo/bulk/", body, format="json",
                     HTTP_IDEMPOTENCY_KEY="b-1")  # fmt: skip
    second = api.post("/jobq/queues/tests-echo/bulk/", body, format="json",
                      HTTP_IDEMPOTENCY_KEY="b-1")  # fmt: skip
    assert second.json() == first.json()
    assert get_queue("tests-echo").counts()["queued"] == 2


def test_overlong_key_is_400(api):
    assert post(api, {"payload": 1}, "k" * 300).status_code == 400
