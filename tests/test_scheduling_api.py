"""The scheduling part of the Queue API: edge validation (bad input is refused before anything
is written), option plumbing into storage, settings limits, and the handler's RateLimited
signal. Backend behaviour itself is pinned down by tests/contract/test_scheduling_contract.py."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import override_settings

from django_jobq import ChangeOutcome, EnqueueOutcome, JobState, QueueBusy, RateLimited
from django_jobq.backend import check_settings
from django_jobq.conf import configured_limits
from django_jobq.errors import ConfigurationError, InvalidOption
from django_jobq.job import ClaimedJob, DedupMode, QueueLimits, RunAtUpdate
from django_jobq.queue import Queue
from django_jobq.storage.memory import MemoryStorage
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker.execution import execute


@pytest.fixture
def q() -> Queue:
    return Queue("sched-api", storage=MemoryStorage())


def soon(seconds: float) -> dt.datetime:
    return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "options",
    [
        {"lifo": "yes"},
        {"singleton": 1},
        {"group": "has space"},
        {"group": "{tag}"},
        {"group": ""},
        {"update_run_at": "sometimes"},
        {"update_data": "true"},
        {"dedup_key": "a:b"},
        {"dedup_key": "k", "dedup_mode": "forever"},
        {"dedup_key": "k", "dedup_mode": "throttle"},  # needs a ttl
        {"dedup_key": "k", "dedup_mode": "debounce"},
        {"dedup_key": "k", "dedup_ttl": 0},
        {"dedup_key": "k", "dedup_ttl": -5},
        {"dedup_mode": "simple"},  # no key
        {"dedup_ttl": 1000},
    ],
)
def test_bad_scheduling_options_are_refused_and_write_nothing(q, options):
    with pytest.raises(InvalidOption):
        q.enqueue("job-1", {"x": 1}, **options)
    assert q.get_status("job-1") is None


def test_options_reach_storage_as_value_objects(q):
    job = q.build(
        "j", 1, lifo=True, group="cust-7", singleton=True, update_data=True,
        update_run_at="if_earlier", reset_counts=True, dedup_key="k1", dedup_mode="debounce",
        dedup_ttl=dt.timedelta(seconds=2),
    )  # fmt: skip
    assert (job.lifo, job.group, job.singleton) == (True, "cust-7", True)
    assert job.update.data and job.update.reset_counts and not job.update.backoff
    assert job.update.run_at is RunAtUpdate.IF_EARLIER
    assert (job.dedup.key, job.dedup.mode, job.dedup.ttl) == ("k1", DedupMode.DEBOUNCE, 2000)
    plain = q.build("p", 1)
    assert plain.update is None and plain.dedup is None  # the fast path stays option-free


def test_enqueue_and_wait_refuses_singleton(q):
    with pytest.raises(InvalidOption, match="singleton"):
        q.enqueue_and_wait("s", 1, timeout=1, singleton=True)
    assert q.get_status("s") is None


def test_change_and_promote_through_the_api(q):
    q.enqueue("later", 1, run_at=soon(3600))
    assert q.get_status("later").state is JobState.SCHEDULED
    assert q.change_run_at("later", delay=dt.timedelta(hours=2)) is ChangeOutcome.CHANGED
    assert q.get_status("later").run_at > soon(3600)
    assert q.promote("later") is ChangeOutcome.CHANGED
    assert q.get_status("later").state is JobState.QUEUED
    assert q.change_priority("later", -5) is ChangeOutcome.CHANGED
    assert q.get_status("later").priority == -5
    assert q.promote("missing") is ChangeOutcome.NOT_FOUND
    with pytest.raises(InvalidOption):
        q.change_run_at("later")  # neither run_at nor delay
    with pytest.raises(InvalidOption):
        q.change_run_at("later", soon(1), delay=5)
    with pytest.raises(InvalidOption):
        q.change_run_at("later", dt.datetime(2030, 1, 1))  # naive
    with pytest.raises(InvalidOption):
        q.change_priority("later", 5000)


def test_limits_round_trip_and_validation(q):
    limits = q.set_limits(rate_max=10, rate_window=dt.timedelta(seconds=1), concurrency=3)
    assert limits == QueueLimits(rate_max=10, rate_window=1000, concurrency=3)
    assert q.get_limits() == limits
    for bad in (
        {"rate_max": 10},  # no window
        {"group_rate_window": 100},  # no max
        {"concurrency": 0},
        {"rate_max": -1, "rate_window": 10},
        {"rate_max": 1, "rate_window": 0},
        {"concurrency": True},
    ):
        with pytest.raises(InvalidOption):
            q.set_limits(**bad)
    assert q.get_limits() == limits  # refused calls changed nothing
    q.set_limits()
    assert q.get_limits() == QueueLimits()


def test_queue_control_through_the_api(q):
    q.enqueue("a", 1)
    q.enqueue("b", 1, delay=60_000)
    q.pause()
    assert q.is_paused()
    assert q.enqueue("c", 1).outcome is EnqueueOutcome.QUEUED  # enqueue still works
    assert q.storage.claim(q.name, "w", 10, 1000).jobs == []
    q.resume()
    assert not q.is_paused()
    assert q.drain(delayed=False) == 2
    assert q.get_status("b").state is JobState.SCHEDULED
    assert q.drain() == 1
    assert q.clean(0) == 3
    with pytest.raises(InvalidOption):
        q.clean(0, states=["queued"])
    q.enqueue("d", 1)
    q.storage.claim(q.name, "w", 1, 60_000)
    with pytest.raises(QueueBusy):
        q.obliterate()
    assert q.obliterate(force=True) == 1
    assert q.get_status("d") is None


def test_settings_limits_are_checked(settings):
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {"mail": {"max_attempts": 2, "limits": {
        "rate_max": 5, "rate_window": 1000, "concurrency": 2}}}}  # fmt: skip
    assert configured_limits("mail") == {"rate_max": 5, "rate_window": 1000, "concurrency": 2}
    assert configured_limits("other") is None
    assert not [p for p in check_settings() if "limits" in p]
    for bad in ({"rate_max": 5}, {"burst": 1}, {"concurrency": 0}, []):
        with override_settings(JOBQ={**settings.JOBQ, "QUEUES": {"mail": {"limits": bad}}}):
            with pytest.raises(ConfigurationError):
                configured_limits("mail")
            assert any("limits" in p for p in check_settings())


def test_worker_applies_configured_limits(settings):
    from django_jobq.worker import Worker

    storage = MemoryStorage()
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {"sched-api": {"limits": {"concurrency": 4}}}}
    registry = HandlerRegistry()
    registry.register("sched-api", lambda job: None)
    worker = Worker(["sched-api"], storage=storage, handlers=registry, concurrency=1)
    worker._apply_configured_limits()
    assert storage.get_limits("sched-api") == QueueLimits(concurrency=4)


def test_rate_limited_handler_becomes_a_postpone_verdict():
    registry = HandlerRegistry()

    def limited(job):
        raise RateLimited(1.5, queue_wide=True)

    registry.register("sched-api", limited)
    claimed = ClaimedJob("sched-api", "j", b"{}", 3, 1, 3, 1000, 60_000)
    ack = execute(claimed, registry)
    assert (ack.kind, ack.retry_in, ack.queue_wide, ack.token) == ("postpone", 1500, True, 3)
    with pytest.raises(ValueError):
        RateLimited(-1)
