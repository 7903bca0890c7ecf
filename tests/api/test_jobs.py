"""Enqueue, status, result (with the long-poll) and cancel, on Redis and the database backend."""

from __future__ import annotations

import time

import pytest

from django_jobq.api import waiting
from django_jobq.queue import get_queue

from ..helpers import wait_until

URL = "/jobq/queues/tests-echo/"


def test_enqueue_new_job_is_201_queued(api):
    response = api.post(URL + "jobs/", {"id": "job-1", "payload": {"n": 1}}, format="json")
    assert response.status_code == 201
    assert response.json() == {
        "id": "job-1", "queue": "tests-echo", "outcome": "queued", "state": "queued",
        "result": None, "error": None,
    }  # fmt: skip


def test_enqueue_without_id_generates_one(api):
    response = api.post(URL + "jobs/", {"payload": 1}, format="json")
    assert response.status_code == 201
    assert len(response.json()["id"]) == 32


def test_enqueue_same_id_is_200_duplicate_and_keeps_first_payload(api):
    api.post(URL + "jobs/", {"id": "job-1", "payload": {"n": 1}}, format="json")
    response = api.post(URL + "jobs/", {"id": "job-1", "payload": {"n": 2}}, format="json")
    assert response.status_code == 200
    assert response.json()["outcome"] == "duplicate"
    assert get_queue("tests-echo").storage.get_record("tests-echo", "job-1").payload == b'{"n":1}'


def test_enqueue_options_reach_the_job(api):
    body = {"id": "opt", "payload": None, "priority": 5, "max_attempts": 7, "delay": 60_000}
    assert api.post(URL + "jobs/", body, format="json").status_code == 201
    status = get_queue("tests-echo").get_status("opt")
    assert (status.priority, status.max_attempts, status.state) == (5, 7, "scheduled")


def test_enqueue_takes_per_job_timeouts_and_the_payload_reads_back_plain(api):
    body = {"id": "timed", "payload": {"n": 1}, "timeout": 2.5, "hard_timeout": 10}
    assert api.post(URL + "jobs/", body, format="json").status_code == 201
    queue = get_queue("tests-echo")
    assert queue.get_payload("timed") == {"n": 1}
    assert queue.storage.get_record("tests-echo", "timed").content_type == "json+env"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"timeout": 0}, "timeout"),
        ({"hard_timeout": 100_000}, "hard_timeout"),
        ({"id": "bad id!"}, "id"),
        ({"id": "x" * 129}, "id"),
        ({"priority": 5000}, "priority"),
        ({"max_attempts": "many"}, "max_attempts"),
        ({"dedup_mode": "throttle", "dedup_key": "k"}, "dedup_mode"),
        ({"dedup_ttl": 10}, "dedup_ttl"),
        ({"update_run_at": "sometimes"}, "update_run_at"),
    ],
)
def test_enqueue_invalid_field_is_400_naming_it_and_stores_nothing(api, body, field):
    response = api.post(URL + "jobs/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert get_queue("tests-echo").counts()["queued"] == 0


def test_enqueue_payload_over_the_limit_is_413(api, settings):
    settings.JOBQ = {**settings.JOBQ, "MAX_PAYLOAD_BYTES": 1000}
    response = api.post(URL + "jobs/", {"id": "big", "payload": "x" * 2000}, format="json")
    assert response.status_code == 413
    assert "over the limit" in response.json()["detail"]
    assert get_queue("tests-echo").get_status("big") is None


def test_bulk_enqueue_returns_each_outcome(api):
    api.post(URL + "jobs/", {"id": "a"}, format="json")
    jobs = [{"id": "a", "payload": 1}, {"id": "b", "payload": 2}, {"payload": 3}]
    response = api.post(URL + "bulk/", {"jobs": jobs}, format="json")
    assert response.status_code == 200
    outcomes = [(r["id"], r["outcome"]) for r in response.json()["results"]]
    assert outcomes[:2] == [("a", "duplicate"), ("b", "queued")]
    assert outcomes[2][1] == "queued"


def test_bulk_enqueue_with_one_bad_item_is_400_for_that_item_and_stores_none(api):
    jobs = [{"id": "ok-1"}, {"id": "bad id"}]
    response = api.post(URL + "bulk/", {"jobs": jobs}, format="json")
    assert response.status_code == 400
    assert list(response.json()["jobs"]) == ["1"]  # the second item, and only it
    assert "id" in response.json()["jobs"]["1"]
    assert get_queue("tests-echo").get_status("ok-1") is None


def test_bulk_enqueue_refuses_an_empty_list(api):
    assert api.post(URL + "bulk/", {"jobs": []}, format="json").status_code == 400


def test_status_of_a_job(api):
    api.post(URL + "jobs/", {"id": "s1", "payload": 1, "priority": 3}, format="json")
    body = api.get(URL + "jobs/s1/").json()
    assert (body["id"], body["queue"], body["state"], body["priority"]) == (
        "s1", "tests-echo", "queued", 3,
    )  # fmt: skip
    assert body["created_at"] is not None


def test_status_shows_progress_and_log_lines(api, worker):
    worker("tests-report")
    get_queue("tests-report").enqueue_and_wait("p1", {}, timeout=30)
    body = api.get("/jobq/queues/tests-report/jobs/p1/").json()
    assert set(body["progress"]) == {"pid"}
    [log] = body["logs"]
    assert log["line"].endswith("at work") and log["at"].endswith("+00:00")


def test_status_of_unknown_job_is_404(api):
    assert api.get(URL + "jobs/nope/").status_code == 404


def test_malformed_job_id_in_path_is_404(api):
    assert api.get(URL + "jobs/.hidden/").status_code == 404


def test_result_of_completed_job_has_value(api, worker):
    worker("tests-echo")
    get_queue("tests-echo").enqueue_and_wait("r1", {"n": 1}, timeout=30)
    body = api.get(URL + "jobs/r1/result/").json()
    assert body == {
        "id": "r1", "queue": "tests-echo", "state": "completed", "ready": True,
        "value": {"echo": {"n": 1}, "attempt": 1}, "error": None,
    }  # fmt: skip


def test_result_of_waiting_job_is_not_ready_at_once(api):
    api.post(URL + "jobs/", {"id": "w1"}, format="json")
    started = time.monotonic()
    body = api.get(URL + "jobs/w1/result/").json()
    assert (body["state"], body["ready"]) == ("queued", False)
    assert time.monotonic() - started < 10  # answered without waiting for the job


def test_result_wait_returns_when_the_job_completes(api, worker):
    api.post(URL + "jobs/", {"id": "w2", "payload": 7}, format="json")
    worker("tests-echo")
    body = api.get(URL + "jobs/w2/result/?wait=10").json()
    assert (body["ready"], body["value"]) == (True, {"echo": 7, "attempt": 1})


def test_result_wait_gives_up_after_the_wait_with_the_state(api):
    api.post(URL + "jobs/", {"id": "w3"}, format="json")
    started = time.monotonic()
    body = api.get(URL + "jobs/w3/result/?wait=0.5").json()
    assert (body["state"], body["ready"]) == ("queued", False)
    assert 0.5 <= time.monotonic() - started < 20  # its own 0.5 s, not the 30 s maximum


@pytest.mark.parametrize("wait", ["-1", "31", "soon"])
def test_result_wait_out_of_bounds_is_400(api, wait):
    api.post(URL + "jobs/", {"id": "w4"}, format="json")
    response = api.get(URL + f"jobs/w4/result/?wait={wait}")
    assert response.status_code == 400
    assert "wait" in response.json()


def test_result_of_failed_job_has_error(api, worker):
    worker("tests-fail")
    api.post("/jobq/queues/tests-fail/jobs/", {"id": "f1", "payload": {"permanent": True}},
             format="json")  # fmt: skip
    body = api.get("/jobq/queues/tests-fail/jobs/f1/result/?wait=10").json()
    assert (body["state"], body["ready"]) == ("failed", True)
    assert body["error"]["message"] == "no point retrying"


def test_result_of_unknown_job_is_404(api):
    assert api.get(URL + "jobs/nope/result/?wait=0.2").status_code == 404


def test_cancel_waiting_job(api):
    api.post(URL + "jobs/", {"id": "c1"}, format="json")
    response = api.post(URL + "jobs/c1/cancel/")
    assert response.status_code == 200
    assert response.json()["state"] == "cancelled"
    assert get_queue("tests-echo").get_status("c1").state == "cancelled"


def test_cancel_completed_job_is_409_with_its_state(api, worker):
    worker("tests-echo")
    get_queue("tests-echo").enqueue_and_wait("c2", 1, timeout=30)
    response = api.post(URL + "jobs/c2/cancel/")
    assert response.status_code == 409
    assert response.json()["state"] == "completed"


def test_cancel_of_a_running_job_is_accepted_and_the_job_ends_cancelled(api, worker):
    worker("tests-slow")
    q = get_queue("tests-slow")
    q.enqueue("running", {"seconds": 2})
    assert wait_until(lambda: q.get_status("running").state == "active")
    assert api.post("/jobq/queues/tests-slow/jobs/running/cancel/?force=maybe").status_code == 400
    response = api.post("/jobq/queues/tests-slow/jobs/running/cancel/?force=true")
    assert response.status_code == 202
    assert response.json()["outcome"] == "requested"
    # The thread pool cannot kill: the handler sleeps on, then its attempt ends cancelled.
    assert wait_until(lambda: q.get_status("running").state == "cancelled")


def test_cancel_unknown_job_is_404(api):
    assert api.post(URL + "jobs/nope/cancel/").status_code == 404


def test_payload_over_the_default_one_mib_limit_is_413(api):
    response = api.post(URL + "jobs/", {"id": "huge", "payload": "x" * (2 * 1024 * 1024)},
                        format="json")  # fmt: skip
    assert response.status_code == 413
    assert get_queue("tests-echo").get_status("huge") is None


def test_result_wait_wakes_on_the_completion_not_at_the_end_of_a_slice(api, worker, monkeypatch):
    # With 20 s slices, only a real wake-up (events on Redis, the record's own signal on the
    # database) can answer well before the first slice ends.
    monkeypatch.setattr(waiting, "SLICE", 20.0)
    api.post(URL + "jobs/", {"id": "wake", "payload": 1}, format="json")
    worker("tests-echo")
    started = time.monotonic()
    body = api.get(URL + "jobs/wake/result/?wait=25").json()
    assert body["ready"] is True
    assert time.monotonic() - started < 10


def test_body_over_the_upload_limit_is_413_before_it_is_parsed(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
    jobs = [{"id": f"b{n}", "payload": "x" * 300_000} for n in range(10)]  # 3 MB in all
    response = api.post(URL + "bulk/", {"jobs": jobs}, format="json")
    assert response.status_code == 413
    assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in response.json()["detail"]
    assert get_queue("tests-echo").counts()["queued"] == 0


def test_result_wait_nan_is_400(api):
    api.post(URL + "jobs/", {"id": "nan"}, format="json")
    assert api.get(URL + "jobs/nan/result/?wait=nan").status_code == 400


def test_a_non_finite_float_in_a_request_body_is_400_and_stores_nothing(api):
    for literal in ("NaN", "Infinity", "-Infinity"):
        body = '{"id": "nf", "payload": {"x": ' + literal + "}}"
        response = api.post(URL + "jobs/", body, content_type="application/json")
        assert response.status_code == 400, literal
    assert get_queue("tests-echo").get_status("nf") is None


def test_a_handler_returning_nan_leaves_a_job_the_api_can_read(api_backend, api):
    """Stored, a NaN result made every REST read of the job a 500; now the attempt fails with
    BadResult, which reads back like any other failure."""
    from django_jobq.backend import get_storage
    from django_jobq.tasks.registry import HandlerRegistry
    from django_jobq.worker import Worker

    handlers = HandlerRegistry()
    handlers.register("api-nan", lambda job: {"score": float("nan")})
    worker = Worker(["api-nan"], storage=get_storage(), handlers=handlers, lease=5000, grace=1)
    worker.start()
    try:
        api.post("/jobq/queues/api-nan/jobs/", {"id": "n1"}, format="json")
        result = api.get("/jobq/queues/api-nan/jobs/n1/result/?wait=10")
        assert result.status_code == 200
        assert (result.json()["state"], result.json()["error"]["type"]) == ("failed", "BadResult")
        assert api.get("/jobq/queues/api-nan/jobs/n1/").status_code == 200
    finally:
        worker.stop(hurry=True)
        worker.stopped.wait(10)


def test_status_of_a_task_job_names_its_task(api):
    from tests.test_tasks import add

    add.using(queue=get_queue("tests-echo")).enqueue(1, 2, job_id="task-1")
    get_queue("tests-echo").enqueue("plain-1", {"n": 1})
    assert api.get(URL + "jobs/task-1/").json()["task"] == "tests.add"
    assert api.get(URL + "jobs/plain-1/").json()["task"] is None
