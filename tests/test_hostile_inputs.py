"""Hostile input at the Python API, on every backend: ``Queue.enqueue`` either stores the value
and gives it back exactly, or refuses it with one of the library's validation errors and
writes nothing. Any other exception (``RecursionError``, a database ``DataError``, a
``UnicodeEncodeError``), or a value that comes back different, is a defect.

The inputs are the shared strategies of ``tests/strategies.py`` (the REST API test uses them
too).
"""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import example, given

from django_jobq.errors import InvalidJobId, InvalidQueueName, ValidationError
from django_jobq.queue import Queue
from django_jobq.validation import validate_job_id
from django_jobq.worker.execution import error_body

from .strategies import (
    built,
    hostile_ids,
    hostile_queue_names,
    hostile_settings,
    hostile_values,
    json_like,
    odd_text,
    same_json,
)

HOSTILE = hostile_settings(40)


def fresh_queue(storage) -> Queue:
    """A queue of this example's own: examples share the backend, never a job id."""
    return Queue(f"hostile-{uuid.uuid4().hex[:10]}", storage=storage)


def is_valid_id(job_id: str) -> bool:
    try:
        validate_job_id(job_id)
    except InvalidJobId:
        return False
    return True


@HOSTILE
@given(payload=hostile_values)
def test_enqueue_round_trips_a_payload_exactly_or_refuses_it_clearly(storage, payload):
    payload = built(payload)
    queue = fresh_queue(storage)
    try:
        outcome = queue.enqueue("job-1", payload)
    except ValidationError:
        assert storage.get_record(queue.name, "job-1") is None, "refused, yet half-written"
        return
    assert outcome.outcome == "queued"
    assert same_json(queue.get_payload("job-1"), payload), "accepted, but it reads back different"


@HOSTILE
@given(job_id=hostile_ids)
def test_enqueue_of_an_odd_id_is_stored_under_it_or_refused_with_invalid_job_id(storage, job_id):
    queue = fresh_queue(storage)
    if not is_valid_id(job_id):
        with pytest.raises(InvalidJobId):
            queue.enqueue(job_id, 1)
        assert storage.counts(queue.name)["queued"] == 0
        return
    assert queue.enqueue(job_id, 1).outcome == "queued"
    assert queue.get_status(job_id).job_id == job_id
    assert [j.job_id for j in storage.claim(queue.name, "w1", 5, 1000).jobs] == [job_id]


@HOSTILE
@given(name=hostile_queue_names)
def test_an_odd_queue_name_works_or_is_refused_with_invalid_queue_name(storage, name):
    try:
        queue = Queue(name, storage=storage)
    except InvalidQueueName:
        return
    name = f"{name[:50]}-{uuid.uuid4().hex[:8]}"  # this example's own queue
    queue = Queue(name, storage=storage)
    assert queue.enqueue("j", [1]).outcome == "queued"
    assert storage.claim(name, "w1", 1, 1000).jobs[0].job_id == "j"
    storage.obliterate(name, force=True)


def kept_or_replaced(stored: str, sent: str) -> bool:
    """The text as sent, or (PostgreSQL's jsonb) with NUL and lone surrogates as U+FFFD."""
    return stored in (sent, "".join("\ufffd" if c == "\x00" or 0xD800 <= ord(c) <= 0xDFFF
                                     else c for c in sent))  # fmt: skip


@HOSTILE
@given(message=odd_text(200), result=json_like)
@example(message="NUL \x00 inside", result=None)
@example(message="lone \ud800 surrogate", result=None)
def test_a_verdict_or_progress_with_odd_text_lands(storage, message, result):
    """A handler's exception message, its progress line and its result come from anywhere (a
    remote API's answer): whatever text they hold, the storage records them. A database that
    cannot store some text (PostgreSQL's jsonb takes no NUL, no lone surrogate) must not turn
    the verdict into a driver error that leaves the job running until its lease ends."""
    queue = fresh_queue(storage)
    queue.enqueue("a", 1)
    queue.enqueue("b", 1, max_attempts=1)
    claimed = {c.job_id: c for c in storage.claim(queue.name, "w1", 2, 60_000).jobs}
    progress = json.dumps({"step": message}).encode()  # what Job.set_progress sends
    assert storage.report(queue.name, "a", claimed["a"].token, progress=progress)
    stored = json.loads(bytes(storage.get_record(queue.name, "a").progress))
    assert kept_or_replaced(stored["step"], message)

    error = error_body(RuntimeError(message))  # what the worker sends
    assert storage.fail(queue.name, "b", claimed["b"].token, error).value == "failed"
    record = json.loads(bytes(storage.get_record(queue.name, "b").error))
    assert record["type"] == "builtins.RuntimeError"
    assert kept_or_replaced(record["message"], message)
    try:
        body = queue.serde.dumps(result)
    except ValidationError:
        return
    assert storage.complete(queue.name, "a", claimed["a"].token, body).value == "completed"
    assert bytes(storage.get_record(queue.name, "a").result) == body
