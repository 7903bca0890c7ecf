"""``enqueue_many`` against the in-memory backend as the reference model.

Why: on PostgreSQL ``enqueue_many`` takes a path of its own (every new id of a chunk in one
``INSERT … SELECT … FROM unnest(…) ON CONFLICT DO NOTHING``, the ids that exist or repeat
handed to the one-by-one rules afterwards), and SQLite another (``bulk_create``). Hypothesis
draws batches with repeated ids, ids that exist (waiting, completed, or completed and expired),
scheduled and LIFO jobs and per-job options, with chunks a few jobs long so that repeats fall
on both sides of a chunk boundary; every backend must then answer item for item as the model
does, store the same records, and hand the jobs out in the same order.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_jobq.job import JobOptions, NewJob
from django_jobq.storage.memory import MemoryStorage

LEASE = 60_000
IDS = [f"j{i}" for i in range(8)]  # a small pool: repeats are the point

options = st.builds(
    JobOptions,
    max_attempts=st.integers(1, 5),
    result_ttl=st.sampled_from([500, 60_000]),
    priority=st.integers(-2, 2),
    max_stalls=st.integers(0, 2),
)
new_jobs = st.builds(
    NewJob,
    job_id=st.sampled_from(IDS),
    payload=st.binary(max_size=8).map(lambda b: b'"' + b.hex().encode() + b'"'),
    options=options,
    delay=st.sampled_from([0, 0, 5_000]),
    lifo=st.booleans(),
    group=st.sampled_from([None, "g1"]),
)
# Ids that exist before the batch: "waiting", or "done" (claimed, completed: its record lives
# for its result_ttl, 500 ms or a minute, and the clock may then pass the short one).
priors = st.dictionaries(st.sampled_from(IDS), st.sampled_from(["waiting", "done"]), max_size=5)


def _record(storage, queue: str, job_id: str) -> tuple | None:
    r = storage.get_record(queue, job_id)
    if r is None:
        return None
    return (
        r.state, r.max_attempts, r.max_stalls, r.priority, r.result_ttl, r.run_at, r.lifo,
        r.group, None if r.payload is None else bytes(r.payload),
        None if r.result is None else bytes(r.result),
    )  # fmt: skip


def _prepare(storage, queue: str, prior: dict[str, str], ttl: int) -> None:
    for job_id, kind in prior.items():
        storage.enqueue(queue, NewJob(job_id, b'"prior"', JobOptions(result_ttl=ttl)))
        if kind == "done":
            (claimed,) = storage.claim(queue, "w-prior", 1, LEASE).jobs
            storage.complete(queue, claimed.job_id, claimed.token, b'"r"')


@pytest.mark.parametrize("chunk", [3, 1000])
@hsettings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(prior=priors, batch=st.lists(new_jobs, min_size=1, max_size=20),
       later=st.sampled_from([0, 1_000]))  # fmt: skip
def test_enqueue_many_answers_as_the_model(
    storage, backend, clock, monkeypatch, chunk, prior, batch, later
):
    if backend.startswith("redis"):
        # Redis ends a record by its key's TTL, in the server's time: the fake clock cannot age
        # it (what the clock drives there, due times, is still checked by the claim below).
        later = 0
    # Short-lived where the fake clock ages the records; on Redis the server's clock would, so
    # there a 500 ms record could expire mid-example on a slow machine.
    ttl = 60_000 if backend.startswith("redis") else 500
    monkeypatch.setattr("django_jobq.storage.database.enqueue.PG_BULK_CHUNK", chunk)
    monkeypatch.setattr("django_jobq.storage.database.enqueue.BULK_CHUNK", chunk)
    model = MemoryStorage(clock=clock)
    queue = f"model-{uuid.uuid4().hex[:10]}"  # a queue of this example's own on both
    for s in (model, storage):
        _prepare(s, queue, prior, ttl)
    clock.advance(later)  # 1 s: the short-lived completed records have expired

    want = model.enqueue_many(queue, batch)
    got = storage.enqueue_many(queue, batch)
    assert [(r.outcome, r.job_id, r.state, r.result) for r in got] == [
        (r.outcome, r.job_id, r.state, r.result) for r in want
    ]
    for job_id in IDS:
        assert _record(storage, queue, job_id) == _record(model, queue, job_id), job_id

    clock.advance(10_000)  # everything scheduled is due: the claim order covers every job
    assert [j.job_id for j in storage.claim(queue, "w", 100, LEASE).jobs] == [
        j.job_id for j in model.claim(queue, "w", 100, LEASE).jobs
    ]
