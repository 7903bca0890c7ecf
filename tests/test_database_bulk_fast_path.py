"""PostgreSQL ``enqueue_many``: the fast path (``storage/database/bulk.py``) sends a chunk as one
plain ``INSERT`` and falls back to the rules when an id is taken; events carry no database
constraint (migration 0023), so the deletes of job rows take the events of what they deleted
after it. These tests pin what must hold around both: a refused attempt leaves nothing and
undoes nothing of the caller's, every job is answered as the rules say, and no event outlives
its job when a delete races a writer."""

from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction

from django_jobq.job import EnqueueOutcome, JobOptions, Keep, NewJob, Retention
from django_jobq.models import Job, JobEvent
from django_jobq.states import JobState
from django_jobq.storage.database import DatabaseStorage
from django_jobq.storage.database import bulk as bulk_module

from .helpers import PATIENCE, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(databases=["pg"], transaction=True)]

Q = "bulk-fast"


@pytest.fixture
def storage():
    s = DatabaseStorage("pg")
    yield s
    s.close()


def job(job_id: str, **kwargs) -> NewJob:
    return NewJob(job_id, b'"p"', JobOptions(), **kwargs)


def events_by_job() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for job_id, kind in (
        JobEvent.objects.using("pg")
        .filter(queue=Q)
        .order_by("id")
        .values_list("job__job_id", "kind")
    ):
        out.setdefault(job_id, []).append(kind)
    return out


def orphan_events() -> int:
    with connections["pg"].cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM {JobEvent._meta.db_table} e WHERE NOT EXISTS "  # noqa: S608
            f"(SELECT 1 FROM {Job._meta.db_table} j WHERE j.id = e.job_id)"
        )
        return cursor.fetchone()[0]


def fast_attempts(monkeypatch) -> list[bool]:
    """Record, per bulk statement sent, whether it was the fast path's plain ``INSERT``."""
    sent: list[bool] = []
    real = bulk_module.BulkInsert._insert_rows

    def spy(self, queue, jobs, now, *, skip_taken, **kwargs):
        sent.append(not skip_taken)
        return real(self, queue, jobs, now, skip_taken=skip_taken, **kwargs)

    monkeypatch.setattr(bulk_module.BulkInsert, "_insert_rows", spy)
    return sent


def test_a_chunk_with_a_taken_id_is_answered_by_the_rules_and_the_refused_attempt_leaves_nothing(
    storage, monkeypatch
):
    storage.enqueue(Q, job("b"))
    sent = fast_attempts(monkeypatch)

    got = storage.enqueue_many(Q, [job("a"), job("b"), job("c")])

    assert sent == [True, False]  # refused, then the careful statement
    assert [(r.outcome, r.job_id) for r in got] == [
        (EnqueueOutcome.QUEUED, "a"), (EnqueueOutcome.DUPLICATE, "b"), (EnqueueOutcome.QUEUED, "c"),
    ]  # fmt: skip
    assert Job.objects.using("pg").filter(queue=Q).count() == 3
    assert events_by_job() == {"a": ["queued"], "b": ["queued"], "c": ["queued"]}
    claimed = storage.claim(Q, "w", 10, 60_000).jobs
    assert [j.job_id for j in claimed] == ["b", "a", "c"]


def test_a_refused_attempt_inside_the_callers_transaction_undoes_only_itself(storage):
    with transaction.atomic(using="pg"):
        storage.enqueue(Q, job("mine"))  # the caller's own write, before the bulk call
        got = storage.enqueue_many(Q, [job("new"), job("mine")])
        assert [r.outcome for r in got] == [EnqueueOutcome.QUEUED, EnqueueOutcome.DUPLICATE]

    assert sorted(Job.objects.using("pg").filter(queue=Q).values_list("job_id", flat=True)) == [
        "mine", "new",
    ]  # fmt: skip
    assert events_by_job() == {"mine": ["queued"], "new": ["queued"]}


def test_a_queue_that_met_a_taken_id_goes_the_careful_way_until_a_chunk_finds_none(
    storage, monkeypatch
):
    storage.enqueue(Q, job("taken"))
    sent = fast_attempts(monkeypatch)

    storage.enqueue_many(Q, [job("x1"), job("taken")])  # refused: careful from now on
    storage.enqueue_many(Q, [job("x2"), job("taken")])  # careful at once, an id still taken
    storage.enqueue_many(Q, [job("x3")])  # careful at once, finds none taken
    storage.enqueue_many(Q, [job("x4")])  # fast again

    assert sent == [True, False, False, False, True]
    assert sorted(events_by_job()) == ["taken", "x1", "x2", "x3", "x4"]


def test_an_expired_record_in_a_chunk_is_replaced_in_its_place(storage, clock):
    timed = DatabaseStorage("pg", clock=clock)
    try:
        timed.enqueue(Q, NewJob("old", b'"p"', JobOptions(result_ttl=500)))
        (claimed,) = timed.claim(Q, "w", 1, 60_000).jobs
        timed.complete(Q, "old", claimed.token, b'"r"')
        clock.advance(1_000)  # the record has expired: the id is free

        got = timed.enqueue_many(Q, [job("a"), job("old"), job("b")])

        assert [(r.outcome, r.job_id) for r in got] == [
            (EnqueueOutcome.QUEUED, "a"), (EnqueueOutcome.QUEUED, "old"),
            (EnqueueOutcome.QUEUED, "b"),
        ]  # fmt: skip
        assert events_by_job()["old"] == ["queued"]  # the old run's history went with it
        assert orphan_events() == 0
        assert [j.job_id for j in timed.claim(Q, "w", 10, 60_000).jobs] == ["a", "old", "b"]
    finally:
        timed.close()


def test_bulk_enqueues_of_the_same_ids_racing_store_each_once():
    ids = [f"r{i}" for i in range(200)]
    barrier = threading.Barrier(2)
    answers: list = [None, None]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        s = DatabaseStorage("pg")
        try:
            barrier.wait(PATIENCE)
            answers[i] = s.enqueue_many(Q, [job(x) for x in ids])
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        finally:
            s.close()
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PATIENCE)
    assert not errors, errors
    for k, job_id in enumerate(ids):
        outcomes = sorted(a[k].outcome.value for a in answers)
        assert outcomes == ["duplicate", "queued"], (job_id, outcomes)
    assert Job.objects.using("pg").filter(queue=Q).count() == len(ids)
    assert events_by_job() == {x: ["queued"] for x in ids}


def test_an_event_does_not_lock_its_job_row(storage):
    """The event's job has no database constraint: its check locked the job row (``FOR KEY
    SHARE``, which leaves the locker in ``xmax``) for every event written."""
    storage.enqueue_many(Q, [job(f"k{i}") for i in range(5)])
    storage.enqueue(Q, job("one"))

    with connections["pg"].cursor() as cursor:
        cursor.execute(
            f"SELECT job_id, xmax::text FROM {Job._meta.db_table} WHERE queue = %s ORDER BY id",  # noqa: S608
            [Q],
        )
        assert [(r[0], r[1]) for r in cursor.fetchall()] == [
            *((f"k{i}", "0") for i in range(5)), ("one", "0"),
        ]  # fmt: skip


def hold_with_an_event(pk: int, locked: threading.Event, release: threading.Event) -> None:
    """A transition of row ``pk`` as every writer of events does it: the row held, an event
    appended, committed once ``release`` is set."""
    try:
        with transaction.atomic(using="pg"), connections["pg"].cursor() as cursor:
            cursor.execute(f"SELECT id FROM {Job._meta.db_table} WHERE id = %s FOR UPDATE", [pk])  # noqa: S608
            cursor.execute(
                f"INSERT INTO {JobEvent._meta.db_table} (job_id, queue, kind, at, worker, "  # noqa: S608
                "stream_id) VALUES (%s, %s, 'progress', now(), '', '')",
                [pk, Q],
            )
            locked.set()
            release.wait(20)
    finally:
        connections["pg"].close()


def a_delete_waits_on_the_row() -> bool:
    with connections["pg"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()"
        )
        return cursor.fetchone()[0] > 0


def test_a_delete_racing_a_writer_of_the_rows_events_leaves_no_orphan(storage):
    storage.enqueue(Q, job("done"))
    (claimed,) = storage.claim(Q, "w", 1, 60_000).jobs
    storage.complete(Q, "done", claimed.token, b'"r"')
    pk = Job.objects.using("pg").get(queue=Q, job_id="done").pk
    locked, release, deleted = threading.Event(), threading.Event(), []
    holder = threading.Thread(target=hold_with_an_event, args=(pk, locked, release))
    holder.start()
    assert locked.wait(PATIENCE)

    def delete() -> None:
        try:
            deleted.append(storage.delete_finished(Q, ["done"]))
        finally:
            connections["pg"].close()

    deleter = threading.Thread(target=delete)
    deleter.start()
    assert wait_until(a_delete_waits_on_the_row, PATIENCE)
    release.set()
    holder.join(PATIENCE)
    deleter.join(PATIENCE)

    assert deleted == [1]
    assert not Job.objects.using("pg").filter(queue=Q).exists()
    assert orphan_events() == 0


@pytest.mark.parametrize("before", ["DedupKey", "ClaimLog", "FailureCall", "Job", "JobEvent"])
def test_obliterate_racing_an_enqueue_leaves_no_orphan_and_no_job_without_its_event(
    storage, monkeypatch, before
):
    """An enqueue that commits between any two statements of ``obliterate``: its job is
    either gone with its event or kept with it."""
    storage.enqueue_many(Q, [job("a"), job("b")])
    tables = {
        "DedupKey": "django_jobq_dedupkey", "ClaimLog": "django_jobq_claimlog",
        "FailureCall": "django_jobq_failurecall", "Job": "django_jobq_job",
        "JobEvent": "django_jobq_jobevent",
    }  # fmt: skip
    real = storage._sql
    fired: list[str] = []

    def racing(query, params, *, fetch=True):
        if not fired and query.startswith(f'DELETE FROM "{tables[before]}"'):  # noqa: S608
            fired.append(before)
            other = threading.Thread(target=enqueue_elsewhere)
            other.start()
            other.join(PATIENCE)
        return real(query, params, fetch=fetch)

    def enqueue_elsewhere() -> None:
        s = DatabaseStorage("pg")
        try:
            s.enqueue(Q, job("late"))
        finally:
            s.close()
            connections["pg"].close()

    monkeypatch.setattr(storage, "_sql", racing)
    storage.obliterate(Q)

    assert fired == [before]
    assert orphan_events() == 0
    left = list(Job.objects.using("pg").filter(queue=Q).values_list("job_id", flat=True))
    assert left in ([], ["late"])
    assert events_by_job() == {x: ["queued"] for x in left}


@pytest.fixture
def listener():
    """Another storage, its listener up: it learns of a commit only through ``NOTIFY``."""
    other = DatabaseStorage("pg")
    other._snapshot()
    assert wait_until(lambda: other._broad > 0)
    yield other
    other.close()


def test_a_chunk_outside_a_transaction_wakes_workers_elsewhere_once_per_chunk(storage, listener):
    work = listener._work
    storage.enqueue_many(Q, [job(f"n{i}") for i in range(3)])
    storage.enqueue_many(Q, [job(f"s{i}", delay=60_000) for i in range(3)])  # nothing to claim
    storage.enqueue(Q, job("marker"))  # NOTIFYs arrive in commit order: this one comes last

    assert wait_until(lambda: listener._work >= work + 2)
    assert listener._work == work + 2  # the queued chunk's and the marker's, not the scheduled
    assert [r.state for r in storage.enqueue_many(Q, [job("n0"), job("s0")])] == [
        JobState.QUEUED, JobState.SCHEDULED,
    ]  # fmt: skip


def test_retention_racing_a_retry_keeps_the_retried_row_and_its_events(clock):
    """The retention pass picks a finished row, then a retry (holding the row) queues it again
    and logs it: the pass's delete re-checks the state, so the row stays with every event."""
    timed = DatabaseStorage("pg", clock=clock)
    try:
        timed.enqueue(Q, job("r"))
        (claimed,) = timed.claim(Q, "w", 1, 60_000).jobs
        timed.complete(Q, "r", claimed.token, b'"r"')
        clock.advance(10_000)
        timed.set_retention(Q, Retention(completed=Keep(age=1_000)))
        pk = Job.objects.using("pg").get(queue=Q, job_id="r").pk
        locked, release, removed = threading.Event(), threading.Event(), []

        def retry() -> None:  # as an operator's retry does: the row held, requeued, logged
            try:
                with transaction.atomic(using="pg"), connections["pg"].cursor() as cursor:
                    cursor.execute(
                        f"UPDATE {Job._meta.db_table} SET state = 'queued', finished_at = NULL, "  # noqa: S608
                        "expires_at = NULL WHERE id = %s",
                        [pk],
                    )
                    cursor.execute(
                        f"INSERT INTO {JobEvent._meta.db_table} (job_id, queue, kind, at, "  # noqa: S608
                        "worker, stream_id) VALUES (%s, %s, 'queued', now(), '', '')",
                        [pk, Q],
                    )
                    locked.set()
                    release.wait(20)
            finally:
                connections["pg"].close()

        def retain() -> None:
            try:
                removed.append(timed.retain(Q))
            finally:
                connections["pg"].close()

        holder = threading.Thread(target=retry)
        holder.start()
        assert locked.wait(PATIENCE)
        pass_ = threading.Thread(target=retain)
        pass_.start()
        assert wait_until(a_delete_waits_on_the_row, PATIENCE)
        release.set()
        holder.join(PATIENCE)
        pass_.join(PATIENCE)

        assert removed == [0]
        assert Job.objects.using("pg").get(pk=pk).state == "queued"
        assert events_by_job()["r"] == ["queued", "active", "completed", "queued"]
        assert orphan_events() == 0
    finally:
        timed.close()
