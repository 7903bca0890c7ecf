"""Values no storage or database can hold are refused where they enter, on every backend.

NaN and infinities are not JSON: stored, they made SQLite's JSON_VALID and PostgreSQL's jsonb
refuse every mirror batch, and a REST read of the job answer 500. A payload nested deeper than
the interpreter can walk raised a raw RecursionError. Each entry point must refuse them with
``InvalidPayload`` (options: ``InvalidOption``) and store nothing; a handler's result or
progress of that kind fails the attempt (or the call) with a clear error instead."""

from __future__ import annotations

import pytest

from django_jobq import InvalidOption, InvalidPayload, JobState, RateLimited, Retry
from django_jobq.contrib.celery.bridge import KombuBridge
from django_jobq.contrib.celery.protocol import build
from django_jobq.job import Job
from django_jobq.queue import Queue
from django_jobq.queue.flows import enqueue_flow, node
from django_jobq.serde import JSONSerde, MsgpackSerde
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker.execution import requested_retry_ms

from .helpers import running_workers, wait_until
from .test_tasks_backend import tasks_on  # noqa: F401, F811 - the fixture

Q = "tests-poison"
NON_FINITE = [float("nan"), float("inf"), float("-inf")]


def deep(levels: int = 100_000) -> list:
    root: list = []
    cur = root
    for _ in range(levels):
        nxt: list = []
        cur.append(nxt)
        cur = nxt
    return root


@pytest.fixture
def q(live_storage) -> Queue:
    return Queue(Q, storage=live_storage)


def assert_nothing_stored(q: Queue, *job_ids: str) -> None:
    assert all(q.get_status(job_id) is None for job_id in job_ids)
    assert sum(q.counts().values()) == 0


# -- payloads, at every way in -----------------------------------------------------------------


@pytest.mark.parametrize("bad", NON_FINITE, ids=["nan", "inf", "-inf"])
def test_enqueue_refuses_a_non_finite_float_in_the_payload(q, bad):
    with pytest.raises(InvalidPayload, match="JSON"):
        q.enqueue("poison", {"x": [1, {"y": bad}]})
    assert_nothing_stored(q, "poison")


def test_enqueue_many_refuses_the_whole_batch_for_one_non_finite_item(q):
    with pytest.raises(InvalidPayload):
        q.enqueue_many([("good", {"x": 1}), ("bad", {"x": float("nan")})])
    assert_nothing_stored(q, "good", "bad")


def test_enqueue_and_wait_refuses_a_non_finite_payload_before_storing(q):
    with pytest.raises(InvalidPayload):
        q.enqueue_and_wait("poison", float("inf"), timeout=1)
    assert_nothing_stored(q, "poison")


def test_enqueue_on_commit_refuses_at_the_call_not_at_commit(q):
    with pytest.raises(InvalidPayload):
        q.enqueue_on_commit("poison", {"x": float("nan")})
    assert_nothing_stored(q, "poison")


def test_a_flow_with_one_non_finite_payload_stores_none_of_its_jobs(live_storage):
    tree = node(Q, "parent", {"ok": 1}, children=[node(Q, "child", {"x": float("nan")})])
    with pytest.raises(InvalidPayload):
        enqueue_flow(tree, storage=live_storage)
    assert_nothing_stored(Queue(Q, storage=live_storage), "parent", "child")


def test_job_options_in_seconds_refuse_nan_and_infinity(q):
    for bad in (*NON_FINITE, 0, -1):
        with pytest.raises(InvalidOption, match="finite"):
            q.enqueue_and_wait("waits", {"x": 1}, timeout=bad)
        with pytest.raises(InvalidOption, match="finite"):
            q.enqueue("timed", {"x": 1}, timeout=bad)
        with pytest.raises(InvalidOption, match="finite"):
            q.enqueue("timed", {"x": 1}, hard_timeout=bad)
    assert_nothing_stored(q, "waits", "timed")


def test_a_payload_nested_100000_deep_is_invalid_payload_not_recursion_error(q):
    with pytest.raises(InvalidPayload, match="nested too deeply"):
        q.enqueue("deep", deep())
    assert_nothing_stored(q, "deep")


def test_json_decoding_of_a_100000_deep_document_is_invalid_payload():
    with pytest.raises(InvalidPayload, match="nested too deeply"):
        JSONSerde().loads(b"[" * 100_000 + b"]" * 100_000)


@pytest.mark.parametrize("bad", NON_FINITE, ids=["nan", "inf", "-inf"])
def test_msgpack_payloads_follow_the_same_rule(bad):
    serde = MsgpackSerde()
    for value in ({"x": bad}, [1, [bad]], {bad: 1}, (bad,)):
        with pytest.raises(InvalidPayload):
            serde.dumps(value)
    with pytest.raises(InvalidPayload):
        serde.dumps(deep())
    with pytest.raises(InvalidPayload):
        serde.loads(b"\x91" * 100_000 + b"\x90")
    # Finite doubles and binary data that merely look like a packed NaN are kept.
    fine = {"x": 1.5, "big": -1e308, "b": b"\xcb\x7f\xf8\x00"}
    assert serde.loads(serde.dumps(fine)) == fine


def test_the_tasks_backend_refuses_non_finite_arguments(tasks_on, live_storage):  # noqa: F811
    from django.tasks.exceptions import InvalidTask

    from . import task_funcs

    with pytest.raises(InvalidTask, match="JSON"):
        task_funcs.add.enqueue(1, float("nan"))
    assert sum(Queue("default", storage=live_storage).counts().values()) == 0


# -- the kombu bridge ----------------------------------------------------------------------------


class Message:
    def __init__(self, body, headers):
        self.body, self.headers, self.content_type = body, headers, "application/json"
        self.calls: list[str] = []

    def ack(self):
        self.calls.append("ack")

    def requeue(self):
        self.calls.append("requeue")


@pytest.mark.parametrize("kind", ["nan", "deep"])
def test_the_bridge_keeps_a_poison_message_aside_and_acknowledges_it(live_storage, kind):
    """Neither crashes the consumer nor loops: requeued, a poison message would come back
    forever; it is kept on the unroutable queue (the bridge's dead letters) instead."""
    from tests.test_celery_interop import celery_conf

    body, headers, _ = build("legacy.echo", [1], {}, task_id=f"poison-{kind}")
    if kind == "nan":
        body = body.replace("[1]", "[NaN]", 1)
    else:
        body = "[" * 100_000 + "]" * 100_000
    with celery_conf(ROUTES={"legacy.echo": Q}):
        bridge = KombuBridge("memory://", ["unused"], storage=live_storage)
        message = Message(body, headers)
        bridge._on_message(message)
    assert message.calls == ["ack"] and bridge.counts["unroutable"] == 1
    assert Queue(Q, storage=live_storage).get_status(f"poison-{kind}") is None
    kept = Queue(bridge.unroutable, storage=live_storage)
    assert kept.counts()[JobState.QUEUED] == 1


# -- what a handler hands back -------------------------------------------------------------------


@pytest.mark.parametrize("bad", NON_FINITE, ids=["nan", "inf", "-inf"])
def test_a_non_finite_result_fails_the_attempt_with_a_clear_error(q, live_storage, bad):
    registry = HandlerRegistry()
    registry.register(Q, lambda job: {"score": bad})
    q.enqueue("result", None)
    with running_workers(live_storage, handlers=registry) as start:
        start([Q])
        assert wait_until(lambda: q.get_status("result").state is JobState.FAILED, 10)
    status = q.get_status("result")
    assert status.attempts == 1  # permanent: the same result would come back every time
    assert status.error["type"] == "BadResult" and "JSON" in status.error["message"]
    assert q.get_result("result").value is None


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), {"x": "\x00"}, deep(5000)],
                         ids=["inf", "nan", "nul", "deep"])  # fmt: skip
def test_set_progress_refuses_what_no_database_can_store(q, live_storage, bad):
    seen: dict = {}

    def handler(job):
        try:
            job.set_progress(bad)
        except InvalidPayload as exc:
            seen["refused"] = str(exc)
        job.set_progress(50)
        return "done"

    registry = HandlerRegistry()
    registry.register(Q, handler)
    q.enqueue("progress", None)
    with running_workers(live_storage, handlers=registry) as start:
        start([Q])
        assert wait_until(lambda: q.get_status("progress").state is JobState.COMPLETED, 10)
    assert "refused" in seen
    assert q.get_status("progress").progress == 50


def test_log_lines_with_nul_or_lone_surrogates_are_kept_readable(q, live_storage):
    def handler(job):
        job.log("before\x00after")
        job.log("half \ud800 pair")
        return None

    registry = HandlerRegistry()
    registry.register(Q, handler)
    q.enqueue("logs", None)
    with running_workers(live_storage, handlers=registry) as start:
        start([Q])
        assert wait_until(lambda: q.get_status("logs").state is JobState.COMPLETED, 10)
    lines = [line for _, line in q.get_status("logs").logs]
    assert lines == ["before\ufffdafter", "half \ufffd pair"]


def test_an_error_message_with_nul_is_stored_readable(q, live_storage):
    registry = HandlerRegistry()

    def handler(job):
        raise ValueError("bad\x00byte")

    registry.register(Q, handler)
    q.enqueue("err", None, max_attempts=1)
    with running_workers(live_storage, handlers=registry) as start:
        start([Q])
        assert wait_until(lambda: q.get_status("err").state is JobState.FAILED, 10)
    error = q.get_status("err").error
    assert error["message"] == "bad\ufffdbyte" and "\x00" not in error["traceback"]


def test_a_non_finite_retry_delay_falls_back_to_the_backoff():
    assert requested_retry_ms(Retry(retry_in=float("nan"))) is None
    assert requested_retry_ms(Retry(retry_at=float("inf"))) is None
    assert requested_retry_ms(Retry(retry_in=1e300)) == 10 * 365 * 24 * 3600 * 1000
    for bad in (*NON_FINITE, -1):
        with pytest.raises(ValueError, match="finite"):
            RateLimited(bad)


def test_progress_refusal_outside_a_worker_keeps_the_last_good_value():
    job = Job(id="x", queue=Q, payload=None, attempt=1, max_attempts=1)
    job.set_progress(10)
    with pytest.raises(InvalidPayload, match="NUL"):
        job.set_progress({"x": "\x00"})
    assert job.progress == 10
    assert job.set_progress("\\u0000 is text") is True  # an escaped backslash, not a NUL


@pytest.mark.parametrize("serde", [JSONSerde(), MsgpackSerde()], ids=["json", "msgpack"])
@pytest.mark.parametrize("bad", [{1: "x", "1": "y"}, [{"a": {None: 1}}], {"a": ({True: 2},)}])
def test_a_dict_key_that_is_not_a_string_is_refused_not_folded_into_another(serde, bad):
    """JSON writes ``1`` as ``"1"``: the pair would read back as ``{"1": "y"}``, a key lost
    without an error."""
    with pytest.raises(InvalidPayload, match="dict keys must be strings"):
        serde.dumps(bad)


def test_enqueue_refuses_a_payload_with_a_non_string_key(q):
    with pytest.raises(InvalidPayload, match="dict keys must be strings"):
        q.enqueue("poison", {"args": [{1: "x", "1": "y"}]})
    assert_nothing_stored(q, "poison")
