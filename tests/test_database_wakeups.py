"""PostgreSQL wake-ups on the request/response path (issue 25, goal 5): a completion's
``NOTIFY`` carries a small result, so its waiter answers without reading the row, and a
worker's wait ends only on signals that can make a job claimable, not on every completion.
Decided on events (``wait_until``, joined threads), never on sleeps."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from django_jobq.job import AckOutcome, JobOptions, NewJob
from django_jobq.states import JobState
from django_jobq.storage.base import Ack
from django_jobq.storage.database import DatabaseStorage

from .helpers import PATIENCE, listen_session_open, up_listener, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(databases=["pg"], transaction=True)]

Q = "wake"
LEASE = 5_000


@pytest.fixture
def storage():
    """With its listener up and its connect signal (which sends every waiter to read its
    row, as after a reconnect) already handled, so the reads counted are the waiter's own."""
    db_storage = DatabaseStorage("pg")
    db_storage._snapshot()
    assert wait_until(lambda: db_storage._broad > 0)
    yield db_storage
    db_storage.close()


def waiting_job(job_id: str) -> NewJob:
    return NewJob(job_id, b'{"n": 1}', JobOptions(), None, 0, "json", True)


def wait_in_thread(storage: DatabaseStorage, job_id: str) -> tuple[threading.Thread, dict]:
    """``enqueue_and_wait`` in a thread that records the Django queries it made (the enqueue
    itself binds on the server through psycopg, so only reads show up)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            with CaptureQueriesContext(connections["pg"]) as ctx:
                out["value"] = storage.enqueue_and_wait(Q, waiting_job(job_id), PATIENCE)
            out["queries"] = [q["sql"] for q in ctx.captured_queries]
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc
        finally:
            connections["pg"].close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def complete_when_registered(storage: DatabaseStorage, job_id: str, result: bytes) -> None:
    """Claim the job once enqueued and complete it as a worker does (``ack_many``)."""
    assert wait_until(lambda: storage.get_record(Q, job_id) is not None)
    claimed = storage.claim(Q, "w1", 1, LEASE).jobs[0]
    assert storage.ack_many(Q, [Ack("complete", job_id, claimed.token, result)]) == [
        AckOutcome.COMPLETED
    ]


def test_a_waiter_answered_by_the_completion_signal_reads_no_row(storage):
    thread, out = wait_in_thread(storage, "j1")
    complete_when_registered(storage, "j1", b'{"ok": 1}')
    thread.join(PATIENCE)
    _, outcome = out["value"]
    assert outcome.state is JobState.COMPLETED and outcome.result == b'{"ok": 1}'
    assert out["queries"] == []


def test_a_result_too_large_for_the_signal_is_read_from_the_row(storage):
    big = b'"' + b"x" * 20_000 + b'"'
    thread, out = wait_in_thread(storage, "j1")
    complete_when_registered(storage, "j1", big)
    thread.join(PATIENCE)
    _, outcome = out["value"]
    assert outcome.state is JobState.COMPLETED and outcome.result == big
    assert len(out["queries"]) == 1 and "django_jobq_job" in out["queries"][0]


def test_a_carried_result_of_an_expired_record_is_not_an_answer(storage):
    """A result kept no longer than it took to arrive (``result_ttl`` 0) is gone for a
    reader; the carried copy must not outlive it either: the waiter reads the row instead."""
    job = NewJob("j1", b'{"n": 1}', JobOptions(result_ttl=0), None, 0, "json", True)
    storage.enqueue(Q, job)
    pk = storage.Job.objects.using("pg").get(queue=Q, job_id="j1").pk
    with storage._watch((Q, "j1")):
        storage._wake_local(f"d {Q} j1 {pk} {storage._now()} eyJvayI6IDF9")
        assert storage._carried_outcome((Q, "j1"), pk) is None
        storage._wake_local(f"d {Q} j1 {pk} {storage._now() + 60_000} eyJvayI6IDF9")
        assert storage._carried_outcome((Q, "j1"), pk).result == b'{"ok": 1}'
        assert storage._carried_outcome((Q, "j1"), pk + 1) is None  # another run of the id


def test_a_completion_signal_does_not_wake_a_waiting_worker(storage):
    """Only signals that can make work claimable (``w``, a reconnected listener) count for
    workers; a job's end (``d``) counts for its outcome waiters and event readers alone."""
    # (The counters themselves: nothing but this test sends a signal meanwhile.)
    work, every = storage._work, storage._generation
    storage._wake_local(f"d {Q} j1 7 1 eyJvayI6IDF9")
    storage._wake_local(f"d {Q}")
    assert storage._work == work and storage._generation == every + 2
    storage._wake_local(f"w {Q}")
    assert storage._work == work + 1


def test_a_worker_that_took_a_full_batch_claims_again_without_a_new_signal(storage):
    """A full batch may have left jobs behind: the next wait ends at once and claims them,
    without waiting for a signal that was already spent."""
    for job_id in ("a", "b"):
        storage.enqueue(Q, NewJob(job_id, b"1", JobOptions()))
    first = storage.wait_and_claim(Q, "w1", 1, LEASE, PATIENCE)
    assert [j.job_id for j in first.jobs] == ["a"]
    with storage._cond:
        assert storage._claim_seen["w1"] == -1  # the re-armed wait: no count matches
    second = storage.wait_and_claim(Q, "w1", 1, LEASE, PATIENCE)
    assert [j.job_id for j in second.jobs] == ["b"]


def test_close_returns_with_the_listen_connection_closed():
    # Arrange: a storage whose LISTEN connection is up (other tests' storages may have theirs
    # too: this one is told apart by its server process).
    db_storage = DatabaseStorage("pg")
    listener = up_listener(db_storage)
    pid = listener.backend_pid
    assert listen_session_open(pid)
    # Act
    db_storage.close()
    # Assert: the listener thread, which closes its connection on its way out, is gone when
    # close() returns; its server process then leaves (the server ends it after the client
    # hung up, on its own schedule: CI saw it still listed right after; DROP DATABASE waits
    # up to 5 s for such a session). Without the join the thread was still running here.
    assert not listener.is_alive()
    assert wait_until(lambda: not listen_session_open(pid))
