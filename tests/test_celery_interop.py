"""Celery interoperability against the real RabbitMQ (and kombu's Redis transport): a real
Celery app sends tasks that django_jobq runs, django_jobq publishes tasks that a real Celery
worker runs, results cross over through Celery's Redis result backend, and a bridge killed
mid-stream loses nothing."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings
from kombu import Connection, Exchange, Producer
from kombu import Queue as KombuQueue

from django_jobq import JobState
from django_jobq.conf import jobq_settings
from django_jobq.contrib.celery import MalformedMessage, parse, publish
from django_jobq.contrib.celery.bridge import KombuBridge, bridge_thread
from django_jobq.contrib.celery.protocol import build, job_id_for
from django_jobq.queue import Queue
from django_jobq.storage.redis.storage import RedisStorage
from django_jobq.worker import Worker

from .celery_app import make_app
from .helpers import ROOT, Spawner, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.rabbitmq]

AMQP = "amqp://guest:guest@127.0.0.1:5672//"
# The suite's own Redis (tests/settings.py: JOBQ_TEST_REDIS_URL), for kombu's Redis transport
# and Celery's result backend alike.
REDIS_TRANSPORT = settings.REDIS_URL


def celery_conf(**overrides):
    base = {**jobq_settings()["CELERY"], "RESULT_BACKEND": REDIS_TRANSPORT}
    return override_settings(JOBQ={**_user_jobq(), "CELERY": {**base, **overrides}})


def _user_jobq():
    return dict(settings.JOBQ)


@pytest.fixture
def celery_queue():
    """A Celery queue of this test's own, deleted (with its exchange) afterwards."""
    name = f"jobqtest-{uuid.uuid4().hex[:10]}"
    yield name
    for url in (AMQP, REDIS_TRANSPORT):
        try:
            with Connection(url) as conn:
                channel = conn.default_channel
                channel.queue_delete(name)
                if url == AMQP:
                    channel.exchange_delete(name)
        except Exception as exc:  # noqa: BLE001 - nothing to delete on that broker
            print(f"cleanup of {name} on {url}: {exc}")


@pytest.fixture
def storage(redis_client, redis_prefix):
    return RedisStorage(redis_client, prefix=redis_prefix)


@pytest.fixture
def running_bridge(storage):
    """A bridge and a worker in this process, on the test's Redis prefix; stopped after."""
    started = []

    def start(broker: str, queue: str, jobq_queues: list[str]):
        bridge = KombuBridge(broker, [queue], storage=storage, prefetch=20)
        thread = bridge_thread(bridge)
        assert bridge.ready.wait(30), "the bridge never started consuming"
        worker = Worker(jobq_queues, storage=storage, concurrency=4, reap_interval=0)
        worker_thread = worker.start()
        started.append((bridge, thread, worker, worker_thread))
        return bridge

    yield start
    for bridge, thread, worker, worker_thread in started:
        bridge.stop()
        worker.stop()
        thread.join(10)
        worker_thread.join(15)


def result_of(storage, queue, job_id):
    record = storage.get_record(queue, job_id)
    return record, (json.loads(record.result) if record and record.result else None)


# -- the message format ------------------------------------------------------------------------


def test_parse_reads_what_celery_itself_sends():
    """Celery's own message builder (no broker needed) against our parser."""
    app = make_app()
    eta = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    message = app.amqp.create_task_message(
        "abc-123", "tests.celery.add", (2, 3), {"z": 1}, eta=eta, retries=2
    )
    body = json.dumps(message.body)
    task = parse(body, message.headers, "application/json")
    assert (task.task, task.id, task.args, task.kwargs) == ("tests.celery.add", "abc-123", [2, 3],
                                                            {"z": 1})  # fmt: skip
    assert task.eta == eta and task.retries == 2


def test_build_and_parse_round_trip_and_protocol_1():
    body, headers, _ = build("t.x", [1, "a"], {"k": [1]}, task_id="id-1", retries=1)
    task = parse(body, headers, "application/json")
    assert (task.task, task.id, task.args, task.kwargs, task.retries) == (
        "t.x", "id-1", [1, "a"], {"k": [1]}, 1,
    )  # fmt: skip
    v1 = json.dumps({"task": "t.y", "id": "id-2", "args": [5], "kwargs": {},
                     "eta": "2031-01-01T00:00:00"})  # fmt: skip
    task = parse(v1, {}, "application/json")
    assert task.task == "t.y" and task.eta == dt.datetime(2031, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("body", "headers", "ctype", "why"),
    [
        (b"\x80\x04K\x01.", {"task": "t", "id": "i"}, "application/x-python-serialize", "JSON"),
        (b"{not json", {"task": "t", "id": "i"}, "application/json", "not valid JSON"),
        (b"[1, 2]", {"task": "t", "id": "i"}, "application/json", "args, kwargs, embed"),
        (b"[[], {}, {}]", {"id": "i"}, "application/json", "no task name"),
        (b"[[], {}, {}]", {"task": "t", "id": 5}, "application/json", "task id"),
        (b"[{}, {}, {}]", {"task": "t", "id": "i"}, "application/json", "args must be a list"),
        (b"[[], {}, {}]", {"task": "t", "id": "i", "eta": "soon"}, "application/json", "eta"),
        (b"[[], {}, {}]", {"task": "t", "id": "i", "retries": -1}, "application/json", "retries"),
    ],
)
def test_malformed_messages_are_refused_with_a_reason(body, headers, ctype, why):
    with pytest.raises(MalformedMessage, match=why):
        parse(body, headers, ctype)


def test_celery_ids_outside_our_charset_map_to_a_stable_id():
    assert (
        job_id_for("0b1c7a2e-6a55-4f0e-9a4b-0a5c0f2c1d11") == "0b1c7a2e-6a55-4f0e-9a4b-0a5c0f2c1d11"
    )
    odd = job_id_for("tenant:42/report")
    assert odd.startswith("celery-") and odd == job_id_for("tenant:42/report")


# -- Celery sends, django_jobq runs ---------------------------------------------------------------


@pytest.mark.parametrize("broker", [AMQP, REDIS_TRANSPORT], ids=["rabbitmq", "redis-transport"])
def test_tasks_sent_by_celery_run_on_django_jobq(broker, celery_queue, storage, running_bridge):
    app = make_app(broker)
    with celery_conf():
        running_bridge(broker, celery_queue, ["tests.celery.add", "tests.celery.explode"])
        sent = [app.send_task("tests.celery.add", (i, 100), queue=celery_queue) for i in range(20)]
        kw = app.send_task("tests.celery.add", kwargs={"x": 1, "y": 2}, queue=celery_queue)
        later = app.send_task("tests.celery.add", (1, 1), countdown=300, queue=celery_queue)
        retried = app.send_task("tests.celery.add", (3, 3), queue=celery_queue, retries=2)
        boom = app.send_task("tests.celery.explode", ("kaput",), queue=celery_queue)
        # Due after it expires (RabbitMQ itself drops a message whose expiry passed while it
        # sat in the queue: Celery sets the AMQP expiration too, so it must arrive in time).
        soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
        expired = app.send_task(
            "tests.celery.add", (5, 5), queue=celery_queue, expires=soon, countdown=1.5
        )

        # Results come back through Celery's own AsyncResult (Redis result backend format).
        assert [r.get(timeout=20) for r in sent] == [i + 100 for i in range(20)]
        assert kw.get(timeout=20) == 3
        assert retried.get(timeout=20) == 6
        with pytest.raises(Exception, match="kaput") as info:
            boom.get(timeout=20)
        assert type(info.value).__name__ == "ValueError"
        with pytest.raises(Exception, match="expired"):
            expired.get(timeout=20)

    # ... and from our storage: the Celery id is the job id. The result reaches Celery's
    # backend before the worker's batched verdict reaches the storage: wait for the verdicts.
    def settled(queue: str, job_id: str) -> bool:
        record = storage.get_record(queue, job_id)
        return record is not None and record.state.value in ("completed", "failed")

    for queue, job_id in [("tests.celery.add", sent[0].id), ("tests.celery.explode", boom.id),
                          ("tests.celery.add", expired.id)]:  # fmt: skip
        assert wait_until(lambda q=queue, j=job_id: settled(q, j)), (queue, job_id)
    record, value = result_of(storage, "tests.celery.add", sent[0].id)
    assert record.state is JobState.COMPLETED and value == 100
    record = storage.get_record("tests.celery.add", later.id)
    assert record.state is JobState.SCHEDULED
    assert abs(record.run_at / 1000 - (dt.datetime.now(dt.UTC).timestamp() + 300)) < 30
    # Celery already retried it twice: of max_retries=5+1 runs... add has the default 3.
    assert storage.get_record("tests.celery.add", retried.id).max_attempts == 2
    assert storage.get_record("tests.celery.explode", boom.id).state is JobState.FAILED
    record = storage.get_record("tests.celery.add", expired.id)
    assert record.state is JobState.FAILED and record.attempts == 1  # permanent: no retries


def test_routes_send_a_celery_task_to_a_plain_handler(storage):
    with celery_conf(ROUTES={"legacy.echo": "tests-echo"}):
        bridge = KombuBridge(AMQP, ["unused"], storage=storage)
        body, headers, _ = build("legacy.echo", [1], {"k": "v"}, task_id="routed-1", retries=1)
        assert bridge.handle(body, headers, "application/json") == "queued"
    record = storage.get_record("tests-echo", "routed-1")
    payload = json.loads(record.payload)
    assert payload["args"] == [1] and payload["kwargs"] == {"k": "v"}
    assert payload["celery"]["task"] == "legacy.echo"
    # The queue's own max_attempts (3 by default) minus the retry Celery already made.
    assert record.max_attempts == 2


def test_redelivered_messages_deduplicate_and_bad_ones_are_kept_aside(
    celery_queue, storage, running_bridge
):
    """A redelivery of the same Celery id is one job; a pickled message, a body that is not a
    task and a task nobody handles are stored on the unroutable queue, and the good messages
    between them still run."""
    with celery_conf():
        bridge = running_bridge(AMQP, celery_queue, ["tests.celery.add"])
        exchange = Exchange(celery_queue, type="direct")
        kq = KombuQueue(celery_queue, exchange, routing_key=celery_queue)
        body, headers, props = build("tests.celery.add", [40, 2], {}, task_id="same-id")
        with Connection(AMQP) as conn:
            producer = Producer(conn)

            def send(b, h, ctype="application/json"):
                producer.publish(
                    b, exchange=exchange, routing_key=celery_queue, declare=[kq], headers=h,
                    content_type=ctype, content_encoding="utf-8",
                )  # fmt: skip

            send(body, headers)
            send(b"\x80\x04\x95pickled", {"task": "tests.celery.add", "id": "pickled-1"},
                 "application/x-python-serialize")  # fmt: skip
            send(body, headers)  # redelivered / sent twice
            send(b'{"hello": "world"}', {})
            unknown, uh, _ = build("nobody.handles.this", [], {}, task_id="unknown-1")
            send(unknown, uh)
            last, lh, _ = build("tests.celery.add", [1, 2], {}, task_id="last-id")
            send(last, lh)

        assert wait_until(lambda: sum(bridge.counts.values()) == 6), bridge.counts
        assert bridge.counts == {"queued": 2, "duplicate": 1, "unroutable": 3, "requeued": 0}
        assert wait_until(lambda: storage.counts("tests.celery.add")[JobState.COMPLETED] == 2)
    assert result_of(storage, "tests.celery.add", "same-id")[1] == 42
    assert result_of(storage, "tests.celery.add", "last-id")[1] == 3
    unroutable = Queue("celery-unroutable", storage=storage)
    kept = unroutable.get_status("pickled-1")
    assert kept is not None and kept.state is JobState.QUEUED
    payload = unroutable.serde_loads(storage.get_record("celery-unroutable", "pickled-1").payload)
    assert "only JSON" in payload["reason"] and payload["body_base64"]
    assert unroutable.get_status("unknown-1") is not None
    assert storage.counts("celery-unroutable")[JobState.QUEUED] == 3


class DiesBeforeAck(KombuBridge):
    """Stores the message, then 'crashes' before acknowledging it (the window the ordering
    exists for)."""

    def _on_message(self, message):
        self.handle(message.body, message.headers, message.content_type)
        self.stop()
        raise ConnectionAbortedError("simulated crash between enqueue and ack")


def test_a_message_stored_but_not_acknowledged_is_redelivered_and_deduplicated(
    celery_queue, storage
):
    app = make_app()
    with celery_conf():
        sent = app.send_task("tests.celery.add", (20, 22), queue=celery_queue)
        dying = DiesBeforeAck(AMQP, [celery_queue], storage=storage)
        dying.run()  # returns once it has 'crashed'; its connection is closed
        assert storage.get_record("tests.celery.add", sent.id).state is JobState.QUEUED

        again = KombuBridge(AMQP, [celery_queue], storage=storage)
        thread = bridge_thread(again)
        try:
            assert wait_until(lambda: again.counts["duplicate"] == 1), again.counts
        finally:
            again.stop()
            thread.join(10)
    assert again.counts["queued"] == 0
    assert storage.counts("tests.celery.add")[JobState.QUEUED] == 1


class RecordingMessage:
    """Stands in for a kombu message to observe when the bridge acknowledges."""

    def __init__(self, body, headers, on_ack):
        self.body, self.headers, self.content_type = body, headers, "application/json"
        self.on_ack = on_ack
        self.calls: list[str] = []

    def ack(self):
        self.on_ack()
        self.calls.append("ack")

    def requeue(self):
        self.calls.append("requeue")


def test_the_bridge_acknowledges_only_after_the_job_is_stored(storage, monkeypatch):
    body, headers, _ = build("tests.celery.add", [1, 2], {}, task_id="ordered-1")
    bridge = KombuBridge(AMQP, ["unused"], storage=storage)

    def stored_before_ack():
        assert storage.get_record("tests.celery.add", "ordered-1") is not None

    message = RecordingMessage(body, headers, stored_before_ack)
    bridge._on_message(message)
    assert message.calls == ["ack"]

    # Storage down: the message goes back to the broker, unacknowledged, and nothing is lost.
    def refuse(*args, **kwargs):
        raise ConnectionError("storage unreachable")

    monkeypatch.setattr(storage, "enqueue", refuse)
    monkeypatch.setattr("django_jobq.contrib.celery.bridge.time.sleep", lambda s: None)
    body, headers, _ = build("tests.celery.add", [1, 2], {}, task_id="ordered-2")
    message = RecordingMessage(body, headers, lambda: None)
    bridge._on_message(message)
    assert message.calls == ["requeue"] and bridge.counts["requeued"] == 1


# -- django_jobq publishes, Celery runs -----------------------------------------------------------


@pytest.fixture
def celery_worker(tmp_path):
    procs: list[subprocess.Popen] = []

    def start(queue: str, broker: str = AMQP) -> subprocess.Popen:
        log = (tmp_path / f"celery-{len(procs)}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker", "-P", "solo",
             "-Q", queue, "--without-heartbeat", "--without-gossip", "--without-mingle",
             "-l", "info", "-n", f"{queue}@%h"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "JOBQ_TEST_CELERY_BROKER": broker},
        )  # fmt: skip
        proc.log_path = log.name  # type: ignore[attr-defined]
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize("broker", [AMQP, REDIS_TRANSPORT], ids=["rabbitmq", "redis-transport"])
def test_published_jobs_run_on_a_real_celery_worker(broker, celery_queue, celery_worker):
    app = make_app(broker)
    # Published before the worker exists: the queue is declared as Celery declares it.
    first = publish("tests.celery_side.mul", (6, 7), queue=celery_queue, broker_url=broker)
    named = publish(
        "tests.celery_side.greet", ["jobq"], {"punctuation": "?"}, queue=celery_queue,
        broker_url=broker,
    )  # fmt: skip
    proc = celery_worker(celery_queue, broker)
    try:
        assert app.AsyncResult(first).get(timeout=60) == 42
        assert app.AsyncResult(named).get(timeout=20) == "hello jobq?"
    except Exception:
        print(Path(proc.log_path).read_text()[-3000:])  # type: ignore[attr-defined]
        raise


def test_publish_refuses_what_json_cannot_carry():
    with pytest.raises(ValueError, match="JSON"):
        publish("x.y", (object(),), broker_url=AMQP)


# -- a bridge killed mid-stream ----------------------------------------------------------------


@pytest.mark.slow
def test_a_bridge_killed_mid_stream_loses_nothing(celery_queue, storage, redis_prefix, tmp_path):
    app = make_app()
    ledger = tmp_path / "ledger.txt"
    total = 400
    ids = [
        app.send_task("tests.celery.record", (str(ledger), n, 0.01), queue=celery_queue).id
        for n in range(total)
    ]
    spawner = Spawner(tmp_path, {
        "JOBQ_TEST_PREFIX": redis_prefix,
        "JOBQ_TEST_SQLITE": str(tmp_path / "subprocess.sqlite3"),
    })  # fmt: skip
    args = ["runworker", "tests.celery.record", "-c", "4", "--lease", "2000",
            "--from-kombu", AMQP, "--celery-queue", celery_queue]  # fmt: skip
    try:
        victim = spawner(*args, log="bridge")

        def stored() -> int:
            return sum(storage.counts("tests.celery.record").values())

        assert wait_until(lambda: stored() >= 60, 30), "the bridge never got going"
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        at_kill = stored()
        assert at_kill < total, "the stream was over before the kill: make it longer"
        spawner(*args, log="bridge")
        assert wait_until(
            lambda: storage.counts("tests.celery.record")[JobState.COMPLETED] == total, 90
        ), storage.counts("tests.celery.record")
    finally:
        spawner.stop_all()

    runs = [int(line) for line in ledger.read_text().split()]
    assert set(runs) == set(range(total)), "a task never ran"
    for job_id in ids:
        assert storage.get_record("tests.celery.record", job_id).state is JobState.COMPLETED
    # At-least-once: only jobs that were running when the process died may run twice.
    assert len(runs) - total <= 4, f"{len(runs) - total} duplicate runs"
    print(f"killed with {at_kill}/{total} stored; {len(runs) - total} duplicate runs")


def test_runworker_refuses_a_celery_queue_without_a_broker():
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--from-kombu"):
        call_command("runworker", "tests.celery.add", "--celery-queue", "celery")


def test_celery_task_names_that_are_not_queue_names_need_an_explicit_queue():
    from django_jobq.contrib.celery import celery_task
    from django_jobq.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="pass queue="):
        celery_task("proj:tasks/odd name")
