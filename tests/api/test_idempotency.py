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


# -- a claim left by a web process that died inside the request -------------------------------
# SIGKILL between the claim and the answer leaves the row exactly as the claim wrote it:
# status 0 ("in flight"), created at the moment of the claim. Time is moved by writing that
# moment (``claimed_ago``), never by waiting.


def claimed_ago(seconds: float, *, job_too: bool) -> None:
    """Turn the stored answer back into the claim a killed request leaves behind, made
    ``seconds`` ago; without ``job_too`` the request died before its enqueue reached storage."""
    at = timezone.now() - dt.timedelta(seconds=seconds)
    IdempotencyRecord.objects.update(status_code=0, response={}, created_at=at)
    if not job_too:
        get_queue("tests-echo").cancel("dead-1")
        assert get_queue("tests-echo").delete(["dead-1"]) == 1


def test_in_flight_key_of_a_dead_request_is_409_within_its_lease(api, settings):
    settings.JOBQ = {**settings.JOBQ, "API": {"IDEMPOTENCY_LEASE": 30}}
    post(api, {"id": "dead-1", "payload": 1}, "k-7")
    claimed_ago(25, job_too=True)
    assert post(api, {"id": "dead-1", "payload": 1}, "k-7").status_code == 409


def test_after_the_lease_a_retry_proceeds_and_the_job_id_keeps_it_one_job(api, settings):
    settings.JOBQ = {**settings.JOBQ, "API": {"IDEMPOTENCY_LEASE": 30}}
    post(api, {"id": "dead-1", "payload": 1}, "k-8")
    claimed_ago(31, job_too=True)  # died after its enqueue, before storing the answer
    retry = post(api, {"id": "dead-1", "payload": 1}, "k-8")
    assert retry.status_code == 200 and retry.json()["outcome"] == "duplicate"
    again = post(api, {"id": "dead-1", "payload": 1}, "k-8")
    assert again["Idempotent-Replayed"] == "true" and again.json() == retry.json()
    assert get_queue("tests-echo").counts()["queued"] == 1


def test_after_the_lease_a_retry_stores_the_job_the_dead_request_never_did(api, settings):
    settings.JOBQ = {**settings.JOBQ, "API": {"IDEMPOTENCY_LEASE": 30}}
    post(api, {"id": "dead-1", "payload": 1}, "k-9")
    claimed_ago(31, job_too=False)
    assert get_queue("tests-echo").get_status("dead-1") is None
    other = post(api, {"id": "dead-2", "payload": 1}, "k-9")  # another body: still refused
    assert other.status_code == 422
    retry = post(api, {"id": "dead-1", "payload": 1}, "k-9")
    assert retry.status_code == 201 and retry.json()["outcome"] == "queued"
    assert IdempotencyRecord.objects.get().status_code == 201
    assert get_queue("tests-echo").counts()["queued"] == 1


def test_the_lease_defaults_to_30_seconds(api):
    post(api, {"id": "dead-1", "payload": 1}, "k-10")
    claimed_ago(29, job_too=True)
    assert post(api, {"id": "dead-1", "payload": 1}, "k-10").status_code == 409
    claimed_ago(31, job_too=True)
    assert post(api, {"id": "dead-1", "payload": 1}, "k-10").status_code == 200


# -- a request without ids that died after its enqueue ----------------------------------------


def killed_after_the_enqueue(monkeypatch, api, url, body, key) -> None:
    """Run the request, then put its key back as a web process SIGKILLed right after the
    enqueue leaves it: the claim row as it was while the request ran, 31 s old."""
    from django_jobq.queue.core import Queue

    seen = {}
    for name in ("enqueue", "enqueue_many"):
        real = getattr(Queue, name)

        def spy(self, *args, _real=real, **kwargs):
            result = _real(self, *args, **kwargs)
            seen["row"] = IdempotencyRecord.objects.values().get()  # what a kill leaves
            return result

        monkeypatch.setattr(Queue, name, spy)
    assert api.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY=key).status_code in (200, 201)
    monkeypatch.undo()
    row = seen["row"]
    assert row["status_code"] == 0
    IdempotencyRecord.objects.filter(pk=row["id"]).update(
        status_code=0, response=row["response"],
        created_at=row["created_at"] - dt.timedelta(seconds=31),
    )  # fmt: skip


def test_a_retry_after_a_dead_request_without_an_id_finds_its_job(api, settings, monkeypatch):
    settings.JOBQ = {**settings.JOBQ, "API": {"IDEMPOTENCY_LEASE": 30}}
    killed_after_the_enqueue(monkeypatch, api, URL, {"payload": {"n": 1}}, "k-dead")
    retry = post(api, {"payload": {"n": 1}}, "k-dead")
    assert retry.status_code == 200 and retry.json()["outcome"] == "duplicate"
    assert get_queue("tests-echo").counts()["queued"] == 1


def test_a_retry_of_a_dead_bulk_request_enqueues_nothing_twice(api, settings, monkeypatch):
    settings.JOBQ = {**settings.JOBQ, "API": {"IDEMPOTENCY_LEASE": 30}}
    url = "/jobq/queues/tests-echo/bulk/"
    body = {"jobs": [{"payload": 1}, {"id": "mine", "payload": 2}, {"payload": 3}]}
    killed_after_the_enqueue(monkeypatch, api, url, body, "b-dead")
    retry = api.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="b-dead")
    assert [r["outcome"] for r in retry.json()["results"]] == ["duplicate"] * 3
    assert retry.json()["results"][1]["id"] == "mine"
    assert get_queue("tests-echo").counts()["queued"] == 3
