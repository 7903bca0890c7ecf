"""PostgreSQL: the database backend's hot statements (enqueue, bulk enqueue, claim, completion)
are prepared once per connection by default (``JOBQ["DATABASE_PREPARE"] = "auto"``), whatever
Django's default ``OPTIONS["prepare_threshold"]`` of None would do, and only they are: Django's
own queries stay unprepared. A ``prepare_threshold`` the user wrote in ``OPTIONS`` (None behind a
transaction-mode PgBouncer before 1.21) is psycopg's to apply under "auto"; False prepares
nothing; True prepares whatever ``OPTIONS`` say. Each test reads ``pg_prepared_statements`` on
the connection that ran the statements (it lists the session's own)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connections

from django_jobq.backend import build_storage, check_settings
from django_jobq.errors import ConfigurationError
from django_jobq.job import EnqueueOutcome, JobOptions, NewJob
from django_jobq.models import Job
from django_jobq.storage.base import Ack
from django_jobq.storage.database import DatabaseStorage

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(databases=["pg"], transaction=True)]

UNSET = object()
LEASE = 30_000


def prepared() -> list[str]:
    """The statements prepared on this thread's connection to ``pg``."""
    with connections["pg"].cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [" ".join(row[0].split()) for row in cursor.fetchall()]


def kinds(statements: list[str]) -> set[str]:
    """Which hot statements are among ``statements``."""
    found = set()
    for s in statements:
        if s.startswith("WITH ins AS (INSERT INTO") and "VALUES" in s:
            found.add("enqueue")
        elif s.startswith("WITH ins AS (INSERT INTO") and "unnest" in s:
            found.add("bulk")
        elif s.startswith("WITH gate AS"):
            found.add("claim")
        elif s.startswith("WITH old AS") and "'completed'" in s:
            found.add("complete")
        else:
            found.add("other: " + s[:80])
    return found


@contextmanager
def pg_options(threshold: Any = UNSET) -> Iterator[None]:
    """``pg``'s OPTIONS with ``prepare_threshold`` set to ``threshold`` (UNSET: absent, as in
    Django's default), on a new connection; the old OPTIONS and a closed connection after."""
    settings_dict = connections["pg"].settings_dict
    saved = dict(settings_dict.get("OPTIONS") or {})
    options = {k: v for k, v in saved.items() if k != "prepare_threshold"}
    if threshold is not UNSET:
        options["prepare_threshold"] = threshold
    settings_dict["OPTIONS"] = options
    connections["pg"].close()  # the next query connects with these OPTIONS
    try:
        yield
    finally:
        settings_dict["OPTIONS"] = saved
        connections["pg"].close()


def job(job_id: str, waiter: bool = False) -> NewJob:
    return NewJob(job_id, b"1", JobOptions(), None, 0, "json", waiter)


def round_trip(storage: DatabaseStorage, tag: str, times: int = 3) -> None:
    """Enqueue (one and a bulk chunk), claim and complete, ``times`` over, each checked."""
    for i in range(times):
        one = storage.enqueue("prep", job(f"{tag}-one{i}"))
        assert one.outcome is EnqueueOutcome.QUEUED
        bulk = storage.enqueue_many("prep", [job(f"{tag}-b{i}-{k}") for k in range(3)])
        assert {o.outcome for o in bulk} == {EnqueueOutcome.QUEUED}
        batch = storage.claim("prep", "w1", 10, LEASE)
        assert {c.job_id for c in batch.jobs} == {f"{tag}-one{i}"} | {
            f"{tag}-b{i}-{k}" for k in range(3)
        }
        for c in batch.jobs:  # one by one: the lone completion, the request/response's
            out = storage.ack_many("prep", [Ack("complete", c.job_id, c.token, b"7")])
            assert [o.value for o in out] == ["completed"]
    for i in range(times):
        record = storage.get_record("prep", f"{tag}-one{i}")
        assert record is not None and record.state.value == "completed"
        assert record.result == b"7"


@pytest.mark.parametrize(
    ("threshold", "mode", "expect"),
    [
        (UNSET, None, True),  # the defaults: jobq prepares its own statements
        (UNSET, "auto", True),
        (UNSET, False, False),
        (None, "auto", False),  # the user chose None (an old PgBouncer): nothing
        (None, True, True),  # ... unless told to anyway
        (0, "auto", True),  # the user's threshold of 0: psycopg prepares at once
        (0, False, False),
    ],
)
def test_hot_statements_are_prepared_as_configured(threshold, mode, expect):
    with pg_options(threshold):
        storage = DatabaseStorage("pg", prepare=mode)
        try:
            round_trip(storage, "t")
            statements = kinds(prepared())
            if expect:
                assert statements == {"enqueue", "bulk", "claim", "complete"}, statements
            elif threshold == 0:  # psycopg prepares other statements of its own cursors
                assert not statements & {"enqueue", "bulk", "claim", "complete"}, statements
            else:
                assert statements == set(), statements
        finally:
            storage.close()


def test_only_jobq_statements_are_prepared_by_default():
    """The connection's threshold jobq sets prepares nothing by count: Django's queries (and
    anything else on the connection) run as often as they like unprepared."""
    with pg_options():
        storage = DatabaseStorage("pg")
        try:
            round_trip(storage, "t", times=1)
            for _ in range(20):
                assert Job.objects.using("pg").filter(queue="prep").count() == 4
                assert len(Job.objects.using("pg").filter(queue="prep", state="completed")) == 4
            assert connections["pg"].connection.prepare_threshold is not None
            assert kinds(prepared()) == {"enqueue", "bulk", "claim", "complete"}
        finally:
            storage.close()


def deallocate_all(times: int = 1) -> None:
    with connections["pg"].cursor() as cursor:
        for _ in range(times):
            cursor.execute("DEALLOCATE ALL")


def test_statements_survive_deallocate_and_reconnect():
    """The server's prepared statements dropped under psycopg's cache (``DEALLOCATE ALL`` run
    on the connection) or a new connection (the old one closed): the hot path goes on,
    preparing again. The second ``DEALLOCATE ALL`` here is one psycopg does not notice (it
    counted that text while nothing was prepared): the first statement to meet the loss runs
    again unprepared, and the cache starts afresh."""
    with pg_options():
        storage = DatabaseStorage("pg")
        try:
            round_trip(storage, "a", times=1)
            deallocate_all()  # psycopg sees this one
            assert prepared() == []
            round_trip(storage, "b", times=1)
            assert kinds(prepared()) == {"enqueue", "bulk", "claim", "complete"}
            deallocate_all(2)  # the second runs with nothing prepared: psycopg counts its text
            round_trip(storage, "c", times=1)
            deallocate_all()  # ... and so misses it now
            assert prepared() == []
            round_trip(storage, "d", times=2)  # each statement's first run: lost, run again
            assert kinds(prepared()) == {"enqueue", "bulk", "claim", "complete"}
            connections["pg"].close()
            round_trip(storage, "e", times=1)
            assert kinds(prepared()) == {"enqueue", "bulk", "claim", "complete"}
        finally:
            storage.close()


def test_a_statement_lost_inside_a_transaction_fails_that_transaction_only():
    """Inside the caller's transaction the loss aborts it (nothing can run again there): the
    enqueue raises, the transaction rolls back, and the next one prepares afresh."""
    from django.db import DatabaseError, transaction

    with pg_options():
        storage = DatabaseStorage("pg")
        try:
            round_trip(storage, "a", times=1)
            deallocate_all()
            round_trip(storage, "b", times=1)
            deallocate_all(2)
            round_trip(storage, "c", times=1)  # ``enqueue`` prepared again, psycopg unaware
            deallocate_all()  # unseen by psycopg
            with (
                pytest.raises(DatabaseError, match="does not exist"),
                transaction.atomic(using="pg"),
            ):
                storage.enqueue("prep", job("lost"))
            assert storage.get_record("prep", "lost") is None
            with transaction.atomic(using="pg"):
                assert storage.enqueue("prep", job("kept")).outcome is EnqueueOutcome.QUEUED
            assert storage.get_record("prep", "kept") is not None
        finally:
            storage.close()


def test_a_failed_transaction_leaves_the_statements_working():
    """A transaction that rolls back (psycopg empties its cache then, and deallocates)."""
    from django.db import transaction

    with pg_options():
        storage = DatabaseStorage("pg")
        try:
            round_trip(storage, "a", times=1)
            with pytest.raises(RuntimeError), transaction.atomic(using="pg"):
                storage.enqueue("prep", job("rolled-back"))
                raise RuntimeError
            assert storage.get_record("prep", "rolled-back") is None
            round_trip(storage, "b", times=1)
            assert kinds(prepared()) == {"enqueue", "bulk", "claim", "complete"}
        finally:
            storage.close()


def test_request_response_with_prepared_statements():
    """``enqueue_and_wait`` against a worker thread (its own connection): the outcome arrives,
    and both connections prepared their side's statements."""
    with pg_options():
        storage = DatabaseStorage("pg")
        seen: dict[str, Any] = {}
        stop = threading.Event()

        def worker() -> None:
            try:
                while not stop.is_set():
                    batch = storage.wait_and_claim("prep", "w1", 1, LEASE, 0.2)
                    assert batch is not None
                    for c in batch.jobs:
                        out = storage.ack_many("prep", [Ack("complete", c.job_id, c.token, b"42")])
                        assert [o.value for o in out] == ["completed"]
                seen["worker"] = kinds(prepared())
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                seen["error"] = exc
            finally:
                connections["pg"].close()

        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        try:
            for i in range(5):
                stored, outcome = storage.enqueue_and_wait("prep", job(f"rr{i}", True), 10.0)
                assert stored.outcome is EnqueueOutcome.QUEUED
                assert outcome is not None and outcome.result == b"42", outcome
            assert "enqueue" in kinds(prepared())
        finally:
            stop.set()
            thread.join(10)
            storage.close()
        assert "error" not in seen, seen.get("error")
        assert {"claim", "complete"} <= seen["worker"], seen["worker"]


PG_BACKEND = {"BACKEND": "database", "DATABASE_ALIAS": "pg"}


@pytest.mark.parametrize("value", ["yes", 1, 0, None])
def test_bad_prepare_setting_is_refused(settings, value):
    settings.JOBQ = {**settings.JOBQ, **PG_BACKEND, "DATABASE_PREPARE": value}
    problems = check_settings()
    assert any("DATABASE_PREPARE" in p for p in problems), problems
    with pytest.raises(ConfigurationError):
        build_storage()  # the storage JOBQ builds


def test_the_setting_reaches_the_storage(settings):
    settings.JOBQ = {**settings.JOBQ, **PG_BACKEND, "DATABASE_PREPARE": False}
    storage = build_storage()
    try:
        assert storage.prepare is False
    finally:
        storage.close()
    assert not [p for p in check_settings() if "DATABASE_PREPARE" in p]
