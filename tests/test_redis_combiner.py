"""The Redis backend's enqueue combiner: concurrent single enqueues of one queue share calls.

A call is slowed on purpose (a wrapper around the script runner) so that callers really park
behind the calls in flight; the results must be those of the same enqueues made one by one.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from django_jobq import Queue
from django_jobq.errors import StorageUnavailable
from django_jobq.job import EnqueueOutcome
from django_jobq.states import JobState
from django_jobq.storage.redis import storage as redis_storage_mod
from django_jobq.storage.redis.storage import RedisStorage, _Combiner, _Slot

pytestmark = pytest.mark.redis


@pytest.fixture
def storage(redis_client, redis_prefix):
    return RedisStorage(redis_client, prefix=redis_prefix)


def slow_calls(storage: RedisStorage, delay: float, fail_batches: bool = False) -> list[int]:
    """Record the number of jobs in each enqueue call (a lone job's goes packed, see
    ``Scripts.call_packed``); optionally refuse combined calls."""
    sizes: list[int] = []
    real = storage.scripts.call

    def call(name, keys, args):
        if name == "enqueue":
            jobs = (len(args) - 3 - int(args[2]) * 10) // 3
            sizes.append(jobs)
            time.sleep(delay)
            if fail_batches and jobs > 1:
                raise RedisConnectionError("injected: connection lost")
        return real(name, keys, args)

    real_packed = storage.scripts.call_packed

    def call_packed(name, packed, arguments):  # a lone job's call, already packed
        if name == "enqueue_one":
            sizes.append(1)
            time.sleep(delay)
        return real_packed(name, packed, arguments)

    storage.scripts.call = call  # type: ignore[method-assign]
    storage.scripts.call_packed = call_packed  # type: ignore[method-assign]
    return sizes


def run_threads(n: int, target) -> None:
    barrier = threading.Barrier(n)
    threads = [
        threading.Thread(target=lambda i=i: (barrier.wait(), target(i)), daemon=True)
        for i in range(n)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a parked caller was never released"


def test_combined_calls_give_the_results_of_one_by_one_calls(storage):
    sizes = slow_calls(storage, 0.002)
    queue = Queue("combine", storage=storage)
    outcomes: dict[str, list[EnqueueOutcome]] = {}
    lock = threading.Lock()

    def produce(i: int) -> None:
        for n in range(40):
            # Each thread's own ids, plus ids every thread shares, with per-job options that
            # must not leak between jobs of one combined call.
            for job_id in (f"t{i}-{n}", f"shared-{n % 10}"):
                r = queue.enqueue(job_id, {"i": i, "n": n}, priority=i % 3, delay=(n % 2) * 60_000)
                with lock:
                    outcomes.setdefault(job_id, []).append(r.outcome)

    run_threads(12, produce)

    assert max(sizes) > 1, "no call was combined: the test did not exercise the combiner"
    for job_id, got in outcomes.items():
        assert got.count(EnqueueOutcome.QUEUED) == 1, (job_id, got)
        assert set(got) <= {EnqueueOutcome.QUEUED, EnqueueOutcome.DUPLICATE}
    for i in range(12):
        for n in range(40):
            record = storage.get_record("combine", f"t{i}-{n}")
            assert record.priority == i % 3
            assert record.state is (JobState.SCHEDULED if n % 2 else JobState.QUEUED)
            assert json.loads(record.payload) == {"i": i, "n": n}
    counts = storage.counts("combine")
    assert counts[JobState.QUEUED] + counts[JobState.SCHEDULED] == 12 * 40 + 10


def test_an_error_of_a_combined_call_reaches_every_caller_in_it_and_nothing_hangs(storage):
    slow_calls(storage, 0.02, fail_batches=True)
    queue = Queue("combine", storage=storage)
    results: dict[int, object] = {}

    def produce(i: int) -> None:
        try:
            results[i] = queue.enqueue(f"j{i}", i).outcome
        except StorageUnavailable as exc:
            results[i] = exc

    run_threads(8, produce)
    errors = [r for r in results.values() if isinstance(r, StorageUnavailable)]
    queued = [r for r in results.values() if r is EnqueueOutcome.QUEUED]
    assert len(results) == 8 and errors and queued
    assert len(errors) + len(queued) == 8
    # The failed calls stored nothing; the combiner is free again for the next caller.
    stored = sum(storage.get_record("combine", f"j{i}") is not None for i in range(8))
    assert stored == len(queued)
    combiner = storage._combiners["combine"]
    assert combiner.in_flight == 0 and not combiner.parked
    assert queue.enqueue("after", 1).outcome is EnqueueOutcome.QUEUED


def test_a_parked_caller_that_is_interrupted_takes_its_job_back_or_runs_its_batch():
    combiner = _Combiner()
    firsts = [_Slot(object()) for _ in range(redis_storage_mod.COMBINE_AFTER)]  # type: ignore[arg-type]
    assert all(combiner.join(s) == [s] for s in firsts)
    parked_a, parked_b = _Slot(object()), _Slot(object())  # type: ignore[arg-type]
    assert combiner.join(parked_a) is None and combiner.join(parked_b) is None

    # Interrupted while still parked: its job leaves the queue of parked jobs.
    assert combiner.withdraw(parked_a) is None
    assert combiner.parked == [parked_b]

    # Interrupted right after being handed a batch: it gets the batch to run.
    combiner.hand_over()
    assert parked_b.event.is_set() and combiner.withdraw(parked_b) == [parked_b]
    combiner.hand_over()
    for _ in firsts[1:]:
        combiner.hand_over()
    assert combiner.in_flight == 0
