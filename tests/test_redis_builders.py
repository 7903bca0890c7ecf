"""The Redis backend builds the records and events it decodes in bulk by position
(``storage/redis/builders.py``): each must be the very object the class's constructor makes."""

from __future__ import annotations

import dataclasses

import pytest

from django_jobq.job import Event, JobRecord
from django_jobq.states import JobState
from django_jobq.storage.redis.builders import positional_builder
from django_jobq.storage.redis.storage import RECORD_FIELDS, _record_values


def test_a_built_record_equals_the_constructed_one_field_by_field():
    values = ("q", "j1", JobState.COMPLETED, 1, 3, 0, 1, 5, 100, None, 110, 120, "w1", 60, "json",
              b"[1]", b"2", None, 900, False, "g", "d", 1000, 3_600_000, True, b"0.5",
              ((1, "line"),))  # fmt: skip
    built = positional_builder(JobRecord)(*values)
    assert built == JobRecord(*values)
    assert dataclasses.astuple(built) == values


def test_a_built_event_stays_frozen():
    record = positional_builder(Event)("1-0", "q", "j1", "queued", 5, None, None, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.kind = "active"  # type: ignore[misc]


def test_a_class_that_is_not_a_frozen_slotted_dataclass_is_refused():
    @dataclasses.dataclass(slots=True)
    class Loose:
        a: int

    with pytest.raises(TypeError):
        positional_builder(Loose)


def test_record_values_read_numbers_and_absent_fields_as_before():
    values = dict.fromkeys(RECORD_FIELDS)
    values.update(
        state=b"active", attempts=b"2", created=b"1700000000000", run_at=b"", worker=b"w",
        ctype=None, payload=b"{}", lifo=b"1", logs=b'[[5, "x"]]',
    )  # fmt: skip
    record = _record_values("q", "j", [values[name] for name in RECORD_FIELDS], 1500, 1000)
    assert record == JobRecord(
        queue="q", job_id="j", state=JobState.ACTIVE, attempts=2, max_attempts=0, stalls=0,
        max_stalls=0, priority=0, created_at=1_700_000_000_000, run_at=None, started_at=None,
        finished_at=None, worker="w", result_ttl=0, content_type="json", payload=b"{}",
        result=None, error=None, expires_at=2500, lifo=True, logs=((5, "x"),),
    )  # fmt: skip
    assert _record_values("q", "gone", [None] * len(RECORD_FIELDS), -2, 1000) is None
