"""Differential model test: a sharded queue answers as a plain queue does, on every backend.

A ``hypothesis.stateful`` machine sends the same operations to a plain ``Queue`` and to a
``Queue(shards=3)`` on one storage: enqueues of a few ids (priorities, delays, updates), jobs
deduplicated by a key under fresh ids, cancel, retry, change of priority, promote, delete, and
workers that claim everything runnable and complete or fail it. Routing, the fall-back lookups
and the aggregated reads must make every answer, every job's state, the counts and the dead
letters of the sharded queue equal to the plain queue's after each step. Where they may differ
by design (the order of claims across partitions) the machine compares sets, not sequences.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from django_jobq.queue import Queue
from django_jobq.queue.sharded import ShardedQueue
from tests.conftest import FakeClock, make_storage

IDS = ("a", "b", "c", "d", "e.1", "f-2")
KEYS = ("k1", "k2")
EXAMPLES = {"memory": 60, "redis": 15, "redis-cluster": 8, "sqlite": 6, "postgres": 6}
ERROR = b'{"type": "ValueError", "message": "boom"}'


class ShardedVsPlain(RuleBasedStateMachine):
    storage = None  # set per backend (see the test)

    def __init__(self) -> None:
        super().__init__()
        stem = uuid.uuid4().hex[:8]
        self.plain = Queue(f"mp{stem}", storage=self.storage)
        self.sharded = Queue(f"ms{stem}", storage=self.storage, shards=3)
        assert isinstance(self.sharded, ShardedQueue)
        self.seen: set[str] = set()

    def both(self, call):
        return call(self.plain), call(self.sharded)

    @rule(job_id=st.sampled_from(IDS), priority=st.sampled_from([0, 5]),
          delay=st.sampled_from([0, 0, 600_000]), update=st.booleans())  # fmt: skip
    def enqueue(self, job_id, priority, delay, update):
        options = {"priority": priority, "delay": delay, "update_data": update}
        plain, sharded = self.both(lambda q: q.enqueue(job_id, {"p": priority}, **options))
        assert (plain.outcome, plain.state) == (sharded.outcome, sharded.state)
        self.seen.add(job_id)

    @rule(key=st.sampled_from(KEYS))
    def enqueue_with_a_dedup_key(self, key):
        job_id = f"x{uuid.uuid4().hex[:6]}"  # fresh: the key alone decides
        plain, sharded = self.both(lambda q: q.enqueue(job_id, 1, dedup_key=key))
        assert plain.outcome == sharded.outcome
        self.seen.add(job_id)

    @rule(ids=st.lists(st.sampled_from(IDS), min_size=1, max_size=4))
    def enqueue_many(self, ids):
        plain, sharded = self.both(lambda q: q.enqueue_many([(i, None) for i in ids]))
        assert [(r.job_id, r.outcome) for r in plain] == [(r.job_id, r.outcome) for r in sharded]
        self.seen.update(ids)

    @rule(job_id=st.sampled_from(IDS))
    def cancel(self, job_id):
        plain, sharded = self.both(lambda q: q.cancel(job_id))
        assert plain == sharded

    @rule(job_id=st.sampled_from(IDS))
    def retry(self, job_id):
        plain, sharded = self.both(lambda q: q.retry(job_id))
        assert plain == sharded

    @rule(job_id=st.sampled_from(IDS), priority=st.sampled_from([-3, 7]))
    def change_priority(self, job_id, priority):
        plain, sharded = self.both(lambda q: q.change_priority(job_id, priority))
        assert plain == sharded

    @rule(job_id=st.sampled_from(IDS))
    def promote(self, job_id):
        plain, sharded = self.both(lambda q: q.promote(job_id))
        assert plain == sharded

    @rule(job_id=st.sampled_from(IDS))
    def delete(self, job_id):
        plain, sharded = self.both(lambda q: q.delete([job_id]))
        assert plain == sharded

    @rule(fail=st.booleans())
    def workers_take_everything_runnable(self, fail):
        """Claim all that is runnable and settle it; the claimed *sets* must be equal."""

        def run(queue: Queue) -> set[str]:
            names = getattr(queue, "partition_names", [queue.name])
            done = set()
            for name in names:
                for job in self.storage.claim(name, "w", 100, 60_000).jobs:
                    if fail:
                        self.storage.fail(name, job.job_id, job.token, ERROR, permanent=True)
                    else:
                        self.storage.complete(name, job.job_id, job.token, b"1")
                    done.add(job.job_id)
            return done

        plain, sharded = self.both(run)
        assert plain == sharded

    @invariant()
    def every_job_and_count_agree(self):
        for job_id in self.seen:
            plain, sharded = self.both(lambda q, job_id=job_id: q.get_status(job_id))
            assert (plain is None) == (sharded is None), job_id
            if plain is not None:
                assert (plain.state, plain.priority, plain.attempts) == (
                    sharded.state, sharded.priority, sharded.attempts,
                ), job_id  # fmt: skip
                assert sharded.queue == self.sharded.name
        plain, sharded = self.both(lambda q: q.counts())
        assert {s: n for s, n in plain.items() if n} == {s: n for s, n in sharded.items() if n}
        dead = self.both(lambda q: {d.status.job_id for d in q.dead_letters(limit=100)})
        assert dead[0] == dead[1]


@pytest.mark.slow
def test_a_sharded_queue_answers_as_a_plain_queue(backend, request):
    clock = FakeClock()
    machine = type(f"ShardedVsPlain_{backend}", (ShardedVsPlain,),
                   {"storage": make_storage(backend, request, clock)})  # fmt: skip
    run_state_machine_as_test(machine, settings=settings(
        max_examples=EXAMPLES.get(backend, 6), stateful_step_count=20, deadline=None,
        derandomize=True, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    ))  # fmt: skip
