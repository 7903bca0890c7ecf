"""Authentication, scopes and throttling: keys by queue and action, users by permission."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from django_jobq.api.keys import find_key, parse_key
from django_jobq.models import ApiKey
from django_jobq.queue import get_queue

A = "/jobq/queues/api-a/"
B = "/jobq/queues/api-b/"


def test_every_endpoint_but_health_needs_credentials(api_backend):
    client = APIClient()
    for url in ["/jobq/jobs/", "/jobq/queues/", A, A + "jobs/x/", A + "jobs/x/result/",
                "/jobq/workers/", "/jobq/schedules/", "/jobq/schema/"]:  # fmt: skip
        assert client.get(url).status_code == 401, url
    for url in [A + "jobs/", A + "bulk/", A + "jobs/x/cancel/", A + "pause/", A + "resume/"]:
        assert client.post(url, {}, format="json").status_code == 401, url
    assert client.get("/jobq/health").status_code == 200


def test_unknown_key_is_401(api_backend, make_key):
    client = APIClient()
    real = make_key()
    prefix, _ = parse_key(real)
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key jobq_{prefix}_wrongsecret")
    assert client.get("/jobq/queues/").status_code == 401
    client.credentials(HTTP_AUTHORIZATION="Api-Key garbage")
    assert client.get("/jobq/queues/").status_code == 401


def test_revoked_key_is_401(api_backend, make_key):
    raw = make_key()
    ApiKey.objects.update(revoked_at="2026-01-01T00:00:00Z")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {raw}")
    assert client.get("/jobq/queues/").status_code == 401


def test_only_a_hash_of_the_secret_is_stored(make_key):
    raw = make_key()
    row = ApiKey.objects.get()
    assert raw.split("_")[2] not in (row.hashed_secret, row.prefix)
    assert find_key(raw) == row


def test_key_without_enqueue_action_cannot_enqueue(api_backend, client_for):
    client = client_for(actions=["read"])
    assert client.post(A + "jobs/", {"id": "x"}, format="json").status_code == 403
    assert get_queue("api-a").get_status("x") is None


def test_read_only_key_cannot_cancel_pause_or_resume(api_backend, client_for):
    get_queue("api-a").enqueue("x")
    client = client_for(actions=["read", "enqueue"])
    assert client.post(A + "jobs/x/cancel/").status_code == 403
    assert client.post(A + "pause/").status_code == 403
    assert get_queue("api-a").get_status("x").state == "queued"
    assert get_queue("api-a").is_paused() is False


def test_key_scoped_to_queue_a_cannot_touch_queue_b(api_backend, client_for):
    get_queue("api-b").enqueue("secret-job", {"card": "1234"})
    client = client_for(queues=["api-a"])
    assert client.get(B + "jobs/secret-job/").status_code == 403
    assert client.get(B + "jobs/secret-job/result/").status_code == 403
    assert client.post(B + "jobs/secret-job/cancel/").status_code == 403
    assert client.post(B + "jobs/", {"id": "y"}, format="json").status_code == 403
    assert client.post(B + "pause/").status_code == 403
    assert get_queue("api-b").get_status("secret-job").state == "queued"


def test_key_scoped_to_queue_a_works_on_queue_a(api_backend, client_for):
    client = client_for(queues=["api-a"])
    assert client.post(A + "jobs/", {"id": "y"}, format="json").status_code == 201
    assert client.get(A + "jobs/y/").status_code == 200


def test_scoped_key_lists_only_its_queues_jobs(api_backend, client_for, mirror_now):
    get_queue("api-a").enqueue("mine")
    get_queue("api-b").enqueue("theirs")
    mirror_now()
    client = client_for(queues=["api-a"])
    ids = [row["id"] for row in client.get("/jobq/jobs/").json()["results"]]
    assert ids == ["mine"]
    assert client.get("/jobq/jobs/?queue=api-b").status_code == 403
    names = [q["name"] for q in client.get("/jobq/queues/").json()]
    assert names == ["api-a"]


@pytest.fixture
def user_client(api_backend):
    def make(*codenames: str) -> APIClient:
        user = User.objects.create_user(f"u{User.objects.count()}", password="pw")  # noqa: S106
        user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
        client = APIClient()
        client.force_authenticate(user)
        return client

    return make


def test_django_user_needs_the_matching_model_permission(user_client):
    nobody = user_client()
    assert nobody.get("/jobq/queues/").status_code == 403
    reader = user_client("view_job")
    assert reader.get("/jobq/queues/").status_code == 200
    assert reader.post(A + "jobs/", {"id": "u1"}, format="json").status_code == 403
    producer = user_client("add_job")
    assert producer.post(A + "jobs/", {"id": "u1"}, format="json").status_code == 201
    assert producer.post(A + "jobs/u1/cancel/").status_code == 403
    changer = user_client("change_job")  # run now / priority in the admin: not cancel
    assert changer.post(A + "jobs/u1/cancel/").status_code == 403
    canceller = user_client("cancel_job")
    assert canceller.post(A + "jobs/u1/cancel/").status_code == 200


def test_session_authentication_keeps_csrf(api_backend):
    User.objects.create_superuser("admin", password="pw")  # noqa: S106
    client = APIClient(enforce_csrf_checks=True)
    assert client.login(username="admin", password="pw")  # noqa: S106
    assert client.get("/jobq/queues/").status_code == 200
    response = client.post(A + "jobs/", {"id": "z"}, format="json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]


def test_basic_authentication_of_the_project_works(api_backend):
    User.objects.create_superuser("admin", password="pw")  # noqa: S106
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Basic YWRtaW46cHc=")  # admin:pw
    assert client.post(A + "jobs/", {"id": "z"}, format="json").status_code == 201


def test_key_throttle_rate_limits_that_key_only(api_backend, client_for):
    limited = client_for(rate="3/min")
    other = client_for()
    codes = [limited.get("/jobq/queues/").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    assert other.get("/jobq/queues/").status_code == 200


def test_default_throttle_rate_applies_to_keys_without_their_own(api_backend, client_for, settings):
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"jobq": "2/min"},
    }
    client = client_for()
    codes = [client.get("/jobq/queues/").status_code for _ in range(3)]
    assert codes == [200, 200, 429]


@pytest.mark.parametrize("method", ["get", "post", "put", "delete"])
@pytest.mark.parametrize("path", ["/jobq/nope/", "/jobq/queues/q/jobs", "/jobq/queues/q/nope/"])
def test_an_unrouted_path_answers_the_json_404_whatever_the_method(db, method, path):
    """Issue 36: a POST to a path no route takes got Django's HTML CSRF page (403)."""
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    if method == "get":
        response = client.get(path)
    else:
        response = getattr(client, method)(path, "{}", content_type="application/json")
    assert response.status_code == 404, response.content[:200]
    assert response.json() == {"detail": "Not found."}


def test_wrong_keys_are_throttled_per_address_then_even_a_right_key_waits(
    api_backend, make_key, settings
):
    """Issue 36: a wrong key failed authentication, and DRF throttles only after it, so keys
    could be guessed at the server's speed."""
    from rest_framework.test import APIClient

    settings.JOBQ = {**settings.JOBQ, "API": {"FAILED_AUTH_RATE": "5/min"}}
    good = make_key()
    client = APIClient()
    for i in range(5):
        client.credentials(HTTP_AUTHORIZATION=f"Api-Key jobq_guess_{i}")
        assert client.get("/jobq/queues/").status_code == 401
    client.credentials(HTTP_AUTHORIZATION="Api-Key jobq_guess_6")
    refused = client.get("/jobq/queues/")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0, refused.content
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {good}")
    assert client.get("/jobq/queues/").status_code == 429  # the address waits out its window
    other = APIClient(REMOTE_ADDR="10.1.2.3")  # another address is not held back
    other.credentials(HTTP_AUTHORIZATION=f"Api-Key {good}")
    assert other.get("/jobq/queues/").status_code == 200


@pytest.mark.parametrize("scheme", ["Bearer", "Token", "bearer"])
def test_a_key_under_another_scheme_is_told_which_scheme_to_use(api_backend, make_key, scheme):
    """Issue 37, defect 8: "Authorization: Bearer <key>" answered "credentials were not
    provided", which sends a user looking for a missing header."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {make_key()}")
    response = client.get("/jobq/queues/")
    assert response.status_code == 401
    assert "Authorization: Api-Key <key>" in response.json()["detail"]
    other = APIClient()  # another scheme's token (a JWT, say) is left to its own class
    other.credentials(HTTP_AUTHORIZATION=f"{scheme} eyJhbGciOi.e30.sig")
    assert "not provided" in other.get("/jobq/queues/").json()["detail"]


def test_the_api_root_lists_its_endpoints_to_a_credential(api_backend, client_for):
    """Issue 37, defect 9: ``/jobq/`` answered 404; it now names every endpoint (the paths of
    the OpenAPI document) and the schema, behind the same authentication as the schema."""
    assert APIClient().get("/jobq/").status_code == 401
    body = client_for(actions=("read",)).get("/jobq/").json()
    assert body["endpoints"]["enqueue"] == "queues/{queue}/jobs/"
    assert body["endpoints"]["job-status"] == "queues/{queue}/jobs/{job_id}/"
    assert body["schema"].endswith("/jobq/schema/")
