"""Broadcasts end to end: the ``Broadcast`` API and ``SubscriberWorker`` on every backend."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections import Counter

import pytest

from django_jobq import InvalidJobId, InvalidOption, PayloadTooLarge, PermanentError
from django_jobq.broadcast import Broadcast, Subscription, subscriber
from django_jobq.broadcast.core import SubscriberRegistry
from django_jobq.broadcast.subscribers import SubscriberWorker
from django_jobq.errors import ConfigurationError

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

    from django_jobq.models.broadcasts import BroadcastDelivery
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


@pytest.mark.postgres
@pytest.mark.django_db(databases=["pg"], transaction=True)
def test_a_publish_racing_one_of_the_same_id_is_a_duplicate():
    """PostgreSQL's single-statement publish checks for the id in its snapshot: a concurrent
    publish of the same id that commits while this one waits for the counter row makes its
    insert fail, and the full path then finds the message: a duplicate, never an error and
    never two messages. The concurrent publisher is played by a transaction that holds the
    counter row and inserts the message."""
    from django.db import connections, transaction

    from django_jobq.models.broadcasts import BroadcastLog, BroadcastMessage
    from django_jobq.storage.database import DatabaseStorage

    name = "tests-bc-race"
    BroadcastMessage.objects.using("pg").filter(broadcast=name).delete()  # an earlier run's
    BroadcastLog.objects.using("pg").filter(name=name).delete()
    bc = Broadcast(name, storage=DatabaseStorage("pg"))
    bc.publish(1, id="first")  # the counter row exists: the next publish takes the fast path
    locked, release, outcome = threading.Event(), threading.Event(), []

    def rival():
        with transaction.atomic(using="pg"):
            log = BroadcastLog.objects.using("pg").select_for_update().get(name=name)
            log.last_seq += 1
            log.save(update_fields=["last_seq"])
            BroadcastMessage.objects.using("pg").create(
                broadcast=name, seq=log.last_seq, message_id="m", payload=b"2",
                content_type="json", published_at=int(time.time() * 1000),
            )  # fmt: skip
            locked.set()
            release.wait(20)
        connections["pg"].close()

    def publisher():
        try:
            outcome.append(bc.publish(3, id="m"))
        finally:
            connections["pg"].close()

    holder = threading.Thread(target=rival)
    holder.start()
    assert locked.wait(10)
    racer = threading.Thread(target=publisher)
    racer.start()

    def publish_waits_on_the_lock() -> bool:
        with connections["pg"].cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            )
            return cursor.fetchone()[0] > 0

    assert wait_until(publish_waits_on_the_lock, 10)
    release.set()
    holder.join(10)
    racer.join(10)
    assert [(p.outcome, p.position) for p in outcome] == [("duplicate", "2")]
    assert bc.length() == 2
    assert bc.decode(*_payload(name, "m")) == 2


def _payload(name: str, message_id: str) -> tuple[bytes, str]:
    from django_jobq.models.broadcasts import BroadcastMessage

    row = BroadcastMessage.objects.using("pg").get(broadcast=name, message_id=message_id)
    return bytes(row.payload), row.content_type


def test_a_worker_logs_when_its_group_falls_behind_the_retention(monkeypatch, caplog):
    from django_jobq.broadcast import subscribers as module
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
    from django.core.management import CommandError

    from django_jobq.management.commands.runworker import Command

    options = {"subscriber": None, "concurrency": 2, "lease": None, "grace": None,
               "worker_id": None, "pool": "process"}  # fmt: skip
    every = Command()._subscribers({**options, "queues": []})
    assert every is not None and every.pool == "process"
    assert {s.label for s in every.subscriptions} >= {"tests-bcast:alpha", "tests-bcast:beta"}
    assert Command()._subscribers({**options, "queues": ["tests-echo"]}) is None
    one = Command()._subscribers({**options, "queues": [], "subscriber": ["tests-bcast:beta"]})
    assert [s.label for s in one.subscriptions] == ["tests-bcast:beta"]
    # tests-bcast-hard:hung has a hard_timeout: the thread pool cannot serve it, as for jobs.
    with pytest.raises(CommandError, match="hard_timeout"):
        Command()._subscribers({**options, "queues": [], "pool": "thread"})


# -- idle waits: an event, not a timer ------------------------------------------------------
# idle_timeout=3600: a worker that found its work by a timer would handle nothing within the
# waits below; every backend must wake it on the publish itself (SQLite: a bounded poll).


def test_an_idle_subscriber_wakes_on_a_publish_not_a_timer(live_storage, run):
    bc = Broadcast(NAME, storage=live_storage)
    rec = Recorder()
    worker = run(sub("g", rec), idle_timeout=3600)
    for i in range(3):  # each time from an idle wait (not from the claims before it)
        assert wait_until(worker.idle.is_set, 20)
        bc.publish(i, id=f"m{i}")
        assert wait_until(lambda i=i: bc.delivery("g", f"m{i}").state == "done", 20)
    assert rec.handled("g") == Counter(["m0", "m1", "m2"])


def test_one_idle_wait_covers_every_broadcast_the_worker_serves(live_storage, run):
    other = Broadcast(f"{NAME}-2", storage=live_storage)
    rec = Recorder()
    worker = run(sub("g", rec), Subscription(other.name, "g", rec, start="earliest"),
                 idle_timeout=3600)  # fmt: skip
    assert wait_until(worker.idle.is_set, 20)
    other.publish(1, id="second")
    assert wait_until(lambda: other.delivery("g", "second").state == "done", 20)
    assert rec.handled("g") == Counter(["second"])


def test_a_dead_letter_sent_back_wakes_an_idle_subscriber(live_storage, run):
    bc = Broadcast(NAME, storage=live_storage)
    calls: list[str] = []

    def first_time_fails(job):
        calls.append(job.id)
        if len(calls) == 1:
            raise PermanentError("not yet")

    worker = run(sub("g", first_time_fails), idle_timeout=3600)
    bc.publish(1, id="m")
    assert wait_until(lambda: bc.delivery("g", "m").state == "dead", 20)
    assert wait_until(worker.idle.is_set, 20)
    assert bc.retry_dead("g") == 1
    assert wait_until(lambda: bc.delivery("g", "m").state == "done", 20)
    assert calls == ["m", "m"]


def test_stop_interrupts_an_idle_wait(live_storage):
    worker = SubscriberWorker([sub("g", Recorder())], storage=live_storage, idle_timeout=3600,
                              grace=1)  # fmt: skip
    worker.start()
    assert wait_until(worker.idle.is_set, 20)
    worker.stop()
    assert worker.stopped.wait(30)


# -- timeouts, registry, counters -----------------------------------------------------------


def test_a_subscriber_past_its_timeout_is_asked_to_stop_and_retried(live_storage, run):
    bc = Broadcast(NAME, storage=live_storage)
    seen: list[tuple[int, bool]] = []

    def stubborn(job):
        if job.attempt == 1:
            seen.append((1, job.cancel_event.wait(60)))  # only the timeout sets it
            raise RuntimeError("stopped")
        seen.append((job.attempt, job.is_cancelled()))

    run(sub("g", stubborn, timeout=0.2, max_attempts=2))
    bc.publish(1, id="m")
    assert wait_until(lambda: bc.delivery("g", "m").state == "done", 30)
    assert seen == [(1, True), (2, False)]


def test_an_async_subscriber_past_its_timeout_is_cancelled(live_storage, run):
    import asyncio

    bc = Broadcast(NAME, storage=live_storage)
    attempts: list[int] = []

    async def forever(job):
        attempts.append(job.attempt)
        if job.attempt == 1:
            await asyncio.Event().wait()  # never set: only the timeout ends it

    run(sub("g", forever, timeout=0.2, max_attempts=2))
    bc.publish(1, id="m")
    assert wait_until(lambda: bc.delivery("g", "m").state == "done", 30)
    assert attempts == [1, 2]


def test_the_decorator_refuses_a_bad_timeout():
    for bad in (0, -1, "5", True):
        with pytest.raises(InvalidOption):
            subscriber(NAME, group="g", timeout=bad)(print)
        with pytest.raises(InvalidOption):
            subscriber(NAME, group="g", hard_timeout=bad)(print)


def test_the_thread_pool_refuses_a_subscriber_with_a_hard_timeout(live_storage):
    with pytest.raises(ConfigurationError, match="hard_timeout"):
        SubscriberWorker([sub("g", print, hard_timeout=1.0)], storage=live_storage)
    with pytest.raises(InvalidOption):
        SubscriberWorker([sub("g", print)], storage=live_storage, pool="fork")


@pytest.mark.parametrize("coroutine", [True, False], ids=["async-def", "plain"])
def test_the_async_pool_cancels_a_subscriber_at_its_hard_timeout(live_storage, run, coroutine):
    """A handler that never returns by itself on attempt 1 is cancelled at its hard timeout
    (a plain one runs in the loop's thread pool and sees ``job.is_cancelled()``), and its
    attempt fails with HardTimeout; another group on the same worker handles the message."""
    import asyncio

    bc = Broadcast(NAME, storage=live_storage)
    attempts: list[int] = []
    other = Recorder()

    async def forever(job):
        attempts.append(job.attempt)
        if job.attempt == 1:
            await asyncio.Event().wait()  # never set: only the hard timeout ends it

    def stubborn(job):
        attempts.append(job.attempt)
        if job.attempt == 1:
            job.cancel_event.wait(60)  # set when the task is cancelled

    handler = forever if coroutine else stubborn
    run(sub("g", handler, hard_timeout=0.2, max_attempts=2), sub("other", other), pool="async")
    bc.publish(1, id="m")
    assert wait_until(lambda: bc.delivery("g", "m").state == "done", 30), bc.status()
    assert attempts == [1, 2]
    assert wait_until(lambda: bc.delivery("other", "m").state == "done", 30)
    assert other.handled("other") == Counter({"m": 1})


def test_the_async_pool_makes_a_dead_letter_at_the_last_attempt(live_storage, run):
    import asyncio

    bc = Broadcast(NAME, storage=live_storage)

    async def forever(job):
        await asyncio.Event().wait()

    run(sub("g", forever, hard_timeout=0.2, max_attempts=2), pool="async")
    bc.publish(1, id="m")
    assert wait_until(lambda: bc.delivery("g", "m").state == "dead", 30), bc.status()
    [dead] = bc.dead_letters("g")
    assert dead.attempts == 2 and json.loads(dead.error)["type"].endswith(".HardTimeout")


def test_a_subscriber_worker_is_listed_with_its_groups_and_counts(live_storage, run):
    bc = Broadcast(NAME, storage=live_storage)
    worker = run(sub("billing", Recorder()), sub("search", Recorder(fail_first=9),
                                                 max_attempts=1))  # fmt: skip

    def record():
        found = [w for w in live_storage.list_workers() if w.worker_id == worker.worker_id]
        return found[0].info if found else None

    assert wait_until(lambda: record() is not None, 20)
    assert record()["groups"] == [f"{NAME}:billing", f"{NAME}:search"]
    bc.publish(1, id="m")
    assert wait_until(lambda: worker.stats["completed"] == 1 and worker.stats["dead"] == 1, 20)
    worker.stop()
    assert worker.stopped.wait(20)
    assert record() is None  # deregistered at shutdown


def test_a_worker_that_died_mid_message_is_redelivered_to_its_group_only(live_storage, run):
    """The in-process form of the SIGKILL test (which needs a backend shared between
    processes, so not memory): a consumer claims and vanishes (no verdict, no heartbeat); a
    live worker of its group gets the messages once the lease lapses; the other group handles
    each message once; nothing is lost."""
    bc = Broadcast(NAME, storage=live_storage)
    bc.subscribe("alpha", start="earliest")
    bc.subscribe("beta", start="earliest")
    ids = [f"k{i}" for i in range(6)]
    bc.publish_many([(i, i) for i in ids])
    held = bc.store.claim(NAME, "alpha", "dead-worker", 2, 300, 3)  # never settled
    assert [d.message_id for d in held] == ids[:2]
    rec = Recorder()
    run(sub("alpha", rec, max_stalls=3), sub("beta", rec, max_stalls=3), lease=2000)
    assert wait_until(lambda: len(rec.calls) == 12 and settled(bc), 30)
    assert rec.handled("alpha") == Counter(ids) == rec.handled("beta")
    assert {(s.group, s.dead, s.missed) for s in bc.status()} == {("alpha", 0, 0), ("beta", 0, 0)}
