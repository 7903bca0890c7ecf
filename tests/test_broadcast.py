"""Broadcasts end to end: the ``Broadcast`` API and ``SubscriberWorker`` on every backend."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections import Counter

import pytest

from django_jobq import InvalidJobId, InvalidOption, PayloadTooLarge, PermanentError
from django_jobq.broadcast import Broadcast, SubscriberRegistry, Subscription, subscriber
from django_jobq.errors import ConfigurationError
from django_jobq.subscribers import SubscriberWorker

from .helpers import wait_until

NAME = "tests-bc"


class Recorder:
    """A handler that records (group, message id, attempt) of every call."""

    def __init__(self, fail_first: int = 0, error: type[Exception] = RuntimeError) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()
        self.fail_first = fail_first
        self.error = error

    def __call__(self, job):
        with self.lock:
            self.calls.append((job.meta["group"], job.id, job.attempt))
        if job.attempt <= self.fail_first:
            raise self.error(f"attempt {job.attempt} fails")
        return None

    def handled(self, group: str) -> Counter:
        with self.lock:
            return Counter(i for g, i, _ in self.calls if g == group)


@pytest.fixture
def run(live_storage):
    workers: list[SubscriberWorker] = []

    def start(*subs: Subscription, **kwargs) -> SubscriberWorker:
        options = {"lease": 5000, "grace": 1, "concurrency": 4, **kwargs}
        worker = SubscriberWorker(subs, storage=live_storage, **options)
        worker.start()
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop(hurry=True)
        assert worker.stopped.wait(20)


def sub(group: str, func, **kw) -> Subscription:
    return Subscription(NAME, group, func, start="earliest", min_backoff=0, max_backoff=0, **kw)


def settled(bc: Broadcast) -> bool:
    return all(s.lag == 0 and s.pending == 0 for s in bc.status())


def test_every_group_handles_every_message_once(live_storage, run):
    bc = Broadcast(NAME, storage=live_storage)
    rec = Recorder()
    run(sub("billing", rec), sub("search", rec))
    ids = [f"u{i}" for i in range(20)]
    bc.publish_many([(i, {"user": i}) for i in ids])
    assert wait_until(lambda: len(rec.calls) == 40 and settled(bc), 30)
    assert rec.handled("billing") == Counter(ids) == rec.handled("search")


def test_workers_of_one_group_share_its_messages(live_storage, run):
    bc = Broadcast(NAME, storage=live_storage)
    rec = Recorder()
    run(sub("billing", rec), concurrency=2)
    run(sub("billing", rec), concurrency=2)
    ids = [f"u{i}" for i in range(30)]
    bc.publish_many([(i, i) for i in ids])
    assert wait_until(lambda: len(rec.calls) == 30 and settled(bc), 30)
    assert rec.handled("billing") == Counter(ids)


def test_a_failing_handler_is_retried_with_the_next_attempt_number(live_storage, run):
    bc = Broadcast(NAME, storage=live_storage)
    rec = Recorder(fail_first=2)
    run(sub("g", rec, max_attempts=3))
    bc.publish({"x": 1}, id="m")
    assert wait_until(lambda: bc.delivery("g", "m").state == "done", 30)
    assert [a for _, _, a in rec.calls] == [1, 2, 3]
    assert bc.dead_letters("g") == []


def test_attempts_used_up_or_permanent_errors_make_dead_letters(live_storage, run):
    bc = Broadcast(NAME, storage=live_storage)
    run(sub("flaky", Recorder(fail_first=9), max_attempts=2),
        sub("strict", Recorder(fail_first=9, error=PermanentError), max_attempts=5))  # fmt: skip
    bc.publish(1, id="m")
    assert wait_until(lambda: {s.group: s.dead for s in bc.status()} == {"flaky": 1, "strict": 1})
    (flaky,) = bc.dead_letters("flaky")
    (strict,) = bc.dead_letters("strict")
    assert (flaky.message_id, flaky.attempts) == ("m", 2)
    assert (strict.attempts, json.loads(strict.error)["type"]) == (
        1,
        "django_jobq.errors.PermanentError",
    )


def test_progress_is_stored_with_the_delivery(live_storage, run):
    bc = Broadcast(NAME, storage=live_storage)
    release = threading.Event()

    def slow(job):
        job.set_progress({"step": 1})
        release.wait(10)

    run(sub("g", slow))
    bc.publish(1, id="m")
    assert wait_until(lambda: bc.delivery("g", "m").progress is not None, 10)
    assert json.loads(bc.delivery("g", "m").progress) == {"step": 1}
    release.set()
    assert wait_until(lambda: bc.delivery("g", "m").state == "done", 10)


def test_a_stopped_worker_hands_back_what_it_did_not_finish(live_storage, run):
    bc = Broadcast(NAME, storage=live_storage)
    started, release = threading.Event(), threading.Event()

    def blocked(job):
        started.set()
        release.wait(10)
        raise RuntimeError("stopped") if job.is_cancelled() else None

    worker = run(sub("g", blocked), grace=0)
    bc.publish(1, id="m")
    assert started.wait(10)
    worker.stop()
    assert worker.stopped.wait(10)
    assert bc.delivery("g", "m").state == "retrying"  # released at once, no attempt used
    release.set()
    rec = Recorder()
    run(sub("g", rec))
    assert wait_until(lambda: bc.delivery("g", "m").state == "done", 10)
    assert rec.calls == [("g", "m", 1)]


def test_publish_validates_ids_payloads_and_options(live_storage):
    bc = Broadcast(NAME, storage=live_storage, max_payload_bytes=10)
    with pytest.raises(InvalidJobId):
        bc.publish(1, id="no spaces")
    with pytest.raises(PayloadTooLarge):
        bc.publish("x" * 20, id="big")
    with pytest.raises(InvalidOption):
        bc.subscribe("g", start="yesterday")
    with pytest.raises(InvalidOption):
        Broadcast(NAME, storage=live_storage, maxlen=0)
    assert bc.length() == 0  # nothing was stored by the refused calls
    assert bc.subscribe("g", start=dt.datetime.now(dt.UTC)) is True


def test_publish_without_an_id_is_never_a_duplicate(live_storage):
    bc = Broadcast(NAME, storage=live_storage)
    first, second = bc.publish(1), bc.publish(1)
    assert first.message_id != second.message_id
    assert bc.publish(1, id=first.message_id).outcome == "duplicate"


def test_a_group_has_one_handler():
    registry = SubscriberRegistry()
    registry.register(Subscription(NAME, "g", print))
    with pytest.raises(ConfigurationError):
        registry.register(Subscription(NAME, "g", len))
    assert [s.label for s in registry.select([NAME])] == [f"{NAME}:g"]
    with pytest.raises(ConfigurationError):
        registry.select(["nobody:g"])


def test_the_decorator_validates_its_options():
    with pytest.raises(InvalidOption):
        subscriber(NAME, group="g", max_attempts=0)(print)


@pytest.mark.postgres
@pytest.mark.django_db(databases=["pg"], transaction=True)
def test_a_verdict_waits_for_a_row_another_transaction_holds():
    """A heartbeat holding a delivery's row for a moment must not turn a verdict into a lost
    lease (the verdict waits for the row; it does not skip it)."""
    from django.db import connections, transaction

    from django_jobq.broadcast_models import BroadcastDelivery
    from django_jobq.storage.broadcast_base import Settle, SettleKind
    from django_jobq.storage.database import DatabaseStorage

    store = DatabaseStorage("pg").broadcasts()
    bc = Broadcast(NAME, storage=DatabaseStorage("pg"))
    bc.subscribe("g", start="earliest")
    bc.publish(1, id="m")
    (d,) = store.claim(NAME, "g", "w1", 1, 5000, 1)
    locked, release, outcome = threading.Event(), threading.Event(), []

    def hold_row():
        with transaction.atomic(using="pg"):
            BroadcastDelivery.objects.using("pg").select_for_update().get(message_id="m")
            locked.set()
            release.wait(20)
        connections["pg"].close()

    def settle():
        outcome.extend(store.settle(NAME, "g", [Settle(SettleKind.COMPLETE, d.position, d.token)]))
        connections["pg"].close()

    holder = threading.Thread(target=hold_row)
    holder.start()
    assert locked.wait(10)
    settler = threading.Thread(target=settle)
    settler.start()

    def settle_waits_on_the_lock() -> bool:
        with connections["pg"].cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            )
            return cursor.fetchone()[0] > 0 or bool(outcome)

    assert wait_until(settle_waits_on_the_lock, 10)
    release.set()
    holder.join(10)
    settler.join(10)
    assert [str(o) for o in outcome] == ["completed"]


def test_a_worker_logs_when_its_group_falls_behind_the_retention(monkeypatch, caplog):
    from django_jobq import subscribers as module
    from django_jobq.storage.memory import MemoryStorage

    monkeypatch.setattr(module, "MISSED_CHECK", 0)
    storage = MemoryStorage()
    bc = Broadcast(NAME, storage=storage, maxlen=2)
    release = threading.Event()
    worker = SubscriberWorker([sub("slow", lambda job: release.wait(10))], storage=storage,
                              concurrency=1, lease=300, grace=0)  # fmt: skip
    worker.start()
    try:
        bc.publish_many([(f"m{i}", i) for i in range(6)])  # 4 dropped before "slow" read them
        assert wait_until(lambda: "fell behind the retention" in caplog.text, 10)
        assert {s.group: s.missed for s in bc.status()}["slow"] >= 3
    finally:
        release.set()
        worker.stop(hurry=True)
        assert worker.stopped.wait(10)


def test_runworker_refuses_an_unknown_subscriber():
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="no subscriber registered for 'nobody'"):
        call_command("runworker", "--subscriber", "nobody")


def test_runworker_serves_every_subscriber_only_when_no_queue_is_named():
    from django_jobq.management.commands.runworker import Command

    options = {"subscriber": None, "concurrency": 2, "lease": None, "grace": None,
               "worker_id": None}  # fmt: skip
    every = Command()._subscribers({**options, "queues": []})
    assert every is not None
    assert {s.label for s in every.subscriptions} >= {"tests-bcast:alpha", "tests-bcast:beta"}
    assert Command()._subscribers({**options, "queues": ["tests-echo"]}) is None
    one = Command()._subscribers({**options, "queues": [], "subscriber": ["tests-bcast:beta"]})
    assert [s.label for s in one.subscriptions] == ["tests-bcast:beta"]
