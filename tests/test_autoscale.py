"""Dynamic concurrency: the decision rule on its own, and a worker that follows it."""

from __future__ import annotations

import time

import pytest

from django_jobq import JobState
from django_jobq.errors import ConfigurationError
from django_jobq.queue import Queue
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker
from django_jobq.worker.autoscale import Autoscaler, Sample, decide

from .helpers import wait_until


def test_full_slots_with_cpu_room_scale_up():
    d = decide(4, 1, 16, Sample(utilisation=1.0, cpu=0.2, latency_ms=100), best_ms=100)
    assert d.limit == 5 and "full" in d.reason


def test_growth_stops_at_the_maximum():
    assert decide(16, 1, 16, Sample(1.0, 0.2, 100), 100).limit == 16


def test_saturated_cpu_scales_down_even_with_full_slots():
    d = decide(8, 1, 16, Sample(utilisation=1.0, cpu=0.97, latency_ms=100), best_ms=100)
    assert d.limit == 6 and "cpu" in d.reason


def test_handlers_much_slower_than_their_best_scale_down():
    d = decide(8, 2, 16, Sample(utilisation=1.0, cpu=0.5, latency_ms=450), best_ms=200)
    assert d.limit == 6 and "slower" in d.reason


def test_idle_slots_scale_down_but_never_below_the_minimum():
    assert decide(8, 2, 16, Sample(0.1, 0.05, 10), 10).limit == 6
    assert decide(2, 2, 16, Sample(0.0, 0.0, None), None).limit == 2


def test_a_busy_level_that_is_neither_full_nor_idle_stays():
    assert decide(8, 1, 16, Sample(0.7, 0.5, 100), 100).reason == "steady"


def test_bad_bounds_are_refused():
    with pytest.raises(ConfigurationError):
        Worker(["q"], autoscale=(5, 2))
    with pytest.raises(ValueError):
        Autoscaler(0, 4)


@pytest.mark.redis
def test_io_bound_jobs_make_the_worker_raise_its_limit(redis_client, redis_prefix):
    from django_jobq.storage.redis.storage import RedisStorage

    storage = RedisStorage(redis_client, prefix=redis_prefix)
    registry = HandlerRegistry()
    registry.register("io", lambda job: time.sleep(0.05))
    worker = Worker(["io"], storage=storage, handlers=registry, autoscale=(1, 8),
                    autoscale_interval=0.3, lease=5000, grace=1)  # fmt: skip
    queue = Queue("io", storage=storage)
    queue.enqueue_many([(f"j{i}", i) for i in range(400)])
    worker.start()
    try:
        assert wait_until(lambda: worker.autoscaler.limit >= 4), worker.autoscaler.last
        assert wait_until(
            lambda: any(
                "autoscale" in w.info and w.info["concurrency"] > 1 for w in storage.list_workers()
            ),
        )
        assert wait_until(lambda: queue.counts()[JobState.COMPLETED] == 400, 60)
    finally:
        worker.stop(hurry=True)
        assert worker.stopped.wait(30)
