"""A worker facing a paused, capped or rate-limited queue sleeps on the storage's wake-up
instead of polling, and picks the work up as soon as it may: on every backend, real clocks.

"Does not poll" is checked by counting claim calls over a second (a polling loop makes
thousands; a blocked worker makes a handful), not by timing anything."""

from __future__ import annotations

import threading
import time

import pytest

from django_jobq import JobState
from django_jobq.queue import Queue
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker

from .helpers import wait_until

Q = "flow-worker"


class CountingStorage:
    """The real storage, with its claim calls counted."""

    def __init__(self, storage) -> None:
        self._storage = storage
        self.claims = 0
        self._lock = threading.Lock()

    def claim(self, *args, **kwargs):
        with self._lock:
            self.claims += 1
        return self._storage.claim(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._storage, name)


@pytest.fixture
def setup(live_storage):
    counting = CountingStorage(live_storage)
    ran: list[str] = []
    registry = HandlerRegistry()
    registry.register(Q, lambda job: ran.append(job.id))
    worker = Worker(
        [Q], storage=counting, handlers=registry, concurrency=2, reap_interval=0, grace=1
    )
    queue = Queue(Q, storage=live_storage)
    yield queue, counting, worker, ran
    worker.stop(hurry=True)
    # The database flush after the test must not race the worker's last writes (deregister).
    if worker.started.is_set():
        assert worker.stopped.wait(30)


def claims_during(counting: CountingStorage, seconds: float) -> int:
    before = counting.claims
    time.sleep(seconds)
    return counting.claims - before


def test_paused_queue_does_not_make_the_worker_poll(setup):
    queue, counting, worker, ran = setup
    queue.pause()
    queue.enqueue("p1", 1)
    worker.start()
    assert claims_during(counting, 1.0) <= 12
    assert ran == []
    queue.enqueue("p2", 1)  # an enqueue while paused wakes nobody into a loop either
    assert claims_during(counting, 0.5) <= 8
    queue.resume()
    assert wait_until(lambda: sorted(ran) == ["p1", "p2"]), ran


def test_full_concurrency_cap_does_not_make_the_worker_poll(setup):
    queue, counting, worker, ran = setup
    queue.set_limits(concurrency=1)
    queue.enqueue("held", 1)
    held = queue.storage.claim(Q, "someone-else", 1, 60_000).jobs[0]  # the one slot is taken
    queue.enqueue_many([(f"c{i}", i) for i in range(3)])
    worker.start()
    assert claims_during(counting, 1.0) <= 12
    assert ran == []
    queue.storage.complete(Q, held.job_id, held.token, b"1")  # frees the slot: wakes a worker
    assert wait_until(lambda: len(ran) == 3), ran
    # The handler has run; its verdict is sent right after, so wait for it too.
    assert wait_until(lambda: queue.counts()[JobState.COMPLETED] == 4), queue.counts()


def test_rate_limited_queue_sleeps_until_the_window_frees(setup):
    queue, counting, worker, ran = setup
    queue.set_limits(rate_max=2, rate_window=1500)
    queue.enqueue_many([(f"r{i}", i) for i in range(4)])
    worker.start()
    assert wait_until(lambda: len(ran) == 2), ran
    assert claims_during(counting, 0.8) <= 10
    assert len(ran) == 2
    assert wait_until(lambda: len(ran) == 4), ran
