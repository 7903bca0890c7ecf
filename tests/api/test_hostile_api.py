"""Hostile input at the REST API, on Redis, SQLite and PostgreSQL: every request gets either a
4xx answer with the JSON error body docs/api.md describes, or 201 with the value stored
exactly; never a 5xx, never an HTML page, never a half-written job.

The inputs are the shared strategies of ``tests/strategies.py`` (the Python API test uses
them too). The request bodies are written by hand: a client may send what ``json.dumps``
never writes (``NaN``, nesting deeper than any parser's stack).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given

from django_jobq.queue import get_queue
from django_jobq.states import JobState

from ..strategies import (
    Built,
    built,
    hostile_ids,
    hostile_queue_names,
    hostile_settings,
    hostile_values,
    same_json,
)

pytestmark = pytest.mark.parametrize("api_backend", ["redis", "sqlite", "postgres"], indirect=True)

HOSTILE = hostile_settings(30)


def json_text(value: Any) -> str:
    """The JSON text of a drawn value as a client could send it: NaN and Infinity as the
    bare words many encoders write, deep nesting without recursion."""
    if isinstance(value, Built) and value.kind != "text":
        opening, closing = ("[", "]") if value.kind == "list" else ('{"k":', "}")
        return opening * value.size + "1" + closing * value.size
    return json.dumps(built(value), allow_nan=True)


def assert_json_client_error(response) -> None:
    assert response.status_code < 500, f"{response.status_code}: {response.content[:300]!r}"
    assert response["Content-Type"].startswith("application/json"), response.content[:300]
    assert isinstance(response.json(), dict)


@HOSTILE
@given(payload=hostile_values)
def test_enqueue_answers_201_and_stores_the_value_exactly_or_a_json_4xx(api, payload):
    queue = f"hostile-{uuid.uuid4().hex[:10]}"
    body = '{"id": "job-1", "payload": ' + json_text(payload) + "}"
    response = api.post(f"/jobq/queues/{queue}/jobs/", body, content_type="application/json")
    if response.status_code != 201:
        assert_json_client_error(response)
        assert response.status_code in (400, 413), response.status_code
        assert get_queue(queue).get_status("job-1") is None, "refused, yet half-written"
        return
    # What the client sent, as JSON reads it back: a key drawn as 1 or None arrives as "1"/"null".
    sent = payload.build() if isinstance(payload, Built) else json.loads(json_text(payload))
    assert same_json(get_queue(queue).get_payload("job-1"), sent), "stored different"


@HOSTILE
@given(job_id=hostile_ids)
def test_an_odd_job_id_is_stored_under_it_or_answered_400(api, job_id):
    queue = f"hostile-{uuid.uuid4().hex[:10]}"
    body = json.dumps({"id": job_id, "payload": 1})  # \u escapes: lone surrogates travel
    response = api.post(f"/jobq/queues/{queue}/jobs/", body, content_type="application/json")
    if response.status_code == 201:
        assert response.json()["id"] == job_id
        assert get_queue(queue).get_status(job_id) is not None
        return
    assert_json_client_error(response)
    assert response.status_code == 400 and "id" in response.json()
    assert get_queue(queue).counts()["queued"] == 0


def encoded(name: str) -> str:
    return quote(name, safe="", errors="surrogatepass")


@HOSTILE
@given(queue=hostile_queue_names, job_id=hostile_ids)
def test_odd_names_in_paths_answer_json_never_html_or_5xx(api, queue, job_id):
    """Queue names and job ids in URLs (percent-encoded, as a client library sends them): a
    job that does not exist is a JSON 404, a name that cannot exist too."""
    path = f"/jobq/queues/{encoded(queue)}/jobs/{encoded(job_id)}/"
    for response in (api.get(path), api.get(path + "result/"), api.post(path + "cancel/")):
        assert_json_client_error(response)
        assert response.status_code in (400, 404), response.status_code


def test_a_stored_non_finite_value_reads_back_spelled_not_as_a_500(api):
    """New values cannot hold NaN or infinities (the serde refuses them), but a job written by
    an older version, or through the storage by other means, can: every read of it still
    answers strict JSON, the non-finite floats spelled as strings."""
    queue = f"stale-{uuid.uuid4().hex[:10]}"
    q = get_queue(queue)
    stale = dataclasses.replace(q.build("stale-1", {"n": 1}), payload=b'{"n":NaN}')
    q.storage.enqueue(queue, stale)
    (claimed,) = q.storage.claim(queue, "old-worker", 1, 60_000).jobs
    q.storage.complete(queue, "stale-1", claimed.token, b'{"v":[NaN,Infinity,-Infinity,1.5]}')
    for path in ("", "result/"):
        response = api.get(f"/jobq/queues/{queue}/jobs/stale-1/{path}")
        assert response.status_code == 200, response.content[:300]
        body = json.loads(response.content, parse_constant=pytest.fail)  # strict JSON
        assert body["state"] == "completed"
    assert body["value"] == {"v": ["NaN", "Infinity", "-Infinity", 1.5]}


# -- a body that would be read as nothing (issue 36) -------------------------------------------

BODY_PATHS = (
    ("/jobq/queues/{q}/jobs/", {"id": "mine", "payload": {"x": 1}}),
    ("/jobq/queues/{q}/bulk/", {"jobs": [{"id": "mine", "payload": {"x": 1}}]}),
    ("/jobq/broadcasts/{q}/publish/", {"payload": {"x": 1}}),
)


@pytest.mark.parametrize(("path", "body"), BODY_PATHS)
def test_a_chunked_body_is_411_and_an_empty_one_400_never_a_blank_enqueue(api, path, body):
    """Django reads a body by its Content-Length: a chunked one without it was read as
    empty, and the enqueue stored a random id with a null payload (runserver and uvicorn)."""
    queue = f"hostile-{uuid.uuid4().hex[:10]}"
    url = path.format(q=queue)
    text = json.dumps(body)
    chunked = api.post(url, text, content_type="application/json", CONTENT_LENGTH="",
                       HTTP_TRANSFER_ENCODING="chunked")  # fmt: skip
    assert chunked.status_code == 411, chunked.content
    assert "Content-Length" in chunked.json()["detail"]
    empty = api.post(url, "", content_type="application/json")
    assert empty.status_code == 400 and "no body" in empty.json()["detail"], empty.content
    assert get_queue(queue).counts().get(JobState.QUEUED, 0) == 0, "refused, yet enqueued"
    assert api.post(url, text, content_type="application/json").status_code in (200, 201, 202)


def test_a_key_allowed_every_queue_cannot_create_queues_without_end(api, settings):
    """Issue 36, item 12: each queue costs every sweep and scrape a little, so the API creates
    at most ``JOBQ["API"]["MAX_QUEUES"]``; past it an enqueue to a new name is a clear 403,
    single or bulk, and queues that exist still take jobs."""
    from django_jobq.api import base as listing
    from django_jobq.api.queues import known_queues

    listing._known[:] = [0.0, frozenset()]  # this process's names, read afresh
    assert api.post("/jobq/queues/cap-0/jobs/", {"id": "a"}, format="json").status_code == 201
    limit = len(known_queues()) + 1
    settings.JOBQ = {**settings.JOBQ, "API": {**settings.JOBQ.get("API", {}),
                                              "MAX_QUEUES": limit}}  # fmt: skip
    listing._known[:] = [0.0, frozenset()]
    assert api.post("/jobq/queues/cap-1/jobs/", {"id": "a"}, format="json").status_code == 201
    refused = api.post("/jobq/queues/cap-2/jobs/", {"id": "a"}, format="json")
    assert refused.status_code == 403 and "MAX_QUEUES" in refused.json()["detail"]
    bulk = api.post("/jobq/queues/cap-3/bulk/", {"jobs": [{"id": "a"}]}, format="json")
    assert bulk.status_code == 403
    assert api.post("/jobq/queues/cap-1/jobs/", {"id": "b"}, format="json").status_code == 201
    assert api.post("/jobq/queues/cap-0/jobs/", {"id": "b"}, format="json").status_code == 201
    assert "cap-2" not in known_queues() and "cap-3" not in known_queues()
