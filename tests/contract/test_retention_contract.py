"""Per-queue retention of finished jobs (``Storage.set_retention``), on every backend with the
fake clock: keep the newest ``count`` records of a final state and none older than ``age``.

Redis and memory apply the count in the step that finishes a job (a bounded few per step) and
the age in the reaper pass; the database backend applies both in the reaper pass. So every
check below runs ``reap`` first; the Redis/memory-only tests say so in their names."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)

from django_jobq.job import EnqueueOutcome, Keep, Retention, RetryOutcome
from django_jobq.states import JobState
from tests.conftest import DB_ALIASES, FakeClock, make_storage

from .test_scheduling_contract import claim_one, job

Q = "keep-q"
ERROR = b'{"type": "ValueError", "message": "boom"}'


def finish(storage, clock, job_id: str, state: str = "completed", queue: str = Q) -> None:
    """Enqueue ``job_id`` and take it to ``state``, 10 ms after the previous finish."""
    clock.advance(10)
    storage.enqueue(queue, job(job_id, max_attempts=1))
    if state == "cancelled":
        storage.cancel(queue, job_id)
        return
    claimed = claim_one(storage, queue)
    assert claimed.job_id == job_id
    if state == "completed":
        storage.complete(queue, job_id, claimed.token, b"1")
    else:
        storage.fail(queue, job_id, claimed.token, ERROR, permanent=True)


def kept(storage, ids, queue: str = Q) -> list[str]:
    return [job_id for job_id in ids if storage.get_record(queue, job_id) is not None]


def test_the_policy_is_stored_per_queue_and_can_be_removed(storage):
    policy = Retention(completed=Keep(count=5), failed=Keep(age=60_000))
    storage.set_retention(Q, policy)
    assert storage.get_retention(Q) == policy
    assert storage.get_retention("other-q") == Retention()
    storage.set_retention(Q, None)
    assert storage.get_retention(Q) == Retention()


def test_completed_records_past_the_count_are_removed_oldest_first(storage, clock):
    storage.set_retention(Q, Retention(completed=Keep(count=3)))
    ids = [f"c{i}" for i in range(6)]
    for job_id in ids:
        finish(storage, clock, job_id)
    storage.reap(Q)
    assert kept(storage, ids) == ["c3", "c4", "c5"]


def test_each_final_state_keeps_its_own_count(storage, clock):
    storage.set_retention(
        Q, Retention(completed=Keep(count=1), failed=Keep(count=2), cancelled=Keep(count=1))
    )
    for i in range(3):
        finish(storage, clock, f"ok{i}", "completed")
        finish(storage, clock, f"bad{i}", "failed")
        finish(storage, clock, f"off{i}", "cancelled")
    storage.reap(Q)
    every = [f"{p}{i}" for p in ("ok", "bad", "off") for i in range(3)]
    assert kept(storage, every) == ["ok2", "bad1", "bad2", "off2"]


def test_a_state_without_a_policy_keeps_its_records(storage, clock):
    storage.set_retention(Q, Retention(failed=Keep(count=1)))
    for i in range(4):
        finish(storage, clock, f"c{i}")
    storage.reap(Q)
    assert kept(storage, [f"c{i}" for i in range(4)]) == ["c0", "c1", "c2", "c3"]


def test_records_older_than_the_age_go_in_the_reaper_pass(storage, clock):
    storage.set_retention(Q, Retention(completed=Keep(age=1_000)))
    finish(storage, clock, "old1")
    finish(storage, clock, "old2")
    clock.advance(995)  # old2 finished 995 ms ago, old1 1,005 ms ago
    finish(storage, clock, "new")  # +10: old2 is now 1,005 ms old too
    report = storage.reap(Q)
    assert kept(storage, ["old1", "old2", "new"]) == ["new"]
    assert report.removed <= 2  # Redis and memory may have removed some when "new" finished


def test_count_and_age_together_keep_the_stricter(storage, clock):
    storage.set_retention(Q, Retention(completed=Keep(count=3, age=1_000)))
    for job_id in ("a", "b", "c"):
        finish(storage, clock, job_id)
    clock.advance(2_000)
    finish(storage, clock, "d")
    storage.reap(Q)
    assert kept(storage, ["a", "b", "c", "d"]) == ["d"]


def test_a_removed_id_is_free_again(storage, clock):
    storage.set_retention(Q, Retention(completed=Keep(count=1)))
    finish(storage, clock, "a")
    finish(storage, clock, "b")
    storage.reap(Q)
    assert storage.get_record(Q, "a") is None
    again = storage.enqueue(Q, job("a"))
    assert again.outcome is EnqueueOutcome.QUEUED
    assert storage.get_record(Q, "a").state is JobState.QUEUED


def test_a_kept_id_stays_deduplicated(storage, clock):
    storage.set_retention(Q, Retention(completed=Keep(count=5)))
    finish(storage, clock, "a")
    storage.reap(Q)
    assert storage.enqueue(Q, job("a")).outcome is EnqueueOutcome.COMPLETED


def test_a_throttle_key_of_a_removed_holder_is_free_as_after_its_expiry(storage, clock):
    """Retention ends a record's life early and nothing more: a dedup key whose holder is
    gone is free on every backend, whatever removed the holder (its TTL, ``clean`` or
    retention); the id is free too."""
    storage.set_retention(Q, Retention(completed=Keep(count=1)))
    clock.advance(10)
    storage.enqueue(Q, job("t1", dedup=("k", "throttle", 60_000)))
    storage.complete(Q, "t1", claim_one(storage, Q).token, b"1")
    assert storage.enqueue(Q, job("t2", dedup=("k", "throttle", 60_000))).job_id == "t1"
    finish(storage, clock, "other")  # t1 falls out of the count
    storage.reap(Q)
    assert storage.get_record(Q, "t1") is None
    third = storage.enqueue(Q, job("t3", dedup=("k", "throttle", 60_000)))
    assert (third.outcome, third.job_id) == (EnqueueOutcome.QUEUED, "t3")


def test_removed_failed_jobs_leave_the_dead_letter_list(storage, clock):
    storage.set_retention(Q, Retention(failed=Keep(count=2)))
    for i in range(4):
        finish(storage, clock, f"f{i}", "failed")
    storage.reap(Q)
    assert [d.job_id for d in storage.dead_letters(Q)] == ["f3", "f2"]
    assert storage.count_dead(Q) == 2


def test_a_retried_job_is_not_removed_while_it_runs_again(storage, clock):
    storage.set_retention(Q, Retention(failed=Keep(count=2)))
    finish(storage, clock, "a", "failed")
    finish(storage, clock, "b", "failed")
    assert storage.retry(Q, "a") is RetryOutcome.RETRIED
    running = claim_one(storage, Q)
    finish(storage, clock, "x", "failed")
    finish(storage, clock, "y", "failed")
    storage.reap(Q)
    assert storage.get_record(Q, "a").state is JobState.ACTIVE
    assert kept(storage, ["b", "x", "y"]) == ["x", "y"]
    clock.advance(10)
    storage.fail(Q, "a", running.token, ERROR, permanent=True)
    storage.reap(Q)
    assert kept(storage, ["a", "x", "y"]) == ["a", "y"]


def test_a_stricter_policy_removes_the_backlog_in_bounded_reaper_passes(storage, clock):
    storage.set_retention(Q, Retention(completed=Keep(count=100)))
    ids = [f"c{i:02d}" for i in range(12)]
    for job_id in ids:
        finish(storage, clock, job_id)
    storage.set_retention(Q, Retention(completed=Keep(count=2)))
    first = storage.reap(Q, limit=4)
    assert first.removed == 4
    while storage.reap(Q, limit=4).removed:
        pass
    assert kept(storage, ids) == ["c10", "c11"]


def test_removing_the_policy_keeps_records_from_then_on(storage, clock):
    storage.set_retention(Q, Retention(completed=Keep(count=1)))
    finish(storage, clock, "a")
    storage.set_retention(Q, None)
    for job_id in ("b", "c"):
        finish(storage, clock, job_id)
    storage.reap(Q)
    assert kept(storage, ["a", "b", "c"]) == ["a", "b", "c"]


def test_redis_and_memory_trim_the_count_as_jobs_finish(storage, clock, backend):
    if backend in DB_ALIASES:
        pytest.skip("the database backend applies retention in the reaper pass only")
    storage.set_retention(Q, Retention(completed=Keep(count=2)))
    for job_id in ("a", "b", "c", "d"):
        finish(storage, clock, job_id)
    assert kept(storage, ["a", "b", "c", "d"]) == ["c", "d"]
    removed = [e.job_id for e in storage.read_events(Q) if e.kind == "removed"]
    assert removed == ["a", "b"]


def test_a_batch_of_completions_is_trimmed_in_its_own_step(storage, clock, backend):
    if backend in DB_ALIASES:
        pytest.skip("the database backend applies retention in the reaper pass only")
    from django_jobq.storage.base import Ack

    storage.set_retention(Q, Retention(completed=Keep(count=3)))
    ids = [f"b{i}" for i in range(8)]
    for job_id in ids:
        storage.enqueue(Q, job(job_id))
    claimed = storage.claim(Q, "w1", 8, 30_000).jobs
    clock.advance(10)
    storage.ack_many(Q, [Ack("complete", c.job_id, c.token, b"1") for c in claimed])
    assert kept(storage, ids) == ["b5", "b6", "b7"]


# -- the property: after any sequence of finishes, the kept set is exactly the policy's ------

STATES = ("completed", "failed", "cancelled")
EXAMPLES = {"memory": 60, "redis": 25, "redis-cluster": 10, "sqlite": 8, "postgres": 6}


class RetentionMachine(RuleBasedStateMachine):
    """Sets a random policy, then finishes jobs in random final states with random gaps and
    runs reaper passes; after every pass each state's records must be exactly the newest
    ``count`` of those finished within ``age``. Redis and memory must also hold the count
    after every finish."""

    storage: Any
    clock: FakeClock
    trims_on_finish: bool

    def __init__(self) -> None:
        super().__init__()
        self.q = f"keep-{uuid.uuid4().hex[:8]}"
        self.finished: dict[str, list[tuple[str, int]]] = {s: [] for s in STATES}
        self.n = 0
        self.policy = Retention()

    @initialize(
        counts=st.tuples(*[st.none() | st.integers(1, 4) for _ in STATES]),
        ages=st.tuples(*[st.none() | st.sampled_from([50, 200]) for _ in STATES]),
    )
    def set_policy(self, counts, ages) -> None:
        keeps = {
            s: Keep(c, a) if (c or a) else None
            for s, c, a in zip(STATES, counts, ages, strict=True)
        }
        self.policy = Retention(**keeps)
        self.storage.set_retention(self.q, self.policy)

    @rule(state=st.sampled_from(STATES), gap=st.sampled_from([1, 10, 60]))
    def finish_one(self, state: str, gap: int) -> None:
        self.n += 1
        job_id = f"j{self.n}"
        self.clock.advance(gap)
        finish(self.storage, self.clock, job_id, state, queue=self.q)
        self.finished[state].append((job_id, self.clock()))
        keep = getattr(self.policy, state)
        if self.trims_on_finish and keep is not None and keep.count is not None:
            ids = [j for j, _ in self.finished[state]]
            assert len(kept(self.storage, ids, self.q)) <= keep.count

    @rule(gap=st.sampled_from([0, 100]))
    def reap(self, gap: int) -> None:
        self.clock.advance(gap)
        self.storage.reap(self.q)
        now = self.clock()
        for state in STATES:
            ids = [j for j, _ in self.finished[state]]
            keep = getattr(self.policy, state)
            if keep is None:
                wanted = ids  # no policy: kept until their result_ttl
            else:
                recent = [j for j, t in self.finished[state]
                          if keep.age is None or t > now - keep.age]  # fmt: skip
                wanted = recent[-keep.count :] if keep.count else recent
            got = kept(self.storage, ids, self.q)
            assert got == wanted, f"{state} under {keep}: kept {got}, want {wanted}"


@pytest.mark.slow
def test_the_kept_set_is_exactly_the_newest_within_the_policy(backend, request):
    clock = FakeClock()
    machine = type(
        f"RetentionMachine_{backend}",
        (RetentionMachine,),
        {
            "storage": make_storage(backend, request, clock),
            "clock": clock,
            "trims_on_finish": backend not in DB_ALIASES,
        },
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=EXAMPLES.get(backend, 8),
            stateful_step_count=25,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
