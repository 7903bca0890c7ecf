"""Retry of failed and cancelled jobs, and the dead-letter list."""

from __future__ import annotations

from django_jobq.queue import get_queue

FAIL = "/jobq/queues/tests-fail/"
ECHO = "/jobq/queues/tests-echo/"


def failed_for_good(api, job_id: str) -> None:
    api.post(FAIL + "jobs/", {"id": job_id, "payload": {"permanent": True}}, format="json")
    assert api.get(FAIL + f"jobs/{job_id}/result/?wait=10").json()["state"] == "failed"


def test_retry_failed_job_runs_it_again_from_attempt_one(api, worker):
    worker("tests-fail")
    failed_for_good(api, "f1")
    response = api.post(FAIL + "jobs/f1/retry/")
    assert response.status_code == 200
    assert response.json()["outcome"] == "retried"
    status = api.get(FAIL + "jobs/f1/result/?wait=10").json()
    assert status["state"] == "failed"  # it failed again: it did run again
    assert get_queue("tests-fail").get_status("f1").attempts == 1


def test_retry_cancelled_job_queues_it(api):
    api.post(ECHO + "jobs/", {"id": "c1"}, format="json")
    api.post(ECHO + "jobs/c1/cancel/")
    response = api.post(ECHO + "jobs/c1/retry/")
    assert (response.status_code, response.json()["state"]) == (200, "queued")


def test_retry_waiting_job_is_409_with_its_state(api):
    api.post(ECHO + "jobs/", {"id": "w1", "delay": 60_000}, format="json")
    response = api.post(ECHO + "jobs/w1/retry/")
    assert response.status_code == 409
    assert response.json()["state"] == "scheduled"


def test_retry_completed_job_is_409(api, worker):
    worker("tests-echo")
    get_queue("tests-echo").enqueue_and_wait("done", 1, timeout=30)
    response = api.post(ECHO + "jobs/done/retry/")
    assert (response.status_code, response.json()["state"]) == (409, "completed")


def test_retry_unknown_job_is_404(api):
    assert api.post(ECHO + "jobs/nope/retry/").status_code == 404


def test_retry_needs_the_manage_action_on_that_queue(api_backend, client_for):
    get_queue("tests-echo").enqueue("c2")
    get_queue("tests-echo").cancel("c2")
    assert client_for(actions=["read", "enqueue"]).post(ECHO + "jobs/c2/retry/").status_code == 403
    assert client_for(queues=["api-a"]).post(ECHO + "jobs/c2/retry/").status_code == 403
    assert get_queue("tests-echo").get_status("c2").state == "cancelled"


def test_dead_letters_list_failed_jobs_with_payload_and_error(api, worker):
    worker("tests-fail")
    failed_for_good(api, "d1")
    failed_for_good(api, "d2")
    body = api.get(FAIL + "dead/").json()
    assert body["count"] == 2
    assert body["failure_calls"] == 0  # tests-fail has no failure handler: nothing recorded
    assert [r["status"]["id"] for r in body["results"]] == ["d2", "d1"]
    assert body["results"][0]["payload"] == {"permanent": True}
    assert body["results"][0]["status"]["error"]["message"] == "no point retrying"
    page = api.get(FAIL + "dead/?offset=1&limit=1").json()["results"]
    assert [r["status"]["id"] for r in page] == ["d1"]


def test_dead_letters_are_scoped(api_backend, client_for):
    assert client_for(queues=["api-a"]).get(FAIL + "dead/").status_code == 403
