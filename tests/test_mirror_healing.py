"""The mirror heals itself and tells the truth: a job the database refuses is set aside
without holding back the others, gaps found while running are resynced in creation order,
the lag is measured on what is not written yet, and the reconciliation check repairs rows
that differ from Redis. Real Redis; rows in SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from django_jobq.job import JobOptions, NewJob
from django_jobq.mirror import Mirror
from django_jobq.mirror.check import check, lag
from django_jobq.mirror.core import GROUP
from django_jobq.models import Job, JobEvent, MirrorReject
from django_jobq.queue import Queue
from django_jobq.storage.redis.storage import RedisStorage

from .helpers import health_as_reader

pytestmark = pytest.mark.redis
Q = "heal-q"


@pytest.fixture(params=["default", "pg"])
def db_alias(request):
    return request.param


@pytest.fixture
def storage(redis_client, redis_prefix) -> RedisStorage:
    return RedisStorage(redis_client, prefix=redis_prefix)


@pytest.fixture
def mirror(storage, db_alias) -> Mirror:
    m = Mirror(storage, queues=[Q], using=db_alias, consumer="m1")
    m.queues()  # group created before any event
    return m


def enqueue(storage, *ids):
    storage.enqueue_many(Q, [NewJob(i, b"{}", JobOptions()) for i in ids])


def rows(alias):
    return dict(Job.objects.using(alias).filter(queue=Q).values_list("job_id", "state"))


def test_a_job_the_database_refuses_is_set_aside_and_the_others_are_mirrored(
    storage, mirror, db_alias
):
    enqueue(storage, "a", "bad", "c")
    # An old or hostile writer: a non-finite float stored as progress, announced by an event.
    storage.client.hset(storage.keys(Q).job("bad"), "progress", "Infinity")
    storage.client.xadd(storage.keys(Q).events, {"job": "bad", "kind": "progress", "at": "1"})
    mirror.drain()
    assert rows(db_alias) == {"a": "queued", "c": "queued"}
    reject = MirrorReject.objects.using(db_alias).get(queue=Q, job_id="bad")
    assert reject.events == 2 and reject.error  # its two entries, and what the database said
    assert mirror.rejected == 1
    assert storage.group_backlog(Q, GROUP) == (0, None)  # acknowledged: nothing is wedged

    enqueue(storage, "d")  # later batches keep flowing
    mirror.drain()
    assert rows(db_alias)["d"] == "queued"


@pytest.mark.parametrize(("field", "column", "value"), [
    ("attempts", "attempts", 2**32 + 5),  # a 4-byte column: a binary copy would keep 5
    ("result_ttl", "result_ttl", 2**63),  # past even 8 bytes
])  # fmt: skip
def test_a_number_too_big_for_its_column_is_refused_never_stored_wrapped(
    storage, mirror, db_alias, field, column, value
):
    enqueue(storage, "a", "big")
    storage.client.hset(storage.keys(Q).job("big"), field, str(value))
    mirror.drain()
    assert rows(db_alias)["a"] == "queued"
    big = Job.objects.using(db_alias).filter(queue=Q, job_id="big")
    stored = list(big.values_list(column, flat=True))
    # Refused (set aside), or kept exactly where the column holds it (SQLite's integers are
    # 8 bytes): never another number.
    assert stored in ([], [value])
    if not stored:
        assert MirrorReject.objects.using(db_alias).filter(queue=Q, job_id="big").exists()
    assert storage.group_backlog(Q, GROUP) == (0, None)


def test_rows_of_several_queues_in_one_transaction_are_each_written_once(
    redis_client, redis_prefix, db_alias
):
    storage = RedisStorage(redis_client, prefix=redis_prefix)
    other = f"{Q}-2"
    mirror = Mirror(storage, queues=[Q, other], using=db_alias, consumer="m1")
    mirror.queues()
    enqueue(storage, "a", "b")
    storage.enqueue_many(other, [NewJob(i, b"{}", JobOptions()) for i in ("c", "d")])
    mirror.drain()
    got = dict(Job.objects.using(db_alias).filter(queue__in=[Q, other])
               .values_list("job_id", "queue"))  # fmt: skip
    assert got == {"a": Q, "b": Q, "c": other, "d": other}
    assert JobEvent.objects.using(db_alias).filter(queue__in=[Q, other]).count() == 4


def test_malformed_stream_entries_do_not_stop_the_mirror(storage, mirror, db_alias):
    enqueue(storage, "a")
    events = storage.keys(Q).events
    storage.client.xadd(events, {"junk": "no job named"})
    storage.client.xadd(events, {"job": "a", "kind": "progress", "at": "not-a-number"})
    storage.client.xadd(events, {"job": "x" * 500, "kind": "queued", "at": "1"})
    enqueue(storage, "b")
    mirror.drain()
    assert rows(db_alias) == {"a": "queued", "b": "queued"}
    assert MirrorReject.objects.using(db_alias).filter(queue=Q, job_id="").exists()
    assert storage.group_backlog(Q, GROUP) == (0, None)


def test_trimmed_entries_are_healed_while_running_in_creation_order(
    redis_client, redis_prefix, db_alias
):
    storage = RedisStorage(redis_client, prefix=redis_prefix, events_maxlen=10)
    mirror = Mirror(storage, queues=[Q], using=db_alias, consumer="m1", gap_check_interval=0)
    mirror.queues()  # running: joined while the stream was empty
    enqueue(storage, *[f"j{i:03}" for i in range(300)])
    assert storage.events_lost(Q, GROUP)
    mirror.run_once()  # the running loop finds the gap, not a restart
    assert mirror.resyncs == 1
    mirror.drain()
    assert set(rows(db_alias).values()) == {"queued"} and len(rows(db_alias)) == 300
    by_pk = list(Job.objects.using(db_alias).filter(queue=Q).order_by("pk")
                 .values_list("job_id", flat=True))  # fmt: skip
    assert by_pk == sorted(by_pk)  # created in this order, listed in this order
    assert not storage.events_lost(Q, GROUP)  # healed: not resynced again on every check
    mirror.check_gaps()
    assert mirror.resyncs == 1


def test_entries_trimmed_just_ahead_of_the_read_are_a_gap_after_it_skipped_them(
    storage, mirror, db_alias
):
    """XREADGROUP skips entries the cap trimmed unread and counts only what it delivers: once
    the group read past them, "more trimmed than read" no longer shows the gap, while
    Redis's lag keeps counting them. Reported as lost (and healed), never as a backlog that
    the mirror would wait on for good."""
    enqueue(storage, *[f"a{i}" for i in range(5)])
    mirror.drain()
    key = storage.keys(Q).events
    enqueue(storage, *[f"b{i:02}" for i in range(20)])
    storage.client.xtrim(key, maxlen=10, approximate=False)  # b00-b09 gone unread
    assert storage.events_lost(Q, GROUP)
    # The read the check did not come before: the group's place passes the gap.
    storage.read_group([Q], GROUP, "m1", count=100)
    info = {_s(g["name"]): g for g in storage.client.xinfo_groups(key)}[GROUP]
    assert info["lag"] == 10 and info["pending"] == 10  # Redis counts the skipped ten
    assert storage.events_lost(Q, GROUP)
    assert storage.group_backlog(Q, GROUP)[0] == 10  # delivered, not acknowledged
    assert mirror.check_gaps() == [Q]  # what the running loop does on its interval
    mirror.drain()
    assert sorted(rows(db_alias)) == sorted([f"a{i}" for i in range(5)] +
                                            [f"b{i:02}" for i in range(20)])  # fmt: skip
    assert not storage.events_lost(Q, GROUP)
    assert storage.group_backlog(Q, GROUP) == (0, None)


def test_a_drain_heals_a_trimmed_stream_before_it_returns(redis_client, redis_prefix, db_alias):
    """``drain`` (``runmirror --once``) checks for a gap itself: a running mirror's check
    every ``gap_check_interval`` seconds is not due yet, and the rows must still be exact."""
    storage = RedisStorage(redis_client, prefix=redis_prefix, events_maxlen=10)
    mirror = Mirror(storage, queues=[Q], using=db_alias, consumer="m1")  # interval: 5 s
    mirror.queues()
    enqueue(storage, *[f"j{i:03}" for i in range(300)])
    assert storage.events_lost(Q, GROUP)
    mirror.drain()
    assert mirror.resyncs == 1
    assert len(rows(db_alias)) == 300 and set(rows(db_alias).values()) == {"queued"}
    assert not storage.events_lost(Q, GROUP)


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def test_a_lost_stream_is_noticed_while_running(storage, mirror, db_alias):
    enqueue(storage, "a")
    mirror.drain()
    storage.client.delete(storage.keys(Q).events)  # flushed, group and all
    enqueue(storage, "b")
    assert mirror.check_gaps() == [Q]
    mirror.drain()
    assert rows(db_alias) == {"a": "queued", "b": "queued"}


def test_a_batch_that_fails_in_the_middle_is_read_again(storage, mirror, db_alias, monkeypatch):
    enqueue(storage, "a", "b")
    original = mirror._store

    def crash(*args, **kwargs):
        original(*args, **kwargs)
        raise ConnectionError("killed mid-batch")  # after the writes, before the commit

    monkeypatch.setattr(mirror, "_store", crash)
    with pytest.raises(ConnectionError):
        mirror.run_once()
    monkeypatch.undo()
    assert rows(db_alias) == {}  # rolled back, not acknowledged
    assert storage.group_backlog(Q, GROUP)[0] == 2
    restarted = Mirror(storage, queues=[Q], using=db_alias, consumer="m1")
    restarted.drain()
    assert rows(db_alias) == {"a": "queued", "b": "queued"}


def test_lag_is_the_age_of_the_oldest_event_not_written(storage, mirror, db_alias, settings):
    settings.JOBQ = {**settings.JOBQ, "MIRROR": {"ENABLED": True}}
    assert lag(storage, [Q]) == (0.0, 0)
    enqueue(storage, "a", "b")
    age, backlog = lag(storage, [Q])
    assert backlog == 2 and age > 0  # behind, even within the millisecond of the event
    # Delivered but not written (a batch in flight, or failing): still behind.
    storage.read_group([Q], GROUP, "m1", count=10)
    assert lag(storage, [Q])[1] == 2
    Mirror(storage, queues=[Q], using=db_alias, consumer="m1").drain()  # m1, restarted
    assert lag(storage, [Q]) == (0.0, 0)


def test_the_check_repairs_rows_that_differ_from_redis(storage, mirror, db_alias):
    enqueue(storage, "a", "b", "c")
    mirror.drain()
    Job.objects.using(db_alias).filter(job_id="b").update(state="completed")
    Job.objects.using(db_alias).filter(job_id="c").delete()
    [report] = check(mirror, [Q], repair=False)
    assert not report.consistent
    assert report.redis_counts["queued"] == 3 and report.row_counts["queued"] == 1
    [report] = check(mirror, [Q])
    assert report.repaired == 3
    assert rows(db_alias) == {"a": "queued", "b": "queued", "c": "queued"}
    assert check(mirror, [Q])[0].consistent


def test_jobq_mirror_check_command(storage, db_alias, settings, capsys):
    settings.JOBQ = {
        "BACKEND": "redis", "REDIS_URL": settings.REDIS_URL, "PREFIX": storage.prefix,
        "MIRROR": {"DATABASE_ALIAS": db_alias},
    }  # fmt: skip
    Mirror(queues=[Q], using=db_alias).queues()
    enqueue(storage, "a")
    Mirror(queues=[Q], using=db_alias).drain()
    call_command("jobq_mirror_check", Q)
    assert "consistent" in capsys.readouterr().out
    Job.objects.using(db_alias).filter(job_id="a").delete()
    with pytest.raises(SystemExit):
        call_command("jobq_mirror_check", Q)
    assert "repaired" in capsys.readouterr().out
    assert rows(db_alias) == {"a": "queued"}


# -- SQLite: the project's own writes while the mirror writes -----------------------------------


@pytest.mark.parametrize("db_alias", ["default"])
def test_a_user_write_is_not_refused_while_the_mirror_writes(storage, db_alias, monkeypatch):
    """With immediate transactions (what the system check asks for), a read-then-write
    transaction of the project waits for the mirror's short ones instead of failing."""
    import threading

    from django.db import connections

    from django_jobq.models import Schedule

    options = connections["default"].settings_dict["OPTIONS"]
    monkeypatch.setitem(options, "transaction_mode", "IMMEDIATE")  # new connections only
    mirror = Mirror(storage, queues=[Q], using="default", consumer="m1", block=0.05)
    mirror.queues()
    thread = mirror.start()
    errors: list[Exception] = []
    writes = [0]

    def user() -> None:
        try:
            for i in range(150):
                Schedule.objects.update_or_create(name="nightly", defaults={"interval": i + 1})
                writes[0] += 1
        except Exception as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    writer = threading.Thread(target=user)
    writer.start()
    n = 0
    while writer.is_alive():  # the mirror keeps committing meanwhile
        enqueue(storage, *[f"j{n + i}" for i in range(100)])
        n += 100
    mirror.stop()
    thread.join(30)
    assert errors == [] and writes[0] == 150
    assert mirror.lag.written > 0  # the mirror did write while the user did


def test_the_system_check_warns_of_sqlite_without_immediate_transactions(settings):
    from django_jobq.checks import mirror_sqlite_check

    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "MIRROR": {"ENABLED": True}}
    [warning] = mirror_sqlite_check(None)
    assert warning.id == "django_jobq.W001"
    settings.DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"
    try:
        assert mirror_sqlite_check(None) == []
    finally:
        del settings.DATABASES["default"]["OPTIONS"]["transaction_mode"]


def test_the_reaper_runs_the_check_on_its_interval(storage, db_alias, settings):
    from django_jobq.worker.reaper import Reaper

    settings.JOBQ = {**settings.JOBQ, "MIRROR": {"ENABLED": True, "DATABASE_ALIAS": db_alias}}
    reaper = Reaper([Q], storage=storage, schedules=False)
    assert reaper.mirror_check_interval == 600.0
    enqueue(storage, "a")
    reaper.mirror.drain()
    Job.objects.using(db_alias).filter(job_id="a").delete()
    reaper.check_mirror()
    assert rows(db_alias) == {"a": "queued"}


def test_the_reaper_starts_a_mirror_thread_that_stopped_again(storage, db_alias, settings):
    import threading

    from django_jobq.worker.reaper import Reaper

    from .helpers import wait_until

    settings.JOBQ = {**settings.JOBQ, "MIRROR": {"ENABLED": True, "DATABASE_ALIAS": db_alias}}
    reaper = Reaper([Q], storage=storage, schedules=False, interval=0.05)
    real_run, runs = reaper.mirror.run, []

    def run() -> None:
        runs.append(1)
        if len(runs) == 1:  # the first thread dies at once, as an escaped error would end it
            raise SystemExit
        real_run()

    reaper.mirror.run = run
    storage.ensure_group(Q, GROUP)  # the mirror's place kept from the first event on
    thread = threading.Thread(target=reaper.run, daemon=True)
    thread.start()
    try:
        enqueue(storage, "a")  # mirrored only by a thread started after the first died
        assert wait_until(lambda: rows(db_alias) == {"a": "queued"}, timeout=60)
        assert len(runs) == 2
    finally:
        reaper.stop()
        thread.join(30)
    assert not thread.is_alive()


# -- the mirror does not shorten the public feed ------------------------------------------------


def test_a_running_mirror_leaves_the_feed_whole_for_a_reader_behind_it(storage, mirror, db_alias):
    """Issue 36: the mirror trimmed the stream to what it had acknowledged, so a feed reader
    resuming behind it got 100 of 990 events and no error. The stream is bounded by
    ``EVENTS_MAXLEN`` only."""
    enqueue(storage, *[f"j{i:04}" for i in range(1000)])
    first = storage.read_events(Q, "0", count=10)
    mirror.drain()
    assert len(rows(db_alias)) == 1000
    rest = [e.job_id for e in Queue(Q, storage=storage).events(since=first[-1].id)]
    assert rest == [f"j{i:04}" for i in range(10, 1000)]


def test_a_gap_is_said_in_health_and_the_admin_banner(
    redis_client, redis_prefix, db_alias, settings
):

    from django_jobq.admin.common import mirror_banner
    from django_jobq.mirror.check import recent_gaps

    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "REDIS_URL": settings.REDIS_URL,
                     "PREFIX": redis_prefix,
                     "MIRROR": {"ENABLED": True, "DATABASE_ALIAS": db_alias}}  # fmt: skip
    storage = RedisStorage(redis_client, prefix=redis_prefix, events_maxlen=10)
    storage.register_queue(Q)  # as the Queue API does: health lists the queues it knows
    mirror = Mirror(storage, queues=[Q], using=db_alias, consumer="m1", gap_check_interval=0)
    mirror.queues()
    assert recent_gaps(storage) == []
    assert health_as_reader()["mirror_gaps"] == []
    enqueue(storage, *[f"j{i:03}" for i in range(300)])  # far past the cap: a gap
    mirror.run_once()
    [gap] = recent_gaps(storage)
    assert (gap["queue"], gap["rows"]) == (Q, 300) and "trimmed" in gap["why"]
    [said] = health_as_reader()["mirror_gaps"]
    assert (said["queue"], said["rows"]) == (Q, 300)
    # Healed: the rows are current again, so no page warns any more (health still says it).
    assert mirror_banner() is None and mirror_banner([Q]) is None
    assert recent_gaps(storage, within=0) == []  # reported for a while, not forever


def test_a_queue_being_re_read_warns_on_its_own_pages_until_the_re_read_ends(
    redis_client, redis_prefix, db_alias, settings
):
    """Issue 37, defect 7: after a retry storm trimmed one queue's stream, the healed mirror
    warned on every job page of every queue for an hour. The warning is for the pages of the
    queue being re-read, while it is (the rows may be stale), and nowhere else."""
    from django_jobq.admin.common import mirror_banner

    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "REDIS_URL": settings.REDIS_URL,
                     "PREFIX": redis_prefix,
                     "MIRROR": {"ENABLED": True, "DATABASE_ALIAS": db_alias}}  # fmt: skip
    storage = RedisStorage(redis_client, prefix=redis_prefix, events_maxlen=10)
    other = f"{Q}-other"
    for name in (Q, other):
        storage.register_queue(name)
    mirror = Mirror(storage, queues=[Q, other], using=db_alias, consumer="m1",
                    gap_check_interval=0)  # fmt: skip
    mirror.queues()
    enqueue(storage, *[f"j{i:03}" for i in range(300)])  # far past the cap: a gap on Q
    seen: dict[str, str | None] = {}
    resync = mirror.resync

    def watched(queue, **kwargs):  # what the pages say while the re-read runs
        seen.update(own=mirror_banner([queue]), other=mirror_banner([other]),
                    every=mirror_banner())  # fmt: skip
        return resync(queue, **kwargs)

    mirror.resync = watched  # type: ignore[method-assign]
    mirror.run_once()
    assert seen["own"] is not None and f"re-reading {Q}" in seen["own"]
    assert seen["every"] is not None and Q in seen["every"]  # the overview, the whole list
    assert seen["other"] is None
    assert mirror_banner([Q]) is None  # the re-read ended: the rows are current


def test_two_mirrors_at_once_never_write_an_older_record_over_a_newer_one(
    storage, mirror, db_alias, monkeypatch
):
    """Issue 36, item 14: a reaper's mirror and a ``runmirror`` share the group, so a job's
    events are split between them. The one that read ``active`` reads the record, stalls;
    the other reads ``completed`` and writes it; the first then writes its active record.
    The row keeps the newer record (``Job.mirror_seq``), not stuck ``active`` for good."""
    other = Mirror(storage, queues=[Q], using=db_alias, consumer="m2")
    other.queues()
    enqueue(storage, "x")
    mirror.drain()
    job = storage.claim(Q, "w", 1, 30_000).jobs[0]
    # m1 reads the active event and the record as it is then...
    events = storage.read_group([Q], GROUP, "m1", count=10)
    assert [e.kind for e in events] == ["active"]
    stale = storage.get_records(Q, ["x"])
    storage.complete(Q, "x", job.token, b"1")
    other.drain()  # ...m2 writes the completion...
    assert rows(db_alias) == {"x": "completed"}
    monkeypatch.setattr(storage, "get_records", lambda queue, ids: stale)
    mirror._apply(events)  # ...and m1's older record arrives last
    assert rows(db_alias) == {"x": "completed"}
    monkeypatch.undo()
    enqueue(storage, "y")  # later writes still go through
    mirror.drain()
    assert rows(db_alias) == {"x": "completed", "y": "queued"}


@pytest.mark.parametrize("how", ["purge_dead", "clean", "delete"])
def test_records_deleted_by_hand_leave_the_rows_too(storage, mirror, db_alias, settings, how):
    """Issue 37, defect 2: purged dead letters stayed "failed" in the admin (no event tells
    the mirror a record was deleted), offering Retry on a job the API no longer knew."""
    settings.JOBQ = {**settings.JOBQ, "MIRROR": {"ENABLED": True, "DATABASE_ALIAS": db_alias}}
    q = Queue(Q, storage=storage)
    q.enqueue_many([{"id": i, "payload": 1, "max_attempts": 1} for i in ("dead", "kept")])
    for job in storage.claim(Q, "w", 2, 30_000).jobs:
        storage.fail(Q, job.job_id, job.token, b'{"type": "E", "message": "m"}', permanent=True)
    mirror.drain()
    assert rows(db_alias) == {"dead": "failed", "kept": "failed"}
    if how == "purge_dead":
        assert q.purge_dead(["dead"]) == 1
    elif how == "clean":
        assert q.clean(0, states=["failed"]) == 2
        assert rows(db_alias) == {}
        return
    else:
        assert q.delete(["dead"]) == 1
    assert q.get_status("dead") is None
    assert rows(db_alias) == {"kept": "failed"}
