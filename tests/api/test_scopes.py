"""What each credential learns from the API: outcomes without ``read``, tracebacks withheld,
one permission map shared with the admin, and JSON errors for malformed paths."""

from __future__ import annotations

import pytest
from django.contrib.admin.sites import site
from django.contrib.auth.models import Permission, User
from django.test import RequestFactory
from rest_framework.test import APIClient

from django_jobq import permissions as ops
from django_jobq.models import Job
from django_jobq.queue import get_queue

from ..helpers import wait_until

ECHO = "/jobq/queues/tests-echo/"
FAIL = "/jobq/queues/tests-fail/"
ECHOED = {"echo": 7, "attempt": 1}  # what tests-echo's handler returns for the payload 7


@pytest.fixture
def finished(worker):
    """One completed job (tests-echo/done, result ECHOED), one failed job (tests-fail/broke)."""
    worker("tests-echo", "tests-fail")
    assert get_queue("tests-echo").enqueue_and_wait("done", 7, timeout=10) == ECHOED
    get_queue("tests-fail").enqueue("broke", {"permanent": True})
    assert wait_until(lambda: get_queue("tests-fail").get_status("broke").state == "failed", 10)


@pytest.fixture
def user_client(api_backend):
    def make(*codenames: str) -> APIClient:
        user = User.objects.create_user(f"u{User.objects.count()}", password="pw")  # noqa: S106
        user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
        client = APIClient()
        client.force_authenticate(User.objects.get(pk=user.pk))  # fresh permission cache
        return client

    return make


# -- re-enqueueing a known id --------------------------------------------------------------------


def test_an_enqueue_only_key_learns_that_the_id_is_taken_only(finished, client_for):
    """Dedup by id must say whether the enqueue made a job (201 or 200): that much an
    enqueue-only key learns. Whether the job finished is a read, so "completed" reads as
    "duplicate" to it."""
    producer = client_for(actions=["enqueue"])
    done = producer.post(ECHO + "jobs/", {"id": "done", "payload": {"n": 1}}, format="json")
    broke = producer.post(FAIL + "jobs/", {"id": "broke"}, format="json")
    assert done.status_code == 200 and done.json() == {
        "id": "done", "queue": "tests-echo", "outcome": "duplicate",
        "state": None, "result": None, "error": None,
    }  # fmt: skip
    assert broke.json()["outcome"] == "duplicate"
    assert (broke.json()["state"], broke.json()["error"]) == (None, None)


def test_bulk_enqueue_without_read_hides_results_too(finished, client_for):
    producer = client_for(actions=["enqueue"])
    body = {"jobs": [{"id": "done"}, {"id": "new-one"}]}
    results = producer.post(ECHO + "bulk/", body, format="json").json()["results"]
    assert [r["outcome"] for r in results] == ["duplicate", "queued"]
    assert all(r["result"] is None and r["state"] is None for r in results)


@pytest.mark.parametrize(
    "update",
    [
        {"update_data": True},
        {"reset_counts": True},
        {"update_run_at": "yes"},
        {"update_max_attempts": True},
    ],
)
@pytest.mark.parametrize("path", ["jobs/", "bulk/"])
def test_an_enqueue_only_key_cannot_rewrite_a_waiting_job(api_backend, client_for, update, path):
    queue = get_queue("tests-echo")
    queue.enqueue("theirs", {"n": "original"})
    producer = client_for(actions=["enqueue"])
    item = {"id": "theirs", "payload": {"n": "rewritten"}, **update}
    body = item if path == "jobs/" else {"jobs": [{"id": "fresh"}, item]}
    response = producer.post(ECHO + path, body, format="json")
    assert response.status_code == 403, response.json()
    assert "change permission" in response.json()["detail"]
    assert queue.get_payload("theirs") == {"n": "original"}
    assert queue.get_status("fresh") is None  # the bulk is refused whole
    manager = client_for(actions=["enqueue", "manage"])
    assert manager.post(ECHO + path, body, format="json").status_code in (200, 201)
    if "update_data" in update:
        assert queue.get_payload("theirs") == {"n": "rewritten"}


def test_a_key_with_read_gets_the_result_of_a_completed_duplicate(finished, client_for):
    both = client_for(actions=["enqueue", "read"])
    body = both.post(ECHO + "jobs/", {"id": "done"}, format="json").json()
    assert (body["outcome"], body["state"], body["result"]) == ("completed", "completed", ECHOED)


def test_a_user_needs_the_view_permission_to_see_a_duplicates_result(finished, user_client):
    producer = user_client("add_job")
    assert producer.post(ECHO + "jobs/", {"id": "done"}, format="json").json()["result"] is None
    reader = user_client("add_job", "view_job")
    assert reader.post(ECHO + "jobs/", {"id": "done"}, format="json").json()["result"] == ECHOED


# -- tracebacks ----------------------------------------------------------------------------------


def test_tracebacks_are_withheld_from_api_readers_by_default(finished, client_for):
    reader = client_for(actions=["enqueue", "read"])
    answers = [
        reader.get(FAIL + "jobs/broke/").json()["error"],
        reader.get(FAIL + "jobs/broke/result/").json()["error"],
        reader.post(FAIL + "jobs/", {"id": "broke"}, format="json").json()["error"],
        reader.get(FAIL + "dead/").json()["results"][0]["status"]["error"],
    ]
    for error in answers:
        assert error["type"].endswith("PermanentError")
        assert error["message"] == "no point retrying"
        assert error["traceback"] is None
    # The storage keeps the whole traceback: the admin shows it to staff.
    assert "Traceback" in get_queue("tests-fail").get_status("broke").error["traceback"]


def test_the_tracebacks_setting_gives_them_back(finished, client_for, settings):
    settings.JOBQ = {**settings.JOBQ, "API": {"TRACEBACKS": True}}
    error = client_for(actions=["read"]).get(FAIL + "jobs/broke/").json()["error"]
    assert "Traceback" in error["traceback"] and "jobs.py" in error["traceback"]


def test_job_lists_withhold_tracebacks_too(finished, client_for, mirror_now):
    mirror_now()
    rows = client_for(actions=["read"]).get("/jobq/jobs/?queue=tests-fail").json()["results"]
    assert rows and rows[0]["error"]["traceback"] is None


# -- one permission map for the admin and the API -----------------------------------------------


@pytest.mark.parametrize("codename, may_cancel", [("cancel_job", True), ("change_job", False)])
def test_a_user_may_cancel_in_the_api_exactly_when_the_admin_lets_them(
    api_backend, user_client, codename, may_cancel
):
    client = user_client(codename, "view_job")
    get_queue("tests-echo").enqueue("c1")
    answer = client.post(ECHO + "jobs/c1/cancel/").status_code
    assert answer == (200 if may_cancel else 403)
    request = RequestFactory().get("/")
    request.user = client.handler._force_user
    assert site._registry[Job].has_cancel_permission(request) is may_cancel


def test_every_admin_job_action_asks_the_shared_permission_map():
    from django_jobq.admin.actions import ACTIONS

    needed = {name: spec.perm for name, spec in ACTIONS.items()}
    assert needed["cancel"] == needed["force_cancel"] == ops.PERMISSIONS[ops.CANCEL]
    assert needed["retry"] == needed["requeue_dead"] == ops.PERMISSIONS[ops.RETRY]
    assert needed["delete"] == ops.PERMISSIONS[ops.DELETE]
    assert needed["run_now"] == needed["priority"] == ops.PERMISSIONS[ops.CHANGE]


# -- malformed names in paths --------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, path",
    [
        ("get", "/jobq/queues/bad{name}/"),
        ("get", "/jobq/queues/" + "q" * 65 + "/"),
        ("get", ECHO + "jobs/.hidden/"),
        ("get", ECHO + "jobs/a%20b/result/"),
        ("get", ECHO + "jobs/" + "x" * 129 + "/"),
        ("post", ECHO + "jobs/caf%C3%A9/cancel/"),
        ("post", "/jobq/queues/a:b/jobs/"),
        ("post", "/jobq/queues/a*b/pause/"),
        ("get", "/jobq/queues/%7Bq%7D/dead/"),
    ],
)
def test_a_malformed_name_in_the_path_is_a_json_404(api, method, path):
    response = getattr(api, method)(path, {}, format="json")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert set(response.json()) == {"detail"}


# -- schedule names ------------------------------------------------------------------------------

NIGHTLY = {"name": "nightly", "interval": 3600, "payload": {"n": 1}}


def test_a_schedule_name_on_a_queue_the_key_cannot_see_is_not_revealed(api_backend, client_for):
    """Names are unique per queue: the name taken on api-b is free on api-a, so a key of api-a
    creates its own schedule exactly as if the other did not exist, and sees only its own."""
    everything, only_a = client_for(), client_for(queues=["api-a"])
    assert everything.post("/jobq/schedules/", {**NIGHTLY, "queue": "api-b"},
                           format="json").status_code == 201  # fmt: skip
    created = only_a.post("/jobq/schedules/", {**NIGHTLY, "queue": "api-a"}, format="json")
    assert created.status_code == 201, created.json()
    assert only_a.get("/jobq/schedules/nightly/").json()["queue"] == "api-a"
    assert [s["queue"] for s in only_a.get("/jobq/schedules/").json()] == ["api-a"]
    again = only_a.post("/jobq/schedules/", {**NIGHTLY, "queue": "api-a"}, format="json")
    assert again.status_code == 409  # its own queue: a real conflict, nothing hidden


def test_a_credential_seeing_one_name_on_two_queues_picks_with_the_queue_parameter(
    api_backend, client_for
):
    api = client_for()
    for queue in ("api-a", "api-b"):
        api.post("/jobq/schedules/", {**NIGHTLY, "queue": queue}, format="json")
    ambiguous = api.get("/jobq/schedules/nightly/")
    assert ambiguous.status_code == 400 and "queue" in ambiguous.json()
    assert api.get("/jobq/schedules/nightly/?queue=api-b").json()["queue"] == "api-b"
    ran = api.post("/jobq/schedules/nightly/run/?queue=api-a")
    assert ran.status_code == 200 and ran.json()["queue"] == "api-a"
    moved = api.patch("/jobq/schedules/nightly/?queue=api-a", {"queue": "api-b"}, format="json")
    assert moved.status_code == 409
    assert api.delete("/jobq/schedules/nightly/?queue=api-b").status_code == 204
    assert api.get("/jobq/schedules/nightly/").json()["queue"] == "api-a"
