"""The three implementations of the state machine (memory, database, the Lua scripts) hold to
one spec (``django_jobq/states.py``): the transitions they make, the constants they share and
the error texts a user reads. Each test here failed on one backend before the spec was shared.
"""

from __future__ import annotations

import json
import re

import pytest

from django_jobq.errors import QueueBusy
from django_jobq.job import JobOptions, NewJob, QueueLimits
from django_jobq.states import (
    DELIVERY_STALLED_ERROR,
    GROUP_SCAN,
    LUA_SPEC,
    STALLED_ERROR,
    JobState,
    can_transition,
)
from django_jobq.storage.redis.scripts import LUA_DIR, SOURCES, spec_include

Q = "spec-q"
LEASE = 1_000
ERROR = b'{"type": "ValueError", "message": "boom"}'


def job(job_id: str, **kwargs) -> NewJob:
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in JobOptions.__dataclass_fields__}
    return NewJob(job_id, b"{}", JobOptions(**options), **kwargs)


def test_a_job_stalled_past_max_stalls_fails_with_the_shared_error(storage, clock):
    storage.enqueue(Q, job("s", max_stalls=0))
    assert [c.job_id for c in storage.claim(Q, "w1", 1, LEASE).jobs] == ["s"]
    clock.advance(LEASE + 1)
    assert storage.reap(Q).failed == ["s"]
    record = storage.get_record(Q, "s")
    assert record.state is JobState.FAILED
    assert json.loads(record.error) == json.loads(STALLED_ERROR)


def test_a_grouped_claim_looks_no_further_than_the_shared_bound(storage):
    """More than ``GROUP_SCAN`` jobs of a spent group ahead of another group's job: the claim
    moves the candidates it looked at to scheduled and returns nothing; the next one looks
    further and finds the other group's job. (The memory backend looked at 1,000.)"""
    storage.set_limits(Q, QueueLimits(group_rate_max=1, group_rate_window=3_600_000))
    storage.enqueue(Q, job("g-first", group="g"))
    assert [c.job_id for c in storage.claim(Q, "w1", 1, LEASE).jobs] == ["g-first"]
    behind = GROUP_SCAN + 20
    storage.enqueue_many(Q, [job(f"g-{i}", group="g") for i in range(behind)])
    storage.enqueue(Q, job("h-1", group="h"))
    assert storage.claim(Q, "w1", 1, LEASE).jobs == []
    assert storage.counts(Q)[JobState.SCHEDULED] == GROUP_SCAN + 1
    assert [c.job_id for c in storage.claim(Q, "w1", 1, LEASE).jobs] == ["h-1"]


def test_cancelling_a_running_job_and_retrying_a_finished_one_are_declared(storage):
    """Every backend makes these moves; the table of allowed transitions lacked them."""
    storage.enqueue(Q, job("c"))
    claimed = storage.claim(Q, "w1", 1, LEASE).jobs[0]
    assert storage.get_record(Q, "c").state is JobState.ACTIVE
    storage.cancel_active(Q, "c", claimed.token, ERROR)
    assert storage.get_record(Q, "c").state is JobState.CANCELLED
    assert can_transition(JobState.ACTIVE, JobState.CANCELLED)
    for state in (JobState.CANCELLED, JobState.FAILED):
        storage.retry(Q, "c")
        assert storage.get_record(Q, "c").state is JobState.QUEUED
        assert can_transition(state, JobState.QUEUED)
        claimed = storage.claim(Q, "w1", 1, LEASE).jobs[0]
        storage.fail(Q, "c", claimed.token, ERROR, permanent=True)


def test_no_script_spells_out_a_shared_text():
    """The error texts live in ``states.py``; a script gets them from the generated include."""
    for path in LUA_DIR.rglob("*.lua"):
        assert '{"type"' not in path.read_text(), path.name


def test_the_generated_include_defines_every_shared_value():
    defined = dict(re.findall(r"^local (\w+) = (.+)$", spec_include(), re.M))
    assert set(defined) == set(LUA_SPEC)
    for name, value in LUA_SPEC.items():
        literal = str(value) if isinstance(value, int) else f"[=[{value}]=]"
        assert defined[name] == literal
    assert STALLED_ERROR.decode() in SOURCES["reap"]
    assert DELIVERY_STALLED_ERROR.decode() in spec_include()


def test_every_backend_refuses_with_the_same_words(storage):
    """Refusals a user reads: obliterating a queue with running jobs, asking a broadcast about
    a group it does not have (each backend wrote its own text)."""
    storage.enqueue(Q, job("busy"))
    storage.claim(Q, "w1", 1, LEASE)
    with pytest.raises(QueueBusy) as busy:
        storage.obliterate(Q)
    assert str(busy.value) == f"queue {Q!r} has active jobs; pass force=True to obliterate it"
    store = storage.broadcasts()
    with pytest.raises(LookupError) as unknown:
        store.claim("spec-bc", "nobody", "c1", 1, LEASE, 3)
    assert str(unknown.value) == "broadcast 'spec-bc' has no group 'nobody'"
