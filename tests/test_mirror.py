"""The model mirror on the real Redis, writing to SQLite and PostgreSQL.

What matters to an operator: rows match Redis after a batch, nothing is missed or doubled when
the mirror crashes between writing and acknowledging, a dead mirror's events are taken over, a
trimmed stream is healed by a resync, and retention deletes only what it should.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.core.management import call_command

from django_jobq.job import JobOptions, NewJob
from django_jobq.mirror import Mirror
from django_jobq.mirror.core import purge_finished
from django_jobq.models import Job, JobEvent, WorkerInfo
from django_jobq.storage.redis.storage import RedisStorage

pytestmark = pytest.mark.redis
Q = "mirror-q"


@pytest.fixture(params=["default", "pg"])
def db_alias(request):
    """The database the mirror writes to (conftest gives the test that database)."""
    return request.param


@pytest.fixture
def alias(db_alias):
    return db_alias


@pytest.fixture
def redis_storage(redis_client, redis_prefix) -> RedisStorage:
    return RedisStorage(redis_client, prefix=redis_prefix)


@pytest.fixture
def mirror(redis_storage, alias) -> Mirror:
    return Mirror(redis_storage, queues=[Q], using=alias, consumer="m1")


def enqueue(storage, job_id, **options):
    return storage.enqueue(Q, NewJob(job_id, b'{"n": 1}', JobOptions(**options)))


def run_one(storage, result=b'"ok"'):
    batch = storage.claim(Q, "worker-1", 1, 30_000)
    job = batch.jobs[0]
    storage.complete(Q, job.job_id, job.token, result)
    return job


def test_rows_follow_every_transition(redis_storage, mirror, alias):
    mirror.queues()  # group created before any event: everything from here on is mirrored
    enqueue(redis_storage, "a")
    enqueue(redis_storage, "b", max_attempts=1)
    mirror.drain()
    rows = {j.job_id: j for j in Job.objects.using(alias).all()}
    assert {k: r.state for k, r in rows.items()} == {"a": "queued", "b": "queued"}
    assert bytes(rows["a"].payload) == b'{"n": 1}'
    assert rows["a"].handler == ""  # no handler registered for this queue in this process

    run_one(redis_storage, b'{"done": true}')
    job = redis_storage.claim(Q, "worker-1", 1, 30_000).jobs[0]
    redis_storage.fail(Q, job.job_id, job.token, b'{"type": "ValueError", "message": "x"}')
    assert mirror.drain() == 4

    a = Job.objects.using(alias).get(queue=Q, job_id="a")
    b = Job.objects.using(alias).get(queue=Q, job_id="b")
    assert (a.state, bytes(a.result), a.attempts, a.worker) == (
        "completed", b'{"done": true}', 1, "worker-1",
    )  # fmt: skip
    assert a.finished_at is not None and a.expires_at is not None
    assert (b.state, b.error["type"]) == ("failed", "ValueError")
    kinds = list(JobEvent.objects.using(alias).filter(job=a).values_list("kind", flat=True))
    assert kinds == ["queued", "active", "completed"]
    assert mirror.lag.written == 6 and mirror.lag.percentile(50) is not None


def test_a_retried_dead_letter_is_mirrored_back_to_queued(redis_storage, mirror, alias):
    mirror.queues()
    enqueue(redis_storage, "d", max_attempts=1)
    job = redis_storage.claim(Q, "worker-1", 1, 30_000).jobs[0]
    redis_storage.fail(Q, "d", job.token, b'{"type": "ValueError", "message": "x"}')
    mirror.drain()
    assert Job.objects.using(alias).get(queue=Q, job_id="d").state == "failed"
    redis_storage.retry(Q, "d")
    mirror.drain()
    row = Job.objects.using(alias).get(queue=Q, job_id="d")
    assert (row.state, row.attempts, row.error, row.finished_at) == ("queued", 0, None, None)
    kinds = list(JobEvent.objects.using(alias).filter(job=row).values_list("kind", flat=True))
    assert kinds == ["queued", "active", "failed", "retried"]


def test_progress_and_logs_are_mirrored(redis_storage, mirror, alias):
    mirror.queues()
    enqueue(redis_storage, "p")
    job = redis_storage.claim(Q, "worker-1", 1, 30_000).jobs[0]
    redis_storage.report(Q, "p", job.token, progress=b'{"step": 2}', log="halfway")
    mirror.drain()
    row = Job.objects.using(alias).get(queue=Q, job_id="p")
    assert row.progress == {"step": 2}
    assert [line for _, line in row.logs] == ["halfway"]
    kinds = list(JobEvent.objects.using(alias).filter(job=row).values_list("kind", flat=True))
    assert kinds == ["queued", "active", "progress", "log"]


def test_crash_before_ack_redelivers_and_writes_once(redis_storage, alias, monkeypatch):
    first = Mirror(redis_storage, queues=[Q], using=alias, consumer="m1")
    first.queues()
    enqueue(redis_storage, "a")
    run_one(redis_storage)

    def crash(*args, **kwargs):
        raise ConnectionError("killed between commit and ack")

    monkeypatch.setattr(redis_storage, "ack_events", crash)
    with pytest.raises(ConnectionError):
        first.run_once()
    monkeypatch.undo()
    assert JobEvent.objects.using(alias).count() == 3  # committed, not acknowledged

    restarted = Mirror(redis_storage, queues=[Q], using=alias, consumer="m1")
    restarted.queues()  # re-reads this consumer's pending events
    restarted.drain()
    assert JobEvent.objects.using(alias).count() == 3
    assert Job.objects.using(alias).get(job_id="a").state == "completed"
    pending = redis_storage.client.xpending(redis_storage.keys(Q).events, "jobq-mirror")
    assert pending["pending"] == 0


def test_a_read_mixing_redelivered_and_new_events_writes_each_once_in_order(
    redis_storage, mirror, alias
):
    """PostgreSQL copies event rows straight into their table and falls back to the insert
    that skips duplicates when a redelivered one is among them: both halves of such a read
    must land, once each, in stream order."""
    mirror.queues()
    enqueue(redis_storage, "a")
    run_one(redis_storage)
    mirror.drain()
    # The group forgets what it read (as after a restored Redis): everything comes again,
    # followed by events written since.
    redis_storage.client.xgroup_setid(redis_storage.keys(Q).events, "jobq-mirror", "0")
    enqueue(redis_storage, "b")
    mirror.drain()
    events = JobEvent.objects.using(alias).filter(queue=Q).order_by("id")
    assert [(e.job.job_id, e.kind) for e in events] == [
        ("a", "queued"), ("a", "active"), ("a", "completed"), ("b", "queued"),
    ]  # fmt: skip
    assert len({e.stream_id for e in events}) == 4


def test_events_of_a_job_without_a_row_are_left_out(redis_storage, mirror, alias):
    mirror.queues()
    enqueue(redis_storage, "a")
    # An entry naming a job that has neither a record nor a row: nothing to attach it to.
    redis_storage.client.xadd(
        redis_storage.keys(Q).events, {"job": "ghost", "kind": "progress", "at": "1"}
    )
    enqueue(redis_storage, "b")
    mirror.drain()
    kinds = list(JobEvent.objects.using(alias).filter(queue=Q).order_by("id")
                 .values_list("job__job_id", "kind"))  # fmt: skip
    assert kinds == [("a", "queued"), ("b", "queued")]


def test_events_of_a_dead_mirror_are_taken_over(redis_storage, alias, monkeypatch):
    dead = Mirror(redis_storage, queues=[Q], using=alias, consumer="dead")
    dead.queues()
    enqueue(redis_storage, "a")
    monkeypatch.setattr(dead, "_apply", lambda events: None)  # reads, then dies silently
    dead.run_once()
    monkeypatch.undo()
    assert Job.objects.using(alias).count() == 0

    other = Mirror(redis_storage, queues=[Q], using=alias, consumer="alive", stale_ms=0)
    other.queues()
    assert Job.objects.using(alias).get(job_id="a").state == "queued"


def test_trimmed_stream_is_healed_by_a_resync(redis_client, redis_prefix, alias):
    storage = RedisStorage(redis_client, prefix=redis_prefix, events_maxlen=10)
    Mirror(storage, queues=[Q], using=alias, consumer="m1").queues()  # group at the start
    for i in range(300):
        enqueue(storage, f"j{i}")
    assert storage.events_lost(Q, "jobq-mirror")
    Mirror(storage, queues=[Q], using=alias, consumer="m1").drain()
    assert Job.objects.using(alias).filter(state="queued").count() == 300


def test_a_record_expired_before_the_mirror_read_it_still_gets_its_final_state(
    redis_storage, mirror, alias
):
    mirror.queues()
    enqueue(redis_storage, "short", result_ttl=1)
    mirror.drain()
    run_one(redis_storage)
    import time

    time.sleep(0.05)
    assert redis_storage.get_record(Q, "short") is None
    mirror.drain()
    assert Job.objects.using(alias).get(job_id="short").state == "completed"


def test_workers_are_mirrored_and_removed(redis_storage, mirror, alias):
    redis_storage.register_worker("w-1", {"host": "h", "pid": 7, "queues": [Q]}, 10_000)
    mirror.sync_workers()
    row = WorkerInfo.objects.using(alias).get(worker_id="w-1")
    assert (row.host, row.pid, row.queues) == ("h", 7, [Q])
    redis_storage.deregister_worker("w-1")
    mirror.sync_workers()
    assert not WorkerInfo.objects.using(alias).exists()


def test_retention_deletes_old_finished_rows_in_batches_only(alias):
    now = dt.datetime.now(dt.UTC)
    old, recent = now - dt.timedelta(days=10), now - dt.timedelta(days=1)

    def make(job_id, state, finished, expires=None):
        return Job(queue=Q, job_id=job_id, state=state, created_at=finished or now,
                   finished_at=finished, expires_at=expires)  # fmt: skip

    Job.objects.using(alias).bulk_create(
        [make(f"old{i}", "completed", old) for i in range(25)]
        + [
            make("recent", "completed", recent),
            make("old-queued", "queued", None),
            make("old-but-dedup-open", "failed", old, now + dt.timedelta(days=1)),
        ]
    )
    assert purge_finished(7, using=alias, batch=10) == 25
    left = set(Job.objects.using(alias).values_list("job_id", flat=True))
    assert left == {"recent", "old-queued", "old-but-dedup-open"}


def test_runmirror_once_command(redis_storage, alias, settings, capsys):
    settings.JOBQ = {
        "BACKEND": "redis",
        "REDIS_URL": settings.REDIS_URL,
        "PREFIX": redis_storage.prefix,
        "MIRROR": {"DATABASE_ALIAS": alias},
    }
    Mirror(queues=[Q], using=alias).queues()
    enqueue(redis_storage, "a")
    call_command("runmirror", Q, "--once")
    assert "mirrored 1 events" in capsys.readouterr().out
    assert Job.objects.using(alias).get(job_id="a").state == "queued"


def test_mirror_refuses_a_backend_without_streams():
    from django_jobq.storage.memory import MemoryStorage

    with pytest.raises(TypeError):
        Mirror(MemoryStorage())


def test_reaper_runs_the_mirror_by_default_on_redis(redis_storage, settings):
    from django_jobq.worker.reaper import Reaper

    settings.JOBQ = {"BACKEND": "redis"}  # the shipped defaults, not the test settings
    assert Reaper(storage=redis_storage).mirror is not None
    assert Reaper(storage=redis_storage, mirror=False).mirror is None


def test_mirrored_rows_name_the_queue_handler(redis_storage, alias):
    mirror = Mirror(redis_storage, queues=["tests-echo"], using=alias, consumer="m1")
    mirror.queues()
    redis_storage.enqueue("tests-echo", NewJob("h", b"1", JobOptions()))
    mirror.drain()
    assert Job.objects.using(alias).get(job_id="h").handler == "tests.jobsapp.jobs.echo"


# -- FinalRows: a row written final is not re-read for older events, but is for newer ones ---


def test_a_job_retried_after_its_row_was_written_final_is_mirrored_again(
    redis_storage, mirror, alias
):
    mirror.queues()
    enqueue(redis_storage, "a", max_attempts=1)
    job = redis_storage.claim(Q, "worker-1", 1, 30_000).jobs[0]
    redis_storage.fail(Q, job.job_id, job.token, b'{"type": "ValueError", "message": "x"}')
    mirror.drain()  # written final (failed): its later events are judged by the finish time
    assert Job.objects.using(alias).get(queue=Q, job_id="a").state == "failed"
    redis_storage.retry(Q, "a")  # a new life, after the finish: read and written again
    mirror.drain()
    assert Job.objects.using(alias).get(queue=Q, job_id="a").state == "queued"
    run_one(redis_storage)
    mirror.drain()
    row = Job.objects.using(alias).get(queue=Q, job_id="a")
    assert row.state == "completed"
    kinds = list(JobEvent.objects.using(alias).filter(job=row).values_list("kind", flat=True))
    assert kinds == ["queued", "active", "failed", "retried", "active", "completed"]


def test_events_of_a_job_already_written_final_only_add_their_event_rows(
    redis_storage, mirror, alias, monkeypatch
):
    mirror.queues()
    enqueue(redis_storage, "a")
    run_one(redis_storage)  # queued, active, completed: all in the stream before a read
    first = redis_storage.read_group([Q], "jobq-mirror", "m1", count=1)  # only 'queued'
    mirror._apply(first)  # the record read now is final: the row is written completed
    reads: list[list[str]] = []
    original = redis_storage.get_records
    monkeypatch.setattr(redis_storage, "get_records",
                        lambda q, ids: reads.append(list(ids)) or original(q, ids))  # fmt: skip
    mirror.drain()
    assert reads == [[]]  # active and completed happened before the finish: no record read
    row = Job.objects.using(alias).get(queue=Q, job_id="a")
    assert row.state == "completed"
    kinds = list(JobEvent.objects.using(alias).filter(job=row).values_list("kind", flat=True))
    assert kinds == ["queued", "active", "completed"]
