"""The OpenAPI schema: the committed docs/openapi.yaml matches the code, and a property-based
run of schemathesis against the schema the application serves finds no 5xx answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from django_jobq.api.schema import render_yaml

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
REGENERATE = (
    "docs/openapi.yaml is out of date; regenerate it with: DJANGO_SETTINGS_MODULE=tests.settings"
    " python manage.py spectacular --urlconf django_jobq.api.urls --custom-settings"
    " django_jobq.api.schema.SETTINGS --file docs/openapi.yaml"
)


def test_committed_schema_matches_the_generated_one():
    assert COMMITTED.read_bytes() == render_yaml(), REGENERATE


def test_schema_is_served_to_authenticated_clients_only(api):
    from rest_framework.test import APIClient

    assert APIClient().get("/jobq/schema/").status_code == 401
    response = api.get("/jobq/schema/?format=json")
    assert response.status_code == 200
    assert "/queues/{queue}/jobs/" in response.json()["paths"]


@pytest.fixture
def live_api(api_backend, make_key, settings):
    """The schema as the running application serves it (over WSGI, in this process), and a
    key with every scope for the requests."""
    settings.ALLOWED_HOSTS = ["localhost"]  # the Host schemathesis's WSGI client sends
    headers = {"Authorization": f"Api-Key {make_key()}"}
    loaded = schemathesis.openapi.from_wsgi(
        "/jobq/schema/?format=json", get_wsgi_application(), headers=headers
    )
    loaded.config.update(base_url="http://localhost/jobq", headers=headers)
    return loaded


EXAMPLES_PER_OPERATION = 30  # about 900 requests over both backends: well under a minute


@pytest.mark.slow
def test_no_request_the_schema_allows_gets_a_server_error(live_api):
    operations = [result.ok() for result in live_api.get_all_operations()]
    assert len(operations) >= 13

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
            suppress_health_check=list(HealthCheck),
        )  # fmt: skip
        def no_server_error(case):
            case.call_and_validate(checks=[not_a_server_error])

        no_server_error()
