"""A gap on a big queue: counts and a sample instead of a full re-read, said in health and the
admin, understood by the reconciliation check, and exact rows again once a full re-read fits.

Real Redis with a small ``EVENTS_MAXLEN`` (50) to force the gap; rows in SQLite and
PostgreSQL. The streams' event rates are read with an injected clock, so whether a full
re-read "fits" is decided by the test's events, never by the machine's speed.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_jobq.job import Event, JobOptions, JobRecord, NewJob
from django_jobq.mirror import Mirror
from django_jobq.mirror.check import check, sampled_queues
from django_jobq.mirror.core import FINISHING_KINDS, GROUP, FinalRows
from django_jobq.models import Job
from django_jobq.states import JobState
from django_jobq.storage.redis.storage import RedisStorage

from .helpers import health_as_reader

pytestmark = pytest.mark.redis
Q = "sample-q"
JOBS = 400


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["default", "pg"])
def db_alias(request):
    return request.param


@pytest.fixture
def storage(redis_client, redis_prefix) -> RedisStorage:
    return RedisStorage(redis_client, prefix=redis_prefix, events_maxlen=50)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def mirror(storage, db_alias, clock) -> Mirror:
    m = Mirror(storage, queues=[Q], using=db_alias, consumer="m1", gap_check_interval=0,
               sample_above=100, sample_size=20, clock=clock)  # fmt: skip
    m.queues()  # group created before any event
    return m


def rows(alias) -> dict[str, str]:
    return dict(Job.objects.using(alias).filter(queue=Q).values_list("job_id", "state"))


def redis_states(storage, ids) -> dict[str, str]:
    return {i: s.value for i, s in zip(ids, storage.job_states(Q, ids), strict=True) if s}


def fall_behind_on_a_big_queue(storage) -> list[str]:
    """400 jobs enqueued and 30 started (10 of them finished) while the mirror did not read:
    440 events through a cap of 50, so the stream lost most of them unread."""
    ids = [f"j{i:04}" for i in range(JOBS)]
    storage.enqueue_many(Q, [NewJob(i, b"{}", JobOptions()) for i in ids])
    claimed = storage.claim(Q, "w1", 30, 60_000).jobs
    for job in claimed[:10]:
        storage.complete(Q, job.job_id, job.token, b"1")
    assert storage.events_lost(Q, GROUP)
    return ids


def test_a_gap_on_a_big_queue_writes_counts_and_a_sample_not_every_record(
    storage, mirror, db_alias, settings
):
    settings.JOBQ = {**settings.JOBQ, "MIRROR": {"ENABLED": True}}
    ids = fall_behind_on_a_big_queue(storage)
    mirror.run_once()  # the running loop finds the gap
    assert Q in storage.mirror_sampled()
    written = rows(db_alias)
    assert 30 <= len(written) < JOBS  # a bounded sample, not the whole queue
    assert written == {i: s for i, s in redis_states(storage, ids).items() if i in written}
    active = {i for i, s in redis_states(storage, ids).items() if s == "active"}
    assert active <= set(written)  # every running job is in the sample (20 < SAMPLE)
    assert {"j0399", "j0030"} <= set(written)  # the newest queued, and the next to run
    [mode] = sampled_queues(storage)
    assert mode["queue"] == Q and mode["counts"]["queued"] == JOBS - 30
    assert mode["counts"]["active"] == 20 and mode["counts"]["completed"] == 10
    assert not storage.events_lost(Q, GROUP)  # the group moved past the gap


def test_health_and_the_admin_say_a_queue_is_shown_as_counts_and_a_sample(
    storage, mirror, db_alias, redis_prefix, settings
):

    from django_jobq.admin.common import mirror_banner

    settings.JOBQ = {**settings.JOBQ, "BACKEND": "redis", "REDIS_URL": settings.REDIS_URL,
                     "PREFIX": redis_prefix,
                     "MIRROR": {"ENABLED": True, "DATABASE_ALIAS": db_alias}}  # fmt: skip
    storage.register_queue(Q)
    assert health_as_reader()["mirror_sampled"] == []
    fall_behind_on_a_big_queue(storage)
    mirror.run_once()
    [said] = health_as_reader()["mirror_sampled"]
    assert said["queue"] == Q and said["counts"]["queued"] == JOBS - 30 and said["since"] > 0
    banner = mirror_banner()
    assert banner is not None and f"counts and a sample for queue {Q} since" in banner


def test_the_check_compares_the_sample_of_a_sampled_queue_and_repairs_it(storage, mirror, db_alias):
    fall_behind_on_a_big_queue(storage)
    mirror.run_once()
    [report] = check(mirror, [Q], repair=False)
    assert report.mode == "sampled"
    assert report.redis_counts != report.row_counts  # expected in this mode: not a difference
    assert report.consistent and report.sampled > 0
    assert "counts and a sample" in str(report)
    Job.objects.using(db_alias).filter(queue=Q, job_id="j0399").update(state="completed")
    [report] = check(mirror, [Q])
    assert not report.consistent and "j0399" in report.mismatched and report.repaired
    assert rows(db_alias)["j0399"] == "queued"
    assert Q in storage.mirror_sampled()  # repaired within the mode, not by a full re-read
    assert check(mirror, [Q])[0].consistent


def test_a_quiet_sampled_queue_returns_to_exact_rows(storage, mirror, db_alias, clock):
    ids = fall_behind_on_a_big_queue(storage)
    mirror.run_once()  # sampled; the stream's position is observed (the rate needs two)
    sampled = set(rows(db_alias))
    clock.now += 10
    mirror.check_gaps()  # no event for 10 s: a full re-read fits
    assert storage.mirror_sampled() == {}
    assert rows(db_alias) == redis_states(storage, ids)  # every job, exact
    jobs = Job.objects.using(db_alias).filter(queue=Q)
    by_pk = [i for i in jobs.order_by("pk").values_list("job_id", flat=True) if i not in sampled]
    assert by_pk == sorted(by_pk)  # the jobs the sample missed were written in creation order
    listed = list(jobs.order_by("-created_at", "-id").values_list("job_id", flat=True))
    created = dict(zip(ids, storage.created_times(Q, ids), strict=True))
    assert [created[i] for i in listed] == sorted(created.values(), reverse=True)


def test_a_busy_sampled_queue_stays_sampled_until_a_full_re_read_fits(
    storage, mirror, db_alias, clock
):
    ids = fall_behind_on_a_big_queue(storage)
    mirror.run_once()
    mirror.seconds_per_record = 0.01  # as measured on a slow database: 4 s for 400 records
    for job in storage.claim(Q, "w1", 20, 60_000).jobs:  # 40 events: under the cap, no gap
        storage.complete(Q, job.job_id, job.token, b"1")
    mirror.drain()  # caught up: its backlog is empty
    clock.now += 0.1  # 400 events/s × 4 s of re-read: far more than half the cap of 50
    mirror.check_gaps()
    assert Q in storage.mirror_sampled() and rows(db_alias) != redis_states(storage, ids)
    clock.now += 60  # then nothing for a minute
    mirror.check_gaps()
    assert storage.mirror_sampled() == {}
    assert rows(db_alias) == redis_states(storage, ids)


def test_a_small_queue_is_still_re_read_in_full(storage, db_alias, clock):
    mirror = Mirror(storage, queues=[Q], using=db_alias, consumer="m1", gap_check_interval=0,
                    sample_above=1000, clock=clock)  # fmt: skip
    mirror.queues()
    ids = fall_behind_on_a_big_queue(storage)
    mirror.run_once()
    assert storage.mirror_sampled() == {}
    assert rows(db_alias) == redis_states(storage, ids)


def test_a_restarted_mirror_keeps_the_mode_until_it_can_leave_it(storage, mirror, db_alias):
    ids = fall_behind_on_a_big_queue(storage)
    mirror.run_once()
    clock = Clock()
    restarted = Mirror(storage, queues=[Q], using=db_alias, consumer="m2", gap_check_interval=0,
                       sample_above=100, sample_size=20, clock=clock)  # fmt: skip
    restarted.queues()
    assert Q in restarted.sampled
    restarted.check_gaps()
    clock.now += 10
    restarted.check_gaps()
    assert storage.mirror_sampled() == {} and rows(db_alias) == redis_states(storage, ids)


# -- FinalRows, as a property: which events a final row covers -----------------------------------


KINDS = ["queued", "retried", "scheduled", "active", "completed", "failed", "cancelled"]


def final_record(job_id: str, finished: int) -> JobRecord:
    return JobRecord(queue=Q, job_id=job_id, state=JobState.COMPLETED, attempts=1,
                     max_attempts=1, stalls=0, max_stalls=0, priority=0, created_at=0,
                     run_at=None, started_at=None, finished_at=finished, worker=None,
                     result_ttl=0, content_type="json", payload=b"", result=None,
                     error=None)  # fmt: skip


@given(
    finished=st.integers(1, 10**13), delta=st.integers(-5, 5), kind=st.sampled_from(KINDS),
    keep=st.integers(1, 5), others=st.integers(0, 10),
)  # fmt: skip
def test_a_final_row_covers_exactly_the_events_before_its_finish(
    finished, delta, kind, keep, others
):
    rows = FinalRows(keep=keep)
    rows.remember(Q, [final_record(f"o{i}", 1) for i in range(others)])  # older: may be dropped
    rows.remember(Q, [final_record("a", finished)])  # newest: always kept
    event = Event("1-0", Q, "a", kind, finished + delta, None)
    expected = delta < 0 or (delta == 0 and kind in FINISHING_KINDS)
    assert rows.covers(Q, event) is expected
    assert not rows.covers("other-queue", event)
    assert rows._size <= keep
    rows.forget(Q)
    assert not rows.covers(Q, event) and rows._size == 0
