"""API keys made by ``manage.py jobq_apikey`` and in the admin; both authenticate."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from django_jobq.models import ApiKey


def works(raw: str) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {raw}")
    return client.get("/jobq/queues/").status_code


def create(*args: str) -> str:
    out = io.StringIO()
    call_command("jobq_apikey", "create", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_command_creates_a_working_scoped_key(api_backend):
    raw = create("billing", "--queue", "api-a", "--action", "read", "--throttle", "10/min")
    key = ApiKey.objects.get()
    assert (key.name, key.queues, key.actions, key.throttle_rate) == (
        "billing", ["api-a"], ["read"], "10/min",
    )  # fmt: skip
    assert works(raw) == 200


def test_command_lists_without_secrets_and_revokes(api_backend):
    raw = create("ops", "--queue", "*", "--action", "manage")
    out = io.StringIO()
    call_command("jobq_apikey", "list", stdout=out)
    secret = raw.split("_", 2)[2]  # the whole secret: it may itself contain "_"
    assert "ops" in out.getvalue() and secret not in out.getvalue()
    call_command("jobq_apikey", "revoke", ApiKey.objects.get().prefix, stdout=io.StringIO())
    assert works(raw) == 401


@pytest.mark.parametrize(
    "args",
    [["--queue", "bad name", "--action", "read"], ["--queue", "a", "--action", "read",
                                                   "--throttle", "lots"]],
)  # fmt: skip
def test_command_refuses_bad_scopes(db, args):
    with pytest.raises(CommandError):
        create("x", *args)
    assert not ApiKey.objects.exists()


def test_admin_creates_a_key_and_shows_it_once(api_backend, client):
    admin = User.objects.create_superuser("admin", password="pw")  # noqa: S106
    client.force_login(admin)
    response = client.post(
        "/admin/django_jobq/apikey/add/",
        {"name": "svc", "queues": "api-a, api-b", "actions": ["read", "enqueue"],
         "throttle_rate": ""},
        follow=True,
    )  # fmt: skip
    text = response.content.decode()
    raw = re.search(r"jobq_[0-9a-f]{8}_[A-Za-z0-9_\-]{43}", text).group(0)
    key = ApiKey.objects.get()
    assert (key.queues, key.actions) == (["api-a", "api-b"], ["enqueue", "read"])
    assert raw.split("_", 2)[2] not in key.hashed_secret
    assert works(raw) == 200
    assert raw not in client.get(f"/admin/django_jobq/apikey/{key.pk}/change/").content.decode()


def test_admin_revoke_action(api_backend, client):
    raw = create("svc", "--queue", "*", "--action", "read")
    client.force_login(User.objects.create_superuser("admin", password="pw"))  # noqa: S106
    client.post("/admin/django_jobq/apikey/", {"action": "revoke_keys",
                "_selected_action": [ApiKey.objects.get().pk]})  # fmt: skip
    assert works(raw) == 401
