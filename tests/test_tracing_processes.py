"""Tracing across processes: the producer span is made here, the consumer spans in a real
``runworker`` process (which exports them as JSON lines); the trace context crosses in the
job's envelope through Redis."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_jobq import JobFailed
from django_jobq.observability import tracing
from django_jobq.queue import Queue
from django_jobq.queue.flows import enqueue_flow, node
from django_jobq.storage.redis.storage import RedisStorage

from .helpers import Spawner, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def worker_spans(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


@pytest.fixture
def exporter():
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.use_provider(provider)
    yield spans
    tracing.use_provider(None)
    provider.shutdown()


def test_worker_spans_are_children_of_the_producer_span(redis_client, redis_prefix, tmp_path,
                                                        exporter):  # fmt: skip
    exported = tmp_path / "spans.jsonl"
    spawn = Spawner(tmp_path, {"JOBQ_TEST_PREFIX": redis_prefix,
                               "JOBQ_TEST_SQLITE": str(tmp_path / "sub.sqlite3"),
                               "JOBQ_TEST_OTEL_LOG": str(exported)})  # fmt: skip
    storage = RedisStorage(redis_client, prefix=redis_prefix)
    echo, fail = Queue("tests-echo", storage=storage), Queue("tests-fail", storage=storage)
    try:
        worker = spawn("runworker", "tests-echo", "tests-fail", log="worker")
        assert echo.enqueue_and_wait("te1", {"n": 1}, timeout=30)["echo"] == {"n": 1}
        with pytest.raises(JobFailed):
            fail.enqueue_and_wait("tf1", {}, max_attempts=2, min_backoff=10, max_backoff=10,
                                  timeout=30)  # fmt: skip
        assert wait_until(lambda: len(worker_spans(exported)) >= 3, 20), Path(
            worker.log_path
        ).read_text()
    finally:
        spawn.stop_all()
    producers = {s.attributes["messaging.message.id"]: s for s in exporter.get_finished_spans()}
    consumers = worker_spans(exported)
    assert {c["pid"] for c in consumers} == {worker.pid} != {os.getpid()}
    (echo_span,) = [c for c in consumers if c["attributes"]["messaging.message.id"] == "te1"]
    assert echo_span["kind"] == "CONSUMER"
    assert echo_span["trace_id"] == producers["te1"].context.trace_id
    assert echo_span["parent_id"] == producers["te1"].context.span_id
    assert echo_span["attributes"]["jobq.outcome"] == "completed"
    failed = sorted((c for c in consumers if c["attributes"]["messaging.message.id"] == "tf1"),
                    key=lambda c: c["attributes"]["jobq.attempt"])  # fmt: skip
    assert [c["attributes"]["jobq.outcome"] for c in failed] == ["retrying", "failed"]
    for span in failed:
        assert span["parent_id"] == producers["tf1"].context.span_id
        assert (span["status"], span["events"]) == ("ERROR", ["exception"])


def test_a_flow_is_one_trace_and_a_parent_links_its_children(redis_client, redis_prefix,
                                                              tmp_path, exporter):  # fmt: skip
    """``enqueue_flow`` under a request span: one ``send flow`` span, a ``send`` span per job
    under it, each attempt (in a real worker) a child of its job's ``send``, and the parent's
    attempt linked to its children's ``send`` spans."""
    exported = tmp_path / "spans.jsonl"
    spawn = Spawner(tmp_path, {"JOBQ_TEST_PREFIX": redis_prefix,
                               "JOBQ_TEST_SQLITE": str(tmp_path / "sub.sqlite3"),
                               "JOBQ_TEST_OTEL_LOG": str(exported)})  # fmt: skip
    storage = RedisStorage(redis_client, prefix=redis_prefix)
    tracer = tracing._tracer()
    flow = node("tests-echo", "fparent", {"p": 1},
                children=[node("tests-echo", "fkid1", {"k": 1}),
                          node("tests-echo", "fkid2", {"k": 2})])  # fmt: skip
    try:
        spawn("runworker", "tests-echo", log="worker")
        with tracer.start_as_current_span("request") as request:
            enqueue_flow(flow, storage=storage)
        assert wait_until(lambda: len(worker_spans(exported)) >= 3, 60)
    finally:
        spawn.stop_all()
    mine = {s.name: s for s in exporter.get_finished_spans() if s.name != "send tests-echo"}
    sends = {s.attributes["messaging.message.id"]: s for s in exporter.get_finished_spans()
             if s.name == "send tests-echo"}  # fmt: skip
    flow_span = mine["send flow tests-echo"]
    assert flow_span.parent.span_id == request.get_span_context().span_id
    assert set(sends) == {"fparent", "fkid1", "fkid2"}
    assert {s.parent.span_id for s in sends.values()} == {flow_span.context.span_id}
    trace_id = request.get_span_context().trace_id
    consumers = {c["attributes"]["messaging.message.id"]: c for c in worker_spans(exported)}
    assert set(consumers) == {"fparent", "fkid1", "fkid2"}
    for job_id, span in consumers.items():
        assert span["trace_id"] == trace_id
        assert span["parent_id"] == sends[job_id].context.span_id
    assert sorted(consumers["fparent"]["links"]) == sorted(
        [trace_id, sends[k].context.span_id] for k in ("fkid1", "fkid2")
    )
    assert consumers["fkid1"]["links"] == []


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_carries_the_context_of_the_call_not_of_the_commit(
    redis_client, redis_prefix, tmp_path, exporter
):
    """The commit runs after the request span ended: the job's attempt is still in the
    request's trace, under the ``send`` span made at the call."""
    from django.db import transaction

    exported = tmp_path / "spans.jsonl"
    spawn = Spawner(tmp_path, {"JOBQ_TEST_PREFIX": redis_prefix,
                               "JOBQ_TEST_SQLITE": str(tmp_path / "sub.sqlite3"),
                               "JOBQ_TEST_OTEL_LOG": str(exported)})  # fmt: skip
    echo = Queue("tests-echo", storage=RedisStorage(redis_client, prefix=redis_prefix))
    try:
        spawn("runworker", "tests-echo", log="worker")
        with transaction.atomic():
            with tracing._tracer().start_as_current_span("request") as request:
                echo.enqueue_on_commit("oc1", {"n": 1})
            assert echo.get_status("oc1") is None  # not sent before the commit
        assert wait_until(lambda: len(worker_spans(exported)) >= 1, 60)
    finally:
        spawn.stop_all()
    (send,) = [s for s in exporter.get_finished_spans() if s.name == "send tests-echo"]
    assert send.parent.span_id == request.get_span_context().span_id
    assert send.attributes["jobq.on_commit"] is True
    (attempt,) = worker_spans(exported)
    assert attempt["trace_id"] == request.get_span_context().trace_id
    assert attempt["parent_id"] == send.context.span_id


def test_a_job_sent_unsampled_is_dropped_by_a_real_worker_and_reads_the_same(
    redis_client, redis_prefix, tmp_path
):
    """A producer whose sampler drops its ``send`` spans marks the jobs (a plain JSON job:
    one trailing space; a job with an envelope: its meta); a real ``runworker`` under
    ``ParentBased(TraceIdRatioBased(0.999999))`` (its roots all but always sampled) drops
    their attempts, while a plain job of an untraced producer is recorded as a root. The
    handler sees the payload it was sent, mark or not."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    exported = tmp_path / "spans.jsonl"
    spawn = Spawner(tmp_path, {"JOBQ_TEST_PREFIX": redis_prefix,
                               "JOBQ_TEST_SQLITE": str(tmp_path / "sub.sqlite3"),
                               "JOBQ_TEST_OTEL_LOG": str(exported),
                               "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                               "OTEL_TRACES_SAMPLER_ARG": "0.999999"})  # fmt: skip
    storage = RedisStorage(redis_client, prefix=redis_prefix)
    echo = Queue("tests-echo", storage=storage)
    dropping = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    dropping.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    tracing.use_provider(dropping)
    try:
        assert tracing.active()
        echo.enqueue("un1", {"n": 1})
        echo.enqueue_many([("un2", [1, "a"]), {"id": "un3", "payload": "x", "timeout": 30}])
        echo.enqueue("un4", {"n": 4}, timeout=30)
    finally:
        tracing.use_provider(None)
    echo.enqueue("plain1", {"n": 5})  # not traced here: unmarked, a root in the worker
    records = {j: storage.get_record("tests-echo", j) for j in ("un1", "un2", "un3", "un4")}
    assert records["un1"].payload == b'{"n":1} ' and records["un1"].content_type == "json"
    assert records["un2"].payload.endswith(b" ")
    for job_id in ("un3", "un4"):
        assert records[job_id].content_type == "json+env"
        assert json.loads(records[job_id].payload)["meta"][tracing.UNSAMPLED_META] is True
    try:
        spawn("runworker", "tests-echo", log="worker")
        ids = ("un1", "un2", "un3", "un4", "plain1")
        done = lambda: all(getattr(echo.get_result(j), "ok", False) for j in ids)  # noqa: E731
        assert wait_until(done, 60)
        assert wait_until(lambda: len(worker_spans(exported)) >= 1, 20)
    finally:
        spawn.stop_all()
    assert [echo.get_result(j).value["echo"] for j in ids] == [  # type: ignore[union-attr]
        {"n": 1}, [1, "a"], "x", {"n": 4}, {"n": 5}
    ]  # fmt: skip
    spans = worker_spans(exported)  # the worker has stopped: every span it ended is here
    assert [(s["attributes"]["messaging.message.id"], s["parent_id"]) for s in spans] == [
        ("plain1", None)
    ]
