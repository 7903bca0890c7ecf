"""Retention from the user's side: the settings' shape and its errors, ``Queue.set_retention``,
and the policy in settings reaching storage when a worker or the reaper starts. The storage
semantics are in tests/contract/test_retention_contract.py; the mirror in
tests/test_retention_mirror.py."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import override_settings

from django_jobq import Keep, Queue, Retention
from django_jobq.backend import check_settings
from django_jobq.conf import configured_retention
from django_jobq.errors import ConfigurationError, InvalidOption
from django_jobq.job import JobOptions, NewJob
from django_jobq.storage.memory import MemoryStorage
from django_jobq.validation import parse_retention
from django_jobq.worker import Worker
from django_jobq.worker.reaper import Reaper

WEEK_MS = 7 * 24 * 3600 * 1000


def test_the_settings_shape_becomes_a_policy():
    policy = parse_retention(
        {"completed": {"count": 1000}, "failed": {"count": 50, "age": dt.timedelta(days=7)}}
    )
    assert policy == Retention(completed=Keep(count=1000), failed=Keep(count=50, age=WEEK_MS))


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ([1000], "must be a dict of states"),
        ({"done": {"count": 1}}, "unknown state"),
        ({"completed": 1000}, "'count' and/or 'age'"),
        ({"completed": {}}, "give 'count', 'age' or both"),
        ({"completed": {"count": 0}}, "count must be an integer from 1"),
        ({"completed": {"count": 2.5}}, "count must be an integer from 1"),
        ({"completed": {"count": True}}, "count must be an integer from 1"),
        ({"failed": {"age": -5}}, "age must be"),
        ({"failed": {"age": 1.5}}, "age must be"),
        ({"failed": {"max": 3}}, "unknown key"),
    ],
)
def test_a_bad_policy_is_refused_with_what_is_wrong(value, fragment):
    with pytest.raises(InvalidOption, match=fragment):
        parse_retention(value, "here")


@pytest.mark.django_db  # model checks (JSONField support) ask the database for its features
def test_a_bad_policy_in_settings_is_a_startup_error_naming_the_queue():
    jobq = {"QUEUES": {"emails": {"retention": {"completed": {"count": -1}}}}}
    with override_settings(JOBQ=jobq):
        assert any("JOBQ['QUEUES']['emails']['retention']" in p for p in check_settings())
        with pytest.raises(ConfigurationError, match="emails"):
            configured_retention("emails")


def test_retention_is_a_queue_setting_not_a_job_option():
    jobq = {"QUEUES": {"emails": {"max_attempts": 2, "retention": {"failed": {"count": 9}}}}}
    with override_settings(JOBQ=jobq):
        assert check_settings() == []
        assert configured_retention("emails") == Retention(failed=Keep(count=9))
        assert configured_retention("other") is None


def test_queue_set_retention_takes_keywords_or_a_policy():
    storage = MemoryStorage()
    q = Queue("reports", storage=storage)
    q.set_retention(completed={"count": 10}, cancelled={"age": dt.timedelta(hours=1)})
    assert q.get_retention() == Retention(completed=Keep(10), cancelled=Keep(age=3_600_000))
    q.set_retention(Retention(failed=Keep(count=3)))
    assert storage.get_retention("reports") == Retention(failed=Keep(count=3))
    q.set_retention()
    assert q.get_retention() == Retention()
    with pytest.raises(InvalidOption):
        q.set_retention(Retention(), failed={"count": 1})
    with pytest.raises(InvalidOption):
        q.set_retention(failed={"count": 0})


def test_a_starting_worker_writes_the_settings_policy_to_storage():
    storage = MemoryStorage()
    storage.set_retention("other", Retention(failed=Keep(count=1)))
    jobq = {"QUEUES": {"emails": {"retention": {"completed": {"count": 5}}}}}
    with override_settings(JOBQ=jobq):
        worker = Worker(["emails", "other"], storage=storage)
        worker._apply_configured_limits()
    assert storage.get_retention("emails") == Retention(completed=Keep(count=5))
    # A queue the settings say nothing about keeps what an operator set.
    assert storage.get_retention("other") == Retention(failed=Keep(count=1))


def test_the_reaper_writes_the_settings_policy_before_its_first_sweep():
    storage = MemoryStorage()
    jobq = {"QUEUES": {"emails": {"retention": {"failed": {"age": 60_000}}}}}
    with override_settings(JOBQ=jobq):
        reaper = Reaper(storage=storage, mirror=False, schedules=False, interval=0.01)
        reaper.stop()  # run() applies the policy, then sees the stop at once
        reaper.run()
    assert storage.get_retention("emails") == Retention(failed=Keep(age=60_000))


@pytest.mark.redis
def test_index_entries_of_records_expired_by_ttl_are_pruned_by_the_reaper(
    redis_client, redis_prefix
):
    """A record can end by its own result_ttl before retention removes it: its index entry
    must not stay behind for ever. The reaper's pass prunes it (and deletes nothing)."""
    from django_jobq.storage.redis.storage import RedisStorage
    from tests.helpers import wait_until

    storage = RedisStorage(redis_client, prefix=redis_prefix)
    storage.set_retention("ttl-q", Retention(completed=Keep(count=100)))
    index = storage.keys("ttl-q").finished("completed")
    # "z-long" finishes last and, when the three finish in the same millisecond, sorts last
    # among equal scores: the walk stops at the first entry that stays (its documented rule).
    for job_id in ("short1", "short2", "z-long"):
        ttl = 60_000 if job_id == "z-long" else 1
        storage.enqueue("ttl-q", NewJob(job_id, b"{}", JobOptions(result_ttl=ttl)))
        job = storage.claim("ttl-q", "w1", 1, 30_000).jobs[0]
        storage.complete("ttl-q", job.job_id, job.token, b"1")
    assert redis_client.zcard(index) == 3
    assert wait_until(
        lambda: (
            storage.get_records("ttl-q", ["short1", "short2"]) == {"short1": None, "short2": None}
        ),
        timeout=10,
    )
    assert storage.reap("ttl-q").removed == 0
    assert [m.decode() for m in redis_client.zrange(index, 0, -1)] == ["z-long"]
    assert storage.get_record("ttl-q", "z-long") is not None


def test_a_reaper_sweep_takes_a_backlog_in_bounded_passes_until_done():
    storage = MemoryStorage()
    q = Queue("backlog", storage=storage)
    q.set_retention(completed={"count": 100})
    for i in range(30):
        storage.enqueue("backlog", NewJob(f"j{i:02d}", b"{}", JobOptions()))
    for job in storage.claim("backlog", "w1", 30, 30_000).jobs:
        storage.complete("backlog", job.job_id, job.token, b"1")
    q.set_retention(completed={"count": 2})
    reaper = Reaper(["backlog"], storage=storage, batch=5, mirror=False, schedules=False)
    report = reaper.run_once()["backlog"]
    assert report.removed == 28
    assert [i for i in range(30) if q.get_status(f"j{i:02d}")] == [28, 29]


def test_a_worker_started_with_settings_keeps_the_newest_completed_jobs(
    live_storage, settings, backend
):
    """End to end: the policy comes from settings through the worker's start, the finishing
    steps (or, on the database backend, the worker's own sweeps) apply it."""
    from django_jobq.tasks.registry import HandlerRegistry
    from tests.helpers import wait_until

    settings.JOBQ = {**settings.JOBQ, "QUEUES": {"wkeep": {"retention": {
        "completed": {"count": 3}}}}}  # fmt: skip
    handlers = HandlerRegistry()
    handlers.register("wkeep", lambda job: "done")
    worker = Worker(["wkeep"], storage=live_storage, handlers=handlers, concurrency=1,
                    reap_interval=0.05)  # fmt: skip
    worker.start()
    try:
        q = Queue("wkeep", storage=live_storage)
        ids = [f"k{i}" for i in range(8)]
        for job_id in ids:  # one at a time: finish order is enqueue order with one slot
            assert q.enqueue_and_wait(job_id, {"i": job_id}, timeout=30) == "done"
        assert wait_until(lambda: [i for i in ids if q.get_status(i)] == ids[-3:], timeout=30)
        assert q.get_retention() == Retention(completed=Keep(count=3))
    finally:
        worker.stop(hurry=True)
        assert worker.stopped.wait(30)


def test_jobq_queue_shows_and_sets_retention(capsys):
    import json

    from django.core.management import CommandError, call_command

    from django_jobq.backend import set_test_storage

    storage = MemoryStorage()
    set_test_storage(storage)
    try:
        call_command("jobq_queue", "retention", "cli-q", "--completed-count", "50")
        call_command("jobq_queue", "retention", "cli-q", "--failed-age", "60000")
        assert storage.get_retention("cli-q") == Retention(
            completed=Keep(count=50), failed=Keep(age=60_000)
        )
        with pytest.raises(CommandError, match="count must be"):
            call_command("jobq_queue", "retention", "cli-q", "--failed-count", "0")
        call_command("jobq_queue", "retention", "cli-q", "--clear")
        assert storage.get_retention("cli-q") == Retention()
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert lines[1] == {"queue": "cli-q", "retention": {"completed": {"count": 50},
                                                           "failed": {"age": 60000}}}  # fmt: skip
        assert lines[-1] == {"queue": "cli-q", "retention": {}}
    finally:
        set_test_storage(None)
