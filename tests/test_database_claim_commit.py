"""PostgreSQL: a claim's own transaction commits without waiting for the WAL flush
(``synchronous_commit`` off until it ends), the completion's and the enqueue's do not, and a
claim inside a caller's transaction leaves the caller's commit as durable as it was.

The setting lasts until its transaction ends, so each call runs inside a transaction opened by
hand (``BEGIN`` on the raw connection: Django sees no ``atomic`` block, as in a worker, where
each of these statements is its own transaction) and the setting is read before it ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections, transaction

from django_jobq.job import JobOptions, NewJob
from django_jobq.storage.base import Ack
from django_jobq.storage.database import DatabaseStorage

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(databases=["pg"], transaction=True)]
Q = "commits"


@pytest.fixture
def storage():
    s = DatabaseStorage("pg")
    yield s
    s.close()


def commit_setting() -> str:
    with connections["pg"].cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


def setting_inside(call: Callable[[], Any], *, keep: bool = True) -> tuple[Any, str]:
    """``call``'s answer and the commit setting its statements left in their transaction;
    the transaction is committed (``keep``) or rolled back afterwards."""
    conn = connections["pg"]
    conn.ensure_connection()
    assert not conn.in_atomic_block
    conn.connection.execute("BEGIN")
    try:
        out = call()
        return out, commit_setting()
    finally:
        conn.connection.execute("COMMIT" if keep else "ROLLBACK")


def enqueue(storage: DatabaseStorage, job_id: str) -> None:
    storage.enqueue(Q, NewJob(job_id, b"1", JobOptions(), waiter=True))


def test_a_claim_relaxes_only_its_own_commit_and_the_completion_stays_durable(storage):
    before = commit_setting()
    assert before != "off"  # the server's default: the durable commit
    _, after_enqueue = setting_inside(lambda: enqueue(storage, "a"))
    assert after_enqueue == before
    batch, after_claim = setting_inside(lambda: storage.claim(Q, "w1", 1, 30_000))
    assert [j.job_id for j in batch.jobs] == ["a"]
    assert after_claim == "off"
    assert commit_setting() == before  # reset when the claim's transaction ended
    job = batch.jobs[0]
    outcomes, after_complete = setting_inside(
        lambda: storage.ack_many(Q, [Ack("complete", job.job_id, job.token, b'"r"')])
    )
    assert [o.value for o in outcomes] == ["completed"]
    assert after_complete == before
    assert [e.kind for e in storage.read_events(Q)] == ["queued", "active", "completed"]


def test_an_idle_claim_relaxes_nothing_it_could_lose(storage):
    """Nothing queued: the claim writes nothing, relaxed or not; a later enqueue's
    transaction on the same connection is durable again."""
    batch, _ = setting_inside(lambda: storage.claim(Q, "w1", 1, 30_000))
    assert batch.jobs == []
    _, after_enqueue = setting_inside(lambda: enqueue(storage, "b"))
    assert after_enqueue != "off"


def test_a_claim_inside_a_callers_transaction_keeps_its_commit_durable(storage):
    enqueue(storage, "c")
    before = commit_setting()
    with transaction.atomic(using="pg"):
        batch = storage.claim(Q, "w1", 1, 30_000)
        assert [j.job_id for j in batch.jobs] == ["c"]
        assert commit_setting() == before
    record = storage.get_record(Q, "c")
    assert record is not None and record.state.value == "active"
