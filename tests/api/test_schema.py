"""The OpenAPI schema: the committed docs/openapi.yaml matches the code, and property-based runs
of schemathesis against the schema the application serves: no 5xx answer, every status code,
content type, header and body as the schema declares them, per operation and along the
schema's links (enqueue, then status / result / cancel / retry of the job it made; a created
schedule, then read / update / run / delete). ``JOBQ_MODEL_LONG=1`` runs many more examples."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

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
    # The event stream is a long request by design (tests/api/test_event_stream.py serves it
    # over real HTTP); through the in-process WSGI client each example would hold for seconds.
    return loaded.exclude(path="/queues/{queue}/events/")


LONG = os.environ.get("JOBQ_MODEL_LONG") == "1"
# About 900 requests over both backends in CI: well under a minute.
EXAMPLES_PER_OPERATION = 300 if LONG else 30
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.mark.slow
def test_every_answer_conforms_to_the_schema(live_api):
    operations = [result.ok() for result in live_api.get_all_operations()]
    assert len(operations) >= 13

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=not LONG,
            database=None, suppress_health_check=list(HealthCheck),
        )  # fmt: skip
        def conforms(case):
            case.call_and_validate(checks=CHECKS)

        conforms()


def test_the_schema_links_enqueue_to_the_job_operations_and_schedules_to_theirs(live_api):
    schema = live_api.raw_schema
    enqueue = schema["paths"]["/queues/{queue}/jobs/"]["post"]["responses"]["201"]["links"]
    assert {link["operationId"] for link in enqueue.values()} == {
        "job_status", "job_result", "job_cancel", "job_retry",
    }  # fmt: skip
    assert enqueue["GetJobStatus"]["parameters"]["job_id"] == "$response.body#/id"
    created = schema["paths"]["/schedules/"]["post"]["responses"]["201"]["links"]
    assert {link["parameters"]["name"] for link in created.values()} == {"$response.body#/name"}


@pytest.mark.slow
def test_sequences_along_the_links_conform_to_the_schema(live_api):
    """Schemathesis's stateful mode: it enqueues, then follows the links with the id it got
    back (and creates schedules, then reads, updates, runs and deletes them), checking every
    answer of each sequence."""

    class Links(live_api.as_state_machine()):  # type: ignore[misc]
        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs or None)

    Links.run(
        settings=settings(
            max_examples=200 if LONG else 25,
            stateful_step_count=8 if LONG else 5,
            deadline=None,
            derandomize=not LONG,
            database=None,
            suppress_health_check=list(HealthCheck),
        )  # fmt: skip
    )
