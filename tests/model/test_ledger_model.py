"""The outcome ledger of ``atomic=True`` handlers on Redis against a model (issue 38).

Random sequences of enqueues, runs, worker deaths (before the commit: the writes roll back; after
it: the outcome is committed, Redis never hears), lease expiries with the reaper's pass, and
deletions that free an id for a new record. After every step: no record's handler writes
committed more than once, a completed record's result is its one committed run's, and a
redelivered job whose outcome exists is never run again. Redis on a fake clock (leases expire
when the model says), the ledger on SQLite."""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import connections
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from django_jobq.job import JobOptions, NewJob
from django_jobq.models import JobOutcome
from django_jobq.states import JobState
from django_jobq.storage.redis import RedisStorage
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import execution
from tests.conftest import FakeClock

pytestmark = [pytest.mark.redis, pytest.mark.django_db(databases=["default"], transaction=True)]
IDS = ("a", "b", "c")
LEASE = 1000


class Died(Exception):  # noqa: N818 - a worker killed before its commit
    pass


class LedgerMachine(RuleBasedStateMachine):
    client = None  # set by the test
    prefix = ""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.storage = RedisStorage(self.client, prefix=self.prefix, clock=self.clock)
        self.q = f"ledger-{uuid.uuid4().hex[:10]}"
        self.gen = dict.fromkeys(IDS, 0)  # the record generation each id is at
        self.committed: dict[str, int] = {}  # "id:gen" -> runs whose writes committed
        self.calls_after_commit = 0
        self.die_next: str | None = None
        self.registry = HandlerRegistry()
        self.registry.register(self.q, self.handle, atomic=True)

    def handle(self, job):
        key = f"{self.q}/{job.id}:{job.payload['gen']}"
        if self.committed.get(key):
            self.calls_after_commit += 1
        with connections["default"].cursor() as cursor:
            cursor.execute("INSERT INTO jobq_test_effects (job_id) VALUES (%s)", [key])
        if self.die_next == "before_commit":
            raise Died("killed before the commit")
        return job.payload["gen"]

    @rule(i=st.sampled_from(IDS))
    def enqueue(self, i: str) -> None:
        if self.storage.get_record(self.q, i) is not None:
            return
        self.gen[i] += 1
        payload = json.dumps({"gen": self.gen[i]}).encode()
        self.storage.enqueue(self.q, NewJob(i, payload, JobOptions(max_stalls=100)))

    @rule(how=st.sampled_from(["ack", "before_commit", "after_commit"]))
    def run(self, how: str) -> None:
        batch = self.storage.claim(self.q, "w", 1, LEASE)
        if not batch.jobs:
            return
        claimed = batch.jobs[0]
        key = f"{self.q}/{claimed.job_id}:{self.gen[claimed.job_id]}"
        had_outcome = bool(self.committed.get(key))  # the model's word, not the ledger's
        self.die_next = how
        try:
            ack = execution.execute(claimed, self.registry, storage=self.storage)
        finally:
            self.die_next = None
        if how == "before_commit" and not had_outcome:
            assert ack.kind == "fail"  # its writes rolled back; the worker is dead: not sent
            return
        assert ack.kind == "complete"
        if not had_outcome:
            self.committed[key] = self.committed.get(key, 0) + 1
        if how == "ack":
            self.storage.ack_many(self.q, [ack])

    @rule()
    def leases_expire(self) -> None:
        self.clock.advance(LEASE + 1)
        self.storage.reap(self.q)

    @rule(i=st.sampled_from(IDS))
    def delete_finished(self, i: str) -> None:
        self.storage.delete_finished(self.q, [i])

    @invariant()
    def each_record_committed_once(self) -> None:
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "SELECT job_id, COUNT(*) FROM jobq_test_effects WHERE job_id LIKE %s"
                " GROUP BY job_id",
                [f"{self.q}/%"],
            )
            rows = dict(cursor.fetchall())
        assert all(n == 1 for n in rows.values()), rows
        assert self.calls_after_commit == 0
        assert all(n == 1 for n in self.committed.values()), self.committed
        # one ledger row per record that committed (none for rolled-back runs)
        rows = JobOutcome.objects.using("default").filter(queue=self.q).count()
        assert rows == len(self.committed)

    @invariant()
    def completed_records_carry_their_committed_result(self) -> None:
        for i in IDS:
            record = self.storage.get_record(self.q, i)
            if record is not None and record.state is JobState.COMPLETED:
                assert json.loads(record.result) == self.gen[i]
                assert self.committed.get(f"{self.q}/{i}:{self.gen[i]}") == 1


def test_the_ledger_agrees_with_the_model(redis_client, redis_prefix):
    with connections["default"].cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS jobq_test_effects")
        cursor.execute("CREATE TABLE jobq_test_effects (job_id varchar(160) NOT NULL)")
    machine = type(
        "LedgerMachine_redis", (LedgerMachine,), {"client": redis_client, "prefix": redis_prefix}
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=25,
            stateful_step_count=30,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),  # fmt: skip
    )
